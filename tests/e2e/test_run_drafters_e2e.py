"""The run command end to end with the drafters beyond the paper (bad
settings and the sweep's points: tests/harness/test_run_drafters.py): a
bigram drafter with adaptive γ and GAMMA='auto' records the new metrics
and stays exact; ACCEPTANCE='block' reaches the loop; DRAFTER=
'shared_encoder' reads the target's encoder output, and MODE='alpha'
measures it.
"""
import json

import gin
import pytest

from specdec_jax.core import drafters
from specdec_jax import run as run_lib
from specdec_jax.metrics import step_costs
from specdec_jax.experiment import arguments
from specdec_jax.experiment import price_cache
from specdec_jax.experiment import runner
from specdec_jax.experiment import summary
from specdec_jax.experiment.plan import PilotSizes
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.experiment.plan import make_decoders
from specdec_jax.core.models import SharedEncoderModel

from run_helpers import parse_local_tiny
from run_helpers import stand_in_seconds

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


@pytest.fixture
def corpus(tmp_path):
  path = tmp_path / "corpus.de"
  path.write_text("Das Haus ist klein.\nDer Hund läuft im Park.\n")
  return path


STAND_IN = step_costs.Pricing(stand_in_seconds)


def test_bigram_adaptive_auto_gamma_end_to_end(tmp_path, corpus, monkeypatch):
  # Few compilations: timings are stand-ins (run's timing is tested
  # elsewhere), and the pilot's γ is the one chosen for α ≈ 0 (random
  # weights), so pilot and run share one program; a one-layer target
  # compiles faster (nothing here depends on its size).
  monkeypatch.setenv(price_cache.ENV_OFF, "0")  # stand-in prices: not kept
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "DRAFTER = 'bigram'",
      f"NGRAM_CORPUS = '{corpus}'", "GAMMA = 'auto'",
      "ADAPTIVE_THRESHOLD = 0.05", "NUM_EXAMPLES = 2",
      "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
      "target/T5Config.num_encoder_layers = 1",
      "target/T5Config.num_decoder_layers = 1"
  ])
  metrics = run_lib.run(
      providers=Providers(pricing=STAND_IN, pilot_sizes=PilotSizes(
          gamma_pilot=1)))
  assert metrics["greedy_outputs_identical"] is True
  written = json.loads((out / "metrics.json").read_text())
  assert written["drafter"] == "bigram"
  assert written["draft_model"] == "bigram adaptive 0.05 auto-γ"
  assert written["exact"] is True and written["lenience"] == 1.0
  assert written["settings"]["run"]["gamma"] == "auto"
  auto = written["gamma_auto"]
  assert written["gamma"] == auto["chosen_gamma"] == 1  # α ≈ 0
  # The stand-in prices a propose of γ guesses at 1 + γ/10 ms: the pilot
  # times γ = 12 (AUTO_GAMMA_CALL_KS), the run its chosen γ = 1.
  assert auto["cost_coefficient_c"] == pytest.approx((1 + 1.2) / 12 / 1.1)
  assert written["cost_coefficient_c"] == pytest.approx(1.1 / 1 / 1.1)
  # The stand-in call costs 1 + K/10 ms, linear in K: interpolation is exact.
  assert auto["call_cost_by_gamma"] == pytest.approx([
      (1 + (g + 1) / 10) / 1.1 for g in range(1, 13)
  ])
  bound = written["per_iteration_gamma"]
  assert bound["oracle_speedup"] >= bound["achieved_speedup"] >= bound[
      "fixed_gamma_speedup"]
  assert written["drafter_settings"]["ngram_order"] == 2
  # No drafter needs the draft model's checkpoint: only the target's counts.
  assert written["random_weights"] is True  # (no target checkpoint here)
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert f"γ=auto→{auto['chosen_gamma']}" in lines[0]
  assert any(line.startswith("GAMMA='auto'") for line in lines)


def test_block_verification_end_to_end(tmp_path):
  """ACCEPTANCE='block' reaches the loop, is recorded, and keeps greedy
  outputs the target's (the rule's exactness: test_block_acceptance.py)."""
  used = []

  def spy(plan, *args):
    used.append(type(plan.acceptance).__name__)
    return make_decoders(plan, *args)

  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'block'", "GAMMA = 2",
      "NUM_EXAMPLES = 2", "TASK_FEATURE_LENGTHS = {'inputs': 32, "
      "'targets': 6}", "target/T5Config.num_encoder_layers = 1",
      "target/T5Config.num_decoder_layers = 1"
  ])
  metrics = run_lib.run(providers=Providers(decoders=spy, pricing=STAND_IN))
  assert used and set(used) == {"BlockAcceptance"}
  assert metrics["greedy_outputs_identical"] is True
  written = json.loads((out / "metrics.json").read_text())
  assert written["acceptance"] == "block" and written["exact"] is True
  assert written["draft_model"].endswith(" block")
  assert written["settings"]["run"]["acceptance"] == "block"


SHARED_ENCODER = [
    "DRAFTER = 'shared_encoder'", "draft/T5Config.num_encoder_layers = 0",
    "draft/T5Config.encoder_width = 64",
    "target/T5Config.num_encoder_layers = 1",
    "target/T5Config.num_decoder_layers = 1"
]


def test_shared_encoder_end_to_end(tmp_path, monkeypatch):
  """DRAFTER='shared_encoder': the draft decoder (no encoder) reads the
  target's encoder output in the loop, stays exact, is priced as a draft
  model step, and MODE='alpha' measures it too."""
  inits = []
  original = drafters.ModelDrafter.init

  def spy(self, inputs, max_len, encoder_output=None):
    inits.append(encoder_output is not None)
    return original(self, inputs, max_len, encoder_output)

  monkeypatch.setattr(drafters.ModelDrafter, "init", spy)
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "GAMMA = 2", "NUM_EXAMPLES = 2",
      "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 6}", *SHARED_ENCODER
  ])
  metrics, models = runner.execute(
      RunPlan.build(arguments.run_arguments(), Providers(pricing=STAND_IN)))
  assert inits and all(inits)  # Started from the target's encoder output.
  target, draft = models.target, models.draft
  assert isinstance(draft, SharedEncoderModel)
  assert draft.encoder is target
  assert "encoder" not in draft.decoder.params["params"]
  assert metrics["greedy_outputs_identical"] is True
  written = json.loads((out / "metrics.json").read_text())
  assert written["drafter"] == "shared_encoder"
  assert written["draft_model"] == "tiny"
  # A propose of γ = 2 guesses at the stand-in's 1 + 2/10 ms, per guess.
  assert written["cost_coefficient_c"] == pytest.approx(1.2 / 2 / 1.1)
  assert written["settings"]["draft"]["encoder_width"] == 64
  assert "encoder_width" not in written["settings"]["target"]
  gin.clear_config()
  parse_local_tiny([
      f"OUTPUT_DIR = '{tmp_path / 'alpha'}'", "MODE = 'alpha'",
      "NUM_EXAMPLES = 2", "TASK_FEATURE_LENGTHS = {'inputs': 32, "
      "'targets': 6}", *SHARED_ENCODER
  ])
  alpha = run_lib.run()
  assert 0.0 <= alpha["alpha_beta"] <= 1.0 and alpha["num_positions"] > 0
