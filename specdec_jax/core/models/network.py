"""T5 v1.1's encoder and decoder stacks with a chunked, per-row-length cache.

`Transformer` is T5X's `t5x/examples/t5/network.py:Transformer` (same
parameter tree) plus the methods the decoders use: `init_cache` and
`decode_chunk`, which appends K >= 1 tokens per row at that row's own
length (see `DecodeCache`). A decoder's `decode_path` (`decode_paths`)
picks how a decode call computes: XLA's ops on T5X's kernels ('xla', and
'cpu_kernel', whose dense layers multiply with the CPU kernel's panels),
XLA's ops on packed kernels ('packed'), or the GPU kernels ('fused',
`kernels.gpu`); teacher forcing and the encoder are the same on every path.
"""
import dataclasses
import functools
from typing import Any, List, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import structs
from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_layers
from specdec_jax.core.models import decode_paths
from specdec_jax.core.models.attention import attend
from specdec_jax.core.models.attention import CACHED
from specdec_jax.core.models.attention import KeyValues
from specdec_jax.core.models.attention import MultiHeadDotProductAttention
from specdec_jax.core.models.attention import PROJECTED
from specdec_jax.core.models.attention import to_cache_layout
from specdec_jax.core.models.attention import tree_visibility
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.layers import DenseGeneral
from specdec_jax.core.models.layers import Embed
from specdec_jax.core.models.layers import LayerNorm
from specdec_jax.core.models.layers import mask_to_bias
from specdec_jax.core.models.layers import MlpBlock
from specdec_jax.core.models.layers import RelativePositionBiases

Array = jax.Array


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
                                    name="relpos_bias")(positions[None],
                                                        positions, length)
    bias = relpos + mask_to_bias(
        valid[:, None, :, None] & valid[:, None, None, :], cfg.dtype)
    drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    x = self.shared_embedding(encoder_input_tokens.astype(jnp.int32))
    x = drop(x, deterministic=deterministic).astype(cfg.dtype)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f"layers_{i}")(x, bias, deterministic)
    x = LayerNorm(cfg.dtype, name="encoder_norm")(x)
    return drop(x, deterministic=deterministic)


