"""Block verification (Sun, Mendlovic, Leviathan et al., ICLR 2025).

Algorithm 1 tests the γ guesses one by one and stops at the first
rejection. Block verification decides how many to keep from the whole block
at once, with the same p_1..p_{γ+1} and q_1..q_γ: its output is distributed
exactly as the target's, it keeps at least as many guesses in expectation as
Algorithm 1, and it is optimal among verifiers that see one draft path.

For guesses x_1..x_γ, with weights w_0 = 1 and
w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)) (how much of the target's mass the
prefix x_1..x_i still carries), the rule stops after i guesses with
probability

  h_i = R_i / (R_i + 1 - w_i),   R_i = Σ_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))

for i < γ, and h_γ = w_γ; it keeps τ = max{i : η_i < h_i} guesses
(η_i ~ U(0, 1), τ = 0 if none) and draws the next token from
norm(max(0, w_τ p_{τ+1} - q_{τ+1})) (p_{γ+1} itself when τ = γ). With
w_i = 1 this residual is Algorithm 1's. Where R_i + 1 - w_i = 0 (w_i = 1 and
p_{i+1} = q_{i+1}) the next guess is kept surely, and a later h_j is 1, so
τ = i has probability 0 whatever h_i is; h_i := 1 there.

Empty slots (`drafters.NO_GUESS`, a suffix; their q rows are zeros) get
h = 0, so τ never passes the real guesses; after the last real guess q := 0
makes h_γ' = w_γ' and the residual p itself, exactly the rule for a block of
γ' guesses. A one-hot q (deterministic drafters) is built from the tokens.

Greedy decoding is unchanged: with one-hot p and a row's guesses matching
the target's argmax up to position n, every w_i for i <= n is 1 and every
later one 0, so τ = n and the next token is the argmax at n + 1, exactly
`sampling.greedy_accept`; the rule delegates to it.
"""
from typing import Tuple

import jax
import jax.numpy as jnp

from specdec_jax.core import acceptance
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.protocols import Verdict

Array = jax.Array


def stop_probabilities(target_probs: Array, draft_probs: Array,
                       draft_tokens: Array) -> Tuple[Array, Array]:
  """Block verification's weights w and stopping probabilities h.

  Args:
    target_probs: [B, γ+1, V] p_1..p_{γ+1}.
    draft_probs: [B, γ, V] q_1..q_γ (zeros at NO_GUESS slots).
    draft_tokens: [B, γ] int guesses x_1..x_γ (negative: NO_GUESS).

  Returns:
    (w [B, γ+1] with w_0 = 1, h [B, γ+1] with h_0 = 1): h[:, i] is the
    probability of stopping after i guesses unless a later i stops.
  """
  gamma = draft_tokens.shape[1]
  guessed = draft_tokens >= 0
  tokens = jnp.maximum(draft_tokens, 0)
  p_x = jnp.take_along_axis(target_probs[:, :gamma], tokens[..., None],
                            axis=-1)[..., 0]
  q_x = jnp.take_along_axis(draft_probs, tokens[..., None], axis=-1)[..., 0]
  # p/q of a guess; a guess with q(x) = 0 cannot have been drawn.
  ratio = jnp.where(q_x > 0, p_x / jnp.where(q_x > 0, q_x, 1.0), 0.0)
  weights = [jnp.ones_like(ratio[:, 0])]
  for i in range(gamma):  # γ is small and static: a sequential min-product.
    weights.append(jnp.minimum(1.0, weights[-1] * ratio[:, i]))
  w = jnp.stack(weights, axis=1)
  # q_{γ+1} := 0: with it the formula gives h_γ = w_γ.
  q_next = _with_empty_last(draft_probs)
  residual = jnp.sum(jnp.maximum(w[..., None] * target_probs - q_next, 0.0),
                     axis=-1)
  denominator = residual + 1.0 - w
  h = jnp.where(denominator > 0,
                residual / jnp.where(denominator > 0, denominator, 1.0), 1.0)
  h = jnp.where(
      jnp.concatenate([jnp.ones_like(guessed[:, :1]), guessed], axis=1), h, 0.0)
  return w, h.at[:, 0].set(1.0)


def _with_empty_last(draft_probs: Array) -> Array:
  """[B, γ, V] q_1..q_γ -> [B, γ+1, V] with q_{γ+1} := 0."""
  return jnp.concatenate(
      [draft_probs, jnp.zeros_like(draft_probs[:, :1])], axis=1)


def _one_hot_draft(draft_tokens: Array, vocab_size: int, dtype) -> Array:
  # NO_GUESS ids (negative) give all-zero rows.
  return jax.nn.one_hot(draft_tokens, vocab_size, dtype=dtype)


@structs.dataclass
class BlockAcceptance(AcceptanceRule):
  """Block verification: exact, and never fewer kept guesses in expectation
  than `ExactAcceptance` (module docstring)."""

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    if method.is_greedy:
      return acceptance.greedy_verdict(target_logits, draft_tokens)
    target_probs = method.standardize(target_logits)
    if draft_probs is None:
      draft_probs = _one_hot_draft(draft_tokens, target_probs.shape[-1],
                                   target_probs.dtype)
    num_accepted, next_token = block_accept(rng, target_probs, draft_probs,
                                            draft_tokens)
    return Verdict(num_accepted, next_token, target_probs, None)


def block_accept(rng: Array, target_probs: Array, draft_probs: Array,
                 draft_tokens: Array) -> Tuple[Array, Array]:
  """Keeps τ guesses and draws the next token (module docstring).

  Args:
    rng: PRNG key.
    target_probs: [B, γ+1, V] p_1..p_{γ+1}.
    draft_probs: [B, γ, V] q_1..q_γ.
    draft_tokens: [B, γ] int guesses (negative: NO_GUESS).

  Returns:
    (num_accepted [B] int32 τ, next_token [B] int32).
  """
  stop_rng, residual_rng = jax.random.split(rng)
  w, h = stop_probabilities(target_probs, draft_probs, draft_tokens)
  eta = jax.random.uniform(stop_rng, h.shape, dtype=h.dtype)
  # Strict: a uniform draw can be exactly 0, and h = 0 must never stop.
  stops = (eta < h).at[:, 0].set(True)
  positions = jnp.arange(h.shape[1], dtype=jnp.int32)
  num_accepted = jnp.max(jnp.where(stops, positions, 0), axis=1)
  rows = jnp.arange(h.shape[0])
  q_next = _with_empty_last(draft_probs)
  residual = jnp.maximum(
      w[rows, num_accepted][:, None] * target_probs[rows, num_accepted] -
      q_next[rows, num_accepted], 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  # No residual mass has probability 0; guard rounding with p itself.
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0),
                       target_probs[rows, num_accepted])
  return num_accepted, sampling.sample_from(residual_rng, residual)


def expected_accepted(target_probs: Array, draft_probs: Array,
                      draft_tokens: Array) -> Array:
  """E[τ | the guesses] from the rule's own h: Σ_i i·h_i·Π_{j>i}(1 - h_j).

  Args, as `stop_probabilities`. Returns [B] float.
  """
  _, h = stop_probabilities(target_probs, draft_probs, draft_tokens)
  survive_after = jnp.cumprod((1.0 - h)[:, ::-1], axis=1)[:, ::-1]
  later = jnp.concatenate(
      [survive_after[:, 1:],
       jnp.ones_like(survive_after[:, :1])], axis=1)
  positions = jnp.arange(h.shape[1], dtype=h.dtype)
  return jnp.sum(positions * h * later, axis=1)
