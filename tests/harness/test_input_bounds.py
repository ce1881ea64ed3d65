"""Issue 42: absurd sizes and accepted nonsense are refused at startup.

NGRAM_ORDER, PROMPT_LOOKUP_MAX and INNER_GAMMA are bounded (100000 hung
or compiled a 720 GB allocation), SEED must fit the PRNG key, OUTPUT_DIR
on gs:// names a bucket, TOPK / TOPP are refused with DECODE='beam',
SPM_MODEL_PATH / EXTRA_IDS with a byte-level vocabulary, and GAMMA='auto'
records a caveat when its pilot is smaller than it needs. The argument
checks are called directly, without a model; GAMMA='auto''s pilot starts a
tiny random target, whose calls the `Providers.pricing` handed in prices.
"""
import re
import types

import numpy as np
import pytest

from specdec_jax.terminal import console
from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import loading  # noqa: F401  # registers vocabulary
from specdec_jax.experiment import plan as plan_lib
from specdec_jax.metrics import step_costs

from conftest import random_model
from conftest import tiny_config

pytestmark = pytest.mark.usefixtures("clean_gin")
ConfigError = gin_utils.ConfigError
LENGTHS = {"inputs": 64, "targets": 32}  # local_tiny.gin's


@pytest.fixture
def tiny(tmp_path):
  gin_utils.parse_gin(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"],
                      finalize=False)


def _refused(overrides, message):
  """run_arguments(overrides) raises a ConfigError whose line (as `run`
  prints it) starts with `message`."""
  with pytest.raises(ConfigError) as e:
    arguments.run_arguments(overrides=overrides)
  text = console.error_text(e.value)
  assert text.startswith(message), text
  assert "\n" not in text
  return text


# -- 1. sizes ---------------------------------------------------------------
def test_ngram_order_is_bounded(tiny):
  """NGRAM_ORDER=100000 printed nothing for 10.5 minutes (7 GB and more):
  the table pads every corpus sentence with n tokens and holds every
  context of up to n-1 tokens."""
  most = drafter_registry.MAX_NGRAM_ORDER
  ngram = {"drafter": "ngram", "ngram_corpus": "corpus.txt"}
  text = _refused({
      **ngram, "ngram_order": 100000
  }, f"NGRAM_ORDER=100000: allowed: None (3) or an integer from 1 to {most}")
  assert "NGRAM_CORPUS" in text
  # Unread by DRAFTER='model' too: the value itself is absurd.
  _refused({"ngram_order": 100000}, "NGRAM_ORDER=100000: allowed")
  assert arguments.run_arguments(overrides={
      **ngram, "ngram_order": most
  }).drafting.order == most


def test_prompt_lookup_max_is_bounded(tiny):
  """Each suffix length is compiled on its own: 128 took 504 s to compile
  at 512 input tokens, 100000 never finished."""
  most = drafter_registry.MAX_PROMPT_LOOKUP
  lookup = {"drafter": "prompt_lookup"}
  _refused({
      **lookup, "prompt_lookup_max": 100000
  }, f"PROMPT_LOOKUP_MAX=100000: allowed: an integer from 1 to {most}")
  _refused({
      **lookup, "prompt_lookup_max": 0
  }, f"PROMPT_LOOKUP_MAX=0: allowed: an integer from 1 to {most}")
  assert arguments.run_arguments(overrides={
      **lookup, "prompt_lookup_max": most
  }).prompt_lookup_max == most


def test_inner_gamma_is_bounded_by_the_decode_length(tiny):
  """INNER_GAMMA=100000 compiled into a 720 GB allocation (the draft
  model scores inner_gamma + 1 tokens per call)."""
  targets = LENGTHS["targets"]
  hierarchical = {"drafter": "hierarchical"}
  _refused({
      **hierarchical, "inner_gamma": 100000
  }, (f"INNER_GAMMA=100000 is more than TASK_FEATURE_LENGTHS['targets']="
      f"{targets}"))
  text = _refused({**hierarchical, "inner_gamma": targets + 1}, "INNER_GAMMA=")
  assert f"Allowed: 1 to {targets}" in text
  assert arguments.run_arguments(overrides={
      **hierarchical, "inner_gamma": targets
  }).inner_gamma == targets


