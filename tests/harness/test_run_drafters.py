"""The run and sweep commands with the drafters beyond the paper.

* Bad DRAFTER / LENIENCE / ADAPTIVE_THRESHOLD / NGRAM_* / GAMMA values and
  bad n-gram corpora (missing, another vocabulary) stop the run before any
  model is loaded, naming the macro; nothing is written.
* The issue's sweep spec expands and every point passes `run`'s checks.
* One run end to end (bigram drafter, adaptive γ, GAMMA='auto') records
  the new metrics and stays exact; the summary of a lenient run says its
  outputs are not the target's.
"""
import dataclasses
import json
import re

import gin
import pytest

from specdec_jax.core import drafters
from specdec_jax import run as run_lib
from specdec_jax.config import gin_utils
from specdec_jax import sweep
from specdec_jax.metrics import timing
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment import runner
from specdec_jax.experiment import summary
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.experiment.plan import make_decoders
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.experiment import ngram_corpus as corpus_lib

from conftest import REPO

PRETRAINED_SPM = REPO / "pretrained" / "multi30k" / "multi30k.model"

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.fixture
def corpus(tmp_path):
  path = tmp_path / "corpus.de"
  path.write_text("Das Haus ist klein.\nDer Hund läuft im Park.\n")
  return path


def _parse(bindings):
  gin_utils.parse_gin(["local_tiny.gin"], bindings, finalize=False)


