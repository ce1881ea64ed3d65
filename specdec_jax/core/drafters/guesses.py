"""Partial guesses: rows that propose fewer than γ tokens (NO_GUESS slots).

A drafter that may stop early (adaptive γ, prompt lookup without a match)
fills a row's unused slots with `NO_GUESS`, always as a suffix. These
helpers are shared by the drafters that stop and by the loops that verify
their guesses.
"""
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import sampling
from specdec_jax.core.protocols import NO_GUESS

Array = jax.Array


def num_guesses(draft_tokens: Array) -> Array:
  """Real guesses per row: [B, γ] -> [B] int32 (NO_GUESS is a suffix)."""
  return jnp.sum(draft_tokens != NO_GUESS, axis=-1).astype(jnp.int32)


def feedable(tokens: Array) -> Array:
  """Tokens safe to feed a model or write to a buffer: NO_GUESS -> 0.

  A negative id would embed as garbage (or NaN) in the empty slot; the
  slot's output is never used, so any valid id does.
  """
  return jnp.maximum(tokens, 0)


def confidence(method: sampling.SamplingMethod, logits: Array, token: Array,
               probs: Optional[Array]) -> Array:
  """How sure a drafter is of the guess it just drew: [B] float32.

  The probability of the guess under the distribution it was drawn from
  (`probs` [B, V], the standardized q) when sampling; at temperature 0 (q is
  one-hot) the softmax of the raw logits [B, V] at the argmax, i.e. the
  model's own top probability. It depends only on the drafter's own draws,
  so stopping on it keeps Algorithm 1 exact.
  """
  if probs is not None and not method.is_greedy:
    return jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0]
  logits = logits.astype(jnp.float32)
  top = jnp.max(logits, axis=-1)
  return jnp.exp(top - jax.nn.logsumexp(logits, axis=-1))


def verify_call(model: Any, last_token: Array, draft_tokens: Array,
                state: Any) -> Tuple[Array, Any]:
  """The verification call over the γ+1 positions, skipping empty blocks.

  Args:
    model: anything with `decode_chunk` (a `decoding.Target`).
    last_token: [B] int32 the last known token of each row.
    draft_tokens: [B, γ] int32 guesses, NO_GUESS slots as a suffix.
    state: the model's state.

  Returns:
    (logits [B, γ+1, V], state advanced by γ+1, or by 1 when no row has a
    guess): that one-token call costs a decode step, not a (γ+1)-token call
    (~1.6x a step on CPU); its logits are padded with zeros at positions
    1..γ, which no row reads (each row's n is 0). The caller rolls the
    state back to the rows' new lengths either way.
  """
  gamma = draft_tokens.shape[1]

  def full(state):
    chunk = jnp.concatenate(
        [last_token[:, None], feedable(draft_tokens)], axis=1)
    return model.decode_chunk(chunk, state)

  def single(state):
    logits, state = model.decode_chunk(last_token[:, None], state)
    return jnp.pad(logits, ((0, 0), (0, gamma), (0, 0))), state

  return lax.cond(jnp.any(draft_tokens[:, 0] != NO_GUESS), full, single, state)