# -- 2. accepted nonsense ---------------------------------------------------
@pytest.mark.parametrize("name,value,macro", [
    ("top_k", 5, "TOPK=5"),
    ("top_p", 0.9, "TOPP=0.9"),
])
def test_top_k_and_top_p_are_refused_with_beam_search(tiny, name, value, macro):
  """They were recorded in metrics.json and changed nothing."""
  text = _refused({
      "decode": "beam",
      name: value
  }, f"DECODE='beam' with {macro}: beam search draws nothing")
  assert "allowed: TOPK=0 and TOPP=1" in text
  assert arguments.run_arguments(overrides={"decode": "beam"}).top_k == 0


@pytest.mark.parametrize("binding,message", [
    ("SPM_MODEL_PATH = '/x/sentencepiece.model'",
     "SPM_MODEL_PATH='/x/sentencepiece.model' with vocabulary.byte_level = "
     "True: a byte-level vocabulary reads no SentencePiece model"),
    ("EXTRA_IDS = 5", "EXTRA_IDS=5 with vocabulary.byte_level = True: a "
     "byte-level vocabulary has no sentinel ids"),
    ("vocabulary.extra_ids = 7", "EXTRA_IDS=7 with vocabulary.byte_level"),
])
def test_spm_model_path_and_extra_ids_are_refused_with_bytes(
    tmp_path, no_load, binding, message):
  """local_tiny.gin's byte-level vocabulary ignored both silently."""
  gin_utils.parse_gin(["local_tiny.gin"],
                      [f"OUTPUT_DIR = '{tmp_path / 'o'}'", binding],
                      finalize=False)
  args = arguments.run_arguments()
  with pytest.raises(ConfigError) as e:
    plan_lib.RunPlan.build(args, no_load)  # before reading the vocabulary
  text = console.error_text(e.value)
  assert text.startswith(message), text
  assert "allowed: " in text and "\n" not in text


@pytest.mark.parametrize("bindings", [
    [],
    ["EXTRA_IDS = 0"],
    ["SPM_MODEL_PATH = None"],
    ["vocabulary.byte_level = False", "SPM_MODEL_PATH = '/x.model'"],
])
def test_vocabulary_macros_that_mean_what_they_say_pass(tmp_path, bindings):
  gin_utils.parse_gin(["local_tiny.gin"], bindings, finalize=False)
  plan_lib.check_vocabulary_macros()  # raises if not


@pytest.mark.parametrize("output_dir", ["gs://", "gs:///x", "gs:/b/x", "gs:"])
def test_output_dir_on_gcs_names_a_bucket(tiny, output_dir):
  """OUTPUT_DIR='gs://' created a local folder 'gs:'."""
  _refused({"output_dir": output_dir},
           f"OUTPUT_DIR={output_dir!r} (run.output_dir): allowed: a local "
           "directory or gs://bucket/folder")


def test_output_dir_on_gcs_with_a_bucket_passes(tiny):
  for path in ("gs://b", "gs://b/", "gs://my-bucket/runs/1"):
    assert arguments.run_arguments(overrides={
        "output_dir": path
    }).output_dir == path


@pytest.fixture(scope="module")
def tiny_target():
  """A one-layer random target: `step_costs.price_calls` starts it, and its
  own drafter, on the pilot's batch before it prices the calls."""
  return random_model(tiny_config(num_encoder_layers=1, num_decoder_layers=1),
                      seed=0)


