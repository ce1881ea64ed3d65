"""The tree call (`decode_tree` + `commit_path`) against sequential decoding.

What must hold, for the tiny T5 (through the CPU kernel where it is built)
and the decoder-only example target:
* each tree node's logits equal `decode_chunk`'s logits at the end of that
  node's root-to-node path (float32 tolerance), with rows at different
  cache lengths and a tree with shared prefixes and branches of unequal
  depth;
* after `commit_path` of one path per row, the state continues exactly as
  if the path had been decoded with `decode_chunk`;
* `tree_visibility` gives ancestors and depths.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core.models.attention import tree_visibility

from conftest import jit_call
from conftest import random_model
from conftest import tiny_config
from decoder_only_helpers import DecoderOnlyLM

ATOL = 2e-5
VOCAB = 24
# A tree of 8 nodes: a root, two children (one of them with a chain of
# three), a third branch off the root, and a lone node after the prefix.
PARENTS = np.array([-1, 0, 0, 1, 3, 4, 0, -1], np.int32)
DEPTHS = np.array([0, 1, 1, 2, 3, 4, 1, 0])


def _path(node):
  path = []
  while node >= 0:
    path.append(node)
    node = PARENTS[node]
  return path[::-1]


def test_tree_visibility():
  visible, depth = tree_visibility(jnp.asarray(PARENTS)[None])
  np.testing.assert_array_equal(depth[0], DEPTHS)
  for i in range(len(PARENTS)):
    expected = np.zeros(len(PARENTS), bool)
    expected[_path(i)] = True
    np.testing.assert_array_equal(visible[0, i], expected)


def _t5_setup():
  model = random_model(tiny_config(vocab_size=VOCAB), seed=5)
  rng = np.random.default_rng(1)
  enc = rng.integers(2, VOCAB, size=(3, 6)).astype(np.int32)
  enc[1, 3:] = 0
  return model, enc


def _decoder_only_setup():
  model = DecoderOnlyLM.random(3, VOCAB)
  rng = np.random.default_rng(2)
  prompts = rng.integers(1, VOCAB, size=(3, 5)).astype(np.int32)
  prompts[2, 2:] = 0
  return model, prompts


@pytest.mark.parametrize("setup", [_t5_setup, _decoder_only_setup],
                         ids=["t5", "decoder-only"])
def test_tree_logits_and_commit_match_sequential_decoding(setup):
  model, inputs = setup()
  rng = np.random.default_rng(3)
  batch, n, max_len = inputs.shape[0], len(PARENTS), 20
  prefix = rng.integers(2, VOCAB, size=(batch, 4)).astype(np.int32)
  tokens = rng.integers(2, VOCAB, size=(batch, n)).astype(np.int32)
  state = jit_call(model, "start", jnp.asarray(inputs), max_len)
  _, state = jit_call(model, "decode_chunk", jnp.asarray(prefix), state)
  # Rows at different lengths: 4, 2 and 3 positions held.
  lengths = np.array([4, 2, 3], np.int32)
  state = jit_call(model, "truncate", state, jnp.asarray(lengths))
  logits, tree_state = jit_call(model, "decode_tree", jnp.asarray(tokens),
                                jnp.asarray(PARENTS), state)
  np.testing.assert_array_equal(model.length(tree_state), lengths)
  for node in range(n):
    path = _path(node)
    expected, _ = jit_call(model, "decode_chunk", jnp.asarray(tokens[:, path]),
                           state)
    np.testing.assert_allclose(logits[:, node], expected[:, -1], atol=ATOL,
                               err_msg=f"node {node}")

  # Commit a different path per row (kept lengths 5, 2 and 1), then go on.
  paths = np.array([[0, 1, 3, 4, 5], [0, 6, 0, 0, 0], [7, 0, 0, 0, 0]],
                   np.int32)
  kept = np.array([5, 2, 1], np.int32)
  committed = jit_call(model, "commit_path", tree_state, jnp.asarray(paths),
                       jnp.asarray(kept))
  np.testing.assert_array_equal(model.length(committed), lengths + kept)
  more = rng.integers(2, VOCAB, size=(batch, 3)).astype(np.int32)
  after, _ = jit_call(model, "decode_chunk", jnp.asarray(more), committed)
  for b in range(batch):
    # Sequential reference for row b: its path, then the continuation, fed
    # in one chunk after row b's prefix.
    chunk = np.concatenate([tokens[b, paths[b, :kept[b]]], more[b]])
    ref, _ = jit_call(
        model, "decode_chunk", jnp.asarray(chunk[None].repeat(batch, 0)),
        jit_call(model, "truncate", state,
                 jnp.full((batch,), lengths[b], jnp.int32)))
    np.testing.assert_allclose(after[b], ref[b, kept[b]:], atol=ATOL,
                               err_msg=f"row {b}")


@pytest.mark.parametrize("parents,match", [
    ([-1, 0, 2], "earlier node"),
    ([-1, -2, 0], "earlier node"),
    ([-1, 0], "shape"),
])
def test_bad_parents_are_rejected(parents, match):
  model, enc = _t5_setup()
  state = model.start(jnp.asarray(enc), 8)
  with pytest.raises(ValueError, match=match):
    model.decode_tree(jnp.ones((3, 3), jnp.int32), np.asarray(parents), state)
