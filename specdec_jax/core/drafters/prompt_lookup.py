"""Prompt lookup (paper §3.6, "copy from the input"): guesses at ~0 cost.

The drafter finds the longest suffix of the generated tokens, of length
1..`max_ngram`, that occurs in the encoder input, and proposes the input
tokens that followed its first occurrence (up to γ of them, never past the
input's padding). Deterministic: q is one-hot (`draft_probs` None), so
Algorithm 1 stays exact at every temperature.

When nothing matches (or the match is followed by fewer than γ tokens) the
row's remaining slots are NO_GUESS: the loop keeps none of them and takes
the next token from the target, and when no row of the batch has a guess
the target makes a one-token call (`guesses.verify_call`), so an iteration
without a match costs one target step, like the target alone.
"""
from typing import Any, Tuple

import jax
import jax.numpy as jnp

from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.protocols import NO_GUESS
from specdec_jax.core.protocols import Drafter

Array = jax.Array


def lookup_start(inputs: Array, buffer: Array, length: Array,
                 max_ngram: int) -> Array:
  """Where in the input to copy from: [B] int32, -1 when nothing matches.

  Args:
    inputs: [B, S] int32 encoder input tokens (0 = padding).
    buffer: [B, T] int32 the loop's token buffer (generated tokens at
      positions 1..length).
    length: [B] int32 tokens generated.
    max_ngram: longest suffix tried (static).

  Returns:
    j + m for the longest suffix (length m <= max_ngram, of generated
    tokens only) found at inputs[j:j+m], the first such j, when it is
    followed by a real token; else -1.
  """
  batch, width = inputs.shape
  start = jnp.full((batch,), -1, jnp.int32)
  for m in range(1, max_ngram + 1):  # Longer matches override shorter ones.
    if width - m < 1:
      break
    positions = length[:, None] - m + 1 + jnp.arange(m)[None, :]
    suffix = jnp.take_along_axis(buffer, jnp.maximum(positions, 0), axis=1)
    # windows[b, j] = inputs[b, j:j+m] for the j followed by a position.
    windows = jnp.stack([inputs[:, i:width - m + i] for i in range(m)], axis=-1)
    match = (jnp.all(windows == suffix[:, None, :], axis=-1) &
             jnp.all(windows != 0, axis=-1) & (inputs[:, m:] != 0))
    found = jnp.any(match, axis=1) & (length >= m)
    start = jnp.where(found, jnp.argmax(match, axis=1) + m, start)
  return start.astype(jnp.int32)


@structs.dataclass
class PromptLookupDrafter(Drafter):
  """Copies from the encoder input (see the module docstring).

  Attributes:
    max_ngram: longest suffix of the generated tokens looked up (static).
  """
  vocab: int = structs.field(pytree_node=False)
  max_ngram: int = structs.field(pytree_node=False, default=3)

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @property
  def may_stop_early(self) -> bool:
    return True

  def init(self, encoder_input_tokens: Array, max_len: int,
           encoder_output: Any = None) -> Array:
    """The state is the input itself, [B, S] int32."""
    return jnp.asarray(encoder_input_tokens, jnp.int32)

  def propose(self, state: Array, buffer: Array, length: Array, rng: Array, *,
              gamma: int,
              method: sampling.SamplingMethod) -> Tuple[Array, Array, None]:
    del rng, method  # Deterministic.
    width = state.shape[1]
    start = lookup_start(state, buffer, length, self.max_ngram)
    index = start[:, None] + jnp.arange(gamma)[None, :]
    tokens = jnp.take_along_axis(state, jnp.clip(index, 0, width - 1), axis=1)
    # A prefix of the slots: stop at the input's end or padding.
    real = jnp.cumprod((start[:, None] >= 0) & (index < width) & (tokens != 0),
                       axis=1).astype(bool)
    return state, jnp.where(real, tokens, NO_GUESS), None

  def rollback(self, state: Array, length: Array) -> Array:
    return state
