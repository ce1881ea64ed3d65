"""A T5 v1.1 encoder-decoder in Flax with T5X's parameter tree and a chunked cache.

The parameter tree is identical in names, shapes and kernel layout to T5X's
`t5x/examples/t5/network.py:Transformer`, so T5X checkpoints load without
renaming:

  token_embedder/embedding                                [vocab, emb]
  encoder/relpos_bias/rel_embedding                       [heads, 32]
  encoder/layers_i/pre_attention_layer_norm/scale         [emb]
  encoder/layers_i/attention/{query,key,value}/kernel     [emb, heads*head_dim]
  encoder/layers_i/attention/out/kernel                   [heads*head_dim, emb]
  encoder/layers_i/pre_mlp_layer_norm/scale               [emb]
  encoder/layers_i/mlp/wi_0/kernel, wi_1/kernel           [emb, mlp]
  encoder/layers_i/mlp/wo/kernel                          [mlp, emb]
  encoder/encoder_norm/scale                              [emb]
  decoder/relpos_bias/rel_embedding                       [heads, 32]
  decoder/layers_i/{pre_self_attention_layer_norm, self_attention,
                    pre_cross_attention_layer_norm, encoder_decoder_attention,
                    pre_mlp_layer_norm, mlp}/...
  decoder/decoder_norm/scale                              [emb]
  decoder/logits_dense/kernel                             [emb, vocab]

A decoder without an encoder of its own (`T5Config.num_encoder_layers = 0`,
`encoder_width` = the width of the encoder it reads) has the same tree
without `encoder/`; its cross-attention key/value kernels
(`decoder/layers_i/encoder_decoder_attention/{key,value}/kernel`) are
[encoder_width, heads*head_dim]. `SharedEncoderModel` pairs it with the
model whose encoder it reads (a shared-encoder draft).

Decoding differs from T5X on purpose. T5X's cache takes one query token per
call and writes keys by one-hot *addition*, so rewinding it would leave stale
sums. Here a decoder call appends a chunk of K >= 1 tokens per row, written in
place with `lax.dynamic_update_slice` at that row's own length, and attention
is masked by length: rolling back after a rejection is just setting
`DecodeCache.length` (nothing is copied or cleared). The encoder-decoder
attention keys/values are projected once per input, not once per step.
"""
import contextlib
import contextvars
import dataclasses
import functools
from typing import Callable, Iterator, NamedTuple, Optional, Tuple, cast

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax import kernels
from specdec_jax.models.config import T5Config

Array = jax.Array

NUM_RELPOS_BUCKETS = 32
RELPOS_MAX_DISTANCE = 128
_NEG_INF = -1e10  # T5X's mask bias value.


# ---------------------------------------------------------------------------
# Initializers (T5X's: variance scaling; the query's is scaled by 1/sqrt(d)).
# ---------------------------------------------------------------------------
def _kernel_init(scale=1.0):
  return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


