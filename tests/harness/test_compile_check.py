"""COMPILE_TOPOLOGY: the run's programs compiled for a Cloud TPU, no TPU.

The compiling tests need libtpu (`pip install -e '.[tpu]'`; CI installs
it) and skip without it; everything else here runs anywhere (the
end-to-end compiles: tests/e2e/test_compile_check_e2e.py). The suite
runs with JAX_PLATFORMS=cpu (conftest), under which libtpu's topology API
still works: the host stays a CPU, the programs are compiled for TPU v4.
"""
import re

import pytest

from specdec_jax.config import flag_utils
from specdec_jax.metrics import analysis
from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_report
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry

from run_helpers import compile_tiny


def test_cloud_and_raw_topology_names():
  for name, raw, chips in (("v4-8", "v4:2x2x1", 4), ("v4-32", "v4:2x2x4", 16),
                           ("v5e-8", "v5e:2x4", 8), ("v5p-8", "v5p:2x2x1", 4),
                           ("v4:2x2x2", "v4:2x2x2", 8), ("v5e:4x4", "v5e:4x4",
                                                         16)):
    topology = compile_report.resolve(name)
    assert (topology.topology_name, topology.num_chips) == (raw, chips)
  assert compile_report.resolve("v5p-8").chip.hbm_bytes == 95 * 2**30


@pytest.mark.parametrize(
    "bad", ["v4-7", "v9-8", "v4:2x2", "v5e:2x2x1", "tpu", 8, None, "v4:0x2x1"])
def test_bad_topology_names_list_what_is_allowed(bad):
  with pytest.raises(ValueError) as e:
    compile_report.resolve(bad)
  message = str(e.value)
  assert f"COMPILE_TOPOLOGY={bad!r}" in message
  assert "v4-8" in message and "v5e-8" in message and "v4:2x2x1" in message


def test_settings_compile_mode_cannot_honour_are_refused():
  base = dict(output_dir="/tmp/unused", gamma=3)
  for fields, words in (({
      "mesh_shape": (1, 8)
  }, "MESH_SHAPE=(1, 8) needs 8 chips"), ({
      "drafting": drafter_registry.DRAFTERS["bigram"],
      "ngram_corpus": __file__
  }, "DRAFTER='bigram' with COMPILE_TOPOLOGY: allowed: 'model', "
                                          "'shared_encoder'"), ({
                                              "gamma": "auto"
                                          }, "GAMMA='auto'")):
    args = arguments.RunArguments(**{**base, **fields})
    with pytest.raises(flag_utils.ConfigError, match=re.escape(words)):
      compile_report.check_compile_settings(args, "v4-8")


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
  chip = compile_report.CHIPS["v4"]
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


def test_the_tree_call_compiles_and_reads_each_weight_once(tmp_path):
  """ACCEPTANCE='tree': the tree call over 1 + k·γ nodes (tree mask) reads
  every target weight once, like a step; the tree loop is compiled."""
  record, _ = compile_tiny(
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
      flag_utils.ConfigError,
      match=re.escape("TREE_WIDTH='auto' with COMPILE_TOPOLOGY")):
    arguments.RunArguments(output_dir="/tmp/unused", gamma=3,
                           decode_mode=decode_modes.TreeMode(width="auto"),
                           compile_topology="v4-8")


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