def _pilot(target, examples: int, batch_size: int = 1, gamma: int = 4):
  """A pilot plan and feed whose every guess is kept (α = 1.00); the
  target drafts for itself."""
  calls = 8
  stats = {
      "accepted_histogram": [0] * gamma + [calls],
      "acceptance_trials": calls * gamma,
      "tokens_generated": calls * (gamma + 1),
  }
  args = arguments.RunArguments(
      output_dir="/tmp/unused", gamma=gamma, batch_size=batch_size,
      task_feature_lengths={
          "inputs": 4,
          "targets": 4
      })
  pilot = types.SimpleNamespace(
      args=args, drafter=target, models=types.SimpleNamespace(target=target),
      speculative=lambda batch, rng: types.SimpleNamespace(statistics=lambda:
                                                           stats),
      baseline=lambda batch, rng: types.SimpleNamespace(tokens=np.full(
          (batch_size, 4), 5, np.int32)))
  feed = types.SimpleNamespace(
      num_batches=-(-examples // batch_size), num_examples=examples,
      batch=lambda b, width=None: np.full(
          (batch_size, width or 4), 3, np.int32), widest=lambda batches: 4)
  return pilot, feed


@pytest.fixture
def cheap_calls():
  """`Providers` whose pricing says verification calls cost one step and
  guesses a tenth of one (no clock); and the list of the calls priced."""
  priced = []

  def call_seconds(calls, *args, **kwargs):
    del args, kwargs
    priced.append(set(calls))
    return {
        name: 0.1 * k if name == "draft" else 1.0
        for name, (_, k) in calls.items()
    }

  return plan_lib.Providers(pricing=step_costs.Pricing(call_seconds)), priced


def test_auto_gamma_on_one_example_records_a_caveat(tiny_target, cheap_calls):
  """GAMMA='auto' on one example picked γ = 12 from α = 1.00 (32 trials)
  and said nothing about how little that is."""
  pilot, feed = _pilot(tiny_target, examples=1)
  providers, priced = cheap_calls
  record = auto_gamma.pilot_gamma(pilot, feed, providers)
  # The calls were priced by the pricing handed in: each K, and a guess.
  assert priced == [set(auto_gamma.AUTO_GAMMA_CALL_KS) | {"draft"}]
  assert record["cost_coefficient_c"] == pytest.approx(0.1)
  assert record["alpha"] == 1.0 and record["chosen_gamma"] == 12
  assert record["pilot_examples"] == 1
  assert record["acceptance_trials"] == 32
  low, high = record["alpha_interval"]
  assert 0.8 < low < 0.95 and high == pytest.approx(1.0)
  assert record["gamma_interval"][0] < 12 == record["gamma_interval"][1]
  caveat = record["caveat"]
  need = auto_gamma.AUTO_GAMMA_EXAMPLES
  assert re.match(
      f"GAMMA='auto': the pilot decoded 1 example, fewer than the {need} "
      "it needs", caveat), caveat
  assert f"NUM_EXAMPLES >= {need}" in caveat and "\n" not in caveat


def test_auto_gamma_on_a_full_pilot_has_no_caveat(tiny_target, cheap_calls):
  pilot, feed = _pilot(tiny_target, examples=20)
  record = auto_gamma.pilot_gamma(pilot, feed, cheap_calls[0])
  assert record["pilot_examples"] == auto_gamma.AUTO_GAMMA_EXAMPLES
  assert record["caveat"] is None


def test_alpha_interval():
  assert auto_gamma.alpha_interval(0, 0) == (0.0, 1.0)
  low, high = auto_gamma.alpha_interval(50, 100)
  assert low == pytest.approx(0.4038, abs=1e-3)
  assert high == pytest.approx(0.5962, abs=1e-3)
  low, high = auto_gamma.alpha_interval(3200, 3200)
  assert 0.998 < low and high == pytest.approx(1.0)
  assert np.all(np.diff(auto_gamma.alpha_interval(10, 40)) > 0)


# -- 3. SEED ----------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**64, 2**63, 2**32, -1])
def test_seed_is_bounded(tiny, seed):
  """SEED beyond int64 ended in a traceback from jax.random.PRNGKey; one of
  2**32 or more (or < 0) repeats another seed's key (32 bits are kept)."""
  most = arguments.MAX_SEED
  assert most == 2**32 - 1
  _refused({"seed": seed}, f"SEED={seed} (run.seed): allowed: an integer "
           f"from 0 to {most}")


def test_seed_range_passes(tiny):
  for seed in (0, 1, arguments.MAX_SEED):
    assert arguments.run_arguments(overrides={"seed": seed}).seed == seed