# ---------------------------------------------------------------------------
# Relative position buckets.
# ---------------------------------------------------------------------------
def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool,
                             num_buckets: int = NUM_RELPOS_BUCKETS,
                             max_distance: int = RELPOS_MAX_DISTANCE
                             ) -> np.ndarray:
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
def _bucket_table(max_len: int, bidirectional: bool) -> np.ndarray:
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
      key_positions: [K] int absolute positions.
      max_len: static bound on |key - query| + 1.

    Returns:
      [B, heads, Q, K] bias in `dtype`.
    """
    rel_embedding = self.param(
        "rel_embedding",
        nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
        (self.num_heads, NUM_RELPOS_BUCKETS), jnp.float32)
    table = jnp.asarray(_bucket_table(max_len, self.bidirectional))
    relative = key_positions[None, None, :] - query_positions[:, :, None]
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
  kernel_init: Callable = _kernel_init()

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
    if self.has_variable("params", "kernel") and (
        self.get_variable("params", "kernel").ndim == 3):
      # Packed for the CPU kernel (`T5Model.prepared_for_decoding`); read
      # directly: `self.param` would reject the packed shape.
      panels: Array = self.get_variable("params", "kernel")
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
                       kernel_init=_kernel_init(),
                       name="wi" if single else f"wi_{i}")(x)
      h = h if act == "linear" else getattr(nn, act)(h)
      hidden = h if hidden is None else hidden * h
    hidden = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(
        hidden, deterministic=deterministic)
    return DenseGeneral((x.shape[-1],), dtype=cfg.dtype,
                        kernel_init=_kernel_init(), name="wo")(hidden)


def _attend(query: Array, key: Array, value: Array, bias: Array,
            config: T5Config) -> Array:
  """Unscaled dot-product attention (T5 folds 1/sqrt(d) into the query init).

  Args:
    query: [B, Q, H, D]; key, value: [B, K, H, D]; bias: [B or 1, H, Q, K].

  Returns:
    [B, Q, H, D].
  """
  if config.float32_attention_logits:
    query, key = query.astype(jnp.float32), key.astype(jnp.float32)
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
  logits = logits + bias.astype(logits.dtype)
  weights = jax.nn.softmax(logits).astype(config.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


def _attend_cached(query: Array, keys_t: Array, values_t: Array, bias: Array,
                   config: T5Config) -> Array:
  """`_attend` over a decode cache laid out [B, H, D, L] (see `DecodeCache`).

  Args:
    query: [B, Q, H, D]; keys_t, values_t: [B, H, D, L]; bias: [B or 1, H,
      Q, L].

  Returns:
    [B, Q, H, D].
  """
  if config.float32_attention_logits:
    query, keys_t = query.astype(jnp.float32), keys_t.astype(jnp.float32)
  logits = jnp.einsum("bqhd,bhdk->bhqk", query, keys_t)
  logits = logits + bias.astype(logits.dtype)
  weights = jax.nn.softmax(logits).astype(config.dtype)
  return jnp.einsum("bhqk,bhdk->bqhd", weights, values_t)


def _attend_cache_and_chunk(query: Array, keys_t: Array, values_t: Array,
                            chunk_keys: Array, chunk_values: Array,
                            cache_bias: Array, chunk_bias: Array,
                            config: T5Config) -> Array:
  """Attention over a cache's earlier positions plus the chunk being fed.

  The chunk's own keys/values are attended from the projections directly,
  not read back from the cache after it is written: then the in-place
  cache write has one user (the returned cache) and XLA does not copy the
  cache buffers around it on every call. One softmax over both parts.

  Args:
    query: [B, K, H, D] the chunk's queries.
    keys_t, values_t: [B, H, D, L] the cache before the chunk is written.
    chunk_keys, chunk_values: [B, K, H, D] the chunk's keys/values.
    cache_bias: [B, H, K, L] relative positions + mask of valid slots.
    chunk_bias: [1, H, K, K] relative positions + causal mask in the chunk.

  Returns:
    [B, K, H, D].
  """
  if config.float32_attention_logits:
    query = query.astype(jnp.float32)
    keys_t, chunk_keys = keys_t.astype(jnp.float32), chunk_keys.astype(
        jnp.float32)
  cache_logits = jnp.einsum("bqhd,bhdk->bhqk", query, keys_t)
  chunk_logits = jnp.einsum("bqhd,bkhd->bhqk", query, chunk_keys)
  logits = jnp.concatenate(
      [cache_logits + cache_bias.astype(cache_logits.dtype),
       chunk_logits + chunk_bias.astype(chunk_logits.dtype)], axis=-1)
  weights = jax.nn.softmax(logits).astype(config.dtype)
  length = keys_t.shape[-1]
  return (jnp.einsum("bhqk,bhdk->bqhd", weights[..., :length], values_t)
          + jnp.einsum("bhqk,bkhd->bqhd", weights[..., length:],
                       chunk_values))


def _to_cache_layout(x: Array) -> Array:
  """[B, L, H, D] keys or values -> the cache layout [B, H, D, L]."""
  return jnp.transpose(x, (0, 2, 3, 1))


class MultiHeadDotProductAttention(nn.Module):
  """T5X-layout attention whose projections can be used piecewise.

  `project_kv` and `attend` let the decoder write projected keys/values into
  its cache; `__call__` is the plain (uncached) use.
  """
  config: T5Config

  def setup(self):
    cfg = self.config
    features = (cfg.num_heads, cfg.head_dim)
    depth_scaling = float(np.sqrt(cfg.head_dim))
    base = _kernel_init()
    query_init = lambda *a: base(*a) / depth_scaling  # pylint: disable=unnecessary-lambda-assignment
    self.query = DenseGeneral(features, dtype=cfg.dtype, kernel_init=query_init)
    self.key = DenseGeneral(features, dtype=cfg.dtype, kernel_init=base)
    self.value = DenseGeneral(features, dtype=cfg.dtype, kernel_init=base)
    self.out = DenseGeneral((cfg.emb_dim,), axis=(-2, -1), dtype=cfg.dtype,
                            kernel_init=_kernel_init())

  def project_kv(self, x: Array) -> Tuple[Array, Array]:
    """[B, L, emb] -> keys, values [B, L, H, D]."""
    return self.key(x), self.value(x)

  def attend(self, x: Array, keys: Array, values: Array, bias: Array) -> Array:
    """Queries from x [B, Q, emb] over given keys/values; returns [B, Q, emb]."""
    return self.out(_attend(self.query(x), keys, values, bias, self.config))

  def attend_cached(self, x: Array, keys_t: Array, values_t: Array,
                    bias: Array) -> Array:
    """Queries from x [B, Q, emb] over [B, H, D, L] keys/values (a cache)."""
    return self.out(_attend_cached(self.query(x), keys_t, values_t, bias,
                                   self.config))

  def attend_cache_and_chunk(self, x, keys_t, values_t, chunk_keys,
                             chunk_values, cache_bias, chunk_bias):
    """`_attend_cache_and_chunk` with queries from x [B, K, emb]."""
    return self.out(_attend_cache_and_chunk(
        self.query(x), keys_t, values_t, chunk_keys, chunk_values,
        cache_bias, chunk_bias, self.config))

  def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array) -> Array:
    keys, values = self.project_kv(inputs_kv)
    return self.attend(inputs_q, keys, values, bias)


def _mask_to_bias(mask: Array, dtype) -> Array:
  return jnp.where(mask, 0.0, _NEG_INF).astype(dtype)


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, bias: Array, deterministic: bool) -> Array:
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    y = LayerNorm(cfg.dtype, name="pre_attention_layer_norm")(x)
    y = MultiHeadDotProductAttention(cfg, name="attention")(y, y, bias)
    x = x + drop(y, deterministic=deterministic)
    y = LayerNorm(cfg.dtype, name="pre_mlp_layer_norm")(x)
    y = MlpBlock(cfg, name="mlp")(y, deterministic)
    return x + drop(y, deterministic=deterministic)


class Encoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoder_input_tokens: Array,
               deterministic: bool = True) -> Array:
    """[B, S] tokens (0 = padding) -> [B, S, emb] encodings."""
    cfg = self.config
    length = encoder_input_tokens.shape[1]
    valid = encoder_input_tokens > 0
    positions = jnp.arange(length)
    relpos = RelativePositionBiases(cfg.num_heads, cfg.dtype, True,
                                    name="relpos_bias")(
                                        positions[None], positions, length)
    bias = relpos + _mask_to_bias(valid[:, None, :, None] & valid[:, None,
                                                                   None, :],
                                  cfg.dtype)
    drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    x = self.shared_embedding(encoder_input_tokens.astype(jnp.int32))
    x = drop(x, deterministic=deterministic).astype(cfg.dtype)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f"layers_{i}")(x, bias, deterministic)
    x = LayerNorm(cfg.dtype, name="encoder_norm")(x)
    return drop(x, deterministic=deterministic)


class Embed(nn.Module):
  """Token embedding [vocab, emb] (T5X's `Embed`, param `embedding`)."""
  num_embeddings: int
  features: int
  dtype: jnp.dtype

  def setup(self):
    self.embedding = self.param(
        "embedding", nn.initializers.normal(stddev=1.0),
        (self.num_embeddings, self.features), jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, query: Array) -> Array:
    return jnp.dot(query, jnp.asarray(self.embedding, self.dtype).T)


# ---------------------------------------------------------------------------
# Decoder with a chunked, per-row-length cache.
# ---------------------------------------------------------------------------
@flax.struct.dataclass
class DecodeCache:
  """Decoder state for cached decoding.

  One array per layer (tuples), so that each layer's chunk is written in
  place into its own buffer; stacking layers would copy the whole cache on
  every call.

  Attributes:
    keys, values: per layer, [B, H, D, max_len] self-attention keys/values
      at absolute decoder positions 0..max_len-1 (position last: the layout
      XLA:CPU's attention dots read without a transposing copy per call).
      Entries at positions >= `length` are stale and masked out, never read.
    cross_keys, cross_values: per layer, [B, H, D, S] encoder-decoder
      attention keys/values, projected once from the encoder output.
    encoder_valid: [B, S] bool, False at encoder padding.
    length: [B] int32, number of decoder positions whose keys/values are
      valid, per row. Rolling back is `cache.replace(length=...)`.
    encoded: [B, S, d] the encoder output the cross keys/values were
      projected from (`T5Model.encoder_output` hands it to a drafter that
      reads it: a shared-encoder draft). Written once by `start`; never read
      by the decoder itself.
  """
  keys: Tuple[Array, ...]
  values: Tuple[Array, ...]
  cross_keys: Tuple[Array, ...]
  cross_values: Tuple[Array, ...]
  encoder_valid: Array
  length: Array
  encoded: Optional[Array] = None

  @property
  def max_len(self) -> int:
    return self.keys[0].shape[-1]


def _write_chunk(cache_rows: Array, chunk: Array, start: Array) -> Array:
  """In-place write of a [B, K, H, D] chunk into [B, H, D, L] at start [B]."""
  def write_row(row, new, s):
    return lax.dynamic_update_slice(row, new, (0, 0, s))
  chunk = _to_cache_layout(chunk).astype(cache_rows.dtype)
  return jax.vmap(write_row)(cache_rows, chunk, start)


class DecoderLayer(nn.Module):
  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = LayerNorm(cfg.dtype)
    self.self_attention = MultiHeadDotProductAttention(cfg)
    self.pre_cross_attention_layer_norm = LayerNorm(cfg.dtype)
    self.encoder_decoder_attention = MultiHeadDotProductAttention(cfg)
    self.pre_mlp_layer_norm = LayerNorm(cfg.dtype)
    self.mlp = MlpBlock(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def _rest(self, x, y, cross_keys, cross_values, cross_bias, deterministic):
    """Residual after self-attention, then cross-attention and MLP.

    cross_keys, cross_values: [B, H, D, S] (the cache layout).
    """
    x = x + self.dropout(y, deterministic=deterministic)
    y = self.pre_cross_attention_layer_norm(x)
    y = self.encoder_decoder_attention.attend_cached(y, cross_keys,
                                                     cross_values, cross_bias)
    x = x + self.dropout(y, deterministic=deterministic)
    y = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(y, deterministic=deterministic)

  def __call__(self, x, encoded, self_bias, cross_bias, deterministic=True):
    """Teacher-forced layer: x [B, T, emb], encoded [B, S, emb]."""
    y = self.pre_self_attention_layer_norm(x)
    y = self.self_attention(y, y, self_bias)
    ck, cv = self.cross_kv(encoded)
    return self._rest(x, y, ck, cv, cross_bias, deterministic)

  def cross_kv(self, encoded):
    """Encoder-decoder keys and values [B, H, D, S] (the cache layout)."""
    keys, values = self.encoder_decoder_attention.project_kv(encoded)
    return _to_cache_layout(keys), _to_cache_layout(values)

  def decode_chunk(self, x, keys, values, start, self_bias, chunk_bias,
                   cross_keys, cross_values, cross_bias):
    """Appends a chunk to this layer's cache and runs the layer on it.

    Args:
      x: [B, K, emb] chunk inputs at positions start..start+K-1.
      keys, values: [B, H, D, max_len] this layer's cache.
      start: [B] write offset per row (the cache length before the chunk).
      self_bias: [B, H, K, max_len] relpos bias, and the mask of the slots
        before `start` (the chunk's own positions are in chunk_bias).
      chunk_bias: [1, H, K, K] relpos bias and causal mask within the chunk.
      cross_keys, cross_values: [B, H, D, S]; cross_bias: [B, 1, 1, S].

    Returns:
      (outputs [B, K, emb], keys, values) with the chunk written in place.
    """
    y = self.pre_self_attention_layer_norm(x)
    new_k, new_v = self.self_attention.project_kv(y)
    attended = self.self_attention.attend_cache_and_chunk(
        y, keys, values, new_k, new_v, self_bias, chunk_bias)
    out = self._rest(x, attended, cross_keys, cross_values, cross_bias, True)
    return out, _write_chunk(keys, new_k, start), _write_chunk(values, new_v,
                                                                start)


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBiases(cfg.num_heads, cfg.dtype, False)
    # A list attribute names its modules layers_0, layers_1, ... as in T5X.
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = LayerNorm(cfg.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = DenseGeneral(
          (cfg.vocab_size,), dtype=jnp.float32,
          kernel_init=_kernel_init())

  def _logits(self, y: Array) -> Array:
    cfg = self.config
    if cfg.logits_via_embedding:
      return self.shared_embedding.attend(y) / jnp.sqrt(y.shape[-1])
    return self.logits_dense(y)

  def __call__(self, encoded, encoder_input_tokens, decoder_input_tokens,
               decoder_target_tokens, deterministic=True):
    """Teacher-forced decoder with T5X's masks: returns [B, T, vocab]."""
    cfg = self.config
    length = decoder_input_tokens.shape[1]
    positions = jnp.arange(length)
    relpos = self.relpos_bias(positions[None], positions, length)
    target_valid = decoder_target_tokens > 0
    causal = positions[:, None] >= positions[None, :]
    self_mask = (causal[None, None] & target_valid[:, None, :, None]
                 & target_valid[:, None, None, :])
    self_bias = relpos + _mask_to_bias(self_mask, cfg.dtype)
    enc_valid = encoder_input_tokens > 0
    cross_bias = _mask_to_bias(
        target_valid[:, None, :, None] & enc_valid[:, None, None, :],
        cfg.dtype)
    y = self.shared_embedding(decoder_input_tokens.astype(jnp.int32))
    y = self.dropout(y, deterministic=deterministic).astype(cfg.dtype)
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias, deterministic)
    y = self.decoder_norm(y)
    y = self.dropout(y, deterministic=deterministic)
    return self._logits(y)

  def init_cache(self, encoded, encoder_valid, max_len):
    """An empty cache over encoded [B, S, d] (encoder_valid [B, S] bool)."""
    keys, values = zip(*[layer.cross_kv(encoded) for layer in self.layers])
    batch = encoded.shape[0]
    shape = (batch, self.config.num_heads, self.config.head_dim, max_len)
    empty = tuple(jnp.zeros(shape, self.config.dtype) for _ in self.layers)
    return DecodeCache(
        keys=empty, values=empty, cross_keys=tuple(keys),
        cross_values=tuple(values), encoder_valid=encoder_valid,
        length=jnp.zeros((batch,), jnp.int32), encoded=encoded)

  def decode_chunk(self, tokens, cache: DecodeCache):
    cfg = self.config
    start = cache.length
    k = tokens.shape[1]
    max_len = cache.max_len
    query_pos = start[:, None] + jnp.arange(k)[None, :]  # [B, K]
    key_pos = jnp.arange(max_len)
    # Cache slots before the chunk; the chunk attends to itself causally
    # (relative positions within it do not depend on start).
    mask = key_pos[None, None, :] < start[:, None, None]  # [B, 1, L]
    self_bias = (self.relpos_bias(query_pos, key_pos, max_len)
                 + _mask_to_bias(mask[:, None], cfg.dtype))
    chunk_pos = jnp.arange(k)
    chunk_bias = (self.relpos_bias(chunk_pos[None], chunk_pos, max_len)
                  + _mask_to_bias(chunk_pos[None, None, None, :]
                                  <= chunk_pos[None, None, :, None],
                                  cfg.dtype))
    cross_bias = _mask_to_bias(cache.encoder_valid[:, None, None, :],
                               cfg.dtype)
    y = self.shared_embedding(tokens.astype(jnp.int32)).astype(cfg.dtype)
    new_keys, new_values = [], []
    for i, layer in enumerate(self.layers):
      y, lk, lv = layer.decode_chunk(y, cache.keys[i], cache.values[i], start,
                                     self_bias, chunk_bias,
                                     cache.cross_keys[i],
                                     cache.cross_values[i], cross_bias)
      new_keys.append(lk)
      new_values.append(lv)
    y = self.decoder_norm(y)
    logits = self._logits(y)
    cache = dataclasses.replace(cache, keys=tuple(new_keys),
                                values=tuple(new_values), length=start + k)
    return logits, cache


class Transformer(nn.Module):
  """T5 v1.1 encoder-decoder (T5X's `Transformer`), plus chunked decoding.

  Methods (use with `model.apply(variables, ..., method=...)`):
    __call__(encoder_input_tokens [B,S], decoder_input_tokens [B,T],
      decoder_target_tokens [B,T]) -> logits [B,T,vocab]: teacher forcing.
    encode(encoder_input_tokens [B,S]) -> [B,S,emb].
    decode(encoded [B,S,d], encoder_input_tokens [B,S], decoder_input_tokens
      [B,T], decoder_target_tokens [B,T]) -> logits [B,T,vocab]: teacher
      forcing from a given encoder output (a model without an encoder of
      its own has this and not __call__ / encode).
    init_cache(encoded [B,S,d], encoder_input_tokens [B,S], max_len)
      -> DecodeCache with length 0 in every row.
    decode_chunk(tokens [B,K], cache) -> (logits [B,K,vocab] float32, cache):
      feeds K tokens per row at positions cache.length..cache.length+K-1.
      The caller must keep cache.length + K <= max_len.
  """
  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    if cfg.has_encoder:
      self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def _check_has_encoder(self):
    if not self.config.has_encoder:
      raise ValueError(
          "This T5 decoder has no encoder of its own (num_encoder_layers=0): "
          "it reads another model's encoder output (`decode`, "
          "`init_cache`, or `SharedEncoderModel`).")

  def encode(self, encoder_input_tokens, deterministic=True):
    self._check_has_encoder()
    return self.encoder(encoder_input_tokens, deterministic)

  def __call__(self, encoder_input_tokens, decoder_input_tokens,
               decoder_target_tokens, deterministic=True):
    encoded = self.encode(encoder_input_tokens, deterministic)
    return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                        decoder_target_tokens, deterministic)

  def decode(self, encoded, encoder_input_tokens, decoder_input_tokens,
             decoder_target_tokens, deterministic=True):
    return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                        decoder_target_tokens, deterministic)

  def init_cache(self, encoded, encoder_input_tokens, max_len: int):
    return self.decoder.init_cache(encoded, encoder_input_tokens > 0,
                                   max_len)

  def init_cache_from_valid(self, encoded, encoder_valid, max_len: int):
    return self.decoder.init_cache(encoded, encoder_valid, max_len)

  def decode_chunk(self, tokens, cache):
    return self.decoder.decode_chunk(tokens, cache)


