"""Optional statistics of the speculative loop (α̂, β, histogram, traces).

They are not part of the algorithm's state: `speculative_sample(...,
statistics=False)` carries none of these arrays through the loop. When on,
they count only what reached the output: guesses that came after an EOS,
or past max_decode_length, were computed but thrown away and are not
counted as accepted (nor are their acceptance tests counted as trials).
"""
from typing import Optional

import flax
import jax
import jax.numpy as jnp

from specdec_jax.core import sampling
from specdec_jax.core.protocols import Verdict

Array = jax.Array

# `trace_next_token` of an iteration whose output ended inside its accepted
# guesses (EOS or max_decode_length): no target token was emitted.
NO_TOKEN = -1


def guess_beta(verdict: Verdict, draft_tokens: Array,
               draft_probs: Optional[Array]) -> Array:
  """β_i = Σ_x min(p_i(x), q_i(x)) per guess (Definition 3.1): [B, γ].

  With one-hot q (draft_probs None) this is p_i(x_i); with one-hot p
  (greedy) it is q_i(argmax p_i), or [x_i == argmax p_i] when q is one-hot
  too.
  """
  gamma = draft_tokens.shape[1]
  if verdict.target_probs is None:
    assert verdict.target_tokens is not None  # Greedy: the rule's argmaxes.
    target_tokens = verdict.target_tokens[:, :gamma]
    if draft_probs is None:
      return (target_tokens == draft_tokens).astype(jnp.float32)
    return jnp.take_along_axis(draft_probs, target_tokens[..., None],
                               axis=-1)[..., 0]
  p = verdict.target_probs[:, :gamma]
  if draft_probs is None:
    return jnp.take_along_axis(p, draft_tokens[..., None].astype(jnp.int32),
                               axis=-1)[..., 0]
  return sampling.acceptance_beta(p, draft_probs)


@flax.struct.dataclass
class SpeculativeStatistics:
  """Per-row statistics of Algorithm 1 (B rows, γ guesses, T = max length).

  Attributes:
    target_calls: [B] int32 iterations (= target calls) while the row was
      active.
    accepted_histogram: [B, γ+1] int32; entry k counts the row's iterations
      whose output kept exactly k draft guesses.
    beta_sum: [B] float32 Σ β over the acceptance tests whose context is on
      the output (Corollary 3.6's α estimate is beta_sum / beta_count).
    beta_count: [B] int32 number of those tests: the acceptance trials
      (α̂ = kept guesses / beta_count).
    trace_draft_tokens: [B, T, γ] int32 the guesses of iteration i (row i of
      the trace; iterations past target_calls are 0).
    trace_num_accepted: [B, T] int32 guesses of iteration i kept in the
      output; -1 past target_calls (as every `CallStatistics` trace).
    trace_next_token: [B, T] int32 the target's token emitted after them,
      or NO_TOKEN (-1) when the output ended inside the guesses.
  """
  target_calls: Array
  accepted_histogram: Array
  beta_sum: Array
  beta_count: Array
  trace_draft_tokens: Array
  trace_num_accepted: Array
  trace_next_token: Array

  @classmethod
  def zeros(cls, batch: int, gamma: int,
            max_decode_length: int) -> "SpeculativeStatistics":

    def z(*shape):
      return jnp.zeros(shape, jnp.int32)

    return cls(
        target_calls=z(batch), accepted_histogram=z(batch, gamma + 1),
        beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=z(batch),
        trace_draft_tokens=z(batch, max_decode_length,
                             gamma), trace_num_accepted=jnp.full(
                                 (batch, max_decode_length), -1, jnp.int32),
        trace_next_token=z(batch, max_decode_length))

  def update(self, *, active: Array, draft_tokens: Array, verdict: Verdict,
             beta: Array, num_kept: Array,
             num_guesses: Optional[Array] = None) -> "SpeculativeStatistics":
    """Adds one iteration.

    Args:
      active: [B] bool rows still decoding at the start of the iteration.
      draft_tokens: [B, γ] int32 x_1..x_γ.
      verdict: the acceptance rule's decision (n, next token).
      beta: [B, γ] float32 β of each guess (`guess_beta`).
      num_kept: [B] int32 tokens this iteration added to the output, m in
        [1, n+1] for active rows (fewer than n+1 when an EOS or
        max_decode_length cut the block), 0 for the others.
      num_guesses: [B] int32 real guesses per row when a drafter may stop
        early (NO_GUESS slots are no trials); None: all γ.
    """
    batch, gamma = draft_tokens.shape
    rows = jnp.arange(batch)
    act = active.astype(jnp.int32)
    n = verdict.num_accepted
    kept_guesses = jnp.minimum(n, num_kept)
    next_kept = active & (num_kept > n)
    # Test i (1-based) ran with context x_1..x_{i-1}; it is on the output
    # iff i <= m. Kept guesses are its successes.
    trials = jnp.minimum(num_kept,
                         gamma if num_guesses is None else num_guesses)
    visited = jnp.arange(gamma)[None, :] < trials[:, None]
    slot = jnp.minimum(self.target_calls, self.trace_num_accepted.shape[1] - 1)

    def record(trace, value):
      old = trace[rows, slot]
      mask = active.reshape((batch,) + (1,) * (old.ndim - 1))
      return trace.at[rows, slot].set(jnp.where(mask, value, old))

    return SpeculativeStatistics(
        target_calls=self.target_calls + act,
        accepted_histogram=self.accepted_histogram.at[rows,
                                                      kept_guesses].add(act),
        beta_sum=self.beta_sum + jnp.sum(jnp.where(visited, beta, 0.0), axis=1),
        beta_count=self.beta_count + trials,
        trace_draft_tokens=record(self.trace_draft_tokens, draft_tokens),
        trace_num_accepted=record(self.trace_num_accepted,
                                  kept_guesses), trace_next_token=record(
                                      self.trace_next_token,
                                      jnp.where(next_kept, verdict.next_token,
                                                NO_TOKEN)))
