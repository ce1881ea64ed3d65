"""The run and sweep commands end to end with tree verification
(ACCEPTANCE='tree'; bad settings and the pricing of the tree's calls:
tests/harness/test_run_tree.py): a tiny run stays exact (greedy: the
target's tokens) and records the tree's settings and counts, with the
shared-encoder drafter too; a sampled run says what it cannot compare; a
sweep over TREE_WIDTH runs; GAMMA='auto' with TREE_WIDTH='auto' runs the
pilots, records the chosen (γ, k) in metrics.json and decodes with them.
"""
import dataclasses
import json

import gin
import numpy as np
import pytest

from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto as auto_lib
from specdec_jax.experiment import price_cache
from specdec_jax.metrics import step_costs
from specdec_jax.experiment import summary
from specdec_jax.experiment.plan import PilotSizes
from specdec_jax.experiment.plan import Providers

from run_helpers import parse_local_tiny
from run_helpers import stand_in_seconds

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]

# A tiny, fast run: two examples of at most 6 tokens, one-layer target.
SMALL = [
    "GAMMA = 2", "NUM_EXAMPLES = 2",
    "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 6}",
    "target/T5Config.num_encoder_layers = 1",
    "target/T5Config.num_decoder_layers = 1"
]

STAND_IN = Providers(pricing=step_costs.Pricing(stand_in_seconds))


def test_tree_verification_end_to_end(tmp_path):
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2", *SMALL
  ])
  metrics = run_lib.run(providers=STAND_IN)
  assert metrics["greedy_outputs_identical"] is True
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert "draft tiny tree k=2" in lines[0]
  # The tree's own cost model, named as outputs.md names it (issue 58).
  model = metrics["theoretical_speedup_measured_call_cost"]
  assert (f"the tree's cost model at the measured call cost {model:.2f}x)"
          in lines[1])
  written = json.loads((out / "metrics.json").read_text())
  assert written["acceptance"] == "tree" and written["exact"] is True
  assert written["tree_width"] == 2
  assert written["tree_without_replacement"] is True
  assert written["draft_model"].endswith(" tree k=2")
  run_settings = written["settings"]["run"]
  assert run_settings["acceptance"] == "tree"
  assert run_settings["tree_width"] == 2
  assert written["alpha_beta"] is None
  assert written["per_iteration_gamma"] is None
  assert written["guesses_per_target_call"] == 4.0
  # The tree call over 1 + 2·2 = 5 nodes at the stand-in's 1 + 5/10 ms.
  assert written["verification_cost_ratio"] == pytest.approx(1.5 / 1.1)
  assert written["cost_coefficient_c"] == pytest.approx(1.2 / 2 / 1.1)
  c, ratio = written["cost_coefficient_c"], written["verification_cost_ratio"]
  assert written["theoretical_speedup_measured_call_cost"] == pytest.approx(
      written["tokens_per_target_call"] / (2 * c + ratio))
  # Its efficiency's factors multiply to it too (no Equation (1): the
  # model reads the measured tokens per call).
  split = written["efficiency_split"]
  assert set(split) == {"output_lengths", "batch", "time"}
  assert "theory_tokens_per_call" not in written
  assert np.prod(list(split.values())) == pytest.approx(
      written["speedup"] / written["theoretical_speedup_measured_call_cost"],
      rel=1e-9)
  rows = [
      json.loads(line)
      for line in (out / "predictions.jsonl").read_text().splitlines()
  ]
  counts = [n for r in rows for n in r["aux"]["accepted_counts"]]
  assert len(counts) == written["target_calls_speculative"]
  assert np.bincount(counts,
                     minlength=3).tolist() == written["accepted_histogram"]
  assert all(r["aux"]["trace"] is None for r in rows)
  kept = sum(counts)
  trials = sum(min(n + 1, 2) for n in counts)
  assert written["alpha"] == pytest.approx(kept / trials)


def test_a_sweep_over_tree_width(tmp_path):
  points = sweep.parse_sweep_args(["TREE_WIDTH=1,2"])
  results = tmp_path / "sweep"
  sweep.run_sweep(points, str(results), ["local_tiny.gin"],
                  ["ACCEPTANCE = 'tree'", *SMALL], providers=STAND_IN)
  written = sorted(
      (json.loads(p.read_text()) for p in results.glob("*/metrics.json")),
      key=lambda m: m["tree_width"])
  assert [m["tree_width"] for m in written] == [1, 2]
  assert all(m["greedy_outputs_identical"] for m in written)
  assert [m["draft_model"][-len(" tree k=1"):] for m in written
         ] == [" tree k=1", " tree k=2"]
  gin.clear_config()


