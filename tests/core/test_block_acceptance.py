"""Block verification (`decoding.block_acceptance`): exact, and never worse.

What must hold:
* the paper's two-token example: 10/9 kept guesses for token verification,
  11/9 for block verification, each computed by exact enumeration of the
  draft blocks from the rule's own probabilities;
* on the 22 (p, q) families of test_sampling: the rule's expected kept
  guesses are never below Algorithm 1's, the first emitted token follows p
  (chi-square, significance 1e-3, fixed seeds), and the exact distribution of
  the first two emitted tokens (enumerated from the rule's h and w) is p x p;
* the whole decoder's first tokens follow the target's enumerated
  distribution at T = 1, T = 0.7 with top-p 0.9 and top-k with top-p, with a
  deterministic and a sampling drafter (chi-square at 1e-3);
* greedy decoding is the token rule's, verdict for verdict; empty
  (NO_GUESS) slots are never kept.
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.decoding import block_acceptance

from decoding_helpers import ScriptedDrafter
from decoding_helpers import ScriptedTarget
from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import scripted_next_probs
from decoding_helpers import sequence_distribution
from test_sampling import DRAWS
from test_sampling import SIGNIFICANCE
from test_sampling import V
from test_sampling import _assert_matches
from test_sampling import _one_hot
from test_sampling import _pq_pairs

GAMMA = 3

# The rule's functions jitted, as the decoder runs them: eagerly, each of
# their operations is a program of its own, compiled once per shape (the
# families below give blocks of many shapes); jitted, one program per
# function and shapes. Sampling methods are static (frozen, hashable).
_expected_accepted = jax.jit(block_acceptance.expected_accepted)
_stop_probabilities = jax.jit(block_acceptance.stop_probabilities)


@functools.partial(jax.jit, static_argnums=4)
def _block_verdict(rng, logits, tokens, draft, method):
  return block_acceptance.BlockAcceptance()(rng, logits, tokens, draft, method)


@functools.partial(jax.jit, static_argnums=4)
def _token_verdict(rng, logits, tokens, draft, method):
  return decoding.ExactAcceptance()(rng, logits, tokens, draft, method)


def _blocks(p, q, gamma):
  """Every draft block of a context-independent pair: ([N, γ+1, V] p,
  [N, γ, V] q, [N, γ] tokens, [N] probability of the block under q)."""
  vocab = len(p)
  blocks = np.asarray(list(itertools.product(range(vocab), repeat=gamma)),
                      np.int32)
  weight = np.prod(np.asarray(q)[blocks], axis=1)
  n = len(blocks)
  target = np.broadcast_to(p, (n, gamma + 1, vocab)).astype(np.float32)
  draft = np.broadcast_to(q, (n, gamma, vocab)).astype(np.float32)
  return target, draft, blocks, weight


def _token_expected_accepted(target, draft, tokens):
  """Algorithm 1: Σ_i Π_{j<=i} min(1, p_j(x_j) / q_j(x_j)), per block."""
  p_x = np.take_along_axis(target[:, :-1], tokens[..., None], -1)[..., 0]
  q_x = np.take_along_axis(draft, tokens[..., None], -1)[..., 0]
  keep = np.minimum(1.0, p_x / np.where(q_x > 0, q_x, 1.0))
  return np.cumprod(keep, axis=1).sum(axis=1)


def test_papers_two_token_example():
  p, q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])
  target, draft, tokens, weight = _blocks(p, q, 2)
  token = float(np.sum(weight *
                       _token_expected_accepted(target, draft, tokens)))
  block = float(
      np.sum(weight * np.asarray(_expected_accepted(target, draft, tokens))))
  assert token == pytest.approx(10 / 9, abs=1e-6)
  assert block == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize("index", range(22))
def test_never_fewer_kept_guesses_than_token_verification(index):
  _, p, q = _pq_pairs()[index]
  target, draft, tokens, weight = _blocks(p, q, GAMMA)
  keep = weight > 0
  token = np.sum(
      weight[keep] *
      _token_expected_accepted(target[keep], draft[keep], tokens[keep]))
  block = np.sum(
      weight[keep] *
      np.asarray(_expected_accepted(target[keep], draft[keep], tokens[keep])))
  assert block >= token - 1e-5, (block, token)


def _iteration_outputs(p, q, gamma):
  """{emitted tuple: probability} of one iteration, from the rule's w and h
  (context-independent p, q)."""
  target, draft, tokens, weight = _blocks(p, q, gamma)
  w, h = (np.asarray(a, np.float64)
          for a in _stop_probabilities(target, draft, tokens))
  out = {}
  for b in np.flatnonzero(weight > 0):
    for tau in range(gamma + 1):
      prob = weight[b] * h[b, tau] * np.prod(1 - h[b, tau + 1:])
      if prob <= 0:
        continue
      q_next = q if tau < gamma else np.zeros_like(q)
      residual = np.maximum(w[b, tau] * p - q_next, 0)
      residual = residual / residual.sum()
      for y in np.flatnonzero(residual > 0):
        key = tuple(tokens[b, :tau]) + (int(y),)
        out[key] = out.get(key, 0.0) + prob * residual[y]
  return out


@pytest.mark.parametrize("index", range(22))
def test_first_two_tokens_are_exactly_the_targets(index):
  _, p, q = _pq_pairs()[index]
  once = _iteration_outputs(p, q, 2)
  assert sum(once.values()) == pytest.approx(1.0, abs=1e-5)
  two = np.zeros((V, V))
  for emitted, prob in once.items():
    if len(emitted) >= 2:
      two[emitted[0], emitted[1]] += prob
    else:  # A second iteration emits the next token: its first is ~ p.
      first = np.zeros(V)
      for more, prob2 in once.items():
        first[more[0]] += prob2
      two[emitted[0]] += prob * first
  np.testing.assert_allclose(two, np.outer(p, p), atol=2e-5)


@functools.partial(jax.jit, static_argnames=("one_hot",))
def _emit_first(rng, p, q, one_hot=False):
  draw_rng, accept_rng = jax.random.split(rng)
  target = jnp.broadcast_to(p, (DRAWS, GAMMA + 1, V)).astype(jnp.float32)
  if one_hot:  # A deterministic drafter: always the same guesses.
    tokens = jnp.broadcast_to(jnp.argmax(q), (DRAWS, GAMMA)).astype(jnp.int32)
    draft = None
  else:
    draft = jnp.broadcast_to(q, (DRAWS, GAMMA, V)).astype(jnp.float32)
    tokens = sampling.sample_from(draw_rng, draft)
  verdict = block_acceptance.BlockAcceptance()(accept_rng, jnp.log(target),
                                               tokens, draft,
                                               sampling.Sampling(1.0))
  return jnp.where(verdict.num_accepted > 0, tokens[:, 0],
                   verdict.next_token), verdict.num_accepted


@pytest.mark.parametrize("index", range(22))
def test_first_emitted_token_follows_p(index):
  name, p, q = _pq_pairs()[index]
  first, _ = _emit_first(jax.random.PRNGKey(300 + index), jnp.asarray(p),
                         jnp.asarray(q))
  _assert_matches(first, p, name)


@pytest.mark.parametrize("index", [0, 3, 8, 15])
def test_first_emitted_token_follows_p_with_one_hot_q(index):
  name, p, q = _pq_pairs()[index]
  first, _ = _emit_first(jax.random.PRNGKey(400 + index), jnp.asarray(p),
                         jnp.asarray(q), one_hot=True)
  _assert_matches(first, p, name + " (one-hot q)")


def test_empty_slots_are_never_kept():
  p = np.array([0.1, 0.2, 0.3, 0.4, 0.0, 0.0])
  target = np.broadcast_to(p.astype(np.float32), (4000, 4, V))
  tokens = np.broadcast_to(np.array([3, 3, decoding.NO_GUESS], np.int32),
                           (4000, 3))
  draft = _one_hot(tokens, V)  # Zero rows at the empty slot.
  verdict = _block_verdict(jax.random.PRNGKey(0), jnp.log(target), tokens,
                           draft, sampling.Sampling(1.0))
  kept = np.asarray(verdict.num_accepted)
  assert kept.max() == 2 and kept.min() == 0 and (kept == 2).any()
  # After both real guesses the next token is p's own draw (q := 0).
  after = np.asarray(verdict.next_token)[kept == 2]
  assert set(after.tolist()) <= {0, 1, 2, 3} and len(set(after.tolist())) > 2


def test_greedy_verdict_is_the_token_rules():
  rs = np.random.RandomState(0)
  logits = np.asarray(rs.randn(64, GAMMA + 1, V), np.float32)
  argmax = np.argmax(logits, -1)
  tokens = np.where(
      rs.rand(64, GAMMA) < 0.7, argmax[:, :GAMMA],
      (argmax[:, :GAMMA] + 1) % V).astype(np.int32)
  method = sampling.Greedy()
  block = _block_verdict(jax.random.PRNGKey(1), logits, tokens, None, method)
  token = _token_verdict(jax.random.PRNGKey(2), logits, tokens, None, method)
  np.testing.assert_array_equal(block.num_accepted, token.num_accepted)
  np.testing.assert_array_equal(block.next_token, token.next_token)
  assert len(set(np.asarray(block.num_accepted).tolist())) > 2


SAMPLES = 20_000
STEPS = 3
DIST_V = 5
EOS = 1


@pytest.mark.parametrize(
    "method,sample_draft,gamma", [
        (sampling.Sampling(1.0), True, 3),
        (sampling.Sampling(1.0), False, 2),
        (sampling.Sampling(0.7, top_p=0.9), True, 3),
        (sampling.Sampling(0.8, top_k=3, top_p=0.9), True, 2),
    ], ids=["T1-q", "T1-onehot-q", "T0.7-p0.9-q", "T0.8-k3-p0.9-q"])
def test_decoder_output_has_the_target_distribution(method, sample_draft,
                                                    gamma):
  rs = np.random.RandomState(1)  # test_speculative_loop's case.
  target = ScriptedTarget(
      position_logits=jnp.asarray(rs.randn(1, 8, DIST_V), jnp.float32),
      bigram=jnp.asarray(rs.randn(DIST_V, DIST_V), jnp.float32),
      expected_fed=-jnp.ones((1, 8), jnp.int32))
  drafter = ScriptedDrafter(
      jnp.asarray(2.0 * rs.randn(1, 8, DIST_V), jnp.float32),
      sample=sample_draft)
  exact = sequence_distribution(
      scripted_next_probs(target,
                          (method.temperature, method.top_k, method.top_p)),
      DIST_V, STEPS, EOS)
  assert abs(sum(exact.values()) - 1.0) < 1e-9 and len(exact) >= 8
  out = decoding.speculative_sample(
      target, drafter, np.ones((SAMPLES, 2), np.int32),
      jax.random.PRNGKey(10 + gamma), gamma=gamma, max_decode_length=STEPS,
      method=method, eos_id=EOS, acceptance=block_acceptance.BlockAcceptance())
  observed, expected = count_sequences(out.tokens, exact)
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE
  alpha = out.statistics()["alpha_hat"]
  assert 0.05 < alpha < 0.95, alpha
