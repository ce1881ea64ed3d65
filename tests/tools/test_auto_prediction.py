"""`tools.benchmarks.auto_prediction`: SPECULATION='auto''s predicted
speedup beside the measured one (its pieces; no run)."""
import pytest

from tools.benchmarks import auto_prediction


def test_the_prediction_script_reads_its_configs_and_fixes_a_candidate():
  script = auto_prediction
  assert script.parse_config("local_tiny.gin GAMMA='auto' TEMPERATURE=1.0") == (
      ["local_tiny.gin"], ["GAMMA='auto'", "TEMPERATURE=1.0"])
  tree = {"mode": "tree", "gamma": 4, "tree_width": 2}
  assert script.fixed_bindings(tree) == [
      "SPECULATION = 'on'", "GAMMA = 4", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"
  ]
  assert script.fixed_bindings({
      "mode": "beam",
      "gamma": 3,
      "tree_width": None
  }) == ["SPECULATION = 'on'", "GAMMA = 3"]
  row = {
      "label": "token γ=3",
      "predicted_speedup": 1.2,
      "alpha": 0.6,
      "call_cost": 1.2
  }
  line = script.compare("x.gin", row, {"speedup": 1.0, "alpha": 0.5}, True)
  assert line["error"] == pytest.approx(0.2)
  assert "| x.gin | token γ=3 | yes | 1.20 | 1.00 | +20% |" in script.table(
      [line])


def test_a_run_that_switched_is_measured_on_its_first_choice():
  row = {"label": "token γ=3", "predicted_speedup": 1.5}
  metrics = {
      "speedup": 1.0,
      "auto": {
          "switches": [{
              "batch": 4
          }],
          "segments": [{
              "measured_speedup": 1.5
          }, {
              "measured_speedup": 0.9
          }]
      }
  }
  line = auto_prediction.compare("x.gin", row, metrics, True)
  assert line["measured_speedup"] == 1.5 and line["error"] == 0.0
  metrics["auto"]["switches"] = []
  assert auto_prediction.compare("x.gin", row, metrics,
                                 True)["measured_speedup"] == 1.0
