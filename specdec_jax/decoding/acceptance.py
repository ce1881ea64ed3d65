"""Acceptance rules: how many of the γ guesses to keep, and the next token.

A rule is a pytree (`flax.struct.dataclass`) passed to the jitted loop as an
argument, so its fields may be traced (e.g. a lenience parameter, or the
benchmark's synthetic α) without recompiling. `ExactAcceptance` is
Algorithm 1: the only rule under which the output is distributed exactly
as the target's. Others (lenience, the timing-only rule in `benchmarking`)
subclass `AcceptanceRule` and may reuse `sampling.acceptance_mask`,
`sampling.leading_accepted` and `sampling.residual_sample`.
"""
import abc
from typing import NamedTuple, Optional

import flax
import jax
import jax.numpy as jnp

from specdec_jax import sampling

Array = jax.Array


class Verdict(NamedTuple):
  """What an acceptance rule decided for one iteration (B rows).

  Attributes:
    num_accepted: [B] int32, the paper's n in [0, γ]: guesses kept before
      the first rejection.
    next_token: [B] int32, the token emitted after them (the residual draw
      after a rejection, or the bonus token from p_{γ+1}).
    target_probs: [B, γ+1, V] float32 p_1..p_{γ+1} the guesses were tested
      against, or None when the method is greedy.
    target_tokens: [B, γ+1] int32 argmax of the target's logits when the
      method is greedy (p_i is its one-hot), else None.
  """
  num_accepted: Array
  next_token: Array
  target_probs: Optional[Array]
  target_tokens: Optional[Array]


class AcceptanceRule(abc.ABC):
  """Turns the target's logits at the γ+1 positions into a `Verdict`."""

  @abc.abstractmethod
  def __call__(self, rng: Array, target_logits: Array, draft_tokens: Array,
               draft_probs: Optional[Array],
               method: sampling.SamplingMethod) -> Verdict:
    """Decides one iteration.

    Args:
      rng: PRNG key for this iteration's acceptance.
      target_logits: [B, γ+1, V] the target's logits at the positions of
        the last known token and of x_1..x_γ (they give p_1..p_{γ+1}).
      draft_tokens: [B, γ] int32 guesses x_1..x_γ.
      draft_probs: [B, γ, V] float32 q_1..q_γ, or None (one-hot q_i at x_i).
      method: the sampling method (static).
    """


@flax.struct.dataclass
class ExactAcceptance(AcceptanceRule):
  """Algorithm 1: keep x_i while r_i < p_i(x_i) / q_i(x_i), then draw from
  norm(max(0, p_{n+1} - q_{n+1})) (or p_{γ+1} when all γ were kept).

  Outputs are distributed exactly as the target's under the same sampling
  method. With a greedy method p is one-hot, q drops out and the rule is
  `sampling.greedy_accept` on argmax tokens: no [B, γ+1, V] probabilities
  are built.
  """

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    if method.is_greedy:
      target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
      num_accepted, next_token = sampling.greedy_accept(target_tokens,
                                                        draft_tokens)
      return Verdict(num_accepted, next_token, None, target_tokens)
    target_probs = method.standardize(target_logits)
    num_accepted, next_token = sampling.speculative_accept(
        rng, target_probs, draft_probs, draft_tokens)
    return Verdict(num_accepted, next_token, target_probs, None)
