"""Sampling math: the paper's standardization (§2.2) and Algorithm 1's acceptance.

Both target p and draft q go through the same standardization, so that
"exactly the target's distribution" means exactly the distribution a user of
the target alone would sample from with the same temperature/top-k/top-p.

A *sampling method* (`Greedy()`, `Sampling(temperature, top_k, top_p)`) is a
small frozen object, validated once when it is built: the decode loops take
it as an argument and ask it for `standardize(logits)`, `draw(rng, logits)`
and `is_greedy` instead of carrying three loose scalars.
`make_method(temperature, top_k, top_p)` builds one from the gin macros'
values (temperature 0 is `Greedy()`).

`Sampling` is a pytree whose leaves are its three values, so a loop compiled
for one temperature, top-k or top-p runs every other without recompiling
(a γ × temperature sweep compiles once per γ). What changes the program is
static: greedy or not, and whether top-k and top-p filter at all (k > 0,
p < 1); a filter that is on costs its passes over the vocabulary even when
its value keeps every token (k >= V).
"""
import dataclasses
import math
import numbers
from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core.protocols import SamplingMethod

Array = jax.Array


def _is_real(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def validate_sampling_args(temperature: float, top_k: int,
                           top_p: float) -> None:
  """Raises ValueError naming the bad argument and its allowed range."""
  if not (_is_real(temperature) and math.isfinite(temperature) and
          temperature >= 0.0):  # Rejects NaN and inf too.
    raise ValueError(
        "temperature must be a finite number >= 0 (0 means greedy argmax), "
        f"got {temperature!r}.")
  if not _is_real(top_k) or int(top_k) != top_k or top_k < 0:
    raise ValueError(
        f"top_k must be an integer >= 0 (0 disables top-k), got {top_k!r}.")
  if not (_is_real(top_p) and 0.0 < top_p <= 1.0):
    raise ValueError(
        f"top_p must be in (0, 1] (1 disables top-p), got {top_p!r}.")


# ---------------------------------------------------------------------------
# Sampling methods: frozen, hashable, validated once.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Greedy(SamplingMethod):
  """Temperature 0: the argmax (ties to the lowest index, like `jnp.argmax`)."""

  @property
  def is_greedy(self) -> bool:
    return True

  def standardize(self, logits: Array) -> Array:
    return _one_hot_argmax(logits)

  def draw(self, rng: Array, logits: Array) -> Tuple[Array, None]:
    del rng  # Deterministic.
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None


@dataclasses.dataclass(frozen=True)
class Sampling(SamplingMethod):
  """Ancestral sampling at a temperature, optionally with top-k and top-p.

  Attributes:
    temperature: finite, > 0 (use `Greedy()` for 0).
    top_k: int >= 0; keep the k most likely tokens (0 = all).
    top_p: in (0, 1]; nucleus mass (1 = all).

  Temperature is applied first, then top-k on the scaled logits, then top-p
  on the resulting probabilities (see `standardize`).

  A pytree: the three values are leaves (traced inside a jitted loop: no
  recompilation when they change), and whether top-k and top-p filter at
  all is its static part, decided here from the concrete values.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  # (top-k filters, top-p filters): static, so set from concrete values.
  _filters: Tuple[bool,
                  bool] = dataclasses.field(default=(False, False), init=False,
                                            repr=False, compare=False)

  def __post_init__(self):
    if any(
        isinstance(v, jax.core.Tracer)
        for v in (self.temperature, self.top_k, self.top_p)):
      raise ValueError(
          "Sampling(...) was given a traced value (inside jax.jit a "
          "method's values are traced); build a variant of a method with "
          "method.replace(top_k=0, ...) instead.")
    validate_sampling_args(self.temperature, self.top_k, self.top_p)
    if self.temperature == 0.0:
      raise ValueError(
          "temperature must be > 0 for Sampling, got 0; use Greedy() (or "
          "make_method(0.0)) for greedy decoding.")
    # Python scalars: Sampling(1) and Sampling(np.float32(1.0)) are the same
    # static argument.
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_k", int(self.top_k))
    object.__setattr__(self, "top_p", float(self.top_p))
    object.__setattr__(self, "_filters", (self.top_k > 0, self.top_p < 1.0))

  def replace(self, **changes) -> "Sampling":
    """This method with some values changed; works inside jax.jit too.

    A changed value must be concrete (a Python number): it is validated and
    sets its filter on or off; unchanged values, traced or not, keep theirs.
    """
    unknown = set(changes) - {"temperature", "top_k", "top_p"}
    if unknown:
      raise ValueError(f"replace: unknown fields {sorted(unknown)}; allowed: "
                       "temperature, top_k, top_p.")
    check = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **changes}
    validate_sampling_args(check["temperature"], check["top_k"], check["top_p"])
    kinds = {"temperature": float, "top_k": int, "top_p": float}
    values = {
        "temperature": self.temperature,
        "top_k": self.top_k,
        "top_p": self.top_p,
        **{
            k: kinds[k](v) for k, v in changes.items()
        }
    }
    if check["temperature"] == 0.0:
      raise ValueError("temperature must be > 0 for Sampling, got 0.")
    top_k_filters, top_p_filters = self._filters
    if "top_k" in changes:
      top_k_filters = changes["top_k"] > 0
    if "top_p" in changes:
      top_p_filters = changes["top_p"] < 1.0
    return type(self).tree_unflatten(
        (top_k_filters, top_p_filters),
        [values["temperature"], values["top_k"], values["top_p"]])

  def tree_flatten(self):
    return (self.temperature, self.top_k, self.top_p), self._filters

  @classmethod
  def tree_unflatten(cls, filters, values):
    # No __post_init__: the values may be tracers (they were validated when
    # the method was built).
    method = object.__new__(cls)
    for name, value in zip(("temperature", "top_k", "top_p"), values):
      object.__setattr__(method, name, value)
    object.__setattr__(method, "_filters", filters)
    return method

  @property
  def is_greedy(self) -> bool:
    return False

  def standardize(self, logits: Array) -> Array:
    top_k_filters, top_p_filters = self._filters
    return _scaled_filtered(logits, self.temperature,
                            self.top_k if top_k_filters else None,
                            self.top_p if top_p_filters else None)

  def draw(self, rng: Array, logits: Array) -> Tuple[Array, Array]:
    probs = self.standardize(logits)
    return sample_from(rng, probs), probs


def make_method(temperature: float = 0.0, top_k: int = 0,
                top_p: float = 1.0) -> SamplingMethod:
  """The sampling method for the gin macros' (TEMPERATURE, TOPK, TOPP).

  Temperature 0 is `Greedy()` (top-k and top-p are then irrelevant but still
  validated); otherwise `Sampling(temperature, top_k, top_p)`.

  Raises:
    ValueError naming the bad argument and its allowed range.
  """
  validate_sampling_args(temperature, top_k, top_p)
  if temperature == 0.0:
    return Greedy()
  return Sampling(temperature, top_k, top_p)


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
  if temperature == 0.0:
    return _one_hot_argmax(logits)
  vocab = logits.shape[-1]
  return _scaled_filtered(logits, float(temperature),
                          int(top_k) if 0 < top_k < vocab else None,
                          float(top_p) if top_p < 1.0 else None)


def _one_hot_argmax(logits: Array) -> Array:
  """Temperature 0's distribution: [..., V] float32 one-hot at the argmax."""
  return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1],
                        dtype=jnp.float32)


