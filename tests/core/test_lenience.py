"""Lenience (paper Appendix A.5): the one acceptance rule that is not exact.

* The derived output distribution (`acceptance.lenient_distribution`)
  equals the process written out by hand, sums to 1, is p at l = 1, and
  never exceeds p(x)/l on 24 (p, q) families × 5 values of l.
* The rule samples the derived distribution (chi-square, 1e-3, fixed
  seeds) on those families, and the empirical frequencies keep the bound.
* Through the decoder at T > 0: the first tokens follow the distribution
  enumerated with the iteration structure (draft positions, bonus
  positions); at T = 0 the paper's variant, by hand.
* The exact rule with every slot a guess is `sampling.speculative_accept`
  draw for draw (NO_GUESS handling changes nothing else).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core import acceptance

from decoding_helpers import ScriptedDrafter
from decoding_helpers import ScriptedTarget
from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import reference_standardize

SIGNIFICANCE = 1e-3
V = 6
LENIENCES = (0.1, 0.3, 0.5, 0.8, 1.0)


def _dist(*values):
  x = np.asarray(values, np.float64)
  return x / x.sum()


def _families():
  """24 (p, q): corner cases, then random ones (some sparse)."""
  rng = np.random.default_rng(3)
  one_hot = np.eye(V)
  uniform = np.full(V, 1.0 / V)
  families = [
      (_dist(1, 2, 3, 4, 5, 6), _dist(1, 2, 3, 4, 5, 6)),
      (_dist(1, 1, 1, 0, 0, 0), _dist(0, 0, 0, 1, 2, 3)),
      (one_hot[2], _dist(3, 1, 2, 1, 1, 1)),
      (_dist(1, 2, 3, 1, 2, 3), one_hot[4]),
      (one_hot[0], one_hot[1]),
      (_dist(5, 1, 1, 1, 1, 1), uniform),
      (uniform, _dist(1, 1, 1, 1, 1, 10)),
      (_dist(0, 0, 1, 2, 3, 4), _dist(4, 3, 2, 1, 0, 0)),
      (_dist(100, 1, 1, 1, 1, 1), _dist(1, 1, 1, 1, 1, 100)),
      (_dist(10, 10, 10, 10, 10, 11), _dist(11, 10, 10, 10, 10, 10)),
  ]
  while len(families) < 24:
    p, q = rng.dirichlet(np.full(V, 0.5)), rng.dirichlet(np.full(V, 0.5))
    if len(families) % 3 == 0:
      p[rng.random(V) < 0.4] = 0
      q[rng.random(V) < 0.4] = 0
      if p.sum() == 0 or q.sum() == 0:
        continue
    families.append((p / p.sum(), q / q.sum()))
  return families


def _by_hand(p, q, lenience):
  """The process, written out: draw x ~ q; keep it with probability
  min(1, p(x) / (l q(x))); else draw from norm(max(0, p - q))."""
  out = np.zeros(V)
  residual = np.maximum(p - q, 0)
  for x in range(V):
    if q[x] == 0:
      continue
    keep = min(1.0, p[x] / (lenience * q[x]))
    out[x] += q[x] * keep
    if residual.sum() > 0:
      out += q[x] * (1 - keep) * residual / residual.sum()
  return out


@pytest.mark.parametrize("lenience", LENIENCES)
def test_derived_distribution_keeps_the_bound(lenience):
  for i, (p, q) in enumerate(_families()):
    derived = acceptance.lenient_distribution(p, q, lenience)
    np.testing.assert_allclose(derived, _by_hand(p, q, lenience), atol=1e-12,
                               err_msg=f"family {i}")
    assert abs(derived.sum() - 1) < 1e-12 and np.all(derived >= 0)
    assert np.all(derived <= p / lenience + 1e-12), (i, derived, p)
    if lenience == 1.0:
      np.testing.assert_allclose(derived, p, atol=1e-12)


# ---------------------------------------------------------------------------
# The rule samples the derived distribution.
# ---------------------------------------------------------------------------
DRAWS = 20_000


@functools.partial(jax.jit, static_argnames=("one_hot_q",))
def _first_token(rng, p, q, lenience, one_hot_q=False):
  """One draft position (γ = 1): the first token emitted, [DRAWS]."""
  draft_rng, rule_rng = jax.random.split(rng)
  logits = jnp.log(jnp.broadcast_to(p, (DRAWS, 2, V)))  # p at both positions
  if one_hot_q:  # The guess is argmax q, deterministic (no q returned).
    tokens = jnp.full((DRAWS, 1), jnp.argmax(q), jnp.int32)
    probs = None
  else:
    probs = jnp.broadcast_to(q, (DRAWS, 1, V))
    tokens = sampling.sample_from(draft_rng, probs)
  verdict = acceptance.LenientAcceptance(lenience)(rule_rng, logits,
                                                   tokens, probs,
                                                   sampling.Sampling(1.0))
  return jnp.where(verdict.num_accepted == 1, tokens[:, 0], verdict.next_token)


def test_rule_samples_the_derived_distribution():
  lenience = 0.3  # (One value: it is a traced argument of one program.)
  for i, (p, q) in enumerate(_families()):
    for one_hot_q in (False, True):
      draft_q = np.eye(V)[np.argmax(q)] if one_hot_q else q
      tokens = np.asarray(
          _first_token(jax.random.PRNGKey(100 * i + one_hot_q),
                       jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32),
                       lenience, one_hot_q=one_hot_q))
      derived = acceptance.lenient_distribution(p, draft_q, lenience)
      observed = np.bincount(tokens, minlength=V).astype(float)
      possible = derived > 0
      assert np.all(observed[~possible] == 0), (i, observed, derived)
      if possible.sum() > 1:  # (One possible token: checked just above.)
        assert chisquare_pvalue(observed[possible],
                                derived[possible]) > (SIGNIFICANCE), (i,
                                                                      one_hot_q,
                                                                      observed,
                                                                      derived)
      # The guarantee, empirically: no frequency above p/l (+ 5 s.e.).
      freq = observed / DRAWS
      slack = 5 * np.sqrt(freq * (1 - freq) / DRAWS) + 1e-9
      assert np.all(freq <= p / lenience + slack), (i, freq, p / lenience)


@jax.jit
def _three_rules(rng, logits, tokens, probs):
  method = sampling.Sampling(1.0)
  exact = acceptance.ExactAcceptance()(rng, logits, tokens, probs, method)
  lenient = acceptance.LenientAcceptance(1.0)(rng, logits, tokens, probs,
                                              method)
  reference = sampling.speculative_accept(rng, method.standardize(logits),
                                          probs, tokens)
  return ((exact.num_accepted, exact.next_token),
          (lenient.num_accepted, lenient.next_token), reference)


def test_exact_rule_is_speculative_accept_draw_for_draw():
  """Also: l = 1 is the same test as Algorithm 1's, draw for draw."""
  rs = np.random.RandomState(0)
  logits = jnp.asarray(rs.randn(64, 4, V), jnp.float32)
  q = jax.nn.softmax(jnp.asarray(2 * rs.randn(64, 3, V), jnp.float32))
  tokens = jnp.asarray(rs.randint(0, V, (64, 3)), jnp.int32)
  for probs in (q, None):
    exact, lenient, reference = _three_rules(jax.random.PRNGKey(1), logits,
                                             tokens, probs)
    assert 0 < np.mean(reference[0]) < 3  # Some kept, some rejected.
    for got in (exact, lenient):
      np.testing.assert_array_equal(got[0], reference[0])
      np.testing.assert_array_equal(got[1], reference[1])


