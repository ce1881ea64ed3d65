"""Speculative beam search on the shipped 38M target and its distilled 1M
draft: identical to T5X's beam search (the quick tests on the tiny fixture
are tests/core/test_speculative_beam.py)."""
import pytest

from specdec_jax.core.decoding import speculative_beam

from beam_helpers import assert_same_beams
from beam_helpers import load_pretrained
from beam_helpers import load_reference

pytestmark = pytest.mark.slow


def test_38m_with_shipped_draft_identical():
  """The shipped 38M target and its distilled 1M draft on the 24 fixture
  sentences (batch 24): identical to the baseline, hence to T5X."""
  reference = load_reference()
  target = load_pretrained("target_38m", "models/multi30k_target_38m.gin")
  draft = load_pretrained("draft_1m_distill_38m",
                          "models/multi30k_draft_1m.gin")
  inputs = reference["m38_encoder_input_tokens"]
  spec = speculative_beam.speculative_beam_search(target, draft, inputs,
                                                  beam_size=4, width=8, gamma=3,
                                                  max_decode_len=32, alpha=0.6)
  assert_same_beams(spec.tokens, spec.scores,
                    reference["m38_k4_alpha0.6_decodes"],
                    reference["m38_k4_alpha0.6_scores"], "38M, alpha 0.6")
