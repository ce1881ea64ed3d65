"""Exactness of the sampling math: standardize and Algorithm 1's acceptance.

Statistical tests use fixed seeds and chi-square goodness of fit at
significance 1e-3 (each can fail: a wrong residual, a missing guard or an
off-by-one in n moves the emitted distribution away from p).
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax.core import sampling

from decoding_helpers import reference_standardize as _reference_standardize

SIGNIFICANCE = 1e-3
DRAWS = 100_000
V = 6

# The sampling functions jitted, as the decoders run them: eagerly, each of
# their operations is a program of its own, compiled once per shape (tens of
# seconds on a cold compilation cache); jitted, one program per function and
# shapes. The arguments standardize checks are static, as are the sampling
# methods (frozen, hashable): the same constants eager calls see. The tests
# of standardize itself call it eagerly: their parameters share its eager
# programs, and one jitted program per (temperature, top_k, top_p) compiled
# slower.
_standardize = jax.jit(sampling.standardize,
                       static_argnames=("temperature", "top_k", "top_p"))
_greedy_accept = jax.jit(sampling.greedy_accept)
_speculative_accept = jax.jit(sampling.speculative_accept)


@functools.partial(jax.jit, static_argnums=0)
def _method_draw(method, rng, logits):
  return method.draw(rng, logits)


@functools.partial(jax.jit, static_argnums=0)
def _method_standardize(method, logits):
  return method.standardize(logits)


@functools.partial(jax.jit, static_argnames=("draws",))
def _accept_rows(rng, p, q, draws):
  """Algorithm 1 on `draws` rows of the same p [γ+1, V] and q [γ, V], with
  x ~ q drawn first: (n, extra token) per row."""
  gamma = q.shape[0]
  draw_rng, accept_rng = jax.random.split(rng)
  draft = jnp.broadcast_to(q, (draws, gamma, V))
  tokens = sampling.sample_from(draw_rng, draft)
  return sampling.speculative_accept(accept_rng,
                                     jnp.broadcast_to(p, (draws, gamma + 1, V)),
                                     draft, tokens)


@functools.partial(jax.jit, static_argnames=("draws",))
def _sample_rows(rng, probs, draws):
  """`sample_from` on `draws` copies of probs [R, V]: [draws, R] tokens."""
  return sampling.sample_from(rng, jnp.broadcast_to(probs,
                                                    (draws, *probs.shape)))


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
      ("q mass where p has none", _dist(0, 0, 1, 2, 3,
                                        4), _dist(4, 3, 2, 1, 0, 0)),
      ("p mass where q has none", _dist(4, 3, 2, 1, 0,
                                        0), _dist(0, 0, 1, 2, 3, 4)),
      ("near-equal", _dist(10, 10, 10, 10, 10,
                           11), _dist(11, 10, 10, 10, 10, 10)),
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
  n, extra = _accept_rows(jax.random.PRNGKey(7), np.asarray(p, np.float32),
                          np.asarray(q, np.float32), draws=DRAWS)
  assert np.all(np.asarray(n) == gamma)
  _assert_matches(extra, p[-1], "bonus")


@pytest.mark.parametrize("gamma,beta", [(1, 0.3), (3, 0.6), (7, 0.9),
                                        (4, 0.75)])
def test_tokens_per_call_follows_eq1(gamma, beta):
  """Mean n + 1 over iterations equals (1 - α^{γ+1}) / (1 - α) (Eq. 1)."""
  # p and q overlap in exactly β mass: p = β·u + (1-β)·a, q = β·u + (1-β)·b
  # with u, a, b on disjoint supports.
  p = np.array([beta / 2, beta / 2, 1 - beta, 0, 0, 0])
  q = np.array([beta / 2, beta / 2, 0, 1 - beta, 0, 0])
  assert np.isclose(np.minimum(p, q).sum(), beta)
  draws = 50_000
  n, _ = _accept_rows(jax.random.PRNGKey(gamma),
                      np.tile(np.asarray(p, np.float32), (gamma + 1, 1)),
                      np.tile(np.asarray(q, np.float32), (gamma, 1)),
                      draws=draws)
  per_call = np.asarray(n) + 1.0
  expected = (1 - beta**(gamma + 1)) / (1 - beta)
  stderr = per_call.std() / np.sqrt(draws)
  assert abs(per_call.mean() - expected) < 5 * stderr, (per_call.mean(),
                                                        expected, stderr)


def _one_hot(tokens, vocab):
  """`jax.nn.one_hot` in numpy: float32, a zero row for an index outside
  [0, vocab)."""
  return (np.asarray(tokens)[..., None] == np.arange(vocab)).astype(np.float32)


def test_greedy_accept_equals_speculative_accept_on_one_hot():
  """Temperature 0's shortcut is Algorithm 1 with one-hot p and q."""
  batch, gamma = 256, 4
  rng = np.random.default_rng(5)
  # Small vocabulary so guesses often match: every n in 0..γ occurs.
  target_tokens = rng.integers(0, 3, (batch, gamma + 1))
  draft_tokens = np.where(
      rng.random((batch, gamma)) < 0.7, target_tokens[:, :gamma],
      rng.integers(0, 3, (batch, gamma)))
  n, extra = _greedy_accept(jnp.asarray(target_tokens),
                            jnp.asarray(draft_tokens))
  ref_n, ref_extra = _speculative_accept(jax.random.PRNGKey(0),
                                         _one_hot(target_tokens, 3),
                                         _one_hot(draft_tokens, 3),
                                         jnp.asarray(draft_tokens))
  np.testing.assert_array_equal(n, ref_n)
  np.testing.assert_array_equal(extra, ref_extra)
  assert set(np.asarray(n).tolist()) == set(range(gamma + 1))


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