def init_params(config: T5Config, rng: Array, encoder_length: int = 8,
                decoder_length: int = 8):
  """Random parameters in T5X's layout: {'params': {...}}."""
  model = Transformer(config)
  enc = jnp.ones((1, encoder_length), jnp.int32)
  dec = jnp.ones((1, decoder_length), jnp.int32)
  if not config.has_encoder:
    encoded = jnp.ones((1, encoder_length, config.cross_attention_input_dim),
                       config.dtype)
    return model.init(rng, encoded, enc, dec, dec, method=Transformer.decode)
  return model.init(rng, enc, dec, dec)


def param_shapes(config: T5Config):
  """Parameter shapes without allocating anything (for XL/XXL checks)."""
  return jax.eval_shape(functools.partial(init_params, config),
                        jax.random.PRNGKey(0))


@jax.jit
def _pack_kernels(stack_params):
  """Packs every 2-D kernel of a stack (`kernels.pack`); one program."""
  def pack(path, leaf):
    name = getattr(path[-1], "key", None)
    if name == "kernel" and leaf.ndim == 2:
      return kernels.pack(leaf)
    return leaf
  return jax.tree_util.tree_map_with_path(pack, stack_params)


# Off by default: a `checkify.debug_check` is a JAX effect, and a jitted
# program with any effect loses JAX's C++ dispatch path (every call then
# runs Python dispatch, measured ~1.5 ms per decode call on this CPU).
_TRACED_OVERFLOW_CHECKS = contextvars.ContextVar(
    "specdec_jax_traced_overflow_checks", default=False)