def _run_error(out, bindings, providers) -> str:
  """`run`'s ConfigError message for `bindings`; asserts nothing was written
  to `out` (the `no_load` fixture as `providers` asserts no model was
  loaded)."""
  gin.clear_config()
  _parse([f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=providers)
  assert not out.exists()
  return str(e.value)


@pytest.mark.parametrize("bindings,expect", [
    (["DRAFTER = 'trigram'"],
     ["DRAFTER='trigram': allowed: 'model', "
      "'unigram', 'bigram', 'ngram'"]),
    (["LENIENCE = 0.0"], ["LENIENCE=0.0: allowed: a number in (0, 1]"]),
    (["LENIENCE = 1.5"], ["LENIENCE=1.5"]),
    (["LENIENCE = 1e999"], ["LENIENCE=inf"]),
    (["ADAPTIVE_THRESHOLD = 1.0"
     ], ["ADAPTIVE_THRESHOLD=1.0: allowed: a number in (0, 1)"]),
    (["ADAPTIVE_THRESHOLD = 0"], ["ADAPTIVE_THRESHOLD=0"]),
    (["DRAFTER = 'prompt_lookup'", "ADAPTIVE_THRESHOLD = 0.5"
     ], ["with DRAFTER='prompt_lookup'"]),
    (["DRAFTER = 'bigram'"], ["NGRAM_CORPUS=None", "'bigram' drafter counts"]),
    (["DRAFTER = 'bigram'", "NGRAM_CORPUS = '/no/such/corpus.txt'"
     ], ["NGRAM_CORPUS='/no/such/corpus.txt': no such file"]),
    (["DRAFTER = 'hierarchical'", "INNER_DRAFTER = 'model'"
     ], ["INNER_DRAFTER='model': allowed: 'prompt_lookup'"]),
    (["DRAFTER = 'hierarchical'", "INNER_GAMMA = 0"], ["INNER_GAMMA=0"]),
    (["DRAFTER = 'prompt_lookup'", "PROMPT_LOOKUP_MAX = 0"
     ], ["PROMPT_LOOKUP_MAX=0"]),
    (["DRAFTER = 'bigram'", "NGRAM_ORDER = 3", "NGRAM_CORPUS = 'README.md'"
     ], ["NGRAM_ORDER=3 contradicts 'bigram'"]),
    (["DRAFTER = 'bigram'", "MODE = 'alpha'", "NGRAM_CORPUS = 'README.md'"
     ], ["MODE='alpha'", "allowed: DRAFTER='model'"]),
    (["GAMMA = 'fast'"], ["GAMMA='fast': allowed: an integer >= 1, or 'auto'"]),
    (["ACCEPTANCE = 'forest'"
     ], ["ACCEPTANCE='forest': allowed: 'token', 'block', 'tree'"]),
    (["ACCEPTANCE = 'block'", "LENIENCE = 0.5"
     ], ["ACCEPTANCE='block' with LENIENCE=0.5", "allowed: LENIENCE=1"]),
    (["DRAFTER = 'shared_encoder'"], [
        "DRAFTER='shared_encoder': the draft has an encoder of its own",
        "encoder_width = the target's emb_dim (64)"
    ]),
    ([
        "draft/T5Config.num_encoder_layers = 0",
        "draft/T5Config.encoder_width = 64"
    ], [
        "DRAFTER='model': the draft has no encoder of its own",
        "allowed: DRAFTER='shared_encoder'"
    ]),
    ([
        "DRAFTER = 'shared_encoder'", "draft/T5Config.num_encoder_layers = 0",
        "draft/T5Config.encoder_width = 32"
    ], ["encoder_width = 32 but the target's emb_dim is 64"]),
])
def test_bad_drafting_settings_fail_before_loading(bindings, expect, tmp_path,
                                                   no_load):
  message = _run_error(tmp_path / "out", bindings, no_load)
  for text in expect:
    assert text in message, (text, message)


def test_corpus_in_another_vocabulary_fails_before_loading(tmp_path, no_load):
  out = tmp_path / "out"
  ids = tmp_path / "ids.npz"
  corpus_lib.write_token_corpus(str(ids), [[5, 6, 1], [7, 1]], 32128)
  assert (f"NGRAM_CORPUS='{ids}' holds ids of a vocabulary of 32128 ids, but "
          "the models' has 259") in _run_error(
              out, ["DRAFTER = 'bigram'", f"NGRAM_CORPUS = '{ids}'"], no_load)
  # Text in a script the vocabulary does not cover: mostly unknown pieces.
  if not PRETRAINED_SPM.exists():
    pytest.skip(f"{PRETRAINED_SPM} not found")
  greek = tmp_path / "greek.txt"
  greek.write_text("Το σπίτι είναι μικρό.\nΟ σκύλος τρέχει στο πάρκο.\n")
  message = _run_error(out, [
      "DRAFTER = 'bigram'", f"NGRAM_CORPUS = '{greek}'",
      "vocabulary.byte_level = False", f"SPM_MODEL_PATH = '{PRETRAINED_SPM}'",
      "EXTRA_IDS = 0", "target/T5Config.vocab_size = 8000",
      "draft/T5Config.vocab_size = 8000"
  ], no_load)
  assert re.search(
      r"of its tokens are unknown to the vocabulary.*another "
      "language or vocabulary", message), message


def test_beyond_paper_sweep_points_all_pass_the_checks(tmp_path, monkeypatch):
  points = sweep.parse_sweep_args([str(REPO / "configs/beyond_paper.yaml")])
  assert len(points) == 34
  assert {"DRAFTER": "model", "GAMMA": "auto", "TEMPERATURE": 1.0} in points
  spm = REPO / "outputs" / "multi30k" / "spm" / "multi30k.model"
  if not spm.exists():
    pytest.skip(f"{spm} not found: the trained Multi30k pair is made by "
                "`python -m specdec_jax.train` (README).")
  sweep.check_keys(points, ["multi30k_1m.gin"], [], [])
  sweep.validate_points(points, str(tmp_path / "r"), ["multi30k_1m.gin"], [],
                        [])


@pytest.mark.slow
def test_bigram_adaptive_auto_gamma_end_to_end(tmp_path, corpus, monkeypatch):
  # Few compilations: timings are stand-ins (run's timing is tested
  # elsewhere), and the pilot's γ is the one chosen for α ≈ 0 (random
  # weights), so pilot and run share one program; a one-layer target
  # compiles faster (nothing here depends on its size).
  monkeypatch.setattr(
      timing, "call_seconds", lambda calls, *args, **kwargs: {
          name: 1e-3 * (1 + k / 10) for name, (_, k) in calls.items()
      })
  monkeypatch.setattr(auto_gamma, "AUTO_GAMMA_PILOT", 1)
  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "DRAFTER = 'bigram'",
      f"NGRAM_CORPUS = '{corpus}'", "GAMMA = 'auto'",
      "ADAPTIVE_THRESHOLD = 0.05", "NUM_EXAMPLES = 2",
      "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
      "target/T5Config.num_encoder_layers = 1",
      "target/T5Config.num_decoder_layers = 1"
  ])
  metrics = run_lib.run()
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