@pytest.mark.parametrize("top_k,top_p",
                         [(1, 1.0), (5, 1.0), (37, 1.0), (0, 0.3), (0, 0.9),
                          (0, 0.99), (20, 0.8)])
def test_sort_free_top_k_top_p_match_sorting(top_k, top_p):
  """The bitwise threshold search keeps exactly the tokens a sort keeps."""
  rng = np.random.default_rng(top_k * 100 + int(top_p * 100))
  # Rounded logits give ties (kept together at the threshold), negative and
  # positive values, and -inf entries (tokens already ruled out).
  logits = np.round(rng.normal(0, 3, size=(16, 300)), 1).astype(np.float32)
  logits[:, rng.choice(300, 10, replace=False)] = -np.inf
  got = np.asarray(sampling.standardize(jnp.asarray(logits), 0.7, top_k, top_p))
  want = _reference_standardize(logits, 0.7, top_k, top_p)
  np.testing.assert_array_equal(got > 0, want > 0)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_sample_from_draws_each_row_from_its_distribution():
  """Chi-square per row at 1e-3; tokens of probability 0 are never drawn.

  V = 300 is not a multiple of the sampler's block width, and the rows put
  mass only in the last (partial) block, only in the first token, on block
  edges, and on isolated tokens between whole blocks of zeros.
  """
  vocab, draws = 300, 60_000
  rng = np.random.default_rng(3)
  probs = np.zeros((6, vocab))
  probs[0] = rng.dirichlet(np.full(vocab, 0.3))
  probs[1, 290:] = rng.dirichlet(np.ones(10))
  probs[2, 0] = 1.0
  probs[3, [127, 128, 255, 256, 299]] = [0.1, 0.2, 0.3, 0.15, 0.25]
  probs[4, [5, 200]] = [1e-3, 1 - 1e-3]
  probs[5] = rng.dirichlet(np.full(vocab, 0.3))
  probs[5, rng.random(vocab) < 0.5] = 0.0
  probs /= probs.sum(axis=-1, keepdims=True)
  tokens = np.asarray(
      _sample_rows(jax.random.PRNGKey(11), np.asarray(probs, np.float32),
                   draws=draws))
  assert tokens.shape == (draws, probs.shape[0])
  for row, p in enumerate(probs):
    counts = np.bincount(tokens[:, row], minlength=vocab)
    assert counts[p == 0].sum() == 0, row
    support = p * draws >= 5  # pool cells too small for chi-square
    observed = np.append(counts[support], counts[~support].sum())
    expected = np.append(p[support], p[~support].sum()) * draws
    keep = expected > 0
    if keep.sum() > 1:
      assert stats.chisquare(observed[keep], expected[keep])[1] > SIGNIFICANCE


@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
])
def test_standardize_rejects_bad_arguments(kwargs, name):
  with pytest.raises(ValueError, match=name):
    sampling.standardize(jnp.zeros((2, 4)), **kwargs)


# ---------------------------------------------------------------------------
# A deterministic drafter: draft_probs None (one-hot q at the guess).
# ---------------------------------------------------------------------------
@jax.jit
def _emit_first_one_hot_q(rng, p, guess):
  """Guess x = `guess` with no q (γ = 1); returns the first emitted token
  and n."""
  tokens = jnp.full((DRAWS, 1), guess, jnp.int32)
  target = jnp.broadcast_to(p, (DRAWS, 2, V)).astype(jnp.float32)
  n, extra = sampling.speculative_accept(rng, target, None, tokens)
  return jnp.where(n > 0, tokens[:, 0], extra), n


