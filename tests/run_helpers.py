"""The run command in tests, shared by its quick tests (tests/harness/) and
its end-to-end ones (tests/e2e/).

* `parse_gin_files` / `parse_local_tiny` / `parse_local_tiny_out`: gin
  files from gin/ with macro bindings, not finalized (a test may still
  read or change them); the `clean_gin` fixture (conftest.py) clears them.
* `certify_arguments`: a gin file's `RunArguments`, gin cleared first.
* `arguments_with`: the run's arguments with gin bindings added (how a
  component's settings are set).
* `tiny_run_plan`: a small local_tiny.gin run, checked, nothing loaded.
* `stand_in_seconds`: call prices without a clock (`Pricing.call_seconds`).
* `compile_tiny`: local_tiny.gin compiled for a TPU v4-8 with no TPU
  (COMPILE_TOPOLOGY; skips without libtpu).
* `run_cli`: the command in a subprocess; `subprocess_env`: the
  environment of one that runs this checkout.
* `gcs_at` / `refused_gcs`: gs:// paths served by a loopback port (a
  stand-in endpoint; one nothing listens on).
"""
import json
import os
import socket
import subprocess
import sys

import gin
import jax
import pytest

from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_report
from specdec_jax.experiment import loading
from specdec_jax.experiment.plan import RunPlan

from conftest import REPO


def parse_gin_files(files, bindings=()):
  gin_utils.parse_gin(files, bindings, finalize=False)


def parse_local_tiny(bindings):
  parse_gin_files(["local_tiny.gin"], bindings)


def parse_local_tiny_out(tmp_path, *bindings):
  """local_tiny.gin writing to tmp_path/out, with `bindings`."""
  parse_local_tiny([f"OUTPUT_DIR = '{tmp_path / 'out'}'", *bindings])


def certify_arguments(bindings, gin_file="local_tiny.gin"):
  """`RunArguments` of `gin_file` with `bindings`, gin cleared first (an
  OUTPUT_DIR nothing writes to: `certify.check` reads the arguments only)."""
  gin.clear_config()
  parse_gin_files([gin_file], ["OUTPUT_DIR = '/tmp/unused_certify'", *bindings])
  return arguments.run_arguments()


def arguments_with(*bindings, **overrides) -> arguments.RunArguments:
  """The run's arguments with gin `bindings` as a user types them
  ("TREE_WIDTH = 2": a component's setting is bound, not overridden) added
  to the configuration parsed so far, and `overrides` (`RunArguments`
  fields)."""
  gin.parse_config(list(bindings))
  return arguments.run_arguments(overrides)


def tiny_run_plan(tmp_path, **overrides) -> RunPlan:
  """local_tiny.gin's plan (built: checked, nothing loaded) for 5 examples
  in batches of 2, at most 8 output tokens, γ = 2, into tmp_path/out;
  `overrides`: `RunArguments` fields."""
  parse_local_tiny_out(tmp_path, "NUM_EXAMPLES = 5", "BATCH_SIZE = 2",
                       "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
                       "GAMMA = 2")
  return RunPlan.build(arguments.run_arguments(overrides=overrides))


def stand_in_seconds(calls, *args, **kwargs):
  """`Pricing.call_seconds` without a clock (run's timing is tested
  elsewhere): 1 ms plus 0.1 ms per token (or guess) of a call."""
  del args, kwargs
  return {name: 1e-3 * (1 + k / 10) for name, (_, k) in calls.items()}


def compile_tiny(out, bindings=()):
  """local_tiny.gin (+ bindings) compiled for v4-8 at MESH_SHAPE=(1, 4):
  (compile.json, (target config, draft config))."""
  pytest.importorskip(
      "libtpu", reason="libtpu is not installed: compiling for a TPU "
      "topology needs it (pip install -e '.[tpu]'; no TPU needed).")
  gin.clear_config()
  # The suite's persistent compilation cache (conftest.py) holds CPU
  # programs; a TPU compilation without a TPU client cannot read entries.
  cache_was = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    gin_utils.parse_gin(["local_tiny.gin"], [
        "COMPILE_TOPOLOGY = 'v4-8'", "MESH_SHAPE = (1, 4)",
        f"OUTPUT_DIR = '{out}'", *bindings
    ])
    args = arguments.run_arguments()
    compile_report.compile_topology(args, args.compile_topology,
                                    ["local_tiny.gin"])
    configs = (loading.model_config("target"), loading.model_config("draft"))
  finally:
    gin.clear_config()
    jax.config.update("jax_enable_compilation_cache", cache_was)
  with open(out / compile_report.COMPILE_FILE) as f:
    return json.load(f), configs


def run_cli(*args) -> subprocess.CompletedProcess:
  """`python -m specdec_jax.run ARGS` in a fresh process, from the
  repository: its exit status, stdout and stderr."""
  return subprocess.run([sys.executable, "-m", "specdec_jax.run", *args],
                        capture_output=True, text=True, cwd=REPO, timeout=300,
                        check=False)


def subprocess_env() -> dict:
  """The environment of a subprocess that runs this checkout on the CPU,
  with no gs:// stand-in endpoint (TENSORSTORE_GCS_HTTP_URL)."""
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  env.pop("TENSORSTORE_GCS_HTTP_URL", None)
  return env


def gcs_at(monkeypatch, port: int, token: str = "loopback") -> None:
  """gs:// paths served by 127.0.0.1:port (tensorstore's stand-in
  endpoint), with a test token instead of credentials."""
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{port}")
  monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", token)


def refused_gcs(monkeypatch) -> int:
  """gs:// paths served by a loopback port nothing listens on (every
  connection refused); returns the port."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # closed again: connections are refused
  gcs_at(monkeypatch, port)
  return port
