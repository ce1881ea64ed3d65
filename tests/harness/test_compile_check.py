"""COMPILE_TOPOLOGY: the run's programs compiled for a Cloud TPU, no TPU.

The compiling test needs libtpu (`pip install -e '.[tpu]'`; CI installs
it) and skips without it; everything else here runs anywhere. The suite
runs with JAX_PLATFORMS=cpu (conftest), under which libtpu's topology API
still works: the host stays a CPU, the programs are compiled for TPU v4.
"""
import json
import math
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from specdec_jax.metrics import analysis
from specdec_jax.config import gin_utils
from specdec_jax.core import kernels
from specdec_jax.multihost import partitioning
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_report
from specdec_jax.experiment import loading
from specdec_jax.experiment import tpu_topologies
from specdec_jax.core.models import param_shapes

from conftest import REPO


def test_cloud_and_raw_topology_names():
  for name, raw, chips in (("v4-8", "v4:2x2x1", 4), ("v4-32", "v4:2x2x4", 16),
                           ("v5e-8", "v5e:2x4", 8), ("v5p-8", "v5p:2x2x1", 4),
                           ("v4:2x2x2", "v4:2x2x2", 8), ("v5e:4x4", "v5e:4x4",
                                                         16)):
    topology = tpu_topologies.resolve(name)
    assert (topology.topology_name, topology.num_chips) == (raw, chips)
  assert tpu_topologies.resolve("v5p-8").chip.hbm_bytes == 95 * 2**30


@pytest.mark.parametrize(
    "bad", ["v4-7", "v9-8", "v4:2x2", "v5e:2x2x1", "tpu", 8, None, "v4:0x2x1"])
def test_bad_topology_names_list_what_is_allowed(bad):
  with pytest.raises(ValueError) as e:
    tpu_topologies.resolve(bad)
  message = str(e.value)
  assert f"COMPILE_TOPOLOGY={bad!r}" in message
  assert "v4-8" in message and "v5e-8" in message and "v4:2x2x1" in message


def test_settings_compile_mode_cannot_honour_are_refused():
  base = dict(output_dir="/tmp/unused", gamma=3)
  for fields, words in (({
      "mesh_shape": (1, 8)
  }, "MESH_SHAPE=(1, 8) needs 8 chips"), ({
      "drafter": "bigram",
      "ngram_corpus": __file__
  }, "DRAFTER='bigram' with COMPILE_TOPOLOGY: allowed: 'model', "
                                          "'shared_encoder'"), ({
                                              "gamma": "auto"
                                          }, "GAMMA='auto'")):
    args = arguments.RunArguments(**{**base, **fields})
    with pytest.raises(gin_utils.ConfigError, match=re.escape(words)):
      compile_report.check_compile_settings(args, "v4-8")


