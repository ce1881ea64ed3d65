"""A feature-level draft decoder (EAGLE-style) for an encoder-decoder target.

At buffer position t its input is the target decoder's top hidden state
f_{t-1} (after the final layer norm, before the output projection; zeros at
t = 0) fused with the embedding of token x_t: concatenated, then projected
to the draft's width (`fuse`), as EAGLE does. The target's own embedding
table is read, frozen (it is the target's, not a parameter of the draft).
One (or more) small T5 decoder layers follow, with self-attention over the
draft's own cache and cross-attention to the target's encoder output (as a
shared-encoder draft reads it). Two heads read the result:

  feature_out   [d, F]: the predicted f_t, which the draft feeds back as its
                own next input when it guesses further ahead;
  logits_dense  [d, K]: logits over K head tokens (the most frequent tokens
                of the training targets, `head_tokens`). The draft's q is
                the softmax over them and exactly 0 on every other token, a
                proper distribution over the full vocabulary (so Algorithm 1
                stays exact), at a fraction of a full [F, V] projection's
                bytes. With ``head_rank`` r set, a low-rank head instead:
                head_down [d, r] then logits_dense [r, K].

A trained head is made cheaper without retraining by `restrict_head` (keep
the K' most frequent of its tokens: q stays exactly 0 off them) and
`low_rank_head` (the best rank-r factorisation of its kernel, by SVD).

Parameter tree (T5X's names and 2-D kernels):

  fuse/kernel                                  [2F, d]
  relpos_bias/rel_embedding                    [heads, 32]
  layers_i/...                                 a T5 decoder layer, width d,
                                               cross-attention from width F
  decoder_norm/scale                           [d]
  feature_out/kernel                           [d, F]
  logits_dense/kernel                          [d, K] ([r, K] with rank r)
  head_down/kernel                             [d, r] (rank r only)

and, beside it in a checkpoint, `head_tokens` [K] int32 (not trained).
"""
import dataclasses
from typing import Any, Optional, Sequence, Tuple, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import structs
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.layers import DenseGeneral
from specdec_jax.core.models.layers import LayerNorm
from specdec_jax.core.models.layers import mask_to_bias
from specdec_jax.core.models.layers import RelativePositionBiases
from specdec_jax.core.models.network import decode_layers
from specdec_jax.core.models.network import DecodeCache
from specdec_jax.core.models.network import DecoderLayer

Array = jax.Array

# The logit of a token outside the head: exp underflows to exactly 0 after
# any temperature the samplers allow, so q is 0 there.
OUTSIDE_HEAD_LOGIT = -1e30


@dataclasses.dataclass(frozen=True)
class FeatureDrafterConfig:
  """Hyperparameters of a feature-level draft decoder.

  Attributes:
    vocab_size: the target's vocabulary size V.
    feature_dim: F, the target's emb_dim (its hidden states' and embedding
      table's width; also its encoder output's).
    emb_dim: d, the draft's own width.
    num_heads, head_dim, mlp_dim, mlp_activations: its decoder layers'.
    num_layers: decoder layers (1 or 2 in EAGLE).
    head_size: K, the number of head tokens (<= V).
    head_rank: None (a full [d, K] head) or r < d: a low-rank head
      [d, r] x [r, K].
    dtype: computation dtype.
  """
  vocab_size: int = 8000
  feature_dim: int = 512
  emb_dim: int = 128
  num_heads: int = 4
  head_dim: int = 32
  mlp_dim: int = 256
  num_layers: int = 1
  head_size: int = 4000
  head_rank: Optional[int] = None
  mlp_activations: Sequence[str] = ("gelu", "linear")
  dtype: Any = jnp.float32

  def __post_init__(self):
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    if isinstance(self.dtype, str):
      object.__setattr__(self, "dtype", jnp.dtype(self.dtype).type)
    for name in ("vocab_size", "feature_dim", "emb_dim", "num_heads",
                 "head_dim", "mlp_dim", "num_layers", "head_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"FeatureDrafterConfig.{name} must be a positive "
                         f"integer, got {value!r}.")
    rank = self.head_rank
    if rank is not None and (not isinstance(rank, int) or isinstance(
        rank, bool) or not 1 <= rank < self.emb_dim):
      raise ValueError(f"FeatureDrafterConfig.head_rank must be None or an "
                       f"integer in [1, emb_dim={self.emb_dim}), got "
                       f"{rank!r}.")
    if self.head_size > self.vocab_size:
      raise ValueError(f"FeatureDrafterConfig.head_size={self.head_size} "
                       f"exceeds vocab_size={self.vocab_size}.")

  @property
  def layer_config(self) -> T5Config:
    """The T5 config its decoder layers are built from."""
    return T5Config(vocab_size=self.vocab_size, dtype=self.dtype,
                    emb_dim=self.emb_dim, num_heads=self.num_heads,
                    num_encoder_layers=0, num_decoder_layers=self.num_layers,
                    head_dim=self.head_dim, mlp_dim=self.mlp_dim,
                    mlp_activations=self.mlp_activations,
                    encoder_width=self.feature_dim)

  @property
  def num_params(self) -> int:
    """Trained parameters (the target's embedding table is not counted)."""
    f, d, h, k = self.feature_dim, self.emb_dim, self.num_heads, self.head_dim
    attn = 4 * d * h * k
    cross = 2 * d * h * k + 2 * f * h * k
    mlp = len(self.mlp_activations) * d * self.mlp_dim + self.mlp_dim * d
    layer = attn + cross + mlp + 3 * d
    return (2 * f * d + h * 32 + self.num_layers * layer + d + d * f +
            self.head_params)

  @property
  def head_params(self) -> int:
    """Parameters of the head: d K, or (d + K) r with rank r."""
    if self.head_rank is None:
      return self.emb_dim * self.head_size
    return (self.emb_dim + self.head_size) * self.head_rank

  @property
  def step_params(self) -> int:
    """Parameters one draft step reads (the cross-attention keys/values
    are projected once per input, not per step)."""
    f, h, k = self.feature_dim, self.num_heads, self.head_dim
    return self.num_params - self.num_layers * 2 * f * h * k


