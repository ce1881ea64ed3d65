"""An n-gram drafter (paper §3.6): guesses from a corpus's counts, cost ~0.

`build_ngram_table` counts a corpus on the host once (token ids in the
model's vocabulary, e.g. the training targets) into an `NGramTable` of
arrays; `NGramDrafter` looks it up inside the compiled loop (no host
calls). Order n: the next token given the last n-1 tokens; 1 = unigram,
2 = bigram.

Smoothing (interpolated Witten–Bell): with N_c tokens and T_c distinct
tokens seen after context c,

  P(x | c) = a_c(x) + b_c · P(x | c'),   a_c(x) = n_c(x) / (N_c + T_c),

c' the context one token shorter, and the unigram level
P(x) = (n(x) + T / V) / (N + T) > 0 for every token. Only the
`max_continuations` most frequent x of each context are stored; b_c = 1 -
Σ stored a_c(x) gives the rest of the mass to the shorter context, so every
level is a distribution. An unseen context backs off entirely (b_c = 1).

Sequences start with the decoder start token 0 and are padded on the left
with more 0s, exactly as the loop's buffer (position 0 holds 0, earlier
positions read as 0), so the table knows how sentences begin. Contexts are
found by a sorted array of 32-bit hashes (`jnp.searchsorted`) and checked
against the stored context; of two contexts with the same hash only the
first is found (the other backs off, which costs only guess quality).
"""
from typing import Any, Iterable, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import carried_while
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.drafters import guesses
from specdec_jax.core.protocols import NO_GUESS
from specdec_jax.core.protocols import Drafter

Array = jax.Array

_HASH_MULTIPLIER = 1000003  # An odd prime; uint32 arithmetic wraps.


def context_hash(contexts):
  """uint32 hashes of contexts [..., k] (NumPy or JAX; the same values)."""
  xp = jnp if isinstance(contexts, jax.Array) else np
  h = xp.zeros(contexts.shape[:-1], xp.uint32)
  for j in range(contexts.shape[-1]):
    h = h * xp.uint32(_HASH_MULTIPLIER) + (contexts[..., j].astype(xp.uint32) +
                                           xp.uint32(1))
  return h


@structs.dataclass
class NGramLevel:
  """The contexts of one length k >= 1 and their stored continuations.

  C contexts sorted by hash, E stored (context, next token) pairs.

  Attributes:
    keys: [C] uint32 `context_hash` of each context, ascending.
    contexts: [C, k] int32 the contexts (to check a hash hit).
    offsets: [C + 1] int32; context i's continuations are entries
      offsets[i]..offsets[i+1]-1, most frequent first.
    tokens: [E] int32 continuation tokens x.
    probs: [E] float32 a_c(x).
    backoff: [C] float32 b_c.
    width: (static) most continuations stored for one context.
  """
  keys: Array
  contexts: Array
  offsets: Array
  tokens: Array
  probs: Array
  backoff: Array
  width: int = structs.field(pytree_node=False)

  def add_to(self, lower: Array, context: Array) -> Array:
    """a_c + b_c · lower for contexts [B, k] and lower [B, V] float32."""
    index = jnp.clip(jnp.searchsorted(self.keys, context_hash(context)), 0,
                     self.keys.shape[0] - 1)
    found = jnp.all(self.contexts[index] == context, axis=-1)
    start = self.offsets[index]
    count = jnp.where(found, self.offsets[index + 1] - start, 0)
    slots = start[:, None] + jnp.arange(self.width)[None, :]
    stored = jnp.arange(self.width)[None, :] < count[:, None]
    slots = jnp.clip(slots, 0, self.tokens.shape[0] - 1)
    weight = jnp.where(found, self.backoff[index], 1.0)
    rows = jnp.arange(context.shape[0])[:, None]
    return (lower * weight[:, None]).at[rows, self.tokens[slots]].add(
        jnp.where(stored, self.probs[slots], 0.0))