@pytest.mark.slow
def test_cli_bad_topology_exits_2_and_writes_nothing(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run([
      sys.executable, "-m", "specdec_jax.run", "--gin_file=local_tiny.gin",
      "--gin.COMPILE_TOPOLOGY='v4-9'", f"--gin.OUTPUT_DIR='{out}'"
  ], cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                        env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "run: error: COMPILE_TOPOLOGY='v4-9': unknown TPU topology" in (
      proc.stderr)
  assert not out.exists()


@pytest.mark.parametrize("temperature,gamma,expected", [(0.0, 7, (0.75, 3.4)),
                                                        (1.0, 7, (0.62, 2.6)),
                                                        (0.0, 5, None)])
def test_paper_row_from_gin_comments(temperature, gamma, expected):
  row = compile_report.paper_row(["ende_small.gin"], temperature, gamma)
  if expected is None:
    assert row is None
  else:
    assert (row["alpha"], row["speedup"], row["source"]) == (*expected,
                                                             "ende_small.gin")
  cnndm = compile_report.paper_row(["cnndm_large.gin"], 1.0, 3)
  assert (cnndm["alpha"], cnndm["speedup"]) == (0.56, 1.7)


def test_roofline_arithmetic():
  chip = tpu_topologies.CHIPS["v4"]
  calls = {
      "target_step": {
          "bytes_accessed": 6e9,
          "flops": 1e9,
          "argument_bytes": 3e9
      },
      "verification": {
          "bytes_accessed": 6.6e9,
          "flops": 8e9,
          "argument_bytes": 3e9
      },
      "draft_step": {
          "bytes_accessed": 1.2e8,
          "flops": 1e7,
          "argument_bytes": 3e7
      }
  }
  paper = {"alpha": 0.75, "gamma": 7}
  roof = compile_report.roofline(calls, chip, 7, paper)
  assert roof["calls"]["target_step"]["seconds"] == pytest.approx(5e-3)
  assert roof["cost_coefficient_c"] == pytest.approx(0.02)
  assert roof["call_cost"] == pytest.approx(1.1)
  assert roof["theorem_3_8_speedup"] == pytest.approx(
      analysis.expected_speedup(0.75, 7, 0.02, 1.1))
  args = roof["from_arguments"]
  assert (args["cost_coefficient_c"], args["call_cost"]) == pytest.approx(
      (0.01, 1.0))
  # A call limited by FLOPs, not bytes: priced by the chip's peak.
  calls["verification"]["flops"] = 2.75e12
  roof = compile_report.roofline(calls, chip, 7, None)
  assert roof["calls"]["verification"]["bound"] == "compute"
  assert roof["call_cost"] == pytest.approx(2.0)
  assert roof["theorem_3_8_speedup"] is None


def test_smallest_fitting_mesh_grows_the_model_axis():
  tried = []

  def total_bytes(shape):  # parameters sharded over 'model' only
    tried.append(shape)
    return 24e9 / shape[1] + 1e9

  assert compile_report.smallest_fitting_mesh(8, (1, 1), 8e9,
                                              total_bytes) == [1, 4]
  assert tried == [(1, 2), (1, 4)]
  assert compile_report.smallest_fitting_mesh(8, (2, 1), 4e9,
                                              total_bytes) is None
  assert tried[2:] == [(2, 2), (2, 4)]  # 3 does not divide 8 // 2


def _sharded_bytes(config, sizes) -> int:
  """Per-device parameter bytes by hand: each dimension a spec shards is
  divided by its mesh axis size."""
  shapes = param_shapes(config)["params"]
  specs = partitioning.param_partition_specs(shapes, sizes)
  total = 0
  for leaf, spec in zip(
      jax.tree_util.tree_leaves(shapes),
      jax.tree_util.tree_leaves(
          specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
    dims = [
        d // (sizes[axis] if axis else 1)
        for d, axis in zip(leaf.shape,
                           tuple(spec) + (None,) * 9)
    ]
    total += math.prod(dims) * np.dtype(config.dtype).itemsize
  return total


def _compile_tiny(out, bindings=()):
  """local_tiny.gin (+ bindings) compiled for v4-8 at MESH_SHAPE=(1, 4):
  (compile.json, (target config, draft config))."""
  pytest.importorskip(
      "libtpu", reason="libtpu is not installed: compiling for a TPU "
      "topology needs it (pip install -e '.[tpu]'; no TPU needed).")
  import gin  # pylint: disable=g-import-not-at-top
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


@pytest.fixture(scope="module")
def tiny_v4(tmp_path_factory):
  """local_tiny.gin compiled for v4-8 at MESH_SHAPE=(1, 4): compile.json."""
  return _compile_tiny(tmp_path_factory.mktemp("compile"))


@pytest.mark.slow
def test_tiny_compiles_for_v4_with_sharded_parameter_bytes(tiny_v4):
  record, (target, draft) = tiny_v4
  assert record["topology"]["topology_name"] == "v4:2x2x1"
  assert record["topology"]["device_kind"] == "TPU v4"
  assert record["topology"]["devices"] == 4  # one megacore device per chip
  sizes = {"data": 1, "model": 4}
  params = record["memory_per_device"]["parameter_bytes"]
  assert params["target"] == _sharded_bytes(target, sizes)
  assert params["draft"] == _sharded_bytes(draft, sizes)
  # Sharding happened: a device holds less than the whole model.
  assert params["target"] < target.num_params * 4
  step = record["calls"]["target_step"]
  # The step's arguments are the parameters, the cache and the tokens.
  assert step["argument_bytes"] >= (
      params["target"] +
      record["memory_per_device"]["kv_cache_bytes"]["target"])
  assert step["flops"] > 0 and step["bytes_accessed"] > 0
  assert step["bytes_per_argument_byte"] == pytest.approx(
      step["bytes_accessed"] / step["argument_bytes"])
  # Each weight is read once per step and per verification call (the
  # relative-position table, a few hundred bytes, is read twice).
  for name in ("target_step", "verification", "draft_step"):
    reads = record["calls"][name]["weight_reads"]
    assert reads["weights"] > 0 and not reads["unread"], reads
    assert reads["reads_per_weight_byte"] == pytest.approx(1.0, abs=0.01)
    assert all("relpos" in n for n in reads["read_more_than_once"]), reads
  # Megatron-style sharding over 'model': all-reduces in every step.
  assert record["collectives_per_target_step"]["all-reduce"] > 0
  memory = record["memory_per_device"]
  assert memory["fits"] and memory["peak_bytes"] == max(
      memory["program_total_bytes"].values())
  assert memory["hbm_bytes"] == 32 * 2**30


@pytest.mark.slow
def test_tiny_tpu_programs_hold_no_cpu_only_parts(tiny_v4):
  record, _ = tiny_v4
  # local_tiny is float32 and this host's backend is the CPU, where
  # `prepared_for_decoding` would pack for the CPU kernel: it must not.
  assert kernels.TARGET_NAME not in record["custom_calls"]
  assert not record["cpu_kernel_in_programs"]
  # The program compiled with the run's rule (local_tiny: Algorithm 1).
  assert record["programs"]["speculative"]["acceptance_rule"] == (
      "ExactAcceptance")
  for r in list(record["calls"].values()) + list(record["programs"].values()):
    assert not any("cpu" in c.lower() for c in r["custom_calls"]), r
  roof = record["roofline"]
  calls = roof["calls"]
  assert roof["cost_coefficient_c"] == pytest.approx(
      calls["draft_step"]["seconds"] / calls["target_step"]["seconds"])
  lines = compile_report.compile_summary_lines(record)
  assert any("fits" in line for line in lines)
  assert any("none of ours" in line for line in lines)


@pytest.mark.slow
def test_shared_encoder_draft_compiles_and_reads_its_own_weights_once(tmp_path):
  # DRAFTER='shared_encoder': a draft decoder without an encoder, reading
  # the target's encoder output (local_tiny's target: emb_dim 64).
  record, (target, draft) = _compile_tiny(tmp_path, [
      "DRAFTER = 'shared_encoder'", "draft/T5Config.num_encoder_layers = 0",
      "draft/T5Config.encoder_width = 64"
  ])
  assert not draft.has_encoder and target.has_encoder
  sizes = {"data": 1, "model": 4}
  params = record["memory_per_device"]["parameter_bytes"]
  # The draft's own parameters: its decoder and embedding, no encoder.
  assert params["draft"] == _sharded_bytes(draft, sizes)
  reads = record["calls"]["draft_step"]["weight_reads"]
  assert reads["weights"] > 0 and not reads["unread"], reads
  assert reads["reads_per_weight_byte"] == pytest.approx(1.0, abs=0.01)
  assert record["memory_per_device"]["fits"]
  assert "speculative" in record["programs"]


@pytest.mark.slow
def test_beam_programs_compile_for_v4(tmp_path):
  """DECODE='beam': the target's beam search and speculative beam search
  are the two programs, and the calls are at the rows they make."""
  k, u, rows, gamma = 2, 4, 6, 2
  record, _ = _compile_tiny(tmp_path, [
      "DECODE = 'beam'", f"BEAM_SIZE = {k}", f"BEAM_WIDTH = {u}",
      f"BEAM_ROWS = {rows}", f"GAMMA = {gamma}", "BATCH_SIZE = 2",
      "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 8}"
  ])
  settings = record["settings"]
  assert (settings["decode"], settings["beam_size"], settings["beam_width"],
          settings["beam_rows"]) == ("beam", k, u, rows)
  assert set(record["programs"]) == {"baseline", "speculative"}
  for r in record["programs"].values():
    assert r["total_bytes"] > 0
    assert not any("cpu" in c.lower() for c in r["custom_calls"]), r
  # Calls at the beam rows: the verification call holds R rows of γ+1
  # positions, so it takes more argument bytes than the k-row step's
  # (the caches: B·R rows against B·k).
  calls = record["calls"]
  assert (calls["verification"]["argument_bytes"]
          > calls["target_step"]["argument_bytes"])
  assert record["paper"] is None  # no Theorem 3.8 for beams
  lines = compile_report.compile_summary_lines(record)
  assert any("DECODE='beam' (k=2, u=4, R=6)" in line for line in lines)
  assert not any(line.startswith("Theorem 3.8") for line in lines)


def test_the_tree_call_compiles_and_reads_each_weight_once(tmp_path):
  """ACCEPTANCE='tree': the tree call over 1 + k·γ nodes (tree mask) reads
  every target weight once, like a step; the tree loop is compiled."""
  record, _ = _compile_tiny(
      tmp_path, ["ACCEPTANCE = 'tree'", "TREE_WIDTH = 3", "GAMMA = 2"])
  settings = record["settings"]
  assert settings["acceptance"] == "tree" and settings["tree_width"] == 3
  calls = record["calls"]
  tree, step = calls["tree_call"], calls["target_step"]
  reads = tree["weight_reads"]
  assert reads["weights"] > 0 and not reads["unread"], reads
  assert reads["reads_per_weight_byte"] == pytest.approx(1.0, abs=0.01)
  assert all("relpos" in n for n in reads["read_more_than_once"]), reads
  # The same weights as a step, over 7 positions rather than 1.
  assert reads["weight_bytes"] == step["weight_reads"]["weight_bytes"]
  assert tree["flops"] > 3 * step["flops"]
  assert tree["argument_bytes"] >= (
      record["memory_per_device"]["parameter_bytes"]["target"] +
      record["memory_per_device"]["kv_cache_bytes"]["target"])
  assert set(record["programs"]) == {"baseline", "speculative"}
  assert record["programs"]["speculative"]["acceptance_rule"] == (
      "TreeAcceptance")
  roof = record["roofline"]
  assert roof["tree_call_cost"] == pytest.approx(
      roof["calls"]["tree_call"]["seconds"] /
      roof["calls"]["target_step"]["seconds"])
  lines = compile_report.compile_summary_lines(record)
  assert any(
      line.startswith("The tree call (N=1+k·γ=7 nodes, k=3, tree mask) "
                      "reads the") and "1.00 times" in line
      for line in lines), lines


def test_tree_width_auto_is_refused_in_compile_mode():
  with pytest.raises(
      gin_utils.ConfigError,
      match=re.escape("TREE_WIDTH='auto' with COMPILE_TOPOLOGY")):
    arguments.RunArguments(output_dir="/tmp/unused", gamma=3, acceptance="tree",
                           tree_width="auto", compile_topology="v4-8")


class _Compiled(Exception):
  """Raised by the spy in place of compiling (nothing is compiled)."""


@pytest.mark.parametrize("bindings, rule",
                         [([], None),
                          (["ACCEPTANCE = 'block'"], "BlockAcceptance"),
                          (["LENIENCE = 0.5"], "LenientAcceptance"),
                          (["ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"], None)])
def test_each_mode_compiles_the_runs_acceptance_rule(tmp_path, monkeypatch,
                                                     bindings, rule):
  """COMPILE_TOPOLOGY hands the compiler the rule the run decodes with
  (issue 42: ACCEPTANCE='block' compiled Algorithm 1's token rule)."""
  pytest.importorskip(
      "libtpu", reason="libtpu is not installed: the topology's devices "
      "need it (pip install -e '.[tpu]'; no TPU needed).")
  import gin  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiment import compile_check  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiment import decode_modes  # pylint: disable=g-import-not-at-top
  seen = {}

  def spy(*args, **kwargs):
    del kwargs
    seen["acceptance"], seen["tree_width"] = args[6], args[3].tree_width
    raise _Compiled()

  monkeypatch.setattr(compile_check, "compile_all", spy)
  gin.clear_config()
  try:
    gin_utils.parse_gin(["local_tiny.gin"], [
        "COMPILE_TOPOLOGY = 'v4-8'", "MESH_SHAPE = (1, 4)",
        f"OUTPUT_DIR = '{tmp_path / 'out'}'", *bindings
    ])
    args = arguments.run_arguments()
    with pytest.raises(_Compiled):
      compile_report.compile_topology(args, args.compile_topology,
                                      ["local_tiny.gin"])
  finally:
    gin.clear_config()
  # The rule the run's plan decodes with (`RunPlan.build`).
  run_rule = decode_modes.mode_of(args).acceptance_rule(args)
  assert type(seen["acceptance"]) is type(run_rule)
  assert (None if run_rule is None else type(run_rule).__name__) == rule
  if rule == "LenientAcceptance":
    assert float(seen["acceptance"].lenience) == 0.5
  assert seen["tree_width"] == (2 if "TREE_WIDTH = 2" in bindings else 0)
