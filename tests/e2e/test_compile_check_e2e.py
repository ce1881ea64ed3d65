"""COMPILE_TOPOLOGY end to end: local_tiny.gin's programs compiled for a
TPU v4-8 with no TPU (needs libtpu, `pip install -e '.[tpu]'`; skips
without it): the parameter bytes per device, one read of each weight per
step, no CPU-only part, the shared-encoder draft and the beam programs; and
the command line's refusal of an unknown topology.
"""
import math

import jax
import numpy as np
import pytest

from specdec_jax.core import kernels
from specdec_jax.core.models import param_shapes
from specdec_jax.experiment import compile_report
from specdec_jax.multihost import partitioning

from run_helpers import compile_tiny
from run_helpers import run_cli

pytestmark = pytest.mark.slow


def test_cli_bad_topology_exits_2_and_writes_nothing(tmp_path):
  out = tmp_path / "out"
  proc = run_cli("--gin_file=local_tiny.gin", "--gin.COMPILE_TOPOLOGY='v4-9'",
                 f"--gin.OUTPUT_DIR='{out}'")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "run: error: COMPILE_TOPOLOGY='v4-9': unknown TPU topology" in (
      proc.stderr)
  assert not out.exists()


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


@pytest.fixture(scope="module")
def tiny_v4(tmp_path_factory):
  """local_tiny.gin compiled for v4-8 at MESH_SHAPE=(1, 4): compile.json."""
  return compile_tiny(tmp_path_factory.mktemp("compile"))


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


def test_shared_encoder_draft_compiles_and_reads_its_own_weights_once(tmp_path):
  # DRAFTER='shared_encoder': a draft decoder without an encoder, reading
  # the target's encoder output (local_tiny's target: emb_dim 64).
  record, (target, draft) = compile_tiny(tmp_path, [
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


def test_beam_programs_compile_for_v4(tmp_path):
  """DECODE='beam': the target's beam search and speculative beam search
  are the two programs, and the calls are at the rows they make."""
  k, u, rows, gamma = 2, 4, 6, 2
  record, _ = compile_tiny(tmp_path, [
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
