"""`drafters.TreeModelDrafter`: k branches per row, run as one batch.

What must hold (decoder-only example model as the draft, batch 2):
* greedy: branch j starts with the draft's j-th most likely token and goes
  on greedily, each step's logits those of the branch's own prefix;
* sampling: each branch's q rows are the draft's distributions after its
  own prefix, and its tokens lie in their support;
* `rollback_tree` keeps the chosen branch: the next greedy proposal is the
  draft's own continuation of the new buffer;
* without replacement, the first tokens are distinct, drawn (not sorted),
  and the branches past q_1's support have q = 0;
* bad drafters are rejected with a clear error.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import drafters
from specdec_jax.core import sampling
from specdec_jax.core.drafters.tree import as_tree_drafter

from conftest import jit_call
from decoder_only_helpers import DecoderOnlyLM
from decoder_only_helpers import next_logits

VOCAB, GAMMA, WIDTH, MAX_LEN = 7, 3, 3, 12
PROMPTS = np.array([[3, 2, 5], [4, 6, 0]], np.int32)


def _prompt(b):
  return tuple(int(t) for t in PROMPTS[b] if t)


def _setup():
  model = DecoderOnlyLM.random(5, VOCAB)
  drafter = as_tree_drafter(model)
  state = jit_call(drafter, "init", jnp.asarray(PROMPTS), MAX_LEN)
  buffer = jnp.zeros(
      (2, MAX_LEN + 1),
      jnp.int32).at[:, 0].set(model.start_token(jnp.asarray(PROMPTS)))
  return model, drafter, state, buffer


def test_greedy_branches_are_the_top_k_then_greedy():
  model, drafter, state, buffer = _setup()
  length = jnp.zeros((2,), jnp.int32)
  _, tokens, probs = jit_call(drafter, "propose_tree", state, buffer, length,
                              jax.random.PRNGKey(0), gamma=GAMMA, width=WIDTH,
                              method=sampling.Greedy())
  assert probs is None and tokens.shape == (2, WIDTH, GAMMA)
  for b in range(2):
    first = np.argsort(-next_logits(model, _prompt(b)), kind="stable")
    np.testing.assert_array_equal(tokens[b, :, 0], first[:WIDTH])
    for j in range(WIDTH):
      for d in range(1, GAMMA):
        prefix = _prompt(b) + tuple(int(t) for t in tokens[b, j, :d])
        assert tokens[b, j, d] == np.argmax(next_logits(model, prefix))


def test_sampled_branches_carry_their_own_q_and_rollback_keeps_one():
  model, drafter, state, buffer = _setup()
  method = sampling.Sampling(1.0, top_k=4)
  length = jnp.zeros((2,), jnp.int32)
  tree_state, tokens, probs = jit_call(drafter, "propose_tree",
                                       state, buffer, length,
                                       jax.random.PRNGKey(1), gamma=GAMMA,
                                       width=WIDTH, method=method)
  assert probs.shape == (2, WIDTH, GAMMA, VOCAB)
  standardize = jax.jit(method.standardize)
  for b in range(2):
    for j in range(WIDTH):
      for d in range(GAMMA):
        prefix = _prompt(b) + tuple(int(t) for t in tokens[b, j, :d])
        expected = standardize(jnp.asarray(next_logits(model, prefix)))
        np.testing.assert_allclose(probs[b, j, d], expected, atol=1e-5)
        assert probs[b, j, d, tokens[b, j, d]] > 0
  # Keep branch 2 of row 0 (2 guesses + 1 token), branch 0 of row 1 (all γ
  # guesses + 1): the next proposals are a ModelDrafter's from that buffer.
  branch = jnp.array([2, 0])
  kept = jnp.array([2, GAMMA])
  buffer = buffer.at[0, 1:3].set(tokens[0, 2, :2]).at[0, 3].set(1)
  buffer = buffer.at[1, 1:GAMMA + 1].set(tokens[1, 0]).at[1, GAMMA + 1].set(4)
  state = jit_call(drafter, "rollback_tree", tree_state, kept + 1, branch)
  _, after, _ = jit_call(drafter, "propose", state, buffer, kept + 1,
                         jax.random.PRNGKey(2), gamma=GAMMA,
                         method=sampling.Greedy())
  for b in range(2):
    known = _prompt(b) + tuple(int(t) for t in buffer[b, 1:kept[b] + 2])
    for d in range(GAMMA):
      guess = known + tuple(int(t) for t in after[b, :d])
      assert after[b, d] == np.argmax(next_logits(model, guess)), (b, d)


def test_bad_drafters_are_rejected():
  model = DecoderOnlyLM.random(5, VOCAB)
  with pytest.raises(ValueError, match="confidence_threshold"):
    as_tree_drafter(drafters.ModelDrafter(model, confidence_threshold=0.5))
  with pytest.raises(ValueError, match="drafter must be a"):
    as_tree_drafter(drafters.PromptLookupDrafter(vocab=VOCAB))


def test_first_tokens_without_replacement_are_distinct():
  model = DecoderOnlyLM.random(5, VOCAB)
  drafter = as_tree_drafter(model, first_without_replacement=True)
  state = jit_call(drafter, "init", jnp.asarray(PROMPTS), MAX_LEN)
  buffer = jnp.zeros(
      (2, MAX_LEN + 1),
      jnp.int32).at[:, 0].set(model.start_token(jnp.asarray(PROMPTS)))
  # top-k 2 leaves 2 tokens of positive q: the third branch has q = 0 (a
  # high temperature makes both orders of the two likely).
  method = sampling.Sampling(8.0, top_k=2)
  seen = set()
  for seed in range(8):
    _, tokens, probs = jit_call(drafter, "propose_tree", state, buffer,
                                jnp.zeros((2,), jnp.int32),
                                jax.random.PRNGKey(seed), gamma=GAMMA,
                                width=WIDTH, method=method)
    for b in range(2):
      first = np.asarray(tokens[b, :, 0])
      q = np.asarray(probs[b, 0, 0])
      assert len(set(first.tolist())) == WIDTH
      assert q[first[0]] > 0 and q[first[1]] > 0 and q[first[2]] == 0
      seen.add((b, tuple(first[:2])))
  # Both orders of the two support tokens occur (a draw, not a sort).
  assert len(seen) == 4, seen
