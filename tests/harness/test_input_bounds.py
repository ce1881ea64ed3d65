"""Issue 42: absurd sizes and accepted nonsense are refused at startup.

NGRAM_ORDER, PROMPT_LOOKUP_MAX and INNER_GAMMA are bounded (100000 hung
or compiled a 720 GB allocation), SEED must fit the PRNG key, OUTPUT_DIR
on gs:// names a bucket, TOPK / TOPP are refused with DECODE='beam',
SPM_MODEL_PATH / EXTRA_IDS with a byte-level vocabulary (GAMMA='auto''s
caveat for a small pilot: tests/harness/test_auto.py). The argument checks
are called directly, without a model.
"""

import pytest
from run_helpers import certify_arguments

from specdec_jax.config import flag_utils
from specdec_jax.terminal import console
from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import loading  # noqa: F401  # registers vocabulary
from specdec_jax.experiment import plan as plan_lib

pytestmark = pytest.mark.usefixtures("clean_gin")
ConfigError = flag_utils.ConfigError
LENGTHS = {"inputs": 64, "targets": 32}  # local_tiny.gin's


def _refused(overrides, message):
  """run_arguments(overrides) raises a ConfigError whose line (as `run`
  prints it) starts with `message`."""
  with pytest.raises(ConfigError) as e:
    arguments.run_arguments(overrides=overrides)
  return _one_line(e, message)


def _refused_with(bindings, message):
  """As `_refused`, for local_tiny.gin with gin `bindings` as a user types
  them (a component's settings are bound, not overridden)."""
  with pytest.raises(ConfigError) as e:
    certify_arguments(bindings)
  return _one_line(e, message)


def _one_line(e, message):
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
  ngram = ["DRAFTER = 'ngram'", "NGRAM_CORPUS = 'corpus.txt'"]
  text = _refused_with(
      [*ngram, "NGRAM_ORDER = 100000"],
      f"NGRAM_ORDER=100000: allowed: None (3) or an integer from 1 to {most}")
  assert "NGRAM_CORPUS" in text
  # Unread by DRAFTER='model': refused as such.
  _refused_with(["NGRAM_ORDER = 100000"],
                "NGRAM_ORDER=100000 with DRAFTER='model': only DRAFTER")
  assert certify_arguments([*ngram, f"NGRAM_ORDER = {most}"
                           ]).drafting.ngram_order() == most


def test_prompt_lookup_max_is_bounded(tiny):
  """Each suffix length is compiled on its own: 128 took 504 s to compile
  at 512 input tokens, 100000 never finished."""
  most = drafter_registry.MAX_PROMPT_LOOKUP
  lookup = "DRAFTER = 'prompt_lookup'"
  _refused_with([lookup, "PROMPT_LOOKUP_MAX = 100000"],
                f"PROMPT_LOOKUP_MAX=100000: allowed: an integer from 1 to "
                f"{most}")
  _refused_with([lookup, "PROMPT_LOOKUP_MAX = 0"],
                f"PROMPT_LOOKUP_MAX=0: allowed: an integer from 1 to {most}")
  assert certify_arguments([lookup, f"PROMPT_LOOKUP_MAX = {most}"
                           ]).drafting.max_ngram == most


def test_inner_gamma_is_bounded_by_the_decode_length(tiny):
  """INNER_GAMMA=100000 compiled into a 720 GB allocation (the draft
  model scores inner_gamma + 1 tokens per call)."""
  targets = LENGTHS["targets"]
  hierarchical = "DRAFTER = 'hierarchical'"
  _refused_with([hierarchical, "INNER_GAMMA = 100000"],
                (f"INNER_GAMMA=100000 is more than "
                 f"TASK_FEATURE_LENGTHS['targets']={targets}"))
  text = _refused_with([hierarchical, f"INNER_GAMMA = {targets + 1}"],
                       "INNER_GAMMA=")
  assert f"Allowed: 1 to {targets}" in text
  assert certify_arguments([hierarchical, f"INNER_GAMMA = {targets}"
                           ]).drafting.inner_gamma == targets


# -- 2. accepted nonsense ---------------------------------------------------
@pytest.mark.parametrize("name,value,macro", [
    ("top_k", 5, "TOPK=5"),
    ("top_p", 0.9, "TOPP=0.9"),
])
def test_top_k_and_top_p_are_refused_with_beam_search(tiny, name, value, macro):
  """They were recorded in metrics.json and changed nothing."""
  beam = {"decode_mode": decode_modes.BEAM}
  text = _refused({
      **beam, name: value
  }, f"DECODE='beam' with {macro}: beam search draws nothing")
  assert "allowed: TOPK=0 and TOPP=1" in text
  assert arguments.run_arguments(overrides=beam).top_k == 0


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
