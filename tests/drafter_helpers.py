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

`check_greedy_identity` runs a drafter through `decoding.speculative_sample`
on the greedy case and asserts the target's tokens; `distribution_pvalue`
is the chi-square p-value of its draws against the enumerated
distribution (test_drafter_contract.py asserts both, and that guesses were
kept and rejected, for every drafter).

`shared_draft`: a shared-encoder draft for a T5 target (a decoder reading
the target's encoder output).
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.models import T5Model

from decoding_helpers import ScriptedTarget
from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import scripted_next_probs
from decoding_helpers import sequence_distribution

SIGNIFICANCE = 1e-3
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


class Baseline(NamedTuple):
  """The target's greedy output alone: tokens [B, L], lengths [B]."""
  tokens: np.ndarray
  lengths: np.ndarray


@functools.lru_cache(maxsize=None)
def greedy_case():
  """(target, draft_model, inputs [4, S], eos, corpus, `Baseline`)."""
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
  return target, draft, inputs, eos, corpus, Baseline(np.asarray(base.tokens),
                                                      lengths)


def one_row(model, row):
  """A scripted model restricted to one row of the batch (batch 1)."""
  return model.replace(position_logits=model.position_logits[row:row + 1],
                       expected_fed=model.expected_fed[row:row + 1])


def check_greedy_identity(make_drafter, gamma):
  """Greedy speculative == greedy target alone, token for token and in
  length, on the batch of 4; make_drafter(draft_model, corpus) builds the
  drafter."""
  target, draft, inputs, eos, corpus, base = greedy_case()
  spec = decoding.speculative_sample(target, make_drafter(draft,
                                                          corpus), inputs,
                                     jax.random.PRNGKey(1), gamma=gamma,
                                     max_decode_length=MAX_LEN, eos_id=eos)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)
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


def distribution_pvalue(make_drafter, method, gamma, seed=0, acceptance=None):
  """(chi-square p-value, output): the first STEPS tokens of SAMPLES
  decodes against the target's enumerated distribution.

  make_drafter(draft_model, corpus) builds the drafter; acceptance: a rule
  other than Algorithm 1 (one known to be wrong: its impossible rows are
  left out and the rest compared).
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
                                    eos_id=EOS, acceptance=acceptance)
  observed, expected = count_sequences(out.tokens, exact,
                                       impossible_ok=acceptance is not None)
  return chisquare_pvalue(observed, expected), out


def shared_draft(target: T5Model, scale: float, seed: int) -> T5Model:
  """A decoder without an encoder: the target's decoder (and embedding)
  with Gaussian noise, reading the target's encoder output (a draft that
  agrees with the target often but not always)."""
  base = target.unpacked().params["params"]
  own = {"token_embedder": base["token_embedder"], "decoder": base["decoder"]}
  leaves, treedef = jax.tree_util.tree_flatten(own)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [
      x + scale * jnp.std(x) * jax.random.normal(k, x.shape)
      for x, k in zip(leaves, keys)
  ]
  config = target.config.replace(num_encoder_layers=0,
                                 encoder_width=target.config.emb_dim)
  return T5Model(config, {
      "params": jax.tree_util.tree_unflatten(treedef, noisy)
  }).prepared_for_decoding()
