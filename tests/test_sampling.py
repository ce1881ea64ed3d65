"""Exactness of the sampling math: standardize and Algorithm 1's acceptance.

Statistical tests use fixed seeds and chi-square goodness of fit at
significance 1e-3 (each can fail: a wrong residual, a missing guard or an
off-by-one in n moves the emitted distribution away from p).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax import sampling

SIGNIFICANCE = 1e-3
DRAWS = 100_000
V = 6


def _dist(*values):
  x = np.asarray(values, np.float64)
  return x / x.sum()


def _pq_pairs():
  """(name, p, q) pairs covering the corner cases of Algorithm 1."""
  rng = np.random.default_rng(0)
  one_hot = lambda i: np.eye(V)[i]  # pylint: disable=unnecessary-lambda-assignment
  uniform = np.full(V, 1.0 / V)
  pairs = [
      ("p==q", _dist(1, 2, 3, 4, 5, 6), _dist(1, 2, 3, 4, 5, 6)),
      ("p==q uniform", uniform, uniform),
      ("disjoint", _dist(1, 1, 1, 0, 0, 0), _dist(0, 0, 0, 1, 2, 3)),
      ("one-hot p", one_hot(2), _dist(3, 1, 2, 1, 1, 1)),
      ("one-hot q", _dist(1, 2, 3, 1, 2, 3), one_hot(4)),
      ("one-hot p==q", one_hot(5), one_hot(5)),
      ("one-hot disjoint", one_hot(0), one_hot(1)),
      ("uniform q", _dist(5, 1, 1, 1, 1, 1), uniform),
      ("uniform p", uniform, _dist(1, 1, 1, 1, 1, 10)),
      ("q mass where p has none", _dist(0, 0, 1, 2, 3, 4), _dist(4, 3, 2, 1, 0, 0)),
      ("p mass where q has none", _dist(4, 3, 2, 1, 0, 0), _dist(0, 0, 1, 2, 3, 4)),
      ("near-equal", _dist(10, 10, 10, 10, 10, 11), _dist(11, 10, 10, 10, 10, 10)),
      ("peaked vs flat", _dist(100, 1, 1, 1, 1, 1), _dist(1, 1, 1, 1, 1, 100)),
  ]
  while len(pairs) < 22:
    k = len(pairs)
    p = rng.dirichlet(np.full(V, 0.5))
    q = rng.dirichlet(np.full(V, 0.5))
    if k % 3 == 0:  # sparse supports
      p[rng.random(V) < 0.4] = 0
      q[rng.random(V) < 0.4] = 0
      if p.sum() == 0 or q.sum() == 0:
        continue
      p, q = p / p.sum(), q / q.sum()
    pairs.append((f"random {k}", p, q))
  return pairs


@functools.partial(jax.jit, static_argnames=("gamma",))
def _emit_first(rng, p, q, gamma=1):
  """Draws x ~ q and runs the acceptance; returns the first emitted token."""
  draw_rng, accept_rng = jax.random.split(rng)
  target = jnp.broadcast_to(p, (DRAWS, gamma + 1, V)).astype(jnp.float32)
  draft = jnp.broadcast_to(q, (DRAWS, gamma, V)).astype(jnp.float32)
  tokens = sampling.sample_from(draw_rng, draft)
  n, extra = sampling.speculative_accept(accept_rng, target, draft, tokens)
  first = jnp.where(n > 0, tokens[:, 0], extra)
  return first, n


def _assert_matches(samples, p, name):
  counts = np.bincount(np.asarray(samples), minlength=V)
  assert counts.sum() == DRAWS
  support = p > 0
  # Tokens the target can never emit must never be emitted.
  assert counts[~support].sum() == 0, (name, counts, p)
  if support.sum() > 1:
    _, pvalue = stats.chisquare(counts[support], DRAWS * p[support])
    assert pvalue > SIGNIFICANCE, (name, counts, DRAWS * p, pvalue)


@pytest.mark.parametrize("index", range(22))
def test_emitted_token_has_target_distribution(index):
  name, p, q = _pq_pairs()[index]
  first, n = _emit_first(jax.random.PRNGKey(100 + index), jnp.asarray(p),
                         jnp.asarray(q))
  _assert_matches(first, p, name)
  # The acceptance rate is β = Σ min(p, q) (Lemma 3.3); 5 sigma.
  beta = np.minimum(p, q).sum()
  rate = float(np.mean(np.asarray(n)))
  assert abs(rate - beta) <= 5 * np.sqrt(beta * (1 - beta) / DRAWS) + 1e-9


def test_bonus_token_after_all_accepted_is_from_last_target_row():
  """When every guess is accepted the extra token comes from p_{γ+1}."""
  gamma = 2
  p = np.stack([_dist(1, 1, 1, 1, 1, 1)] * gamma + [_dist(5, 0, 1, 2, 0, 3)])
  q = np.full((gamma, V), 1.0 / V)  # q == p on the first rows: always accept
  rng = jax.random.PRNGKey(7)
  draw_rng, accept_rng = jax.random.split(rng)
  draft = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (DRAWS, gamma, V))
  tokens = sampling.sample_from(draw_rng, draft)
  n, extra = sampling.speculative_accept(
      accept_rng, jnp.broadcast_to(jnp.asarray(p, jnp.float32),
                                   (DRAWS, gamma + 1, V)), draft, tokens)
  assert np.all(np.asarray(n) == gamma)
  _assert_matches(extra, p[-1], "bonus")


@pytest.mark.parametrize("gamma,beta", [(1, 0.3), (3, 0.6), (7, 0.9), (4, 0.75)])
def test_tokens_per_call_follows_eq1(gamma, beta):
  """Mean n + 1 over iterations equals (1 - α^{γ+1}) / (1 - α) (Eq. 1)."""
  # p and q overlap in exactly β mass: p = β·u + (1-β)·a, q = β·u + (1-β)·b
  # with u, a, b on disjoint supports.
  p = np.array([beta / 2, beta / 2, 1 - beta, 0, 0, 0])
  q = np.array([beta / 2, beta / 2, 0, 1 - beta, 0, 0])
  assert np.isclose(np.minimum(p, q).sum(), beta)
  draws = 50_000
  rng = jax.random.PRNGKey(gamma)
  draw_rng, accept_rng = jax.random.split(rng)
  draft = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (draws, gamma, V))
  tokens = sampling.sample_from(draw_rng, draft)
  n, _ = sampling.speculative_accept(
      accept_rng, jnp.broadcast_to(jnp.asarray(p, jnp.float32),
                                   (draws, gamma + 1, V)), draft, tokens)
  per_call = np.asarray(n) + 1.0
  expected = (1 - beta ** (gamma + 1)) / (1 - beta)
  stderr = per_call.std() / np.sqrt(draws)
  assert abs(per_call.mean() - expected) < 5 * stderr, (
      per_call.mean(), expected, stderr)


def test_standardize_greedy_is_one_hot_argmax():
  logits = jnp.array([[0.1, 2.0, -1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
  probs = sampling.standardize(logits, temperature=0.0)
  np.testing.assert_array_equal(probs, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_standardize_temperature_top_k_top_p():
  logits = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
  np.testing.assert_allclose(sampling.standardize(logits, 1.0),
                             [0.4, 0.3, 0.2, 0.1], rtol=1e-6)
  # Temperature 0.5 squares then renormalizes.
  sq = np.array([0.16, 0.09, 0.04, 0.01])
  np.testing.assert_allclose(sampling.standardize(logits, 0.5), sq / sq.sum(),
                             rtol=1e-5)
  np.testing.assert_allclose(sampling.standardize(logits, 1.0, top_k=2),
                             [4 / 7, 3 / 7, 0, 0], rtol=1e-6)
  # Nucleus: 0.4 < 0.65, 0.4 + 0.3 >= 0.65 -> keep two tokens.
  np.testing.assert_allclose(sampling.standardize(logits, 1.0, top_p=0.65),
                             [4 / 7, 3 / 7, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(sampling.standardize(logits, 1.0, top_p=0.75),
                             [4 / 9, 3 / 9, 2 / 9, 0], rtol=1e-6)
  np.testing.assert_allclose(sampling.standardize(logits, 1.0, top_p=0.3),
                             [1, 0, 0, 0], rtol=1e-6)


@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
])
def test_standardize_rejects_bad_arguments(kwargs, name):
  with pytest.raises(ValueError, match=name):
    sampling.standardize(jnp.zeros((2, 4)), **kwargs)