# ---------------------------------------------------------------------------
# Through the decoder.
# ---------------------------------------------------------------------------
DIST_V = 5
STEPS = 3
GAMMA = 2
EOS = 1


def _lenient_sequences(target, guess_logits, lenience):
  """{first STEPS tokens: probability} under LenientAcceptance at T = 1
  with a drafter sampling q_t = softmax(guess_logits[t]) for position t:
  after j kept guesses the next token is a draft position (j < γ) or the
  bonus token from p (j = γ); a rejection starts a new iteration."""
  table = np.asarray(target.position_logits, np.float64)[0]
  bigram = np.asarray(target.bigram, np.float64)
  q_table = reference_standardize(np.asarray(guess_logits)[0], 1.0, 0, 1.0)
  out = {}

  def walk(prefix, slot, mass):
    if len(prefix) == STEPS or (prefix and prefix[-1] == EOS):
      key = prefix + (0,) * (STEPS - len(prefix))
      out[key] = out.get(key, 0.0) + mass
      return
    p = reference_standardize(table[len(prefix)] + bigram[((0,) + prefix)[-1]],
                              1.0, 0, 1.0)
    if slot == GAMMA:
      branches = [(p, 0)]
    else:
      q = q_table[len(prefix) + 1]
      kept = np.minimum(q, p / lenience)
      residual = acceptance.lenient_distribution(p, q, lenience) - kept
      branches = [(kept, slot + 1), (residual, 0)]
    for probs, next_slot in branches:
      for y in range(DIST_V):
        if probs[y] > 0:
          walk(prefix + (y,), next_slot, mass * probs[y])

  walk((), 0, 1.0)
  return out


