"""`run` end to end with DRAFTER='feature' (the feature-level draft; bad
settings, its pricing for real and sweeps:
tests/harness/test_run_feature_drafter.py).

* One run at T = 0 loads the draft from its checkpoint against the loaded
  target, hands the speculative decoder `target.with_features()` and the
  baseline the plain target, writes predictions identical to the baseline
  on every example, and records the drafter, its config, α and c (priced
  through `propose` with the target's features); a run at T = 1 with
  GAMMA='auto' works too.
* ACCEPTANCE='tree': the draft's top-k branches, with the features target
  in the tree decoder only; greedy predictions identical; the tree call and
  the branches priced with the target's features.
"""
import json

import pytest

from specdec_jax import run as run_lib
from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.experiment import price_cache
from specdec_jax.metrics import step_costs
from specdec_jax.experiment.plan import PilotSizes
from specdec_jax.experiment.plan import Providers

from feature_helpers import WIDTH
from feature_helpers import write_feature_checkpoint
from run_helpers import parse_local_tiny
from run_helpers import stand_in_seconds

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return write_feature_checkpoint(tmp_path_factory.mktemp("feature"))


SMALL = [
    "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
    "target/T5Config.num_encoder_layers = 1",
    "target/T5Config.num_decoder_layers = 1"
]


def _spy_decoders(monkeypatch):
  """Which targets the two decoders were built with (keep_features)."""
  used = {"baseline": [], "speculative": [], "tree": []}
  for name in used:
    original = getattr(decoding, f"{name}_decoder")

    def spy(target, *args, _original=original, _name=name, **kwargs):
      used[_name].append(target.keep_features)
      return _original(target, *args, **kwargs)

    monkeypatch.setattr(decoding, f"{name}_decoder", spy)
  return used


def _stand_in_timing():
  """Stand-in seconds (timing is tested elsewhere), as `Providers.pricing`;
  records the calls. Returns (the pricing, the calls priced)."""
  priced = []

  def call_seconds(calls, *args, **kwargs):
    priced.append(dict(calls))
    return stand_in_seconds(calls)

  return step_costs.Pricing(call_seconds), priced


def test_feature_run_is_exact_and_recorded(tmp_path, checkpoint, monkeypatch):
  used = _spy_decoders(monkeypatch)
  pricing, priced = _stand_in_timing()
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "DRAFTER = 'feature'",
      f"DRAFT_CHECKPOINT_PATH = '{checkpoint}'", "DRAFT_NAME = 'feature_tiny'",
      "GAMMA = 3", "NUM_EXAMPLES = 3", *SMALL
  ])
  metrics = run_lib.run(providers=Providers(pricing=pricing))
  # The speculative loop runs the target keeping its features; the
  # baseline the plain target.
  assert used == {"baseline": [False], "speculative": [True], "tree": []}
  rows = [json.loads(line) for line in (out / "predictions.jsonl").open()]
  assert len(rows) == 3
  for row in rows:
    assert row["prediction"] == row["aux"]["baseline"], row
  assert metrics["greedy_outputs_identical"] is True
  assert metrics["greedy_identical_examples"] == 3
  written = json.loads((out / "metrics.json").read_text())
  assert written["drafter"] == "feature"
  assert written["draft_model"] == "feature_tiny"
  assert written["drafter_settings"]["drafter"] == "feature"
  assert 0.0 <= written["alpha"] <= 1.0 and written["exact"] is True
  # The draft's own config, not the gin draft/T5Config, is recorded.
  assert written["settings"]["draft"]["feature_dim"] == WIDTH
  assert written["settings"]["draft"]["head_size"] == 100
  assert written["settings"]["run"]["draft_checkpoint_path"] == checkpoint
  # c: one propose of γ = 3 guesses (stand-in 1.3 ms) per guess over a
  # target step (1.1 ms); the propose handed the target's features.
  assert written["cost_coefficient_c"] == pytest.approx(1.3 / 3 / 1.1)
  (calls,) = priced
  assert calls[1][0].keep_features is False  # a baseline step
  assert calls[4][0].keep_features is True  # the loop's verification
  proposer = calls["draft"][0]
  assert isinstance(proposer.drafter, step_costs.FeaturesGiven)
  assert isinstance(proposer.drafter.drafter, drafters.FeatureDrafter)


def test_feature_run_at_temperature_one(tmp_path, checkpoint, monkeypatch):
  """With GAMMA='auto' too: the pilot prices the feature draft the same way
  (a pilot γ of 1 and α ≈ 0: one program for pilot and run)."""
  monkeypatch.setenv(price_cache.ENV_OFF, "0")  # priced now, not read
  pricing, priced = _stand_in_timing()
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "DRAFTER = 'feature'",
      f"DRAFT_CHECKPOINT_PATH = '{checkpoint}'", "GAMMA = 'auto'",
      "TEMPERATURE = 1.0", "NUM_EXAMPLES = 2", *SMALL
  ])
  metrics = run_lib.run(
      providers=Providers(pricing=pricing, pilot_sizes=PilotSizes(
          gamma_pilot=1)))
  assert metrics["greedy_outputs_identical"] is None
  written = json.loads((out / "metrics.json").read_text())
  assert written["drafter"] == "feature" and written["temperature"] == 1.0
  assert written["gamma"] == written["gamma_auto"]["chosen_gamma"]
  pilot = priced[0]  # the pilot's calls: K = 1 plain, the rest keeping
  assert pilot[1][0].keep_features is False
  assert all(pilot[k][0].keep_features for k in pilot if k not in (1, "draft"))
  assert isinstance(pilot["draft"][0].drafter, step_costs.FeaturesGiven)
  assert 0.0 <= written["alpha"] <= 1.0 and written["exact"] is True
  assert len((out / "predictions.jsonl").read_text().splitlines()) == 2


def test_feature_tree_run(tmp_path, checkpoint, monkeypatch):
  used = _spy_decoders(monkeypatch)
  pricing, priced = _stand_in_timing()
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "DRAFTER = 'feature'",
      f"DRAFT_CHECKPOINT_PATH = '{checkpoint}'", "ACCEPTANCE = 'tree'",
      "TREE_WIDTH = 2", "GAMMA = 2", "NUM_EXAMPLES = 2", *SMALL
  ])
  metrics = run_lib.run(providers=Providers(pricing=pricing))
  assert used == {"baseline": [False], "speculative": [], "tree": [True]}
  assert metrics["greedy_outputs_identical"] is True
  written = json.loads((out / "metrics.json").read_text())
  assert written["drafter"] == "feature" and written["acceptance"] == "tree"
  assert written["tree_width"] == 2 and written["exact"] is True
  (calls,) = priced
  assert calls["step"][0].keep_features is False
  assert calls["tree"][0].target.keep_features is True
  given = calls["draft"][0].drafter.drafter
  assert isinstance(given, step_costs.FeaturesGiven)
  assert isinstance(given.drafter, drafters.FeatureTreeDrafter)