def _self_biases(relpos, query_pos: Array, max_len: int, start: Array,
                 dtype) -> Tuple[Array, Array]:
  """(cache bias [B, H, K, max_len], chunk bias [1, H, K, K]) of a chunk at
  positions query_pos [B, K] = start[:, None] + arange(K)."""
  k = query_pos.shape[1]
  key_pos = jnp.arange(max_len)
  mask = key_pos[None, None, :] < start[:, None, None]
  self_bias = relpos(query_pos, key_pos, max_len) + mask_to_bias(
      mask[:, None], dtype)
  chunk_pos = jnp.arange(k)
  causal = chunk_pos[None, None, None, :] <= chunk_pos[None, None, :, None]
  chunk_bias = (relpos(chunk_pos[None], chunk_pos, max_len) +
                mask_to_bias(causal, dtype))
  return self_bias, chunk_bias


class FeatureDecoder(nn.Module):
  """The draft network (see the module docstring).

  Methods (use with `apply(variables, ..., method=...)`):
    __call__(features_prev [B,T,F], embedded [B,T,F], encoded [B,S,F],
      encoder_valid [B,S] bool, target_valid [B,T] bool): teacher forcing,
      -> (predicted features [B,T,F], head logits [B,T,K] float32).
    init_cache(encoded, encoder_valid, max_len) -> DecodeCache.
    decode_chunk(features_prev [B,K,F], embedded [B,K,F], cache):
      K positions per row at cache.length.. -> (features, head logits,
      cache).
  """
  config: FeatureDrafterConfig

  def setup(self):
    cfg = self.config
    layer = cfg.layer_config
    self.fuse = DenseGeneral((cfg.emb_dim,), dtype=cfg.dtype)
    self.relpos_bias = RelativePositionBiases(cfg.num_heads, cfg.dtype, False)
    self.layers = [DecoderLayer(layer) for _ in range(cfg.num_layers)]
    self.decoder_norm = LayerNorm(cfg.dtype)
    self.feature_out = DenseGeneral((cfg.feature_dim,), dtype=cfg.dtype)
    if cfg.head_rank is not None:
      self.head_down = DenseGeneral((cfg.head_rank,), dtype=jnp.float32)
    self.logits_dense = DenseGeneral((cfg.head_size,), dtype=jnp.float32)

  def _fused(self, features_prev: Array, embedded: Array) -> Array:
    x = jnp.concatenate([features_prev, embedded], axis=-1)
    return self.fuse(x.astype(self.config.dtype))

  def _heads(self, y: Array) -> Tuple[Array, Array]:
    y = self.decoder_norm(y)
    h = y if self.config.head_rank is None else self.head_down(y)
    return self.feature_out(y), self.logits_dense(h).astype(jnp.float32)

  def __call__(self, features_prev, embedded, encoded, encoder_valid,
               target_valid):
    cfg = self.config
    length = features_prev.shape[1]
    positions = jnp.arange(length)
    causal = positions[:, None] >= positions[None, :]
    self_mask = (causal[None, None] & target_valid[:, None, :, None] &
                 target_valid[:, None, None, :])
    self_bias = (self.relpos_bias(positions[None], positions, length) +
                 mask_to_bias(self_mask, cfg.dtype))
    cross_bias = mask_to_bias(
        target_valid[:, None, :, None] & encoder_valid[:, None, None, :],
        cfg.dtype)
    y = self._fused(features_prev, embedded)
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias)
    return self._heads(y)

  def init_cache(self, encoded, encoder_valid, max_len: int) -> DecodeCache:
    keys, values = zip(*[layer.cross_kv(encoded) for layer in self.layers])
    batch = encoded.shape[0]
    cfg = self.config
    shape = (batch, cfg.num_heads, cfg.head_dim, max_len)
    empty = tuple(jnp.zeros(shape, cfg.dtype) for _ in self.layers)
    return DecodeCache(keys=empty, values=empty, cross_keys=tuple(keys),
                       cross_values=tuple(values), encoder_valid=encoder_valid,
                       length=jnp.zeros((batch,), jnp.int32))

  def decode_chunk(self, features_prev, embedded, cache: DecodeCache):
    cfg = self.config
    start = cache.length
    k = features_prev.shape[1]
    query_pos = start[:, None] + jnp.arange(k)[None, :]
    self_bias, chunk_bias = _self_biases(self.relpos_bias, query_pos,
                                         cache.max_len, start, cfg.dtype)
    cross_bias = mask_to_bias(cache.encoder_valid[:, None, None, :], cfg.dtype)
    y = self._fused(features_prev, embedded)
    y, new_keys, new_values = decode_layers(self.layers, y, cache, self_bias,
                                            chunk_bias, cross_bias)
    features, logits = self._heads(y)
    cache = dataclasses.replace(cache, keys=tuple(new_keys),
                                values=tuple(new_values), length=start + k)
    return features, logits, cache


