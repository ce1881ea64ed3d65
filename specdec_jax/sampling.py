"""Sampling math: the paper's standardization (§2.2) and Algorithm 1's acceptance.

Both target p and draft q go through the same `standardize`, so that
"exactly the target's distribution" means exactly the distribution a user of
the target alone would sample from with the same temperature/top-k/top-p.
"""
from typing import Tuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def validate_sampling_args(temperature: float, top_k: int,
                           top_p: float) -> None:
  """Raises ValueError naming the bad argument and its allowed range."""
  if not temperature >= 0.0:  # Also rejects NaN.
    raise ValueError(
        f"temperature must be >= 0 (0 means greedy argmax), got {temperature!r}.")
  if isinstance(top_k, bool) or int(top_k) != top_k or top_k < 0:
    raise ValueError(
        f"top_k must be an integer >= 0 (0 disables top-k), got {top_k!r}.")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(
        f"top_p must be in (0, 1] (1 disables top-p), got {top_p!r}.")


def standardize(logits: Array, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0) -> Array:
  """Turns logits into the probability vector the model samples from.

  Args:
    logits: [..., V] unnormalized log-probabilities.
    temperature: static float >= 0. 0 means argmax: a one-hot distribution
      (ties go to the lowest index, like `jnp.argmax`).
    top_k: static int >= 0; keep the k most likely tokens (0 = all). Tokens
      tied with the k-th are kept too.
    top_p: static float in (0, 1]; keep the smallest set of most likely tokens
      whose mass reaches top_p (nucleus sampling; 1 = all).

  Returns:
    [..., V] float32 probabilities that sum to 1 along the last axis.
  """
  validate_sampling_args(temperature, top_k, top_p)
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  if temperature == 0.0:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab,
                          dtype=jnp.float32)
  logits = logits / temperature
  if 0 < top_k < vocab:
    kth = lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  if top_p < 1.0:
    sorted_probs = jnp.flip(jnp.sort(probs, axis=-1), axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    # The least likely token kept is the last one whose preceding mass is
    # still short of top_p; keep everything at least that likely.
    kept = mass_before < top_p
    threshold = jnp.min(jnp.where(kept, sorted_probs, jnp.inf), axis=-1,
                        keepdims=True)
    probs = jnp.where(probs >= threshold, probs, 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return probs


def sample_from(rng: Array, probs: Array) -> Array:
  """Draws one token per row from probabilities [..., V]; returns [...] int32."""
  logp = jnp.where(probs > 0, jnp.log(jnp.maximum(probs, 1e-38)), -jnp.inf)
  return jax.random.categorical(rng, logp, axis=-1).astype(jnp.int32)


def speculative_accept(rng: Array, target_probs: Array, draft_probs: Array,
                       draft_tokens: Array) -> Tuple[Array, Array]:
  """Algorithm 1's modified rejection sampling, batched.

  Draft token x_i is kept if r_i < p_i(x_i) / q_i(x_i) (r_i ~ U[0, 1)), and n
  is the number kept before the first rejection. The extra token is drawn from
  norm(max(0, p_{n+1} - q_{n+1})) after a rejection, or from p_{γ+1} when all
  γ are kept. The emitted tokens are then distributed exactly as p.

  Args:
    rng: PRNG key.
    target_probs: [B, γ+1, V] p_1..p_{γ+1} (standardized target probs at the
      positions of draft tokens 1..γ and one past them).
    draft_probs: [B, γ, V] q_1..q_γ the draft tokens were sampled from.
    draft_tokens: [B, γ] int x_1..x_γ.

  Returns:
    num_accepted: [B] int32 n in [0, γ].
    next_token: [B] int32, the token after the n accepted draft tokens.
  """
  batch, gamma = draft_tokens.shape
  if target_probs.shape[:2] != (batch, gamma + 1):
    raise ValueError(
        f"target_probs must have shape [B, γ+1, V] = [{batch}, {gamma + 1}, V]"
        f", got {target_probs.shape}.")
  if draft_probs.shape != (batch, gamma, target_probs.shape[-1]):
    raise ValueError(
        f"draft_probs must have shape [B, γ, V] = "
        f"[{batch}, {gamma}, {target_probs.shape[-1]}], got "
        f"{draft_probs.shape}.")
  accept_rng, residual_rng = jax.random.split(rng)
  tokens = draft_tokens[..., None].astype(jnp.int32)
  p_x = jnp.take_along_axis(target_probs[:, :gamma], tokens, axis=-1)[..., 0]
  q_x = jnp.take_along_axis(draft_probs, tokens, axis=-1)[..., 0]
  r = jax.random.uniform(accept_rng, (batch, gamma))
  # r < p/q without dividing: q == 0 (never sampled) can't produce NaN, and
  # p >= q always accepts.
  accepted = r * q_x < p_x
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=-1),
                         axis=-1)
  # q_{γ+1} := 0, so one formula covers both cases: after all γ are accepted
  # the "residual" is p_{γ+1} itself.
  q_padded = jnp.concatenate(
      [draft_probs, jnp.zeros_like(draft_probs[:, :1])], axis=1)
  rows = jnp.arange(batch)
  p_n = target_probs[rows, num_accepted]
  residual = jnp.maximum(p_n - q_padded[rows, num_accepted], 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  # p == q leaves no residual mass; a rejection then has probability 0, but
  # guard against rounding by falling back to p itself.
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0),
                       p_n)
  next_token = sample_from(residual_rng, residual)
  return num_accepted.astype(jnp.int32), next_token


def acceptance_beta(target_probs: Array, draft_probs: Array) -> Array:
  """β = Σ_x min(p(x), q(x)) (the paper's Definition 3.1): [..., V] -> [...]."""
  return jnp.sum(jnp.minimum(target_probs, draft_probs), axis=-1)