@contextlib.contextmanager
def traced_overflow_checks() -> Iterator[None]:
  """Within it, programs traced from `T5Model.decode_chunk` check overflow.

  Each traced chunk gets a `checkify.debug_check` that its rows' cache
  lengths + K fit the cache (an error under
  `jax.experimental.checkify.checkify`, silent otherwise). For tests and
  debugging: trace a fresh function inside the block (jit caches programs
  traced before it).
  """
  token = _TRACED_OVERFLOW_CHECKS.set(True)
  try:
    yield
  finally:
    _TRACED_OVERFLOW_CHECKS.reset(token)


def _stacks(params):
  """The stacks a parameter tree has: encoder (unless shared) and decoder."""
  return [stack for stack in ("encoder", "decoder") if stack in params]


class EncoderOutput(NamedTuple):
  """An encoder's output, as a target hands it to its drafter.

  Attributes:
    encoded: [B, S, d] the encoder's output (d: its model's emb_dim).
    valid: [B, S] bool, False at input padding.
  """
  encoded: Array
  valid: Array


@flax.struct.dataclass
class T5Model:
  """A T5 `Transformer` bound to its parameters, as the decoders use it.

  A pytree: `params` are traced leaves, `config` is static, so jitted decode
  functions take it as an argument without baking weights into the program.
  """
  config: T5Config = flax.struct.field(pytree_node=False)
  params: dict  # {'params': {...}} in T5X's layout.

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  def prepared_for_decoding(self) -> "T5Model":
    """The same model with its weights packed for the CPU kernel.

    Where `kernels.packing_enabled` (float32 on one CPU device, kernel
    built), every encoder and decoder kernel [in, out] is replaced by its
    packed panels (`kernels.pack`), once, so that decode calls of 1..64 rows
    (and short inputs' encoding) read each weight once, and decoder calls
    give bit-identical rows whatever their number. Elsewhere
    (accelerators, meshes, bfloat16) it returns the model unchanged. Outputs
    agree with the unpacked model to float32 rounding (the dot's summation
    order differs).
    """
    if self.is_packed or not kernels.packing_enabled(self.config.dtype):
      return self
    params = dict(self.params["params"])
    for stack in _stacks(params):
      params[stack] = _pack_kernels(params[stack])
    return dataclasses.replace(
        self, params={**self.params, "params": params})

  def unpacked(self) -> "T5Model":
    """The same model in T5X's layout (undoes `prepared_for_decoding`)."""
    if not self.is_packed:
      return self
    shapes = param_shapes(self.config)["params"]
    params = dict(self.params["params"])
    for stack in _stacks(params):
      params[stack] = jax.tree_util.tree_map(
          lambda x, shape: (kernels.unpack(x, shape.shape[1])
                            if x.ndim == 3 else x),
          params[stack], shapes[stack])
    return dataclasses.replace(
        self, params={**self.params, "params": params})

  @property
  def is_packed(self) -> bool:
    """Whether the weights are packed (`prepared_for_decoding`)."""
    leaves = jax.tree_util.tree_leaves(self.params["params"]["decoder"])
    return any(getattr(leaf, "ndim", 0) == 3 for leaf in leaves)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def start_token(self, encoder_input_tokens: Array) -> Array:
    """[B] int32 decoder start tokens (0, T5's and T5X's convention)."""
    return jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32)

  def length(self, cache: DecodeCache) -> Array:
    """[B] int32 decoder positions the cache holds."""
    return cache.length

  def start(self, encoder_input_tokens: Array, max_len: int) -> DecodeCache:
    """Encodes [B, S] inputs once; returns an empty cache of max_len slots."""
    if not self.config.has_encoder:
      raise ValueError(
          "start: this T5 decoder has no encoder of its own "
          "(num_encoder_layers=0); start it from another model's encoder "
          "output (`start_from_encoder_output`) or pair it with that model "
          "(`SharedEncoderModel`).")
    def fn(module, tokens):
      return module.init_cache(module.encode(tokens), tokens, max_len)
    return nn.apply(fn, self.module)(self.params, encoder_input_tokens)

  def encode(self, encoder_input_tokens: Array) -> EncoderOutput:
    """The encoder's output for [B, S] inputs (0 = padding)."""
    encoded = cast(Array, self.module.apply(self.params, encoder_input_tokens,
                                            method=Transformer.encode))
    return EncoderOutput(encoded, encoder_input_tokens > 0)

  def encoder_output(self, cache: DecodeCache) -> EncoderOutput:
    """What `start` encoded (the `Target.encoder_output` a drafter reads)."""
    # Set by every `start`/`start_from_encoder_output`.
    return EncoderOutput(cast(Array, cache.encoded), cache.encoder_valid)

  @property
  def reads_target_encoder(self) -> bool:
    """True for a decoder without an encoder of its own: as a draft it
    starts from the target's encoder output (`drafters.ModelDrafter`)."""
    return not self.config.has_encoder

  def start_from_encoder_output(self, encoder_output: EncoderOutput,
                                max_len: int) -> DecodeCache:
    """An empty cache of max_len slots over a given encoder output.

    The decoder projects its cross-attention keys/values from it: for a
    model without an encoder (num_encoder_layers=0) that is another model's
    output, of width `config.cross_attention_input_dim`.
    """
    encoded, valid = encoder_output
    width = self.config.cross_attention_input_dim
    if encoded.shape[-1] != width:
      raise ValueError(
          f"start_from_encoder_output: an encoder output of width "
          f"{encoded.shape[-1]}, but this decoder's cross-attention reads "
          f"width {width} (T5Config.encoder_width).")
    return cast(DecodeCache, self.module.apply(
        self.params, encoded, valid, max_len,
        method=Transformer.init_cache_from_valid))

  def teacher_forced_logits(self, encoder_input_tokens: Array,
                            decoder_input_tokens: Array,
                            decoder_target_tokens: Array) -> Array:
    """[B, T, V] logits of teacher forcing (T5X's masks)."""
    return cast(Array, self.module.apply(
        self.params, encoder_input_tokens, decoder_input_tokens,
        decoder_target_tokens))

  def decode_chunk(self, tokens: Array, cache: DecodeCache
                   ) -> Tuple[Array, DecodeCache]:
    """Feeds tokens [B, K]; returns logits [B, K, V] and the advanced cache.

    Row b's tokens go to positions cache.length[b] .. cache.length[b]+K-1,
    which must lie inside the cache (< cache.max_len): a write past the end
    would be clamped by `dynamic_update_slice` onto valid slots.

    Raises:
      ValueError: K > cache.max_len, or (when cache.length is concrete, i.e.
        outside jit) some row's cache.length + K > cache.max_len. With
        traced lengths the same condition is a `checkify.debug_check`, added
        only inside `traced_overflow_checks()` (an error under
        `jax.experimental.checkify.checkify`).
    """
    self._check_chunk_fits(tokens.shape[1], cache)
    # `apply` returns the method's value (no collection is mutable here).
    return cast(Tuple[Array, DecodeCache],
                self.module.apply(self.params, tokens, cache,
                                  method=Transformer.decode_chunk))

  @staticmethod
  def _check_chunk_fits(k: int, cache: DecodeCache) -> None:
    """The overflow check of `decode_chunk` (static, concrete or checkify)."""
    from jax.experimental import checkify  # pylint: disable=g-import-not-at-top
    max_len = cache.max_len
    if k > max_len:
      raise ValueError(
          f"decode_chunk: a chunk of {k} tokens cannot fit a cache of "
          f"max_len={max_len} positions.")
    try:
      length = np.asarray(cache.length)
    except jax.errors.TracerArrayConversionError:
      if not _TRACED_OVERFLOW_CHECKS.get():
        return
      checkify.debug_check(
          jnp.all(cache.length + k <= max_len),
          f"decode_chunk: a chunk of {k} tokens at cache lengths {{length}} "
          f"writes past the cache's max_len={max_len}.",
          length=cache.length)
      return
    if np.any(length + k > max_len):
      raise ValueError(
          f"decode_chunk: a chunk of {k} tokens at cache lengths "
          f"{length.tolist()} writes past the cache's max_len={max_len}; "
          "start() a longer cache or truncate() it first.")

  def truncate(self, cache: DecodeCache, length: Array) -> DecodeCache:
    """Forgets every decoder position >= length [B] (int32), per row.

    Rollback by index: the slots stay in memory, masked out, and the next
    chunk overwrites them. A row whose cache holds fewer positions than
    `length` is left as it is (length = min(cache.length, length)).
    """
    return dataclasses.replace(
        cache, length=jnp.minimum(cache.length, length))