def test_tree_verification_with_the_shared_encoder_drafter(tmp_path):
  """DRAFTER='shared_encoder': the k branches' draft decoder reads the
  target's encoder output (`tree_loop` starts it from it) and stays exact."""
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2",
      "DRAFTER = 'shared_encoder'", "draft/T5Config.num_encoder_layers = 0",
      "draft/T5Config.encoder_width = 64", *SMALL
  ])
  metrics = run_lib.run(providers=STAND_IN)
  assert metrics["greedy_outputs_identical"] is True
  assert metrics["drafter"] == "shared_encoder"
  assert metrics["tree_width"] == 2


def test_a_sampled_tree_run(tmp_path):
  """T > 0: no token-for-token comparison, no β; the summary says so."""
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2",
      "TREE_WITHOUT_REPLACEMENT = False", "TEMPERATURE = 1.0", *SMALL
  ])
  metrics = run_lib.run(providers=STAND_IN)
  assert metrics["greedy_outputs_identical"] is None
  assert metrics["alpha_beta"] is None
  assert metrics["tree_without_replacement"] is False
  written = json.loads((out / "metrics.json").read_text())
  assert written["settings"]["run"]["tree_without_replacement"] is False
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert "outputs are samples (T=1)" in lines[1]
  assert "chi-square tests in tests/core/test_tree_acceptance.py" in lines[1]
  assert "Σ min(p, q)" not in lines[1]


def test_auto_gamma_and_tree_width_end_to_end(tmp_path, monkeypatch):
  """GAMMA='auto', TREE_WIDTH='auto': one pilot with the widest k (a_1 of
  every k from its first rounds, k = 1's the lowest), the calls priced
  (stand-in seconds), the (γ, k) of the best predicted speedup recorded and
  decoded with, exactly."""
  monkeypatch.setenv(price_cache.ENV_OFF, "0")  # stand-in prices: not kept
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", *SMALL, "GAMMA = 'auto'",
      "TREE_WIDTH = 'auto'"
  ])
  metrics = run_lib.run(providers=dataclasses.replace(
      STAND_IN, pilot_sizes=PilotSizes(gamma_pilot=2, gamma_max=3,
                                       tree_max_width=2)))
  assert metrics["greedy_outputs_identical"] is True
  written = json.loads((out / "metrics.json").read_text())
  auto = written["gamma_auto"]
  assert auto["pilot_gamma"] == 2 and auto["pilot_tree_widths"] == [1, 2]
  assert written["gamma"] == auto["chosen_gamma"]
  assert written["tree_width"] == auto["chosen_tree_width"]
  assert written["settings"]["run"]["tree_width"] == "auto"
  predicted = auto["predicted_speedup"]
  assert len(predicted) == 3 * 2
  best = max(predicted, key=predicted.get)
  by_width = auto["acceptance_by_tree_width"]
  assert by_width["1"]["first_depth"] <= by_width["2"]["first_depth"]
  assert by_width["1"]["deeper_depths"] == by_width["2"]["deeper_depths"]
  rates = by_width[str(auto["chosen_tree_width"])]
  # E(γ, k), each pilot output's last call cut at its end: at most E.
  assert 1.0 <= auto["predicted_tokens_per_call"] <= (
      auto_lib.expected_tree_tokens(
          rates["first_depth"], rates["deeper_depths"], auto["chosen_gamma"]) +
      1e-9)
  assert best == (f"gamma={auto['chosen_gamma']},"
                  f"k={auto['chosen_tree_width']}")
  # The pilot was timed: its calibration (an overhead >= 0 a call) is in
  # every prediction, the choice's at most its model's.
  calibration = auto["calibration"]
  assert (calibration["pilot"], calibration["gamma"],
          calibration["tree_width"]) == ("tree", 2, 2)
  assert calibration["measured_speedup"] > 0
  assert calibration["overhead_steps"] >= 0
  assert auto["chosen_predicted_speedup"] == pytest.approx(predicted[best])
  assert auto["chosen_predicted_speedup"] <= auto["chosen_model_speedup"]
  assert written["draft_model"].endswith(
      f" auto-(γ,k) tree k={auto['chosen_tree_width']}")
  # The stand-in's tree call over N nodes: (1 + N/10) / 1.1 steps.
  costs = auto["tree_call_cost_by_nodes"]
  assert costs[4] == pytest.approx(1.5 / 1.1)
  # Each γ's rows waiting, replayed from the pilot's rows: none at batch 1.
  assert auto["batch_factor_by_gamma"] == [1.0] * 3
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  line = next(
      l for l in lines
      if f"γ={auto['chosen_gamma']}, k={auto['chosen_tree_width']}" in l)
  assert (f"predicted {auto['chosen_predicted_speedup']:.2f}× (the pilot ran "
          f"{calibration['measured_speedup']:.2f}×") in line