def test_summary_of_a_lenient_run():
  metrics = dict(task="multi30k", num_examples=10, speedup=1.3,
                 theoretical_speedup=1.5, alpha=0.8, alpha_beta=0.7,
                 tokens_per_target_call=3.0, greedy_outputs_identical=False,
                 greedy_identical_examples=6, random_weights=False,
                 lenience=0.5, exact=False, gamma=5, draft_model="1m", bleu={
                     "baseline": 40.0,
                     "speculative": 39.0
                 })
  args = arguments.RunArguments(temperature=0.0, gamma=5, mode="walltime",
                                target_name="11m", draft_name="1m",
                                output_dir="/tmp/x")
  text = "\n".join(summary.summary_lines(metrics, args))
  assert "LENIENCE=0.5 < 1: outputs are NOT the target's distribution" in text
  assert "identical to the target's on 6/10 examples" in text
  assert "NOT all: at T=0 they must be" not in text
  metrics.update(greedy_outputs_identical=None, greedy_identical_examples=None)
  text = "\n".join(
      summary.summary_lines(metrics, dataclasses.replace(args,
                                                         temperature=1.0)))
  assert "NOT the target's distribution" in text
  assert "samples the target's distribution exactly" not in text


@pytest.mark.slow
def test_block_verification_end_to_end(tmp_path, monkeypatch):
  """ACCEPTANCE='block' reaches the loop, is recorded, and keeps greedy
  outputs the target's (the rule's exactness: test_block_acceptance.py)."""
  monkeypatch.setattr(
      timing, "call_seconds", lambda calls, *args, **kwargs: {
          name: 1e-3 * (1 + k / 10) for name, (_, k) in calls.items()
      })
  used = []

  def spy(plan, *args):
    used.append(type(plan.acceptance).__name__)
    return make_decoders(plan, *args)

  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'block'", "GAMMA = 2",
      "NUM_EXAMPLES = 2", "TASK_FEATURE_LENGTHS = {'inputs': 32, "
      "'targets': 6}", "target/T5Config.num_encoder_layers = 1",
      "target/T5Config.num_decoder_layers = 1"
  ])
  metrics = run_lib.run(providers=Providers(decoders=spy))
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


@pytest.mark.slow
def test_shared_encoder_end_to_end(tmp_path, monkeypatch):
  """DRAFTER='shared_encoder': the draft decoder (no encoder) reads the
  target's encoder output in the loop, stays exact, is priced as a draft
  model step, and MODE='alpha' measures it too."""
  monkeypatch.setattr(
      timing, "call_seconds", lambda calls, *args, **kwargs: {
          name: 1e-3 * (1 + k / 10) for name, (_, k) in calls.items()
      })
  inits = []
  original = drafters.ModelDrafter.init

  def spy(self, inputs, max_len, encoder_output=None):
    inits.append(encoder_output is not None)
    return original(self, inputs, max_len, encoder_output)

  monkeypatch.setattr(drafters.ModelDrafter, "init", spy)
  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "GAMMA = 2", "NUM_EXAMPLES = 2",
      "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 6}", *SHARED_ENCODER
  ])
  metrics, models = runner.execute(RunPlan.build(arguments.run_arguments()))
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
  _parse([
      f"OUTPUT_DIR = '{tmp_path / 'alpha'}'", "MODE = 'alpha'",
      "NUM_EXAMPLES = 2", "TASK_FEATURE_LENGTHS = {'inputs': 32, "
      "'targets': 6}", *SHARED_ENCODER
  ])
  alpha = run_lib.run()
  assert 0.0 <= alpha["alpha_beta"] <= 1.0 and alpha["num_positions"] > 0
