"""Acceptance rules: how many of the γ guesses to keep, and the next token.

A rule is a pytree (`structs.dataclass`) passed to the jitted loop as an
argument, so its fields may be traced (e.g. a lenience parameter, or the
benchmark's synthetic α) without recompiling. `ExactAcceptance` is
Algorithm 1: the only rule under which the output is distributed exactly
as the target's. `LenientAcceptance` is the paper's Appendix A.5 (not
exact: each token's probability is at most p(x)/l; its exact output
distribution is `lenient_distribution`). Others (the benchmarks'
timing-only rule, `tools/benchmarks/synthetic.py`) subclass
`AcceptanceRule` and may reuse `sampling.acceptance_mask`,
`sampling.leading_accepted` and `sampling.residual_sample`.

Guesses may end in empty slots (`drafters.NO_GUESS`, a negative id, as a
suffix of the row; their q rows are zeros): a rule never accepts one, so
the row keeps at most its real guesses and the token after them comes from
p itself (q := 0 there, as after all γ guesses).
"""
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.protocols import Verdict

Array = jax.Array


@structs.dataclass
class ExactAcceptance(AcceptanceRule):
  """Algorithm 1: keep x_i while r_i < p_i(x_i) / q_i(x_i), then draw from
  norm(max(0, p_{n+1} - q_{n+1})) (or p_{γ+1} when all γ were kept).

  Outputs are distributed exactly as the target's under the same sampling
  method. With a greedy method p is one-hot, q drops out and the rule is
  `sampling.greedy_accept` on argmax tokens: no [B, γ+1, V] probabilities
  are built (a NO_GUESS slot never equals the argmax).
  """

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    if method.is_greedy:
      return greedy_verdict(target_logits, draft_tokens)
    target_probs = method.standardize(target_logits)
    num_accepted, next_token = _accept_guesses(rng, target_probs, draft_probs,
                                               draft_tokens)
    return Verdict(num_accepted, next_token, target_probs, None)


def greedy_verdict(target_logits, draft_tokens) -> Verdict:
  """The exact verdict with a greedy method (p one-hot at the argmax): keep
  guesses while they equal the target's argmax, then emit the argmax."""
  target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
  num_accepted, next_token = sampling.greedy_accept(target_tokens, draft_tokens)
  return Verdict(num_accepted, next_token, None, target_tokens)


def _accept_guesses(rng: Array, target_probs: Array,
                    draft_probs: Optional[Array], draft_tokens: Array,
                    lenience: Optional[Array] = None):
  """`sampling.speculative_accept` (same draws, same results when every
  slot is a guess) that never accepts a NO_GUESS slot; with `lenience` l,
  the test is r·l·q(x) < p(x). Returns (num_accepted [B], next_token [B])."""
  accept_rng, residual_rng = jax.random.split(rng)
  guessed = draft_tokens >= 0
  tokens = jnp.maximum(draft_tokens, 0)  # Any valid id: the slot is masked.
  if lenience is None:
    accepted = sampling.acceptance_mask(accept_rng, target_probs, draft_probs,
                                        tokens)
  else:
    gamma = draft_tokens.shape[1]
    p_x = jnp.take_along_axis(target_probs[:, :gamma], tokens[..., None],
                              axis=-1)[..., 0]
    q_x = 1.0 if draft_probs is None else jnp.take_along_axis(
        draft_probs, tokens[..., None], axis=-1)[..., 0]
    r = jax.random.uniform(accept_rng, draft_tokens.shape)
    accepted = r * lenience * q_x < p_x
  num_accepted = sampling.leading_accepted(accepted & guessed)
  # One-hot q: residual_sample's one-hot of a NO_GUESS id is all zeros, so
  # after the real guesses it samples p itself.
  next_token = sampling.residual_sample(residual_rng, target_probs, draft_probs,
                                        num_accepted, draft_tokens)
  return num_accepted, next_token


@structs.dataclass
class LenientAcceptance(AcceptanceRule):
  """Appendix A.5's lenience l in (0, 1): NOT exact (l = 1 is Algorithm 1).

  At temperature > 0 a guess x is kept when r < p(x) / (l·q(x)), and after
  the first rejection the next token is drawn from Algorithm 1's residual
  norm(max(0, p - q)) (from p after all γ guesses). Each emitted token then
  has the distribution `lenient_distribution(p, q, l)` given its prefix,
  which never exceeds p(x)/l (proof there). At temperature 0 (the paper's
  variant) a guess x is kept when p(x) >= l·max p, p the softmax of the
  target's raw logits, and the next token is the target's argmax.

  Attributes:
    lenience: l, a scalar in (0, 1] (a pytree leaf: changing it does not
      recompile).
  """
  lenience: Array

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    gamma = draft_tokens.shape[1]
    target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
    if method.is_greedy:
      logits = target_logits[:, :gamma].astype(jnp.float32)
      guess = jnp.take_along_axis(logits,
                                  jnp.maximum(draft_tokens, 0)[..., None],
                                  axis=-1)[..., 0]
      # p(x) / max p = exp(logit(x) - max logit): no softmax needed.
      kept = (guess - jnp.max(logits, axis=-1) >= jnp.log(
          self.lenience)) & (draft_tokens >= 0)
      num_accepted = sampling.leading_accepted(kept)
      rows = jnp.arange(draft_tokens.shape[0])
      return Verdict(num_accepted, target_tokens[rows, num_accepted], None,
                     target_tokens)
    target_probs = method.standardize(target_logits)
    num_accepted, next_token = _accept_guesses(rng, target_probs, draft_probs,
                                               draft_tokens,
                                               lenience=self.lenience)
    return Verdict(num_accepted, next_token, target_probs, None)


def lenient_distribution(p: np.ndarray, q: np.ndarray,
                         lenience: float) -> np.ndarray:
  """The exact distribution of a token `LenientAcceptance` emits at a draft
  position (temperature > 0), given its prefix: [..., V] float64.

  With x ~ q kept with probability min(1, p(x)/(l q(x))) and, on rejection,
  a draw from r = norm(max(0, p - q)):

    P(y) = min(q(y), p(y)/l) + (1 - A)·r(y),   A = Σ_x min(q(x), p(x)/l).

  Bound: P(y) <= p(y)/l. Where p(y) <= q(y), r(y) = 0 and P(y) =
  min(q(y), p(y)/l). Where p(y) > q(y), the first term is q(y), and
  1 - A <= 1 - Σ min(q, p) = Σ max(0, p - q), so (1 - A)·r(y) <= p(y) - q(y)
  and P(y) <= p(y) <= p(y)/l. With l = 1, P = p. (Algorithm 1's residual,
  as the exact rule samples it, keeps the bound, so it is kept; the
  alternative norm(max(0, p - l·q)) would keep it too.)
  A one-hot q at x is a deterministic drafter's guess.

  Args:
    p, q: [..., V] target and draft distributions (each sums to 1).
    lenience: l in (0, 1].
  """
  p = np.asarray(p, np.float64)
  q = np.asarray(q, np.float64)
  kept = np.minimum(q, p / lenience)
  residual = np.maximum(p - q, 0.0)
  mass = residual.sum(-1, keepdims=True)
  # No residual mass means p == q: then A = 1 and the residual is unused.
  residual = np.where(mass > 0, residual / np.where(mass > 0, mass, 1.0), p)
  return kept + (1.0 - kept.sum(-1, keepdims=True)) * residual
