"""Decoder-level exactness checks shared by the drafter tests.

Two scripted cases (no neural network; `decoding_helpers.ScriptedTarget`
logits depend on the position and on the token fed, so the target's
distribution is context-dependent):

* `greedy_case()`: 4 rows, V = 8, with an EOS id that ends one row early
  and another late, encoder inputs that contain most of each row's greedy
  output (prompt lookup finds matches, not always), a corpus of those
  outputs with noise (an n-gram table guesses some tokens right), and a
  scripted draft model close to the target.
* `distribution_case()`: one context-dependent target (V = 5) whose
  distribution over the first STEPS tokens is enumerated exactly.

`check_greedy_identity` and `check_distribution` run a drafter through
`decoding.speculative_sample` and assert exactness; both also assert that
guesses were both kept and rejected, so a drafter that never guesses (or
a test that never rejects) cannot pass vacuously.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling

from decoding_helpers import ScriptedTarget
from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import scripted_next_probs
from decoding_helpers import sequence_distribution

SIGNIFICANCE = 1e-3
GAMMAS = (1, 3, 7)
GREEDY_V = 8
MAX_LEN = 12
DIST_V = 5
STEPS = 3
SAMPLES = 20_000
EOS = 1
# T > 0, then with top-k and top-p together (top-k alone and top-p alone are
# covered for the loop in test_decoding.py; here the drafter is under test).
METHODS = (sampling.Sampling(1.0), sampling.Sampling(0.8, top_k=3, top_p=0.9))
METHOD_IDS = ("T1", "T0.8-k3-p0.9")


def scripted(rs, rows, length, vocab, bigram_scale=1.0):
  return ScriptedTarget(
      position_logits=jnp.asarray(rs.randn(rows, length, vocab), jnp.float32),
      bigram=jnp.asarray(bigram_scale * rs.randn(vocab, vocab), jnp.float32),
      expected_fed=-jnp.ones((rows, length), jnp.int32))


def noisy_copy(rs, model, scale):
  """A draft model: the scripted target plus noise on its logits."""
  return model.replace(
      position_logits=model.position_logits +
      scale * jnp.asarray(rs.randn(*model.position_logits.shape), jnp.float32),
      bigram=model.bigram +
      scale * jnp.asarray(rs.randn(*model.bigram.shape), jnp.float32))


@functools.lru_cache(maxsize=None)
def greedy_case():
  """(target, draft_model, inputs [4, S], eos, corpus, baseline tokens)."""
  rs = np.random.RandomState(7)
  target = scripted(rs, 4, MAX_LEN + 12, GREEDY_V, bigram_scale=2.0)
  free = np.asarray(
      decoding.temperature_sample(target, np.full((4, 2), 3, np.int32),
                                  jax.random.PRNGKey(0),
                                  max_decode_length=MAX_LEN, eos_id=-1).tokens)

  # An EOS id one row emits early and another late (or never).
  def first(tok, row):
    hits = np.flatnonzero(free[row] == tok)
    return hits[0] if hits.size else MAX_LEN

  eos = next(tok for tok in range(1, GREEDY_V)
             if min(first(tok, r) for r in range(4)) <= 3 and max(
                 first(tok, r) for r in range(4)) >= MAX_LEN - 3)
  # Inputs: each row's free-running output with every 4th token replaced,
  # so prompt lookup matches often but not always (0 = padding: use 2).
  inputs = np.where(free == 0, 2, free).astype(np.int32)
  inputs[:, 3::4] = 2 + (inputs[:, 3::4] - 1) % (GREEDY_V - 2)
  corpus = [list(row) + [eos] for row in free] + [
      list(rs.randint(2, GREEDY_V, size=8)) + [eos] for _ in range(8)
  ]
  draft = noisy_copy(rs, target, 0.6)
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=MAX_LEN, eos_id=eos)
  lengths = np.asarray(base.lengths)
  assert lengths.min() <= 4 and lengths.max() >= MAX_LEN - 3, lengths
  return target, draft, inputs, eos, corpus, np.asarray(base.tokens)


def one_row(model, row):
  """A scripted model restricted to one row of the batch (batch 1)."""
  return model.replace(position_logits=model.position_logits[row:row + 1],
                       expected_fed=model.expected_fed[row:row + 1])


def check_greedy_identity(make_drafter, gamma, row=None, statistics=True):
  """Greedy speculative == greedy target alone, token for token.

  make_drafter(draft_model, corpus) builds the drafter; row: decode that
  row alone (batch 1) instead of the batch of 4; statistics=False: the
  loop without statistics (a smaller program, compiled faster; tokens only).
  """
  target, draft, inputs, eos, corpus, base = greedy_case()
  if row is not None:
    target, draft = one_row(target, row), one_row(draft, row)
    inputs, base = inputs[row:row + 1], base[row:row + 1]
  spec = decoding.speculative_sample(target, make_drafter(draft,
                                                          corpus), inputs,
                                     jax.random.PRNGKey(1), gamma=gamma,
                                     max_decode_length=MAX_LEN, eos_id=eos,
                                     statistics=statistics)
  np.testing.assert_array_equal(spec.tokens, base)
  return spec


@functools.lru_cache(maxsize=None)
def distribution_case():
  """(target, draft_model, inputs [1, S], corpus): V = DIST_V."""
  rs = np.random.RandomState(1)
  target = scripted(rs, 1, 8, DIST_V)
  draft = noisy_copy(rs, target, 1.0)
  inputs = np.array([[2, 3, 4, 2, 3, 0, 4, 4, 1]], np.int32)
  corpus = [
      list(rs.randint(2, DIST_V, size=rs.randint(1, 5))) + [EOS]
      for _ in range(30)
  ]
  return target, draft, inputs, corpus


def check_distribution(make_drafter, method, gamma, seed=0):
  """The first STEPS tokens follow the target's enumerated distribution.

  make_drafter(draft_model, corpus) builds the drafter.
  """
  target, draft, inputs, corpus = distribution_case()
  drafter = make_drafter(draft, corpus)
  exact = sequence_distribution(
      scripted_next_probs(target,
                          (method.temperature, method.top_k, method.top_p)),
      DIST_V, STEPS, EOS)
  assert abs(sum(exact.values()) - 1.0) < 1e-9 and len(exact) >= 8
  out = decoding.speculative_sample(target, drafter,
                                    np.repeat(inputs, SAMPLES, axis=0),
                                    jax.random.PRNGKey(seed), gamma=gamma,
                                    max_decode_length=STEPS, method=method,
                                    eos_id=EOS)
  observed, expected = count_sequences(out.tokens, exact)
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE
  stats = out.statistics()
  assert 0.02 < stats["alpha_hat"] < 0.98, stats  # Kept and rejected.
  return out
