"""What the decode loops return, and the one statistics interface they share.

Every output (`DecodeOutput`, `SpeculativeOutput`, the tree's and the beam
decoders') is a pytree (`structs.dataclass`), so a jitted loop returns
it, and a `CallStatistics`: per-row `lengths`, `target_calls`, the
histogram of kept guesses and the per-call trace, from which it gives
tokens per target call, α̂ and a host-side `statistics()` summary with the
same keys for every mode. The target alone is the case γ = 0: every call
kept no guess.
"""
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp

from specdec_jax.core import structs
from specdec_jax.core.decoding.statistics import SpeculativeStatistics

Array = jax.Array


class CallStatistics:
  """The statistics every decode output gives (a mixin).

  A subclass has `lengths` [B] int32 (tokens per row), `target_calls` [B]
  int32 (target calls while the row was active), `accepted_histogram`
  [B, γ+1] int32 (entry n: the row's calls that kept n guesses) and
  `trace_num_accepted` [B, T] int32 (entry i: the guesses the row's
  (i+1)-th call kept; -1 after its last call).
  """
  lengths: Array
  target_calls: Array
  accepted_histogram: Array
  trace_num_accepted: Array

  @property
  def gamma(self) -> int:
    """γ, the guesses a call can keep (0: the target alone)."""
    return self.accepted_histogram.shape[-1] - 1

  @property
  def tokens_per_target_call(self) -> Array:
    """Mean generated tokens per target call over the batch (scalar)."""
    return jnp.sum(self.lengths) / jnp.maximum(jnp.sum(self.target_calls), 1)

  @property
  def acceptance_trials(self) -> Array:
    """Acceptance tests run (scalar): a call that kept n < γ guesses tested
    n + 1 of them, one that kept all γ tested γ."""
    hist = jnp.sum(self.accepted_histogram, axis=0)
    n = jnp.arange(hist.shape[0])
    return jnp.sum(jnp.minimum(n + 1, self.gamma) * hist)

  @property
  def alpha_hat(self) -> Array:
    """α̂: kept guesses / acceptance trials (scalar; 0 when no guess was
    made)."""
    hist = jnp.sum(self.accepted_histogram, axis=0)
    successes = jnp.sum(jnp.arange(hist.shape[0]) * hist)
    return successes / jnp.maximum(self.acceptance_trials, 1)

  def statistics(self) -> Dict[str, Any]:
    """Host-side summary (Python numbers) for logs and metrics files; the
    same keys for every output (`alpha_hat` None when γ = 0)."""
    return {
        "gamma": self.gamma,
        "tokens_generated": int(jnp.sum(self.lengths)),
        "target_calls": int(jnp.sum(self.target_calls)),
        "tokens_per_target_call": float(self.tokens_per_target_call),
        "alpha_hat": float(self.alpha_hat) if self.gamma else None,
        "acceptance_trials": int(self.acceptance_trials),
        "accepted_histogram": [
            int(x) for x in jnp.sum(self.accepted_histogram, axis=0)
        ],
    }


class OneTokenPerCall(CallStatistics):
  """`CallStatistics` of a decoder that guesses nothing (γ = 0): each call
  is one step, in histogram column 0."""
  tokens: Array

  # Derived here, fields elsewhere: read-only by design.
  @property
  def accepted_histogram(self) -> Array:  # type: ignore[override]
    """[B, 1] int32: every call kept 0 guesses."""
    return self.target_calls[:, None]

  @property
  def trace_num_accepted(self) -> Array:  # type: ignore[override]
    """[B, T] int32: 0 for each of the row's calls, -1 after the last."""
    steps = jnp.arange(self.tokens.shape[1])
    return jnp.where(steps[None, :] < self.target_calls[:, None], 0,
                     -1).astype(jnp.int32)


@structs.dataclass
class DecodeOutput(OneTokenPerCall):
  """Result of `temperature_sample`.

  Attributes:
    tokens: [B, max_decode_length] int32 generated tokens, EOS included, 0
      after EOS (T5X's convention).
    lengths: [B] int32 number of generated tokens (EOS included).
    target_calls: [B] int32 target decoder calls while the row was active
      (one per generated token).
  """
  tokens: Array
  lengths: Array
  target_calls: Array


@structs.dataclass
class SpeculativeOutput(CallStatistics):
  """Result of `speculative_sample`, with Algorithm 1's statistics.

  Attributes:
    tokens: [B, max_decode_length] int32, as in `DecodeOutput`.
    lengths: [B] int32 number of generated tokens.
    stats: `SpeculativeStatistics` (per-row target calls, histogram of kept
      guesses, β, traces), or None when decoded with statistics=False. Its
      fields are also readable here (`out.target_calls`,
      `out.accepted_histogram`, ...).
  """
  tokens: Array
  lengths: Array
  stats: Optional[SpeculativeStatistics] = None

  def _stats(self) -> SpeculativeStatistics:
    if self.stats is None:
      raise ValueError(
          "This output was decoded with statistics=False: it has tokens and "
          "lengths only. Pass statistics=True for target calls, α and traces.")
    return self.stats

  # Fields of `SpeculativeStatistics`, for convenience.
  target_calls = property(lambda self: self._stats().target_calls)
  accepted_histogram = property(lambda self: self._stats().accepted_histogram)
  beta_sum = property(lambda self: self._stats().beta_sum)
  beta_count = property(lambda self: self._stats().beta_count)
  trace_draft_tokens = property(lambda self: self._stats().trace_draft_tokens)
  trace_num_accepted = property(lambda self: self._stats().trace_num_accepted)
  trace_next_token = property(lambda self: self._stats().trace_next_token)

  @property
  def acceptance_trials(self) -> Array:
    """Acceptance tests whose guesses reached the output (scalar): as
    `CallStatistics`', but an iteration whose output ended inside its
    guesses (EOS or max_decode_length) counts only the trials that reached
    the output. They are `beta_count`."""
    return jnp.sum(self.beta_count)

  @property
  def alpha_beta(self) -> Array:
    """α̂ as the mean β over visited positions (Corollary 3.6; scalar)."""
    return jnp.sum(self.beta_sum) / jnp.maximum(jnp.sum(self.beta_count), 1)

  def statistics(self) -> Dict[str, Any]:
    """`CallStatistics.statistics`, plus β's estimate of α."""
    return dict(super().statistics(), alpha_beta=float(self.alpha_beta))
