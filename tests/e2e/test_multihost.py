"""Several hosts, simulated: processes on 127.0.0.1 with JAX's distributed
runtime, the CPU backend and its gloo collectives (`specdec_jax.multihost`).

Each process is `tests/multihost_worker.py` (the real `run` / `sweep`
command lines with T5X's multi-host flags; TensorFlow kept out for speed),
with `--xla_force_host_platform_device_count` devices. Every process group
is killed if it outlives GROUP_TIMEOUT_S. Both timeouts are generous: the
machine is shared, and another user's timing script may pause every python
process (SIGSTOP) for minutes; JAX's heartbeat timeout is the coordination
timeout, so such a pause does not kill the group either.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import gin
import jax
import numpy as np
import pytest

import multihost_worker
from specdec_jax import checkpoints
from specdec_jax import multihost
from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax.experiment import loading
from specdec_jax.experiment.plan import Providers
from specdec_jax import sweep
from specdec_jax.data import tasks
from specdec_jax.core.models import init_params

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "multihost_worker.py"
GROUP_TIMEOUT_S = 900
COORDINATION_TIMEOUT_S = 600

# Seven short sentences: odd, so the data shards differ in size, and every
# input fits one 16-wide bucket (one compilation per decoder).
DATA = [
    "a house\tein Haus", "the dog\tder Hund", "red cat\trote Katze",
    "my tree\tmein Baum", "an apple\tein Apfel", "no\tnein",
    "big sea\tgrosses Meer"
]
# Tiny models and lengths: compilation dominates these runs.
BINDINGS = {
    "NUM_EXAMPLES": "7",
    "GAMMA": "2",
    "TASK_FEATURE_LENGTHS": "{'inputs': 16, 'targets': 8}",
    **{
        f"{role}/T5Config.{field}": "1" for role in ("target", "draft") for field in ("num_encoder_layers", "num_decoder_layers")
    },
    # The workers' CharVocabulary (98 ids) is deliberately smaller than the
    # tiny models' 259 rows: no checkpoint here was trained on text.
    "check_vocabulary_fits.allow_size_mismatch": "True",
}

# A cleared gin configuration before and after each test (conftest.py).
# End to end: marked slow, like every test in tests/e2e/.
pytestmark = [pytest.mark.usefixtures("clean_gin"), pytest.mark.slow]


@pytest.fixture(scope="module")
def model_bindings(tmp_path_factory):
  """BINDINGS plus target and draft checkpoints of random weights: loading
  them costs the workers no compilation (random init would)."""
  folder = tmp_path_factory.mktemp("models")
  gin.clear_config()
  gin_utils.parse_gin(["local_tiny.gin"],
                      [f"{k} = {v}" for k, v in BINDINGS.items()],
                      finalize=False)
  paths = {}
  for seed, role in enumerate(("target", "draft")):
    config = loading.model_config(role)
    params = init_params(config, jax.random.PRNGKey(seed))["params"]
    paths[f"{role.upper()}_CHECKPOINT_PATH"] = repr(
        checkpoints.save_params(params, str(folder / role)))
  gin.clear_config()
  return {**BINDINGS, **paths}


def _data(tmp_path) -> str:
  path = tmp_path / "data.tsv"
  path.write_text("\n".join(DATA) + "\n")
  return str(path)


def _flags(bindings) -> list:
  return [f"--gin.{k}={v}" for k, v in bindings.items()]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(tmp_path, name, processes, devices, command, args, env=None):
  """Runs `processes` workers; returns [(returncode, stdout, stderr)].

  Every worker still running after GROUP_TIMEOUT_S, or when this function
  fails, is killed.
  """
  port = _free_port()
  environ = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
  environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={devices}")
  procs, files = [], []
  try:
    for i in range(processes):
      out = open(tmp_path / f"{name}.{i}.out", "w+")
      err = open(tmp_path / f"{name}.{i}.err", "w+")
      files += [out, err]
      procs.append(
          subprocess.Popen([
              sys.executable,
              str(WORKER), command, *args, "--multiprocess_gpu",
              f"--coordinator_address=127.0.0.1:{port}",
              f"--process_count={processes}", f"--process_index={i}",
              f"--coordination_timeout_s={COORDINATION_TIMEOUT_S}"
          ], cwd=REPO, env=environ, stdout=out, stderr=err))
    deadline = time.monotonic() + GROUP_TIMEOUT_S
    for proc in procs:
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    results = []
    for i, proc in enumerate(procs):
      files[2 * i].seek(0)
      files[2 * i + 1].seek(0)
      results.append(
          (proc.returncode, files[2 * i].read(), files[2 * i + 1].read()))
    return results
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    for f in files:
      f.close()


def _failed(results) -> str:
  return "\n".join(f"--- process {i}: rc {rc}\n{err[-4000:]}"
                   for i, (rc, _, err) in enumerate(results))


def _rows(folder) -> list:
  return [
      json.loads(line)
      for line in (pathlib.Path(folder) /
                   "predictions.jsonl").read_text().splitlines()
  ]


# ---------------------------------------------------------------------------
# Which examples and rows a process holds (no processes needed).
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("num_shards,batch_size,num_examples", [(1, 3, 7),
                                                                (2, 2, 7),
                                                                (2, 4, 7),
                                                                (4, 4, 2),
                                                                (2, 2, 1)])
def test_layout_covers_every_example_once_in_order(num_shards, batch_size,
                                                   num_examples):
  layouts = [
      multihost.DataLayout(g, num_shards, batch_size) for g in range(num_shards)
  ]
  layout = layouts[0]
  k = layout.rows_per_shard
  kept = []
  for b in range(layout.num_batches(num_examples)):
    fed, real = layout.fed_examples(b, num_examples)
    for g in range(num_shards):  # a shard feeds only examples it read
      mine = set(range(g, num_examples, num_shards))
      block = fed[g * k:(g + 1) * k]
      assert all(e in mine or (e == -1 and not mine) for e in block)
    kept += list(fed[layout.kept_rows(b, num_examples)])
    assert real.sum() == len(layout.kept_rows(b, num_examples))
  assert kept == list(range(num_examples))
  # One host: batch b is examples b*B.., the last row repeated (as before).
  if num_shards == 1:
    fed, real = layout.fed_examples(2, 7)
    assert fed.tolist() == [6, 6, 6] and real.tolist() == [True, False, False]


def test_local_files_are_sliced_by_stride(tmp_path):
  data = _data(tmp_path)
  whole = tasks.load_examples(source_file=data, num_examples=5)
  parts = [
      tasks.load_examples(source_file=data, num_examples=5,
                          shard_info=multihost.ShardInfo(g, 2))
      for g in range(2)
  ]
  assert parts[0] == whole[0::2] and parts[1] == whole[1::2]


def test_one_process_layout_and_bad_flags():
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax.multihost import partitioning  # pylint: disable=g-import-not-at-top
  mesh = partitioning.make_mesh(1, 1)
  layout = multihost.data_layout(partitioning.data_sharding(mesh, 3), 3)
  assert layout == multihost.DataLayout(0, 1, 3)
  assert multihost.allgather("x", 5) == [5] and multihost.is_first()
  assert multihost.run_on_first("y", lambda: 7) == 7
  assert multihost.slowest(1.0, 2.0) == (1.0, 2.0)
  with pytest.raises(ValueError, match="missing: --process_count, "
                     "--process_index"):
    multihost.initialize(multiprocess_gpu=True,
                         coordinator_address="127.0.0.1:1")
  with pytest.raises(ValueError, match="--process_index=2 with "
                     "--process_count=2"):
    multihost.initialize(multiprocess_gpu=True, coordinator_address="a:1",
                         process_count=2, process_index=2)
  with pytest.raises(ValueError, match="--coordination_timeout_s=0"):
    multihost.initialize(timeout_s=0)
  # Issue 37: T5X ignores these without --multiprocess_gpu, and N such
  # processes ran as N independent runs.
  with pytest.raises(
      ValueError, match="--coordinator_address=a:1, "
      "--process_count=2, --process_index=1 without "
      "--multiprocess_gpu"):
    multihost.initialize(coordinator_address="a:1", process_count=2,
                         process_index=1)
  with pytest.raises(ValueError, match="--process_index=0 without"):
    multihost.initialize(process_index=0)
  assert not jax.distributed.is_initialized()


def test_a_pilot_pads_its_batches_to_one_width():
  """`Feeder.common_width` / `batch(b, width)`: a pilot's
  batches at one width (one compile), 0-padded; a width below a batch's
  own is refused."""
  from specdec_jax.multihost import partitioning  # pylint: disable=g-import-not-at-top
  sharding = partitioning.data_sharding(partitioning.make_mesh(1, 1), 1)
  layout = multihost.data_layout(sharding, 1)
  inputs = np.zeros((3, 48), np.int32)
  for row, n in enumerate([5, 20, 3]):
    inputs[row, :n] = 7
  shared = multihost.share_examples(layout, [{}] * 3, inputs,
                                    np.array([5, 20, 3]))
  feed = multihost.Feeder(layout, inputs, shared, sharding, 16)
  assert [feed.batch_width(b) for b in range(3)] == [16, 32, 16]
  # The most common (a tie: the narrower).
  assert feed.common_width(3) == feed.common_width(2) == 16
  assert feed.common_width(1) == 16 and feed.common_width(9) == 16
  padded = np.asarray(feed.batch(2, 32))
  assert padded.shape == (1, 32) and padded[0, :3].tolist() == [7] * 3
  assert not padded[0, 3:].any()
  assert np.asarray(feed.batch(2)).shape == (1, 16)
  with pytest.raises(ValueError, match="width=16 must be in \\[32, 48\\]"):
    feed.batch(1, 16)


# ---------------------------------------------------------------------------
# Several processes.
# ---------------------------------------------------------------------------
def test_two_hosts_mesh_2x2_equal_one_host(tmp_path, monkeypatch,
                                           model_bindings):
  """MESH_SHAPE=(2, 2) over 2 processes x 2 devices: each process reads and
  feeds its rows; the predictions are the one-process run's, token for
  token (greedy), and the counts agree."""
  data = _data(tmp_path)
  bindings = {**model_bindings, "SOURCE_FILE": repr(data), "BATCH_SIZE": "2"}
  one = tmp_path / "one"
  gin_bindings = [f"{k} = {v}" for k, v in bindings.items()]
  gin_utils.parse_gin(["local_tiny.gin"],
                      gin_bindings + [f"OUTPUT_DIR = '{one}'"], finalize=False)
  reference = run_lib.run(providers=Providers(
      vocabulary=multihost_worker.CharVocabulary))

  two = tmp_path / "two"
  results = _launch(tmp_path, "two", 2, 2, "run", [
      "--gin_file=local_tiny.gin", *_flags(bindings), "--gin.MESH_SHAPE=(2, 2)",
      f"--gin.OUTPUT_DIR='{two}'"
  ])
  assert all(rc == 0 for rc, _, _ in results), _failed(results)
  assert "greedy outputs identical to the target's on 7/7" in results[0][1]
  # Process 0 alone reports (and writes).
  assert "speculative decoding:" not in results[1][1]
  metrics = json.loads((two / "metrics.json").read_text())
  assert metrics["num_devices"] == 4 and reference["num_devices"] == 1
  for key in ("num_examples", "tokens_generated", "tokens_generated_baseline",
              "target_calls_baseline", "target_calls_speculative",
              "accepted_histogram", "alpha", "greedy_identical_examples",
              "inputs_truncated", "longest_input_tokens"):
    assert metrics[key] == reference[key], key
  assert metrics["greedy_outputs_identical"] is True
  rows, expected = _rows(two), _rows(one)
  assert [r["inputs"]["inputs_pretokenized"] for r in rows
         ] == [line.split("\t")[0] for line in DATA]
  assert rows == expected


def test_four_hosts_sweep_agree_on_finished_points(tmp_path, model_bindings):
  """4 processes x 1 device (MESH_SHAPE=(4, 1)): a sweep where processes
  1-3 believe no point is finished still runs exactly the points process 0
  chose."""
  data = _data(tmp_path)
  results_dir = tmp_path / "results"
  # MODE='alpha': fewer programs to compile in each of the 4 processes.
  bindings = {
      **model_bindings, "SOURCE_FILE": repr(data),
      "BATCH_SIZE": "4",
      "MESH_SHAPE": "(4, 1)",
      "MODE": "'alpha'"
  }
  flags = ["--gin_file=local_tiny.gin", *_flags(bindings)]
  points = sweep.parse_sweep_args(["NUM_EXAMPLES=6,7"])
  done, todo = (sweep.point_name(p) for p in points)
  # A sweep's results dir in which the first point is finished.
  (results_dir / done).mkdir(parents=True)
  (results_dir / done / "metrics.json").write_text('{"finished": "before"}')
  (results_dir / sweep.SWEEP_FILE).write_text(
      json.dumps({
          "gin_files": ["local_tiny.gin"],
          "gin_bindings": [f"{k}={v}" for k, v in bindings.items()]
      }))

  results = _launch(
      tmp_path, "four", 4, 1, "sweep",
      [*flags, "--sweep=NUM_EXAMPLES=6,7", f"--results_dir={results_dir}"],
      env={"SPECDEC_TEST_FORGETFUL": "1"})
  assert all(rc == 0 for rc, _, _ in results), _failed(results)
  assert "Sweep finished: 2 points" in results[0][1]
  assert (results_dir / done /
          "metrics.json").read_text() == ('{"finished": "before"}')
  alpha = json.loads((results_dir / todo / "alpha.json").read_text())
  assert alpha["num_examples"] == 7
  # Greedy target outputs: every generated position once (at least one
  # token per example, at most TASK_FEATURE_LENGTHS['targets']).
  assert 7 <= alpha["num_positions"] <= 7 * 8
  assert 0 <= alpha["alpha_beta"] <= 1


def test_a_failing_host_fails_every_host_with_its_error(tmp_path):
  """Process 1 raises instead of decoding, while process 0 decodes and waits
  in the decoder's collectives: both exit non-zero promptly, process 0
  naming process 1's error, and nothing is written. (Random weights: the
  multi-process random init is exercised here.)"""
  bindings = {
      **BINDINGS, "SOURCE_FILE": repr(_data(tmp_path)),
      "BATCH_SIZE": "2",
      "MESH_SHAPE": "(2, 1)"
  }
  out = tmp_path / "out"
  start = time.monotonic()
  results = _launch(tmp_path, "fail", 2, 1, "run", [
      "--gin_file=local_tiny.gin", *_flags(bindings),
      f"--gin.OUTPUT_DIR='{out}'"
  ], env={"SPECDEC_TEST_FAIL": "1"})
  assert time.monotonic() - start < COORDINATION_TIMEOUT_S  # no timeout
  (rc0, _, err0), (rc1, _, err1) = results
  assert rc0 == 1 and rc1 == 1, _failed(results)
  assert "RuntimeError: injected failure in process 1" in err1
  assert ("run: error: process 1: RuntimeError: injected failure in "
          "process 1") in err0
  assert not (out / "metrics.json").exists()


def test_two_hosts_infer_interrupted_resumes_with_one_hosts_rows(
    tmp_path, model_bindings):
  """MODE='infer' on 2 processes (MESH_SHAPE=(2, 2)) interrupted on every
  host at its 3rd batch (a preempted slice) resumes after the 2 batches
  process 0 checkpointed; the rows are the one-process run's (greedy)."""
  bindings = {
      **model_bindings, "SOURCE_FILE": repr(_data(tmp_path)),
      "BATCH_SIZE": "2",
      "MODE": "'infer'"
  }
  one = tmp_path / "one"
  gin_utils.parse_gin(["local_tiny.gin"],
                      [f"{k} = {v}" for k, v in bindings.items()] +
                      [f"OUTPUT_DIR = '{one}'"], finalize=False)
  reference = run_lib.run(providers=Providers(
      vocabulary=multihost_worker.CharVocabulary))
  two = tmp_path / "two"
  flags = [
      "--gin_file=local_tiny.gin", *_flags(bindings), "--gin.MESH_SHAPE=(2, 2)",
      f"--gin.OUTPUT_DIR='{two}'"
  ]
  stopped = _launch(tmp_path, "stopped", 2, 2, "run", flags,
                    env={"SPECDEC_TEST_STOP_AT": "3"})
  assert all(rc == 130 for rc, _, _ in stopped), _failed(stopped)
  lines = [l for l in stopped[0][2].splitlines() if l.startswith("run: ")]
  assert len(lines) == 1 and "Traceback" not in stopped[0][2], _failed(stopped)
  assert lines[0].startswith("run: interrupted: kept 4 predictions rows in ")
  assert lines[0].endswith("the same command resumes after them.")
  resumed = _launch(tmp_path, "resumed", 2, 2, "run", flags)
  assert all(rc == 0 for rc, _, _ in resumed), _failed(resumed)
  assert ("resuming an interrupted run after 4 of 7 examples (2 batches"
          in resumed[0][2])
  assert _rows(two) == _rows(one)
  written = json.loads((two / "infer.json").read_text())
  assert written["resumed_after_examples"] == 4
  for key in ("num_examples", "tokens_generated", "target_calls", "alpha"):
    assert written[key] == reference[key], key