@flax.struct.dataclass
class SharedEncoderModel:
  """A decoder reading another T5 model's encoder: a shared-encoder draft.

  `decoder` has no encoder of its own (`T5Config.num_encoder_layers = 0`);
  its cross-attention projects keys/values from `encoder`'s output (width
  `encoder.config.emb_dim` = the decoder's `encoder_width`). In speculative
  decoding `encoder` is the target: the drafter starts from the output the
  target's `start` already computed (`start_from_encoder_output`, via
  `Target.encoder_output` and `Drafter.init`), so the draft encodes nothing.
  `start` (encode, then start) is for running it on its own (timing, tests).

  It has `Target`'s interface (`start`, `decode_chunk`, `truncate`, ...),
  so `drafters.ModelDrafter` drafts with it. Only the decoder's parameters
  are its own: a checkpoint holds `token_embedder/` and `decoder/` in T5X's
  layout (`decoder` alone); `encoder`'s decoder is never called.
  """
  encoder: T5Model
  decoder: T5Model

  @classmethod
  def pair(cls, encoder: T5Model, decoder: T5Model) -> "SharedEncoderModel":
    """Checks that `decoder` reads `encoder`'s output, then pairs them."""
    cfg = decoder.config
    if cfg.has_encoder:
      raise ValueError(
          "SharedEncoderModel: the decoder model has an encoder of its own "
          f"({cfg.num_encoder_layers} layers); a shared-encoder draft has "
          "num_encoder_layers=0 and encoder_width = the target's emb_dim.")
    if not encoder.config.has_encoder:
      raise ValueError("SharedEncoderModel: the encoder model has no "
                       "encoder.")
    if cfg.encoder_width != encoder.config.emb_dim:
      raise ValueError(
          f"SharedEncoderModel: the decoder's encoder_width is "
          f"{cfg.encoder_width} but the encoder's emb_dim is "
          f"{encoder.config.emb_dim}.")
    if cfg.vocab_size != encoder.config.vocab_size:
      raise ValueError(
          f"SharedEncoderModel: vocab_size {cfg.vocab_size} (decoder) != "
          f"{encoder.config.vocab_size} (encoder).")
    return cls(encoder=encoder, decoder=decoder)

  @property
  def config(self) -> T5Config:
    """The decoder's config (the draft's own)."""
    return self.decoder.config

  @property
  def vocab_size(self) -> int:
    return self.decoder.vocab_size

  def prepared_for_decoding(self) -> "SharedEncoderModel":
    return dataclasses.replace(
        self, encoder=self.encoder.prepared_for_decoding(),
        decoder=self.decoder.prepared_for_decoding())

  def start_token(self, encoder_input_tokens: Array) -> Array:
    return self.decoder.start_token(encoder_input_tokens)

  def length(self, cache: DecodeCache) -> Array:
    return cache.length

  def encode(self, encoder_input_tokens: Array) -> EncoderOutput:
    return self.encoder.encode(encoder_input_tokens)

  def start(self, encoder_input_tokens: Array, max_len: int) -> DecodeCache:
    """Encodes with `encoder`, then starts the decoder (standalone use)."""
    return self.start_from_encoder_output(self.encode(encoder_input_tokens),
                                          max_len)

  def start_from_encoder_output(self, encoder_output: EncoderOutput,
                                max_len: int) -> DecodeCache:
    return self.decoder.start_from_encoder_output(encoder_output, max_len)

  def encoder_output(self, cache: DecodeCache) -> EncoderOutput:
    return self.decoder.encoder_output(cache)

  @property
  def reads_target_encoder(self) -> bool:
    return True

  def decode_chunk(self, tokens: Array, cache: DecodeCache
                   ) -> Tuple[Array, DecodeCache]:
    return self.decoder.decode_chunk(tokens, cache)

  def truncate(self, cache: DecodeCache, length: Array) -> DecodeCache:
    return self.decoder.truncate(cache, length)

  def teacher_forced_logits(self, encoder_input_tokens: Array,
                            decoder_input_tokens: Array,
                            decoder_target_tokens: Array) -> Array:
    """[B, T, V] the decoder's teacher-forced logits on `encoder`'s output."""
    encoded = self.encode(encoder_input_tokens).encoded
    return cast(Array, self.decoder.module.apply(
        self.decoder.params, encoded, encoder_input_tokens,
        decoder_input_tokens, decoder_target_tokens,
        method=Transformer.decode))
