"""Tree verification with a feature-level draft's top-k branches.

* The target hands over its hidden states after a tree call: `commit_path`
  moves them with the keys and values (equal to feeding the kept path).
* `FeatureTreeDrafter.propose_tree`: greedy branch j starts with the j-th
  most likely token of q_1; one branch is `propose`'s guesses.
* Exactness through the tree loop: greedy identity with temperature_sample
  on every row (k 1, 2, 3; guesses kept and rejected); the target's
  distribution at T = 1 (k = 3, first guesses drawn with and without
  replacement) and at T = 0.8 with top-k 3 (k = 2) (chi-square,
  significance 1e-3, fixed seeds); power: the same check on the same draws
  fails with a rule that forgets the residual (not exact).
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
from decoding_helpers import chisquare_pvalue
import test_decoding
from test_feature_drafter import feature_draft
from test_tree_acceptance import UncorrectedTreeAcceptance

MAX_LEN = 14
SIGNIFICANCE = 1e-3


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
  target = random_model(tiny_config(vocab_size=8), seed=11)
  draft = feature_draft(target, 6, seed=22)  # α̂ ≈ 0.4 (test_feature_drafter)
  rng = np.random.default_rng(1)
  inputs = rng.integers(2, 8, size=(4, 6)).astype(np.int32)
  inputs[2, 3:] = 0
  return target, draft, inputs


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


@pytest.mark.parametrize("width", [1, 2, 3])
def test_greedy_identity(greedy_case, width):
  target, draft, inputs = greedy_case
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=MAX_LEN, eos_id=-1)
  out = decoding.tree_speculative_sample(target.with_features(),
                                         drafters.FeatureDrafter(draft), inputs,
                                         jax.random.PRNGKey(1), gamma=3,
                                         tree_width=width,
                                         max_decode_length=MAX_LEN, eos_id=-1)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  hist = out.statistics()["accepted_histogram"]
  assert hist[0] > 0 and sum(hist[1:]) > 0, hist  # Kept and rejected.


def test_the_loop_refuses_a_target_that_keeps_no_features(greedy_case):
  target, draft, inputs = greedy_case
  with pytest.raises(ValueError, match="with_features"):
    decoding.tree_speculative_sample(target, drafters.FeatureDrafter(draft),
                                     inputs, jax.random.PRNGKey(1), gamma=3,
                                     tree_width=2, max_decode_length=MAX_LEN)


def _tree_pvalue(method, width, distinct, acceptance=None):
  """Chi-square p-value of SAMPLES tree decodes of one input."""
  target = random_model(tiny_config(vocab_size=test_decoding.VOCAB), seed=21)
  draft = feature_draft(target, test_decoding.VOCAB - 1, seed=22, scale=3.0)
  inputs = np.array([[3, 4, 2, 1]], np.int32)
  exact = test_decoding._exact_sequence_distribution(  # pylint: disable=protected-access
      target, inputs, method.temperature, method.top_k, method.top_p)
  assert abs(sum(exact.values()) - 1.0) < 1e-5 and len(exact) >= 8
  out = decoding.tree_speculative_sample(
      target.with_features(), drafters.FeatureDrafter(draft),
      np.repeat(inputs, test_decoding.SAMPLES, axis=0),
      jax.random.PRNGKey(5 + width), gamma=2, tree_width=width,
      max_decode_length=test_decoding.STEPS, method=method,
      eos_id=test_decoding.EOS, acceptance=acceptance,
      without_replacement=distinct)
  keys = sorted(exact)
  index = {k: i for i, k in enumerate(keys)}
  observed = np.zeros(len(keys))
  for row in map(tuple, np.asarray(out.tokens)):
    if acceptance is None:
      assert row in index, f"sequence {row} has probability 0 under p"
    if row in index:
      observed[index[row]] += 1
  expected = np.array([exact[k] for k in keys])
  return chisquare_pvalue(observed, expected), out


@pytest.mark.parametrize("method,width,distinct", [
    (sampling.Sampling(1.0), 3, True),
    (sampling.Sampling(1.0), 3, False),
    (sampling.Sampling(0.8, top_k=3), 2, True),
], ids=["T1-k3", "T1-k3-iid", "T0.8-topk3-k2"])
def test_output_has_the_target_distribution(method, width, distinct):
  pvalue, out = _tree_pvalue(method, width, distinct)
  assert pvalue > SIGNIFICANCE
  hist = out.statistics()["accepted_histogram"]
  assert hist[0] > 0 and hist[-1] > 0, hist  # Both outcomes exercised.


def test_power_a_wrong_rule_fails_the_same_check():
  pvalue, _ = _tree_pvalue(sampling.Sampling(1.0), 3, True,
                           acceptance=UncorrectedTreeAcceptance(True))
  assert pvalue < SIGNIFICANCE