@structs.dataclass
class NGramTable:
  """A smoothed n-gram model as arrays (see the module docstring).

  Attributes:
    unigram: [V] float32 P(x), every entry > 0.
    levels: `NGramLevel`s for context lengths 1..n-1.
  """
  unigram: Array
  levels: Tuple[NGramLevel, ...]

  @property
  def order(self) -> int:
    return len(self.levels) + 1

  @property
  def vocab_size(self) -> int:
    return self.unigram.shape[0]

  def next_probs(self, context: Array) -> Array:
    """P(x | context) [B, V] float32 for contexts [B, n-1] int32."""
    probs = jnp.broadcast_to(self.unigram,
                             (context.shape[0],) + self.unigram.shape)
    for k, level in enumerate(self.levels, start=1):
      probs = level.add_to(probs, context[:, context.shape[1] - k:])
    return probs


def build_ngram_table(sequences: Iterable[Sequence[int]], vocab_size: int,
                      order: int, max_continuations: int = 32) -> NGramTable:
  """Counts token-id sequences into an `NGramTable` (on the host).

  Args:
    sequences: token ids in [0, vocab_size), one sequence per sentence,
      each ending with its EOS (it is counted as a next token).
    vocab_size: V, the model's vocabulary size.
    order: n >= 1 (1 = unigram, 2 = bigram).
    max_continuations: continuations stored per context (most frequent).

  Raises:
    ValueError: an id outside [0, vocab_size), no tokens, or a bad order.
  """
  if isinstance(order, bool) or not isinstance(order, int) or order < 1:
    raise ValueError(f"order must be an integer >= 1, got {order!r}.")
  if max_continuations < 1:
    raise ValueError("max_continuations must be >= 1, got "
                     f"{max_continuations!r}.")
  pad = order - 1
  padded, is_next = [], []
  for sequence in sequences:
    seq = np.asarray(sequence, np.int64).ravel()
    if seq.size == 0:
      continue
    bad = (seq < 0) | (seq >= vocab_size)
    if np.any(bad):
      raise ValueError(
          f"n-gram corpus: token id {int(seq[bad][0])} is outside the model's "
          f"vocabulary [0, {vocab_size}): the corpus was tokenized with "
          "another vocabulary.")
    # The start token 0 (position 0 of the loop's buffer), left-padded with
    # 0s so that every context of length <= n-1 lies inside the sentence.
    padded.append(np.concatenate([np.zeros(pad + 1, np.int64), seq]))
    is_next.append(
        np.concatenate([np.zeros(pad + 1, bool),
                        np.ones(seq.size, bool)]))
  if not padded:
    raise ValueError("n-gram corpus has no tokens.")
  flat = np.concatenate(padded)
  positions = np.flatnonzero(np.concatenate(is_next))
  following = flat[positions]
  counts = np.bincount(following, minlength=vocab_size).astype(np.float64)
  seen = float(np.count_nonzero(counts))
  unigram = (counts + seen / vocab_size) / (counts.sum() + seen)
  levels = tuple(
      _build_level(
          np.stack([flat[positions - k + j]
                    for j in range(k)], axis=1), following, max_continuations)
      for k in range(1, order))
  return NGramTable(unigram=jnp.asarray(unigram, jnp.float32), levels=levels)