# ---------------------------------------------------------------------------
# Decoder with a chunked, per-row-length cache.
# ---------------------------------------------------------------------------
@structs.dataclass
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
    features: None (the default), or [B, max_len, emb] the decoder's top
      hidden states (after the final layer norm, before the output
      projection) at positions 0..max_len-1, written by each chunk beside
      its keys; entries at positions >= `length` are stale. Kept only when
      the cache was started with `keep_features` (a feature-level drafter
      reads them, `T5Model.features`); None costs nothing.
    barriers: None, or [B] int32 the GPU kernels' barrier counters
      (`gpu_layers.barrier_counters`: the 'fused' path under
      `Tiles.programs`), carried from call to call so that a call's kernels
      count on from the last one's instead of XLA zeroing and copying a
      buffer for every call (a wait that gave up, `_gpu_grid.SPIN_LIMIT`,
      leaves the rest of the decode's calls wrong too, not just its own).
  """
  keys: Tuple[Array, ...]
  values: Tuple[Array, ...]
  cross_keys: Tuple[Array, ...]
  cross_values: Tuple[Array, ...]
  encoder_valid: Array
  length: Array
  encoded: Optional[Array] = None
  features: Optional[Array] = None
  barriers: Optional[Array] = None

  @property
  def max_len(self) -> int:
    return self.keys[0].shape[-1]


def _write_chunk(cache_rows: Array, chunk: Array, start: Array) -> Array:
  """In-place write of a [B, K, H, D] chunk into [B, H, D, L] at start [B]."""

  def write_row(row, new, s):
    return lax.dynamic_update_slice(row, new, (0, 0, s))

  chunk = to_cache_layout(chunk).astype(cache_rows.dtype)
  return jax.vmap(write_row)(cache_rows, chunk, start)


class DecoderLayer(nn.Module):
  """A decoder layer; `decode_path` (a name in `decode_paths.PATHS`, whose
  object gives its self-attention projections and MLP) picks how
  `decode_chunk` / `decode_chunk_fused` compute, reading the paths' weights
  from `layers.PACKED_COLLECTION` (`decode_paths.pack`)."""
  config: T5Config
  decode_path: str = decode_paths.XLA

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
    y = self.encoder_decoder_attention.attend(
        y, [KeyValues(cross_keys, cross_values, cross_bias, CACHED)])
    x = x + self.dropout(y, deterministic=deterministic)
    y = self.pre_mlp_layer_norm(x)
    y = decode_paths.get(self.decode_path).mlp(self, y, deterministic)
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
    return to_cache_layout(keys), to_cache_layout(values)

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
    query, new_k, new_v = decode_paths.get(self.decode_path).self_qkv(self, y)
    attended = self.self_attention.out(
        attend(query, [
            KeyValues(keys, values, self_bias, CACHED),
            KeyValues(new_k, new_v, chunk_bias, PROJECTED)
        ], self.config))
    out = self._rest(x, attended, cross_keys, cross_values, cross_bias, True)
    return out, _write_chunk(keys, new_k,
                             start), _write_chunk(values, new_v, start)

  def decode_chunk_fused(self, weights, x, partials, keys, values, start, bias,
                         cross_keys, cross_values, encoder_valid):
    """`decode_chunk` in GPU kernels ('fused': `decode_paths.fused_layer`;
    weights: `decode_paths.fused_weights`; x, partials: the residual
    stream; bias: every slot's, `gpu.SelfBias`)."""
    return decode_paths.fused_layer(self, weights, x, partials, keys, values,
                                    start, bias, cross_keys, cross_values,
                                    encoder_valid)


def decode_layers(layers: Sequence[DecoderLayer], y: Array, cache: DecodeCache,
                  self_bias: Array, chunk_bias: Array,
                  cross_bias: Array) -> Tuple[Array, List[Array], List[Array]]:
  """Each layer's `DecoderLayer.decode_chunk` of y [B, K, E] in turn, the
  new tokens at cache.length: (y, the new keys per layer, the new values
  per layer)."""
  new_keys, new_values = [], []
  for i, layer in enumerate(layers):
    y, lk, lv = layer.decode_chunk(y, cache.keys[i], cache.values[i],
                                   cache.length, self_bias, chunk_bias,
                                   cache.cross_keys[i], cache.cross_values[i],
                                   cross_bias)
    new_keys.append(lk)
    new_values.append(lv)
  return y, new_keys, new_values


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module
  decode_path: str = decode_paths.XLA

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBiases(cfg.num_heads, cfg.dtype, False)
    # A list attribute names its modules layers_0, layers_1, ... as in T5X.
    self.layers = [
        DecoderLayer(cfg, self.decode_path)
        for _ in range(cfg.num_decoder_layers)
    ]
    self.decoder_norm = LayerNorm(cfg.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = DenseGeneral((cfg.vocab_size,), dtype=jnp.float32)

  def logits(self, y: Array) -> Array:
    """Top hidden states [..., emb] -> logits [..., vocab]."""
    return self._logits(y)

  def _logits(self, y: Array) -> Array:
    cfg = self.config
    if cfg.logits_via_embedding:
      return self.shared_embedding.attend(y) / jnp.sqrt(y.shape[-1])
    return self.logits_dense(y)

  def __call__(self, encoded, encoder_input_tokens, decoder_input_tokens,
               decoder_target_tokens, deterministic=True):
    """Teacher-forced decoder with T5X's masks: returns [B, T, vocab]."""
    return self._logits(
        self.hidden(encoded, encoder_input_tokens, decoder_input_tokens,
                    decoder_target_tokens, deterministic))

  def hidden(self, encoded, encoder_input_tokens, decoder_input_tokens,
             decoder_target_tokens, deterministic=True):
    """Teacher-forced top hidden states [B, T, emb] (after the final layer
    norm and dropout, before the output projection)."""
    cfg = self.config
    length = decoder_input_tokens.shape[1]
    positions = jnp.arange(length)
    relpos = self.relpos_bias(positions[None], positions, length)
    target_valid = decoder_target_tokens > 0
    causal = positions[:, None] >= positions[None, :]
    self_mask = (causal[None, None] & target_valid[:, None, :, None] &
                 target_valid[:, None, None, :])
    self_bias = relpos + mask_to_bias(self_mask, cfg.dtype)
    enc_valid = encoder_input_tokens > 0
    cross_bias = mask_to_bias(
        target_valid[:, None, :, None] & enc_valid[:, None, None, :], cfg.dtype)
    y = self.shared_embedding(decoder_input_tokens.astype(jnp.int32))
    y = self.dropout(y, deterministic=deterministic).astype(cfg.dtype)
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias, deterministic)
    y = self.decoder_norm(y)
    return self.dropout(y, deterministic=deterministic)

  def init_cache(self, encoded, encoder_valid, max_len, keep_features=False):
    """An empty cache over encoded [B, S, d] (encoder_valid [B, S] bool);
    with `keep_features`, room for the top hidden states too."""
    keys, values = zip(*[layer.cross_kv(encoded) for layer in self.layers])
    batch = encoded.shape[0]
    shape = (batch, self.config.num_heads, self.config.head_dim, max_len)
    empty = tuple(jnp.zeros(shape, self.config.dtype) for _ in self.layers)
    features = None
    if keep_features:
      features = jnp.zeros((batch, max_len, self.config.emb_dim),
                           self.config.dtype)
    barriers = (gpu_layers.barrier_counters(batch)
                if decode_paths.get(self.decode_path).fused else None)
    return DecodeCache(keys=empty, values=empty, cross_keys=tuple(keys),
                       cross_values=tuple(values), encoder_valid=encoder_valid,
                       length=jnp.zeros((batch,), jnp.int32), encoded=encoded,
                       features=features, barriers=barriers)

  def decode_chunk(self, tokens, cache: DecodeCache):
    logits, cache = self._decode_new(tokens, cache, None, None)
    return logits, dataclasses.replace(cache,
                                       length=cache.length + tokens.shape[1])

  def decode_argmax(self, logits, cache: DecodeCache):
    """`decode_chunk` of the tokens argmax(logits [B, K, V], -1): on the
    'fused' path taken in the call's first kernel, elsewhere by XLA."""
    if not decode_paths.get(self.decode_path).fused:
      return self.decode_chunk(gpu_layers.token_ids(logits), cache)
    out, cache = self._decode_new_fused(logits, cache, None, None)
    return out, dataclasses.replace(cache,
                                    length=cache.length + logits.shape[1])

  def decode_tree(self, tokens, parents, cache: DecodeCache):
    """Scores a token tree [B, N] after the cached prefix (`tree_visibility`).

    Node i sits at position length + depth_i and attends to the prefix and
    to its ancestors; its keys/values go to slots length + i (length is not
    advanced: `commit_path` keeps a path of them).
    """
    visible, depth = tree_visibility(parents)
    return self._decode_new(tokens, cache, depth, visible)

  def _decode_new(self, tokens, cache: DecodeCache, offsets, visible):
    """Runs K new tokens after the cache; writes their keys/values in place.

    Args:
      tokens: [B, K] int.
      cache: the cache; its length is left as it is.
      offsets: [B or 1, K] int, each token's position minus cache.length;
        None: a chain, 0..K-1 (`decode_chunk`).
      visible: [B or 1, K, K] bool, which new tokens each one attends to;
        None with offsets: a chain's, causal.

    Returns:
      (logits [B, K, V], cache with slots length..length+K-1 written).
    """
    cfg = self.config
    path = decode_paths.get(self.decode_path)
    if path.fused:
      return self._decode_new_fused(tokens, cache, offsets, visible)
    if offsets is None:  # A chain: the chunk attends to itself causally.
      chunk_pos = jnp.arange(tokens.shape[1])
      offsets = chunk_pos[None]
      visible = (chunk_pos[None, :] <= chunk_pos[:, None])[None]
    start = cache.length
    max_len = cache.max_len
    query_pos = start[:, None] + offsets  # [B, K]
    key_pos = jnp.arange(max_len)
    # Cache slots before the new tokens; relative positions among the new
    # tokens do not depend on start.
    mask = key_pos[None, None, :] < start[:, None, None]  # [B, 1, L]
    self_bias = (self.relpos_bias(query_pos, key_pos, max_len) +
                 mask_to_bias(mask[:, None], cfg.dtype))
    chunk_bias = (self.relpos_bias(offsets, offsets, max_len) +
                  mask_to_bias(visible[:, None], cfg.dtype))
    cross_bias = mask_to_bias(cache.encoder_valid[:, None, None, :], cfg.dtype)
    if path.biases_once:
      # Computed once per call: XLA would otherwise fuse the bias (a gather
      # of the relative-position table) into every layer's attention.
      self_bias, chunk_bias, cross_bias = lax.optimization_barrier(
          (self_bias, chunk_bias, cross_bias))
    y = self.shared_embedding(tokens.astype(jnp.int32)).astype(cfg.dtype)
    y, new_keys, new_values = decode_layers(self.layers, y, cache, self_bias,
                                            chunk_bias, cross_bias)
    y = self.decoder_norm(y)
    return self._finish(y, self._logits(y), cache, new_keys, new_values)

  def _finish(self, y, logits, cache: DecodeCache, new_keys, new_values):
    """(logits, the cache with the new keys/values, and the top hidden
    states y [B, K, emb] if it keeps them)."""
    start = cache.length
    features = cache.features
    if features is not None:  # Static: only a cache started to keep them.
      features = jax.vmap(
          lambda row, new, s: lax.dynamic_update_slice(row, new, (s, 0)))(
              features, y.astype(features.dtype), start)
    cache = dataclasses.replace(cache, keys=tuple(new_keys),
                                values=tuple(new_values), features=features)
    return logits, cache

  def _decode_new_fused(self, tokens, cache: DecodeCache, offsets, visible):
    """`_decode_new` on the 'fused' path: 6 GPU kernels a layer (or fewer:
    `gpu_tiles.Tiles`), the final norm and the logits in one more (`kernels.gpu`);
    the embedding gathered and the attention masks applied in the
    kernels. tokens: [B, K] int, or [B, K, V] logits whose argmax are the
    tokens (`decode_argmax`)."""
    cfg = self.config
    start = cache.length
    bias = decode_paths.self_bias(self.relpos_bias, cache.max_len, offsets,
                                  visible)
    embed = self.shared_embedding
    y: Any  # the residual stream's rows, first as the kernels gather them
    if getattr(embed, "dtype", None) == cfg.dtype:  # `layers.Embed`'s rows
      y = gpu_layers.Embedded(tokens, embed.variables["params"]["embedding"],
                              cfg.dtype)
    else:
      y = embed(gpu_layers.token_ids(tokens)).astype(cfg.dtype)
    y, partials, new_keys, new_values, barriers = decode_paths.fused_layers(
        self.layers, y, cache.keys, cache.values, start, bias, cache.cross_keys,
        cache.cross_values, cache.encoder_valid, cache.barriers)
    if cache.barriers is not None and barriers is not None:
      cache = dataclasses.replace(cache, barriers=barriers)
    y = gpu_layers.summed(y, partials)
    batch, k, emb = y.shape
    if cfg.logits_via_embedding or cache.features is not None:
      top = self.decoder_norm(y)  # XLA: a tied output layer, or kept states.
      logits = self._logits(top)
    else:
      top = y
      kernel = self.logits_dense.variables["params"]["kernel"]
      logits = gpu.rms_dense(y.reshape(batch * k, emb),
                             self.decoder_norm.variables["params"]["scale"],
                             kernel[None], ("linear",),
                             jnp.float32).reshape(batch, k, -1)
    return self._finish(top, logits, cache, new_keys, new_values)


def commit_path(cache: DecodeCache, path: Array,
                path_length: Array) -> DecodeCache:
  """Keeps one root-to-node path of a scored tree (`Decoder.decode_tree`).

  Moves the keys/values (and the kept hidden states, `features`, if any) of
  nodes path[b, :path_length[b]] (written at slots
  length + node) to slots length, length+1, ... and advances length by
  path_length; the other nodes' slots lie past the new length, masked, as
  after a rollback. Gathered before written, so a path may read slots it
  overwrites.

  Args:
    cache: the cache `decode_tree` returned (length: the prefix).
    path: [B, P] int node indices, path[b, j] the node at depth j (entries
      past path_length are ignored; length + P <= max_len).
    path_length: [B] int32 nodes kept per row, in [0, P].
  """
  start = cache.length
  slots = start[:, None] + path  # [B, P]

  def move(rows):
    picked = jnp.take_along_axis(rows, slots[:, None, None, :], axis=-1)
    return jax.vmap(
        lambda row, new, s: lax.dynamic_update_slice(row, new, (0, 0, s)))(
            rows, picked, start)

  features = cache.features
  if features is not None:  # [B, max_len, F]: kept hidden states move too.
    picked = jnp.take_along_axis(features, slots[:, :, None], axis=1)
    features = jax.vmap(
        lambda row, new, s: lax.dynamic_update_slice(row, new, (s, 0)))(
            features, picked, start)
  return dataclasses.replace(cache, keys=tuple(map(move, cache.keys)),
                             values=tuple(map(move, cache.values)),
                             length=start + path_length, features=features)


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
    decode_tree(tokens [B,N], parents [B,N], cache) -> (logits [B,N,vocab],
      cache): scores a token tree after the cache (`Decoder.decode_tree`);
      `commit_path` then keeps one path of it.
  """
  config: T5Config
  decode_path: str = decode_paths.XLA  # A name in `decode_paths.PATHS`.

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    if cfg.has_encoder:
      self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder, self.decode_path)

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

  def init_cache(self, encoded, encoder_input_tokens, max_len: int,
                 keep_features: bool = False):
    return self.decoder.init_cache(encoded, encoder_input_tokens > 0, max_len,
                                   keep_features)

  def init_cache_from_valid(self, encoded, encoder_valid, max_len: int,
                            keep_features: bool = False):
    return self.decoder.init_cache(encoded, encoder_valid, max_len,
                                   keep_features)

  def decode_hidden(self, encoded, encoder_input_tokens, decoder_input_tokens,
                    decoder_target_tokens):
    """Teacher forcing without dropout from encoded [B, S, d]: (top hidden
    states [B, T, emb], logits [B, T, vocab]) (a feature-level draft's
    training targets)."""
    hidden = self.decoder.hidden(encoded, encoder_input_tokens,
                                 decoder_input_tokens, decoder_target_tokens)
    return hidden, self.decoder.logits(hidden)

  def decode_chunk(self, tokens, cache):
    return self.decoder.decode_chunk(tokens, cache)

  def decode_argmax(self, logits, cache):
    return self.decoder.decode_argmax(logits, cache)

  def decode_tree(self, tokens, parents, cache):
    return self.decoder.decode_tree(tokens, parents, cache)


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