@pytest.mark.parametrize("index", [0, 2, 3, 4, 9, 12, 15])
def test_one_hot_q_without_probs_emits_target_distribution(index):
  """With q omitted (a deterministic guess x), the first emitted token is
  still distributed as p, for the most and the least likely x, and x is
  kept with probability p(x) (= β of one-hot q)."""
  name, p, _ = _pq_pairs()[index]
  for guess in (int(np.argmax(p)), int(np.argmin(p))):
    first, n = _emit_first_one_hot_q(
        jax.random.PRNGKey(300 + 10 * index + guess), jnp.asarray(p), guess)
    _assert_matches(first, p, f"{name} / one-hot q at {guess}")
    rate, beta = float(np.mean(np.asarray(n))), p[guess]
    assert abs(rate - beta) <= 5 * np.sqrt(beta * (1 - beta) / DRAWS) + 1e-9


def test_none_draft_probs_equals_explicit_one_hot_q():
  """draft_probs=None is exactly Algorithm 1 with one-hot q: same draws."""
  rng = np.random.default_rng(8)
  batch, gamma = 512, 3
  p = rng.dirichlet(np.full(V, 0.7), size=(batch, gamma + 1))
  tokens = rng.integers(0, V, (batch, gamma))
  key = jax.random.PRNGKey(4)
  got = _speculative_accept(key, jnp.asarray(p, jnp.float32), None,
                            jnp.asarray(tokens))
  want = _speculative_accept(key, jnp.asarray(p, jnp.float32),
                             _one_hot(tokens, V), jnp.asarray(tokens))
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
  assert len(set(np.asarray(got[0]).tolist())) == gamma + 1


# ---------------------------------------------------------------------------
# Sampling methods: frozen, hashable, validated once.
# ---------------------------------------------------------------------------
def test_sampling_methods_are_static_values():
  a = sampling.Sampling(0.7, top_p=0.9)
  b = sampling.Sampling(temperature=np.float64(0.7), top_k=np.int64(0),
                        top_p=0.9)
  assert a == b and hash(a) == hash(b) and type(b.top_k) is int
  assert hash(sampling.Sampling(1)) == hash(sampling.Sampling(1.0))
  assert isinstance(sampling.Sampling(1).temperature, float)
  assert sampling.Greedy() == sampling.Greedy()
  assert sampling.Greedy().is_greedy and not a.is_greedy
  with pytest.raises(dataclasses.FrozenInstanceError):
    a.temperature = 1.0  # pytype: disable=not-writable
  assert sampling.make_method(0.0, 5, 0.5) == sampling.Greedy()
  assert sampling.make_method(0.7, 0, 0.9) == a
  # Used as a static jit argument: one compilation per distinct method.
  calls = []

  @functools.partial(jax.jit, static_argnames=("method",))
  def probs(logits, method):
    calls.append(method)
    return method.standardize(logits)

  logits = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
  probs(logits, method=sampling.Sampling(1.0, top_p=0.65))
  probs(logits, method=sampling.Sampling(1.0, top_p=0.65))
  np.testing.assert_allclose(
      probs(logits, method=sampling.Sampling(1.0, top_p=0.65)),
      sampling.standardize(logits, 1.0, 0, 0.65), rtol=1e-6)
  assert len(calls) == 1


def test_method_draw_and_standardize():
  logits = jnp.array([[0.1, 2.0, -1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
  tokens, probs = _method_draw(sampling.Greedy(), jax.random.PRNGKey(0), logits)
  np.testing.assert_array_equal(tokens, [1, 0])
  assert probs is None
  np.testing.assert_array_equal(_method_standardize(sampling.Greedy(), logits),
                                [[0, 1, 0, 0], [1, 0, 0, 0]])
  method = sampling.Sampling(0.5, top_k=2)
  tokens, probs = _method_draw(method, jax.random.PRNGKey(0), logits)
  np.testing.assert_allclose(probs, _standardize(logits, 0.5, 2), rtol=1e-6)
  assert np.all(np.asarray(probs)[[0, 1], np.asarray(tokens)] > 0)


@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=0.0), "Greedy"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature="1"), "temperature"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_k=True), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
])
def test_sampling_method_validated_at_construction(kwargs, name):
  with pytest.raises(ValueError, match=name):
    sampling.Sampling(**kwargs)