def _build_level(contexts: np.ndarray, following: np.ndarray,
                 max_continuations: int) -> NGramLevel:
  """One level from every (context [N, k], next token [N]) occurrence."""
  k = contexts.shape[1]
  grams, counts = np.unique(np.concatenate([contexts, following[:, None]], 1),
                            axis=0, return_counts=True)
  # `grams` is sorted, so each context's continuations are contiguous.
  unique_contexts, first, context_of = np.unique(grams[:, :k], axis=0,
                                                 return_index=True,
                                                 return_inverse=True)
  context_of = context_of.ravel()
  total = np.add.reduceat(counts, first).astype(np.float64)  # N_c
  types = np.diff(np.append(first, len(grams)))  # T_c
  # Most frequent continuations first within each context; keep the top.
  order = np.lexsort((-counts, context_of))
  rank = np.arange(len(order)) - first[context_of[order]]
  order = order[rank < max_continuations]
  # Contexts sorted by hash (ties keep their lexicographic order).
  keys = context_hash(unique_contexts)
  by_hash = np.argsort(keys, kind="stable")
  new_index = np.empty_like(by_hash)
  new_index[by_hash] = np.arange(len(by_hash))
  stored_context = new_index[context_of[order]]
  resorted = np.argsort(stored_context, kind="stable")
  order, stored_context = order[resorted], stored_context[resorted]
  probs = counts[order] / (total + types)[context_of[order]]
  per_context = np.bincount(stored_context, minlength=len(unique_contexts))
  backoff = 1.0 - np.bincount(stored_context, weights=probs,
                              minlength=len(unique_contexts))
  return NGramLevel(
      keys=jnp.asarray(keys[by_hash], jnp.uint32),
      contexts=jnp.asarray(unique_contexts[by_hash], jnp.int32),
      offsets=jnp.asarray(np.concatenate([[0], np.cumsum(per_context)]),
                          jnp.int32),
      tokens=jnp.asarray(grams[order, k],
                         jnp.int32), probs=jnp.asarray(probs, jnp.float32),
      backoff=jnp.asarray(np.clip(backoff, 0.0, 1.0),
                          jnp.float32), width=int(per_context.max()))


@structs.dataclass
class NGramDrafter(Drafter):
  """Guesses by sampling its own smoothed n-gram q (argmax at T = 0).

  q_i = the sampling method's standardization of P(· | last n-1 tokens),
  the context including the guesses before it; q is returned at T > 0, so
  Algorithm 1 stays exact. No state (the context is read from the buffer).

  Adaptive γ: a row stops after a guess whose confidence
  (`guesses.confidence`) is below `confidence_threshold` (a traced scalar:
  0, the default, never stops; changing it does not recompile). The guesses
  run in a while loop (`carried_while`) that ends when every row has
  stopped; a guess costs a table lookup, so the loop is the same program
  either way.
  """
  table: NGramTable
  confidence_threshold: Any = 0.0

  @property
  def vocab_size(self) -> int:
    return self.table.vocab_size

  @property
  def may_stop_early(self) -> bool:
    return True

  def init(self, encoder_input_tokens: Array, max_len: int,
           encoder_output: Any = None) -> Tuple[()]:
    return ()

  def propose(self, state, buffer: Array, length: Array, rng: Array, *,
              gamma: int, method: sampling.SamplingMethod):
    batch = buffer.shape[0]
    k = self.table.order - 1
    # The last k known tokens; positions before 0 read as the start token 0.
    positions = length[:, None] - k + 1 + jnp.arange(k)[None, :]
    context = jnp.where(
        positions >= 0,
        jnp.take_along_axis(buffer, jnp.maximum(positions, 0), axis=1), 0)
    rngs = jax.random.split(rng, gamma)
    vocab = self.vocab_size
    threshold = self.confidence_threshold

    def cond(carry):
      i, _, _, _, stopped = carry
      return (i < gamma) & jnp.logical_not(jnp.all(stopped))

    def body(carry):
      i, context, tokens, probs, stopped = carry
      logits = jnp.log(self.table.next_probs(context))
      token, q = method.draw(rngs[i], logits)
      tokens = tokens.at[:, i].set(jnp.where(stopped, NO_GUESS, token))
      if probs is not None:
        probs = probs.at[:, i].set(jnp.where(stopped[:, None], 0.0, q))
      stopped = stopped | (guesses.confidence(method, logits, token, q)
                           < threshold)
      if k:
        context = jnp.concatenate([context[:, 1:], token[:, None]], axis=1)
      return i + 1, context, tokens, probs, stopped

    carry = (jnp.int32(0), context, jnp.full(
        (batch, gamma), NO_GUESS,
        jnp.int32), None if method.is_greedy else jnp.zeros(
            (batch, gamma, vocab), jnp.float32), jnp.zeros((batch,), bool))
    _, _, tokens, probs, _ = carried_while.while_loop(cond, body, carry)
    return state, tokens, probs

  def rollback(self, state, length: Array):
    return state
