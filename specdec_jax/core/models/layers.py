"""T5 v1.1's building blocks in T5X's parameter layout (T5X's `layers.py`).

Initializers, relative position biases, the RMS layer norm, the bias-free
dense layer (which multiplies with the CPU kernel's packed panels when the
module is applied with them: `PACKED_COLLECTION`), the gated MLP and the
token embedding. Attention is in `attention.py`; the stacks in `network.py`.
"""
import functools
from typing import Callable, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax.core import kernels
from specdec_jax.core.models.config import T5Config

Array = jax.Array

NUM_RELPOS_BUCKETS = 32
RELPOS_MAX_DISTANCE = 128
NEG_INF = -1e10  # T5X's mask bias value.
# The flax variable collection holding the packed panels of the CPU kernel
# (`T5Model.packed`), beside (never inside) the T5X-layout 'params'.
PACKED_COLLECTION = "packed_kernels"


# ---------------------------------------------------------------------------
# Initializers (T5X's: variance scaling; the query's is scaled by 1/sqrt(d)).
# ---------------------------------------------------------------------------
def default_kernel_init(scale=1.0):
  """T5X's kernel initializer: truncated normal, fan-in variance scaling."""
  return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


# ---------------------------------------------------------------------------
# Relative position buckets.
# ---------------------------------------------------------------------------
def relative_position_bucket(
    relative_position: np.ndarray, bidirectional: bool,
    num_buckets: int = NUM_RELPOS_BUCKETS,
    max_distance: int = RELPOS_MAX_DISTANCE) -> np.ndarray:
  """T5's bucketing of (key position - query position), in numpy float32.

  Computed in numpy, as T5X does, so bucket boundaries match bit for bit.
  """
  ret = np.zeros_like(relative_position, dtype=np.int32)
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  with np.errstate(divide="ignore"):
    val_if_large = max_exact + (
        np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps) /
        np.log(max_distance / max_exact) *
        (num_buckets - max_exact)).astype(np.int32)
  val_if_large = np.minimum(val_if_large, num_buckets - 1)
  ret += np.where(is_small, n, val_if_large)
  return ret


@functools.lru_cache(maxsize=64)
def bucket_table(max_len: int, bidirectional: bool) -> np.ndarray:
  """Buckets for every relative position in [-(max_len-1), max_len-1].

  Entry `r + max_len - 1` is the bucket of relative position r. Indexing this
  static table with traced positions keeps the bucket math in numpy.
  """
  rel = np.arange(-(max_len - 1), max_len, dtype=np.int32)
  return relative_position_bucket(rel, bidirectional)


class RelativePositionBiases(nn.Module):
  """T5's learned relative position bias, shared by all layers of a stack."""
  num_heads: int
  dtype: jnp.dtype
  bidirectional: bool

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array,
               max_len: int) -> Array:
    """Bias for each (query, key) pair.

    Args:
      query_positions: [B, Q] int absolute positions.
      key_positions: [K] int absolute positions, or [B, K] per row (a token
        tree's nodes: `network.Decoder.decode_tree`).
      max_len: static bound on |key - query| + 1.

    Returns:
      [B, heads, Q, K] bias in `dtype`.
    """
    rel_embedding = self.param(
        "rel_embedding",
        nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
        (self.num_heads, NUM_RELPOS_BUCKETS), jnp.float32)
    table = jnp.asarray(bucket_table(max_len, self.bidirectional))
    relative = (jnp.expand_dims(key_positions, -2) -
                query_positions[:, :, None])
    buckets = table[relative + max_len - 1]  # [B, Q, K]
    # Gather per head: [heads, buckets] -> [B, heads, Q, K].
    bias = jnp.take(rel_embedding.astype(self.dtype), buckets, axis=1)
    return jnp.moveaxis(bias, 0, 1)


# ---------------------------------------------------------------------------
# Layers.
# ---------------------------------------------------------------------------
class LayerNorm(nn.Module):
  """T5's RMS layer norm: no mean subtraction, no bias, computed in float32."""
  dtype: jnp.dtype
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],),
                       jnp.float32)
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * lax.rsqrt(var + self.epsilon), self.dtype)
    return y * jnp.asarray(scale, self.dtype)


class DenseGeneral(nn.Module):
  """A bias-free dense layer over arbitrary axes (T5X's DenseGeneral)."""
  features: Tuple[int, ...]
  axis: Tuple[int, ...] = (-1,)
  dtype: jnp.dtype = jnp.float32
  kernel_init: Callable = default_kernel_init()

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = tuple(self.features)
    axis = tuple(a % x.ndim for a in self.axis)
    kernel_shape = tuple(x.shape[a] for a in axis) + features
    # T5X stores every kernel flattened to 2-D [prod(in), prod(out)]
    # (e.g. a query kernel is [emb, heads * head_dim]) and reshapes on use.
    stored_shape = (int(np.prod(kernel_shape[:len(axis)])),
                    int(np.prod(features)))
    x = jnp.asarray(x, self.dtype)
    if self.has_variable(PACKED_COLLECTION, "kernel"):
      # Applied with the CPU kernel's panels (`T5Model.prepared_for_decoding`):
      # multiply with them; the T5X-layout kernel in 'params' is not read.
      panels: Array = self.get_variable(PACKED_COLLECTION, "kernel")
      batch_shape = x.shape[:x.ndim - len(axis)]
      y = kernels.dense(x.reshape(*batch_shape, stored_shape[0]), panels,
                        stored_shape[1])
      return y.reshape(*batch_shape, *features)
    kernel = self.param("kernel", self.kernel_init, stored_shape, jnp.float32)
    kernel = jnp.asarray(kernel, self.dtype).reshape(kernel_shape)
    contract = (axis, tuple(range(len(axis))))
    return lax.dot_general(x, kernel, (contract, ((), ())))


class MlpBlock(nn.Module):
  """Gated MLP: prod_i act_i(x W_i) then W_o (T5 v1.1: gelu * linear)."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    cfg = self.config
    hidden = None
    single = len(cfg.mlp_activations) == 1
    for i, act in enumerate(cfg.mlp_activations):
      h = DenseGeneral((cfg.mlp_dim,), dtype=cfg.dtype,
                       name="wi" if single else f"wi_{i}")(x)
      h = h if act == "linear" else getattr(nn, act)(h)
      hidden = h if hidden is None else hidden * h
    hidden = nn.Dropout(cfg.dropout_rate,
                        broadcast_dims=(-2,))(hidden,
                                              deterministic=deterministic)
    return DenseGeneral((x.shape[-1],), dtype=cfg.dtype, name="wo")(hidden)


def mask_to_bias(mask: Array, dtype) -> Array:
  """A boolean mask -> an additive attention bias (0 where True)."""
  return jnp.where(mask, 0.0, NEG_INF).astype(dtype)


class Embed(nn.Module):
  """Token embedding [vocab, emb] (T5X's `Embed`, param `embedding`)."""
  num_embeddings: int
  features: int
  dtype: jnp.dtype

  def setup(self):
    self.embedding = self.param("embedding", nn.initializers.normal(stddev=1.0),
                                (self.num_embeddings, self.features),
                                jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, query: Array) -> Array:
    return jnp.dot(query, jnp.asarray(self.embedding, self.dtype).T)