def test_decoder_follows_the_derived_distribution():
  rs = np.random.RandomState(4)
  target = ScriptedTarget(
      position_logits=jnp.asarray(rs.randn(1, 8, DIST_V), jnp.float32),
      bigram=jnp.asarray(rs.randn(DIST_V, DIST_V), jnp.float32),
      expected_fed=-jnp.ones((1, 8), jnp.int32))
  drafter = ScriptedDrafter(
      jnp.asarray(2 * rs.randn(1, 8, DIST_V), jnp.float32), sample=True)
  lenience = 0.4
  derived = _lenient_sequences(target, drafter.guess_logits, lenience)
  assert abs(sum(derived.values()) - 1) < 1e-9 and len(derived) >= 8
  out = decoding.speculative_sample(
      target, drafter, np.ones((20_000, 2), np.int32), jax.random.PRNGKey(5),
      gamma=GAMMA, max_decode_length=STEPS, temperature=1.0, eos_id=EOS,
      acceptance=acceptance.LenientAcceptance(lenience))
  observed, expected = count_sequences(out.tokens, derived)
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE
  # ... which is not the target's: lenience changed what was emitted.
  exact = _lenient_sequences(target, drafter.guess_logits, 1.0)
  assert max(abs(derived[k] - exact[k]) for k in derived) > 0.02


def test_greedy_lenience_by_hand():
  """T = 0: the target's greedy path is 2 3 4 5 6 2 3 4; at generated
  token 3 its second choice 6 has p(6) = 0.4 max p. The drafter guesses the
  path but 6 there: kept when l <= 0.4 (l = 0.3), not when l = 0.5."""
  path = [2, 3, 4, 5, 6, 2, 3, 4, 5, 6, 2, 3]
  logits = np.full((1, 12, 8), -10.0, np.float32)
  for t, y in enumerate(path):  # Position t predicts generated token t+1.
    logits[0, t, y] = 0.0
  logits[0, 2, 6] = np.log(0.4)
  target = ScriptedTarget(jnp.asarray(logits), jnp.zeros((8, 8), jnp.float32),
                          -jnp.ones((1, 12), jnp.int32))
  guesses = np.zeros((1, 13, 8), np.float32)
  for t, y in enumerate([0] + path[:2] + [6] + path[3:]):
    guesses[0, t, y] = 1.0
  drafter = ScriptedDrafter(jnp.asarray(guesses))
  run = functools.partial(decoding.speculative_sample, target, drafter,
                          np.ones((1, 2), np.int32), jax.random.PRNGKey(0),
                          gamma=4, max_decode_length=8, eos_id=EOS)
  strict = run(acceptance=acceptance.LenientAcceptance(0.5))
  np.testing.assert_array_equal(strict.tokens, [path[:8]])
  np.testing.assert_array_equal(strict.trace_num_accepted[0, :3], [2, 4, -1])
  loose = run(acceptance=acceptance.LenientAcceptance(0.3))
  np.testing.assert_array_equal(loose.tokens, [[2, 3, 6, 5, 6, 2, 3, 4]])
  np.testing.assert_array_equal(loose.trace_num_accepted[0, :2], [4, 3])
