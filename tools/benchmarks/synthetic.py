"""Synthetic acceptance at a chosen α: for timing only, never exact.

The benchmark prices Algorithm 1 at acceptance rates it picks, with random
weights whose real α would be ~0. `SyntheticAcceptance` runs the exact rule
(so that its cost is measured) and then replaces the number of accepted
guesses by the leading successes of γ Bernoulli(α) trials. The emitted tokens
are then NOT samples of the target's distribution; `decoding` never uses this
rule unless it is passed as the loop's acceptance rule, as the benchmark does.
"""
import functools
from typing import Any, Tuple

import jax
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core import structs

Array = jax.Array


def synthetic_accept(rng: Array, shape: Tuple[int, int], *, alpha) -> Array:
  """`SyntheticAcceptance`'s mask: each guess kept with probability alpha.

  n = leading successes of γ independent Bernoulli(alpha) trials (u < alpha
  with u ~ U[0, 1): alpha = 1 accepts all, alpha = 0 none).
  For timing only: the output is NOT the target's distribution.

  Args:
    rng: PRNG key.
    shape: (B, γ).
    alpha: acceptance probability (Python float or traced scalar).

  Returns:
    [B, γ] bool.
  """
  return jax.random.uniform(rng, shape) < alpha


@structs.dataclass
class SyntheticAcceptance(decoding.AcceptanceRule):
  """An acceptance rule at a chosen α, for timing only (not exact).

  Runs Algorithm 1 (`decoding.ExactAcceptance`: probabilities, the accept
  test, the residual or argmax token) so that its cost is measured, then
  replaces its n by the leading successes of `synthetic_accept`; the extra
  token stays the one drawn at the exact n (its value does not matter
  here). `alpha` is a traced leaf: one compilation serves every α.
  """
  alpha: Any

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    verdict = decoding.ExactAcceptance()(rng, target_logits, draft_tokens,
                                         draft_probs, method)
    mask = synthetic_accept(jax.random.fold_in(rng, 1), draft_tokens.shape,
                            alpha=self.alpha)
    return verdict._replace(num_accepted=sampling.leading_accepted(mask))


def expected_accepted(alpha: float, gamma: int) -> Tuple[float, float]:
  """Mean and variance of n = leading successes of γ Bernoulli(alpha) trials."""
  k = np.arange(gamma + 1)
  prob = alpha**k * np.where(k < gamma, 1.0 - alpha, 1.0)
  mean = float(np.sum(k * prob))
  return mean, float(np.sum((k - mean)**2 * prob))


@functools.partial(jax.jit, static_argnames=("gamma", "max_decode_length"))
def speculative_loop(target, drafter, encoder_input_tokens, rng, alpha, eos_id,
                     *, gamma, max_decode_length, method):
  """`decoding.speculative_loop` with `SyntheticAcceptance(alpha)`, jitted.

  alpha and the method's values are traced: one compilation per γ serves
  every α and temperature.
  """
  return decoding.speculative_loop(target, drafter, encoder_input_tokens, rng,
                                   eos_id, gamma=gamma,
                                   max_decode_length=max_decode_length,
                                   method=method,
                                   acceptance=SyntheticAcceptance(alpha),
                                   statistics=True)
