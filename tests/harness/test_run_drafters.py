"""The run and sweep commands with the drafters beyond the paper.

* Bad DRAFTER / LENIENCE / ADAPTIVE_THRESHOLD / NGRAM_* / GAMMA values and
  bad n-gram corpora (missing, another vocabulary) stop the run before any
  model is loaded, naming the macro; nothing is written.
* The issue's sweep spec expands and every point passes `run`'s checks.
* The summary of a lenient run says its outputs are not the target's.

Runs end to end (bigram drafter, adaptive γ, GAMMA='auto'; block
verification; the shared-encoder drafter): tests/e2e/test_run_drafters_e2e.py.
"""
import dataclasses
import re

import gin
import pytest

from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.experiment import arguments
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import summary

from conftest import REPO
from run_helpers import parse_local_tiny

PRETRAINED_SPM = REPO / "pretrained" / "multi30k" / "multi30k.model"

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = pytest.mark.usefixtures("clean_gin")


def _run_error(out, bindings, providers) -> str:
  """`run`'s ConfigError message for `bindings`; asserts nothing was written
  to `out` (the `no_load` fixture as `providers` asserts no model was
  loaded)."""
  gin.clear_config()
  parse_local_tiny([f"OUTPUT_DIR = '{out}'", *bindings])
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
     ], ["LENIENCE=0.5 with ACCEPTANCE='block'", "allowed: LENIENCE=1.0"]),
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
  drafter_registry.write_token_corpus(str(ids), [[5, 6, 1], [7, 1]], 32128)
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


@pytest.mark.parametrize("drafter,extra", [
    ("prompt_lookup", []),
    ("bigram", ["NGRAM_CORPUS = 'README.md'"]),
])
def test_infer_takes_every_drafter(drafter, extra):
  """MODE='infer' decodes with the run's speculative decoder, whatever
  drafts for it (it was refused with MODE='alpha''s words: only 'alpha'
  needs the draft model's q); MODE='alpha' still refuses it."""
  parse_local_tiny([f"DRAFTER = '{drafter}'", "MODE = 'infer'", *extra])
  args = arguments.run_arguments()
  assert args.mode == "infer" and args.drafting.name == drafter
  gin.clear_config()
  parse_local_tiny([f"DRAFTER = '{drafter}'", "MODE = 'alpha'", *extra])
  with pytest.raises(run_lib.ConfigError, match="with MODE='alpha'"):
    arguments.run_arguments()
