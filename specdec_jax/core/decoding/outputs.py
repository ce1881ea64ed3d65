"""What the decode loops return: `DecodeOutput` (the target alone) and
`SpeculativeOutput` (speculative decoding, with Algorithm 1's statistics).

Both are pytrees (`flax.struct.dataclass`), so a jitted loop returns them;
`SpeculativeOutput` reads α̂, β and the tokens per target call from its
optional `SpeculativeStatistics` (`decoding.statistics`).
"""
from typing import Optional

import flax
import jax
import jax.numpy as jnp

from specdec_jax.core.decoding.statistics import SpeculativeStatistics

Array = jax.Array


@flax.struct.dataclass
class DecodeOutput:
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


@flax.struct.dataclass
class SpeculativeOutput:
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
  def gamma(self) -> int:
    return self.accepted_histogram.shape[-1] - 1

  @property
  def tokens_per_target_call(self) -> Array:
    """Mean generated tokens per target call over the batch (scalar)."""
    return jnp.sum(self.lengths) / jnp.maximum(jnp.sum(self.target_calls), 1)

  @property
  def alpha_hat(self) -> Array:
    """α̂ from acceptance counts: kept guesses / acceptance trials (scalar).

    An iteration whose n guesses were kept and followed by the target's
    token ran min(n + 1, γ) trials (it stops at the first rejection), n of
    them successes; one whose output ended inside its guesses (EOS or
    max_decode_length) counts only the trials and guesses that reached the
    output. The trials are `beta_count`.
    """
    hist = jnp.sum(self.accepted_histogram, axis=0)
    successes = jnp.sum(jnp.arange(hist.shape[0]) * hist)
    return successes / jnp.maximum(jnp.sum(self.beta_count), 1)

  @property
  def alpha_beta(self) -> Array:
    """α̂ as the mean β over visited positions (Corollary 3.6; scalar)."""
    return jnp.sum(self.beta_sum) / jnp.maximum(jnp.sum(self.beta_count), 1)

  def statistics(self) -> dict:
    """Host-side summary (Python numbers) for logs and metrics files."""
    return {
        "gamma": self.gamma,
        "tokens_generated": int(jnp.sum(self.lengths)),
        "target_calls": int(jnp.sum(self.target_calls)),
        "tokens_per_target_call": float(self.tokens_per_target_call),
        "alpha_hat": float(self.alpha_hat),
        "alpha_beta": float(self.alpha_beta),
        "acceptance_trials": int(jnp.sum(self.beta_count)),
        "accepted_histogram": [
            int(x) for x in jnp.sum(self.accepted_histogram, axis=0)
        ],
    }
