"""Tree verification with a feature-level draft's top-k branches.

* The target hands over its hidden states after a tree call: `commit_path`
  moves them with the keys and values (equal to feeding the kept path).
* `FeatureTreeDrafter.propose_tree`: greedy branch j starts with the j-th
  most likely token of q_1; one branch is `propose`'s guesses.
* The loop refuses a target that keeps no features.

Exactness through the tree loop (greedy identity, k 1, 2, 3; the target's
distribution at T = 1, k = 3, first guesses drawn with and without
replacement, and with top-k + top-p at k = 2; a rule that forgets the
residual failing the same check) is the drafter contract's:
test_drafter_contract.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import sampling

from conftest import jit_call
from conftest import random_model
from conftest import tiny_config
import feature_helpers

MAX_LEN = feature_helpers.GREEDY_LEN


def test_commit_path_moves_the_kept_hidden_states():
  target = random_model(tiny_config(vocab_size=16), seed=5).with_features()
  inputs = jnp.asarray([[3, 4, 5, 1, 0], [6, 7, 1, 0, 0]], jnp.int32)
  prefix = jnp.asarray([[0, 5, 6], [0, 7, 8]], jnp.int32)
  state = jit_call(target, "decode_chunk", prefix,
                   jit_call(target, "start", inputs, 12))[1]
  state = jit_call(target, "truncate", state, jnp.asarray([3, 2]))
  # A root and two chains of two: nodes 1-2 and 3-4.
  parents = jnp.asarray([-1, 0, 1, 0, 3], jnp.int32)
  nodes = jnp.asarray([[9, 10, 11, 12, 13], [4, 5, 6, 7, 8]], jnp.int32)
  _, tree_state = jit_call(target, "decode_tree", nodes, parents, state)
  paths = jnp.asarray([[0, 3, 4], [0, 1, 2]], jnp.int32)
  kept = jnp.asarray([3, 2], jnp.int32)
  committed = jit_call(target, "commit_path", tree_state, paths, kept)
  for b, held in enumerate((3, 2)):
    path_tokens = nodes[b, paths[b, :int(kept[b])]]
    row = jit_call(target, "truncate", state, jnp.asarray([held, held]))
    chunk = jnp.tile(path_tokens[None], (2, 1))
    _, ref = jit_call(target, "decode_chunk", chunk, row)
    end = held + int(kept[b])
    np.testing.assert_allclose(
        target.features(committed)[b, :end],
        target.features(ref)[b, :end], atol=2e-5, err_msg=f"row {b}")


@pytest.fixture(scope="module")
def greedy_case():
  return feature_helpers.greedy_case()


def test_branches_start_with_the_top_k_of_q1(greedy_case):
  target, draft, inputs = greedy_case
  keeping = target.with_features()
  tree = drafters.as_tree_drafter(drafters.FeatureDrafter(draft))
  assert isinstance(tree, drafters.FeatureTreeDrafter)
  state = jit_call(keeping, "start", jnp.asarray(inputs), 16)
  buffer = jnp.zeros((4, 16), jnp.int32).at[:, 1:4].set(5)
  state = jit_call(keeping, "decode_chunk", buffer[:, :3], state)[1]
  length = jnp.full((4,), 3, jnp.int32)
  kwargs = dict(gamma=3, method=sampling.Greedy(),
                target_features=keeping.features(state))
  start = jit_call(tree, "init", jnp.asarray(inputs), 16,
                   keeping.encoder_output(state))
  _, one, _ = jit_call(tree, "propose", start, buffer, length,
                       jax.random.PRNGKey(0), **kwargs)
  _, branches, probs = jit_call(tree, "propose_tree", start, buffer, length,
                                jax.random.PRNGKey(0), width=3, **kwargs)
  assert probs is None and branches.shape == (4, 3, 3)
  np.testing.assert_array_equal(branches[:, 0], one)  # branch 0: propose's
  q1_logits, _, _ = jit_call(tree, "catch_up", start, buffer, length, 3,
                             keeping.features(state))
  np.testing.assert_array_equal(branches[:, :, 0],
                                jax.lax.top_k(q1_logits, 3)[1])


def test_the_loop_refuses_a_target_that_keeps_no_features(greedy_case):
  target, draft, inputs = greedy_case
  with pytest.raises(ValueError, match="with_features"):
    decoding.tree_speculative_sample(target, drafters.FeatureDrafter(draft),
                                     inputs, jax.random.PRNGKey(1), gamma=3,
                                     tree_width=2, max_decode_length=MAX_LEN)
