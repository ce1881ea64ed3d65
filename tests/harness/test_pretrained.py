"""The pair shipped in pretrained/multi30k (the README's main job).

It must load through the T5X loader into the gin model configs, in
bfloat16 on disk and float32 after loading, and decode as a trained pair:
greedy speculative output equal to the target's, with a high acceptance
rate on a simple caption (random weights would give α near 0).
"""
import jax
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.core.models import SharedEncoderModel

from beam_helpers import PRETRAINED
from beam_helpers import load_pretrained


def _load(name, gin_file):
  """A shipped model (`beam_helpers.load_pretrained`), its parameters
  float32 in memory (the checkpoint stores bfloat16)."""
  model = load_pretrained(name, gin_file)
  leaves = jax.tree_util.tree_leaves(model.params)
  assert all(x.dtype == np.float32 for x in leaves)
  return model


# (target, its model gin, draft, its model gin): the main job's pair first.
PAIRS = {
    "38m_with_1m": ("target_38m", "models/multi30k_target_38m.gin", "draft_1m",
                    "models/multi30k_draft_1m.gin"),
    "11m_with_1m": ("target", "models/multi30k_target.gin", "draft_1m",
                    "models/multi30k_draft_1m.gin"),
    "38m_with_1m_distilled":
        ("target_38m", "models/multi30k_target_38m.gin", "draft_1m_distill_38m",
         "models/multi30k_draft_1m.gin"),
    # Shared-encoder drafts: decoders reading the 38M target's encoder.
    "38m_with_shared_1m":
        ("target_38m", "models/multi30k_target_38m.gin", "shared_encoder_1m",
         "models/multi30k_shared_encoder_1m.gin"),
    "38m_with_shared_4m":
        ("target_38m", "models/multi30k_target_38m.gin", "shared_encoder_4m",
         "models/multi30k_shared_encoder_4m.gin"),
}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_shipped_pair_loads_and_decodes_exactly(pair):
  target_name, target_gin, draft_name, draft_gin = PAIRS[pair]
  target = _load(target_name, target_gin)
  # A shared-encoder draft is paired with the target whose encoder it reads.
  draft = SharedEncoderModel.draft_for(target, _load(draft_name, draft_gin))
  vocab = vocab_lib.get_vocabulary(str(PRETRAINED / "multi30k.model"),
                                   extra_ids=0)
  ids = vocab.encode("A man in a blue shirt is riding a bicycle.") + [1]
  inputs = np.asarray([ids], np.int32)
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=16)
  spec = decoding.speculative_sample(target, draft, inputs,
                                     jax.random.PRNGKey(0), gamma=6,
                                     max_decode_length=16)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  text = vocab.decode([int(t) for t in np.asarray(base.tokens)[0] if t > 1])
  assert "Mann" in text, text  # A trained En->De model, not random weights.
  assert float(spec.alpha_hat) > 0.5
