"""Optional statistics of the speculative loop (α̂, β, histogram, traces).

They are not part of the algorithm's state: `speculative_sample(...,
statistics=False)` carries none of these arrays through the loop. When on,
they count only what reached the output: guesses that came after an EOS,
or past max_decode_length, were computed but thrown away and are not
counted as accepted (nor are their acceptance tests counted as trials).
The loop carries a `StatisticsRecord` (one in-place write an iteration) and
returns the `SpeculativeStatistics` counted from it.
"""
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import sampling
from specdec_jax.core import structs
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


@structs.dataclass
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


# `StatisticsRecord.records`' columns after the γ guesses.
_KEPT, _NEXT, _TRIALS, _BETA = 0, 1, 2, 3
_COLUMNS = 4


def _no_call(gamma: int) -> Array:
  """[γ+4] int32 the record of an iteration a row did not run: the traces'
  values past target_calls (0 guesses, -1 kept, 0 next token, 0 trials,
  β sum +0.0)."""
  return jnp.array((0,) * gamma + (-1, 0, 0, 0), jnp.int32)


@structs.dataclass
class StatisticsRecord:
  """What the loop carries for `SpeculativeStatistics` (B rows, T = max
  length): one record per iteration, written by one in-place update.

  On a GPU every kernel of the loop body costs ~2 µs of launch an
  iteration: counters, a running β sum, a histogram and three traces
  scattered at each row's own slot were 9 kernels. Here an iteration
  writes one [B, 1, γ+4] slice at the iteration number (an active row's
  call count): one kernel (plus β's own reduction over the vocabulary when
  sampling with the draft's q). The counts and β's sum are taken from the
  records once, after the loop (`finish`).

  Attributes:
    records: [B, T, γ+4] int32; row b's record i is iteration i's guesses
      (γ columns), then its kept guesses, the target's next token, its
      acceptance trials and the sum of their β (float32 bits); an
      iteration the row did not run holds `_no_call` (the traces' values
      past target_calls).
  """
  records: Array

  @classmethod
  def zeros(cls, batch: int, gamma: int,
            max_decode_length: int) -> "StatisticsRecord":
    return cls(
        records=jnp.broadcast_to(_no_call(gamma), (batch, max_decode_length,
                                                   gamma + _COLUMNS)))

  def update(self, *, iteration: Array, active: Array, draft_tokens: Array,
             verdict: Verdict, beta: Array, num_kept: Array,
             num_guesses: Optional[Array] = None) -> "StatisticsRecord":
    """Adds one iteration.

    Args:
      iteration: [] int32 the loop's iteration number: the call count of
        every active row, since rows start active and stay done once done
        (the loop runs at most T iterations: each adds a token to every
        active row).
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
    gamma = draft_tokens.shape[1]
    n = verdict.num_accepted
    # Test i (1-based) ran with context x_1..x_{i-1}; it is on the output
    # iff i <= m. Kept guesses are its successes.
    trials = jnp.minimum(num_kept,
                         gamma if num_guesses is None else num_guesses)
    visited = jnp.arange(gamma)[None, :] < trials[:, None]
    record = jnp.concatenate(
        [  # Columns: guesses, _KEPT, _NEXT, _TRIALS, _BETA.
            draft_tokens,
            jnp.minimum(n, num_kept)[:, None],
            jnp.where(num_kept > n, verdict.next_token, NO_TOKEN)[:, None],
            trials[:, None],
            lax.bitcast_convert_type(
                jnp.sum(jnp.where(visited, beta, 0.0), axis=1),
                jnp.int32)[:, None],
        ],
        axis=1).astype(jnp.int32)
    # A done row writes the no-call values its slot already holds: its
    # calls ended before this iteration.
    record = jnp.where(active[:, None], record, _no_call(gamma))
    slot = jnp.minimum(iteration, self.records.shape[1] - 1)
    records = lax.dynamic_update_slice(self.records, record[:, None, :],
                                       (0, slot, 0))
    return StatisticsRecord(records=records)

  def finish(self) -> SpeculativeStatistics:
    """The statistics, counted from the records (once, after the loop)."""
    gamma = self.records.shape[2] - _COLUMNS
    sums = lax.bitcast_convert_type(self.records[:, :, gamma + _BETA],
                                    jnp.float32)
    # Added in iteration order, one by one (as a running sum would: a
    # reduction may pair them otherwise, and round differently); the
    # iterations a row did not run add +0.0, which changes no sum.
    beta_sum = jnp.zeros(sums.shape[:1], jnp.float32)
    for i in range(sums.shape[1]):
      beta_sum = beta_sum + sums[:, i]
    kept = self.records[:, :, gamma + _KEPT]
    histogram = jnp.sum(kept[:, :, None] == jnp.arange(gamma + 1), axis=1)
    return SpeculativeStatistics(
        target_calls=jnp.sum(kept >= 0, axis=1, dtype=jnp.int32),
        accepted_histogram=histogram.astype(jnp.int32), beta_sum=beta_sum,
        beta_count=jnp.sum(self.records[:, :, gamma + _TRIALS], axis=1,
                           dtype=jnp.int32),
        trace_draft_tokens=self.records[:, :, :gamma], trace_num_accepted=kept,
        trace_next_token=self.records[:, :, gamma + _NEXT])
