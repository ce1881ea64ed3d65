"""Beam search on the shipped 38M target equals T5X's (K = 4, α = 0.6 and
0.0: these beams finish, so they test the brevity penalty and the
termination too), and speculative beam search with its distilled 1M draft
is identical to it (the quick tests on the tiny fixture:
tests/core/test_beam_search.py, tests/core/test_speculative_beam.py)."""
import numpy as np
import pytest

from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding import speculative_beam

from beam_helpers import assert_same_beams
from beam_helpers import load_pretrained
from beam_helpers import load_reference

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
  return load_reference()


@pytest.fixture(scope="module")
def target_38m():
  return load_pretrained("target_38m", "models/multi30k_target_38m.gin")


def test_38m_beams_equal_t5x(reference, target_38m):
  """The shipped 38M target, 24 Multi30k sentences, K = 4 (one compile:
  α is traced)."""
  target = target_38m
  for alpha in (0.6, 0.0):
    name = f"m38_k4_alpha{alpha}"
    out = beam_search.beam_search(target, reference["m38_encoder_input_tokens"],
                                  beam_size=4, max_decode_len=32, alpha=alpha)
    assert_same_beams(out.tokens, out.scores, reference[f"{name}_decodes"],
                      reference[f"{name}_scores"], name)
    # The beams finished with EOS and the search stopped before 32 steps.
    assert np.all(np.any(np.asarray(out.tokens) == 1, axis=2))
    assert int(out.steps) < 32


def test_38m_with_shipped_draft_identical(reference, target_38m):
  """The shipped 38M target and its distilled 1M draft on the 24 fixture
  sentences (batch 24): identical to the baseline, hence to T5X."""
  target = target_38m
  draft = load_pretrained("draft_1m_distill_38m",
                          "models/multi30k_draft_1m.gin")
  inputs = reference["m38_encoder_input_tokens"]
  spec = speculative_beam.speculative_beam_search(target, draft, inputs,
                                                  beam_size=4, width=8, gamma=3,
                                                  max_decode_len=32, alpha=0.6)
  assert_same_beams(spec.tokens, spec.scores,
                    reference["m38_k4_alpha0.6_decodes"],
                    reference["m38_k4_alpha0.6_scores"], "38M, alpha 0.6")