def _scaled_filtered(logits: Array, temperature, top_k, top_p) -> Array:
  """`standardize` at temperature > 0 without the argument checks.

  Args:
    logits: [..., V].
    temperature: > 0, a Python float or a traced [] scalar.
    top_k: the k to keep (>= 1, concrete or traced), or None: no top-k.
    top_p: the nucleus mass (concrete or traced), or None: no top-p.
  """
  logits = logits.astype(jnp.float32) / temperature
  if top_k is not None:
    # The k-th largest logit, found without a sort (see `_largest_key_where`).
    keys = _order_keys(logits)
    kth = _largest_key_where(lambda t: jnp.sum(keys >= t, axis=-1) >= top_k,
                             keys.shape[:-1])
    logits = jnp.where(keys >= kth[..., None], logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  if top_p is not None:
    # Keep the smallest set of most likely tokens whose mass reaches top_p
    # (and every token tied with the least likely of them): everything at
    # least as likely as the largest threshold t with mass(p >= t) >= top_p.
    # If rounding leaves even the full mass short of top_p, t stays at the
    # smallest key and everything is kept.
    keys = _order_keys(probs)
    threshold = _largest_key_where(
        lambda t: jnp.sum(jnp.where(keys >= t, probs, 0.0), axis=-1) >= top_p,
        keys.shape[:-1])
    probs = jnp.where(keys >= threshold[..., None], probs, 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return probs


def _order_keys(x: Array) -> Array:
  """float32 [..., V] -> uint32 keys in the same order (NaN aside)."""
  bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _largest_key_where(holds: Callable[[Array], Array], batch_shape) -> Array:
  """The largest uint32 t per row with holds(t), for holds monotone in t.

  `holds` maps thresholds [..., 1] to [...] bool and must be true for every
  t up to some point and false after it. The answer is built bit by bit from
  the top, 32 passes over the vocabulary and no sort: sorting V entries is
  the slowest part of top-k/top-p on CPU and on TPU, and this runs once per
  draft step and per target position. Returns 0 if holds is false for every
  t > 0.
  """

  def set_bit(i, t):
    candidate = t | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
    return jnp.where(holds(candidate[..., None]), candidate, t)

  return lax.fori_loop(0, 32, set_bit, jnp.zeros(batch_shape, jnp.uint32))


# Block width of `sample_from`'s two-level inverse CDF.
_SAMPLE_BLOCK = 128


def _last_positive(x: Array) -> Array:
  """Index of the last entry > 0 along the last axis of [..., N] (0 if none)."""
  n = x.shape[-1]
  return n - 1 - jnp.argmax(jnp.flip(x > 0, axis=-1), axis=-1)


def sample_from(rng: Array, probs: Array) -> Array:
  """Draws one token per row from probabilities [..., V]; returns [...] int32.

  Inverse CDF with one uniform per row, in two levels (which block of
  `_SAMPLE_BLOCK` tokens, then which token in it), so a draw costs two short
  cumulative sums instead of V random numbers (Gumbel-max): on CPU that is
  most of a small draft's step. A token of probability 0 is never drawn,
  whatever the rounding.
  """
  *lead, vocab = probs.shape
  flat = probs.reshape(-1, vocab).astype(jnp.float32)
  rows = jnp.arange(flat.shape[0])
  num_blocks = -(-vocab // _SAMPLE_BLOCK)
  blocks = jnp.pad(flat, ((0, 0), (0, num_blocks * _SAMPLE_BLOCK - vocab)))
  blocks = blocks.reshape(-1, num_blocks, _SAMPLE_BLOCK)
  block_mass = jnp.sum(blocks, axis=-1)
  block_cdf = jnp.cumsum(block_mass, axis=-1)
  u = jax.random.uniform(rng, (flat.shape[0],)) * block_cdf[:, -1]
  # Block b is drawn when cdf[b-1] <= u < cdf[b]: never a block of mass 0.
  # u can round up to the total; then take the last block with mass.
  block = jnp.minimum(jnp.sum(block_cdf <= u[:, None], axis=-1),
                      _last_positive(block_mass))
  u = u - jnp.where(block > 0, block_cdf[rows, block - 1], 0.0)
  in_block = blocks[rows, block]
  index = jnp.minimum(
      jnp.sum(jnp.cumsum(in_block, axis=-1) <= u[:, None], axis=-1),
      _last_positive(in_block))
  token = block * _SAMPLE_BLOCK + index
  return token.reshape(lead).astype(jnp.int32)


def acceptance_mask(rng: Array, target_probs: Array,
                    draft_probs: Optional[Array], draft_tokens: Array) -> Array:
  """Algorithm 1's accept test for each guess: r_i < p_i(x_i) / q_i(x_i).

  Args:
    rng: PRNG key.
    target_probs: [B, γ(+1), V] p_1..p_γ (a trailing p_{γ+1} is ignored).
    draft_probs: [B, γ, V] q_1..q_γ, or None for a deterministic drafter
      (q_i is the one-hot of x_i, so q_i(x_i) = 1).
    draft_tokens: [B, γ] int x_1..x_γ.

  Returns:
    [B, γ] bool; guess i would be kept if all guesses before it were.
  """
  gamma = draft_tokens.shape[1]
  tokens = draft_tokens[..., None].astype(jnp.int32)
  p_x = jnp.take_along_axis(target_probs[:, :gamma], tokens, axis=-1)[..., 0]
  r = jax.random.uniform(rng, draft_tokens.shape)
  if draft_probs is None:
    return r < p_x
  q_x = jnp.take_along_axis(draft_probs, tokens, axis=-1)[..., 0]
  # r < p/q without dividing: q == 0 (never sampled) can't produce NaN, and
  # p >= q always accepts.
  return r * q_x < p_x


def leading_accepted(accepted: Array) -> Array:
  """n = number of guesses kept before the first rejection: [B, γ] -> [B]."""
  return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=-1),
                 axis=-1).astype(jnp.int32)


def residual_sample(rng: Array, target_probs: Array,
                    draft_probs: Optional[Array], num_accepted: Array,
                    draft_tokens: Optional[Array] = None) -> Array:
  """The token after n kept guesses: from norm(max(0, p_{n+1} - q_{n+1})).

  After all γ were kept (n = γ) this is p_{γ+1} itself (q_{γ+1} := 0).

  Args:
    rng: PRNG key.
    target_probs: [B, γ+1, V] p_1..p_{γ+1}.
    draft_probs: [B, γ, V] q_1..q_γ, or None for one-hot q_i at x_i (then
      `draft_tokens` is required and only a [B, V] one-hot is built).
    num_accepted: [B] int n in [0, γ].
    draft_tokens: [B, γ] int x_1..x_γ (used only when draft_probs is None).

  Returns:
    [B] int32 tokens.
  """
  rows = jnp.arange(target_probs.shape[0])
  p_n = target_probs[rows, num_accepted]
  if draft_probs is None:
    if draft_tokens is None:
      raise ValueError("residual_sample: draft_tokens is required when "
                       "draft_probs is None (one-hot q).")
    # x_{γ+1} := -1, whose one-hot is all zeros (q_{γ+1} := 0).
    padded = jnp.pad(draft_tokens.astype(jnp.int32), ((0, 0), (0, 1)),
                     constant_values=-1)
    q_n = jax.nn.one_hot(padded[rows, num_accepted], p_n.shape[-1],
                         dtype=p_n.dtype)
  else:
    q_padded = jnp.concatenate(
        [draft_probs, jnp.zeros_like(draft_probs[:, :1])], axis=1)
    q_n = q_padded[rows, num_accepted]
  residual = jnp.maximum(p_n - q_n, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  # p == q leaves no residual mass; a rejection then has probability 0, but
  # guard against rounding by falling back to p itself.
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_n)
  return sample_from(rng, residual)


def speculative_accept(rng: Array, target_probs: Array,
                       draft_probs: Optional[Array],
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
    draft_probs: [B, γ, V] q_1..q_γ the draft tokens were sampled from, or
      None when the drafter is deterministic (q_i = one-hot of x_i: the
      test is r_i < p_i(x_i) and the residual is p_{n+1} without x_{n+1}).
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
  if draft_probs is not None and draft_probs.shape != (batch, gamma,
                                                       target_probs.shape[-1]):
    raise ValueError(f"draft_probs must have shape [B, γ, V] = "
                     f"[{batch}, {gamma}, {target_probs.shape[-1]}], got "
                     f"{draft_probs.shape}.")
  accept_rng, residual_rng = jax.random.split(rng)
  num_accepted = leading_accepted(
      acceptance_mask(accept_rng, target_probs, draft_probs, draft_tokens))
  next_token = residual_sample(residual_rng, target_probs, draft_probs,
                               num_accepted, draft_tokens)
  return num_accepted, next_token


def greedy_accept(target_tokens: Array,
                  draft_tokens: Array) -> Tuple[Array, Array]:
  """`speculative_accept` at temperature 0, from argmax tokens alone.

  With one-hot p, x_i is kept iff it is the target's argmax (p/q is 1 or 0
  whatever q is), and the residual after a rejection, like p_{γ+1}, is the
  one-hot of the target's argmax: q drops out, so no [B, γ, V] tensors are
  needed.

  Args:
    target_tokens: [B, γ+1] int the target's argmax at positions 1..γ+1.
    draft_tokens: [B, γ] int x_1..x_γ.

  Returns:
    (num_accepted [B] int32, next_token [B] int32), as `speculative_accept`.
  """
  gamma = draft_tokens.shape[1]
  num_accepted = leading_accepted(target_tokens[:, :gamma] == draft_tokens)
  rows = jnp.arange(target_tokens.shape[0])
  return num_accepted, target_tokens[rows, num_accepted].astype(jnp.int32)


def acceptance_beta(target_probs: Array, draft_probs: Array) -> Array:
  """β = Σ_x min(p(x), q(x)) (the paper's Definition 3.1): [..., V] -> [...]."""
  return jnp.sum(jnp.minimum(target_probs, draft_probs), axis=-1)