def full_logits(head_logits: Array, head_tokens: Array,
                vocab_size: int) -> Array:
  """Head logits [..., K] -> logits [..., V]: OUTSIDE_HEAD_LOGIT off the head.

  head_tokens: [K] int32 distinct token ids, entry i the token of logit i.
  """
  out = jnp.full(head_logits.shape[:-1] + (vocab_size,), OUTSIDE_HEAD_LOGIT,
                 jnp.float32)
  return out.at[..., head_tokens].set(head_logits.astype(jnp.float32))


def restrict_head(
    config: FeatureDrafterConfig, params: dict, head_tokens: Array,
    keep_tokens: Sequence[int]) -> Tuple[FeatureDrafterConfig, dict, Array]:
  """A trained draft with a smaller head: only `keep_tokens` of its head.

  The kept tokens' logits are unchanged, so q becomes the draft's q
  renormalised over them (exactly 0 elsewhere): still a distribution over
  the vocabulary, so verification stays exact; only α can change.

  Args:
    config, params ({'params': ...}), head_tokens [K] int32: the draft.
    keep_tokens: K' distinct ids, each one of head_tokens.

  Returns:
    (config with head_size K', params with the kept logits_dense columns,
    head_tokens [K'] int32 sorted).

  Raises:
    ValueError: a kept token outside the head, repeats, or none at all.
  """
  head = np.asarray(head_tokens)
  keep = np.sort(np.asarray(keep_tokens, np.int64))
  if keep.size == 0 or len(np.unique(keep)) != keep.size:
    raise ValueError(f"restrict_head: keep_tokens must be distinct and "
                     f"non-empty, got {keep.size} ids "
                     f"({len(np.unique(keep))} distinct).")
  column = {int(t): i for i, t in enumerate(head)}
  outside = [int(t) for t in keep if int(t) not in column]
  if outside:
    raise ValueError(f"restrict_head: keep_tokens {outside[:5]} are not in "
                     f"the head ({len(outside)} of {keep.size}).")
  columns = np.asarray([column[int(t)] for t in keep])
  tree = dict(params["params"])
  dense = dict(tree["logits_dense"])
  dense["kernel"] = jnp.asarray(dense["kernel"])[:, columns]
  tree["logits_dense"] = dense
  new = dataclasses.replace(config, head_size=int(keep.size))
  return new, {"params": tree}, jnp.asarray(keep, jnp.int32)


def low_rank_head(config: FeatureDrafterConfig, params: dict,
                  rank: int) -> Tuple[FeatureDrafterConfig, dict]:
  """A trained draft whose full head [d, K] becomes rank `rank`: the SVD's
  best rank-r approximation U_r S_r V_r^T, as head_down = U_r S_r^(1/2)
  [d, r] and logits_dense = S_r^(1/2) V_r^T [r, K].

  Raises:
    ValueError: the head is low-rank already, or a rank outside [1, d).
  """
  if config.head_rank is not None:
    raise ValueError(f"low_rank_head: the head has rank {config.head_rank} "
                     "already.")
  new = dataclasses.replace(config, head_rank=rank)  # Checks the rank.
  tree = dict(params["params"])
  kernel = np.asarray(tree["logits_dense"]["kernel"], np.float64)
  u, s, vt = np.linalg.svd(kernel, full_matrices=False)
  root = np.sqrt(s[:rank])
  dtype = jnp.asarray(tree["logits_dense"]["kernel"]).dtype
  tree["head_down"] = {"kernel": jnp.asarray(u[:, :rank] * root, dtype)}
  tree["logits_dense"] = {
      "kernel": jnp.asarray(root[:, None] * vt[:rank], dtype)
  }
  return new, {"params": tree}


def shifted_features(features: Array) -> Array:
  """[B, T, F] f_0..f_{T-1} -> the inputs f_{-1}..f_{T-2} (f_{-1} = 0)."""
  return jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :-1]


def init_feature_params(config: FeatureDrafterConfig, rng: Array,
                        encoder_length: int = 8, decoder_length: int = 8):
  """Random parameters {'params': {...}} (no `head_tokens`)."""
  f = config.feature_dim
  feats = jnp.ones((1, decoder_length, f), config.dtype)
  encoded = jnp.ones((1, encoder_length, f), config.dtype)
  return FeatureDecoder(config).init(rng, feats, feats, encoded,
                                     jnp.ones((1, encoder_length), bool),
                                     jnp.ones((1, decoder_length), bool))


@structs.dataclass
class FeatureDraftModel:
  """A `FeatureDecoder` bound to its parameters and its target's tables.

  A pytree (arrays traced, `config` static), as the decode loops take it.

  Attributes:
    config: the draft's hyperparameters.
    params: {'params': ...} its `FeatureDecoder` parameters.
    head_tokens: [K] int32 the head's token ids (distinct).
    embedding: [V, F] the target's token embedding table (read, frozen).
  """
  config: FeatureDrafterConfig = structs.field(pytree_node=False)
  params: dict
  head_tokens: Array
  embedding: Array

  @classmethod
  def for_target(cls, config: FeatureDrafterConfig, params: dict,
                 head_tokens: Array, target: Any) -> "FeatureDraftModel":
    """Checks the draft against `target` (a `T5Model`), then binds them."""
    tcfg = target.config
    if (tcfg.vocab_size, tcfg.emb_dim) != (config.vocab_size,
                                           config.feature_dim):
      raise ValueError(
          f"FeatureDraftModel: the target has vocab_size {tcfg.vocab_size} "
          f"and emb_dim {tcfg.emb_dim}, the draft reads vocab_size "
          f"{config.vocab_size} and features of width {config.feature_dim}.")
    if tuple(jnp.shape(head_tokens)) != (config.head_size,):
      raise ValueError(f"FeatureDraftModel: head_tokens has shape "
                       f"{tuple(jnp.shape(head_tokens))}, expected "
                       f"({config.head_size},).")
    table = target.params["params"]["token_embedder"]["embedding"]
    return cls(config=config, params=params,
               head_tokens=jnp.asarray(head_tokens, jnp.int32),
               embedding=jnp.asarray(table, config.dtype))

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def start_from_encoder_output(self, encoder_output: Any,
                                max_len: int) -> DecodeCache:
    """An empty cache over the target's (encoded [B, S, F], valid [B, S])."""
    encoded, valid = encoder_output
    return cast(
        DecodeCache,
        FeatureDecoder(self.config).apply(self.params, encoded, valid, max_len,
                                          method=FeatureDecoder.init_cache))

  def decode_chunk(self, features_prev: Array, tokens: Array,
                   cache: DecodeCache) -> Tuple[Array, Array, DecodeCache]:
    """Feeds K positions per row at cache.length.

    Args:
      features_prev: [B, K, F] the feature of each position's predecessor
        (the target's, or the draft's own prediction; zeros at position 0).
      tokens: [B, K] int32 each position's token.
      cache: the draft's cache.

    Returns:
      (predicted features [B, K, F], logits [B, K, V] float32 with
      OUTSIDE_HEAD_LOGIT off the head, the advanced cache).
    """
    embedded = jnp.take(self.embedding, tokens, axis=0)
    features, head_logits, cache = cast(
        Tuple[Array, Array, DecodeCache],
        FeatureDecoder(self.config).apply(
            self.params, features_prev.astype(self.config.dtype), embedded,
            cache, method=FeatureDecoder.decode_chunk))
    logits = full_logits(head_logits, self.head_tokens, self.vocab_size)
    return features, logits, cache

  def truncate(self, cache: DecodeCache, length: Array) -> DecodeCache:
    """Forgets positions >= length [B] (L = min(L, length))."""
    return dataclasses.replace(cache, length=jnp.minimum(cache.length, length))
