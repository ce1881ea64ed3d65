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
from typing import Any, ContextManager, Iterator, NamedTuple, Optional, Tuple, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import structs
from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import decode_paths
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.layers import PACKED_COLLECTION
from specdec_jax.core.models.network import commit_path
from specdec_jax.core.models.network import DecodeCache
from specdec_jax.core.models.network import init_params
from specdec_jax.core.models.network import param_shapes
from specdec_jax.core.models.network import Transformer

Array = jax.Array

__all__ = [
    "DecodeCache", "EncoderOutput", "T5Model", "Transformer", "init_params",
    "param_shapes", "traced_overflow_checks"
]

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


class EncoderOutput(NamedTuple):
  """An encoder's output, as a target hands it to its drafter.

  Attributes:
    encoded: [B, S, d] the encoder's output (d: its model's emb_dim).
    valid: [B, S] bool, False at input padding.
  """
  encoded: Array
  valid: Array


def _check_parents(parents, shape) -> None:
  """ValueError unless parents is [N] or [B, N] with -1 <= parents[i] < i
  (checked on the host when concrete; traced parents are trusted)."""
  if np.shape(parents) not in (shape[1:], tuple(shape)):
    raise ValueError(
        f"decode_tree: parents must have shape [N] or [B, N] = {list(shape)} "
        f"(one per node), got {list(np.shape(parents))}.")
  try:
    values = np.asarray(parents)
  except jax.errors.TracerArrayConversionError:
    return
  nodes = np.arange(shape[1])
  bad = (values < -1) | (values >= nodes)
  if np.any(bad):
    raise ValueError(
        "decode_tree: parents[i] must be -1 (after the cached prefix) or an "
        f"earlier node's index in [0, i), got {values.tolist()}.")


@structs.dataclass
class T5Model:
  """A T5 `Transformer` bound to its parameters, as the decoders use it.

  A pytree: `params` and `packed` are traced leaves, `config` is static, so
  jitted decode functions take it as an argument without baking weights
  into the program.

  Attributes:
    config: the model's hyperparameters.
    params: {'params': {...}} in T5X's layout, always: what checkpoints
      save and converters read.
    packed: None, or the decode path's weights (`prepared_for_decoding`), a
      tree of its own beside `params` (flax collection
      `layers.PACKED_COLLECTION`): the CPU kernel's panels of the encoder's
      and decoder's kernels ('cpu_kernel': the dense layers multiply with
      them and never read the T5X-layout kernels; jit drops the unused
      arguments), or the decoder's packed kernels ('packed', 'fused':
      `decode_paths.pack`).
    decode_path: how decode calls compute (`decode_paths`): 'xla' (not
      prepared), 'cpu_kernel', 'packed' or 'fused'. Static: each path is its
      own compiled program.
    keep_features: whether `start` gives a cache that keeps the decoder's
      top hidden states (`DecodeCache.features`, read with `features`) for
      a feature-level drafter (`with_features`). False: the decode path is
      exactly the plain one.
    tiles: the GPU kernels' tiles its decode calls trace with
      (`with_tiles`); None: the context's (`gpu_tiles.current_tiles`).
      Static: a model under other tiles is another compiled program.
  """
  config: T5Config = structs.field(pytree_node=False)
  params: dict
  packed: Optional[dict] = None
  keep_features: bool = structs.field(pytree_node=False, default=False)
  decode_path: str = structs.field(pytree_node=False, default=decode_paths.XLA)
  tiles: Optional[gpu_tiles.Tiles] = structs.field(pytree_node=False,
                                                   default=None)

  @property
  def module(self) -> Transformer:
    return Transformer(self.config, self.decode_path)

  @property
  def variables(self) -> dict:
    """The flax variables to apply `module` with: params (+ the panels)."""
    if self.packed is None:
      return self.params
    return {**self.params, PACKED_COLLECTION: self.packed}

  def prepared_for_decoding(self, path: Optional[str] = None) -> "T5Model":
    """The same model with its decode path's weights beside its parameters.

    `path` (a name in `decode_paths.PATHS`; None: the backend's,
    `decode_paths.default_path`), its weights from `decode_paths.pack`:
    'cpu_kernel' packs every encoder and decoder kernel [in, out] into the
    CPU kernel's panels (`kernels.pack`), once, so that decode calls of
    1..64 rows (and short inputs' encoding) read each weight once and
    decoder calls give bit-identical rows whatever their number; 'packed'
    and 'fused' pack the decoder's kernels for the GPU ('fused' runs the
    GPU kernels of `kernels.gpu`, in Pallas' interpret mode off a GPU:
    tests); 'xla' packs nothing. Outputs agree with the unpacked model to
    the dtype's rounding (sums run in another order). `params` is
    untouched. A model already on `path` is returned as it is.

    Raises:
      ValueError: a path that cannot run here (`decode_paths.check`).
    """
    path = decode_paths.check(path, self.config)
    if path == self.decode_path:
      return self
    packed = decode_paths.pack(self.params["params"], path, self.config)
    return dataclasses.replace(self, packed=packed, decode_path=path)

  def unpacked(self) -> "T5Model":
    """The same model on the 'xla' path (undoes `prepared_for_decoding`)."""
    if self.packed is None and self.decode_path == decode_paths.XLA:
      return self
    return dataclasses.replace(self, packed=None, decode_path=decode_paths.XLA)

  def with_tiles(self, tiles: Optional[gpu_tiles.Tiles]) -> "T5Model":
    """The same model, its decode calls' GPU kernels traced with `tiles`
    (the 'fused' path's; None: the context's): e.g. a draft on one preset
    of `gpu_tiles.TILE_PRESETS`, its target on another. Part of the jit
    cache's key, unlike the context's, so models under different tiles
    compile apart (and may compile at once, in threads)."""
    if tiles is not None and not isinstance(tiles, gpu_tiles.Tiles):
      raise TypeError(f"with_tiles: tiles={tiles!r}; a gpu_tiles.Tiles (e.g. "
                      "one of gpu_tiles.TILE_PRESETS) or None.")
    if tiles == self.tiles:
      return self
    return dataclasses.replace(self, tiles=tiles)

  def _under_tiles(self) -> ContextManager[Any]:
    """Traces inside it use `tiles` (the context's if None)."""
    return (gpu_tiles.tiles(self.tiles)
            if self.tiles is not None else contextlib.nullcontext())

  def _decoding(self, *args, method) -> Tuple[Array, DecodeCache]:
    """module.apply of a decode method, its kernels traced under
    `tiles`."""
    with self._under_tiles():
      return cast(Tuple[Array, DecodeCache],
                  self.module.apply(self.variables, *args, method=method))

  def with_features(self) -> "T5Model":
    """The same model, whose decode caches keep the top hidden states."""
    return dataclasses.replace(self, keep_features=True)

  def features(self, cache: DecodeCache) -> Array:
    """[B, max_len, emb] top hidden states of the positions decoded so far.

    Entry [b, t] is the final-layer-norm output at position t, whose output
    projection gives the distribution of the token at t + 1; valid for
    t < cache.length[b]. The optional `Target.features` a feature-level
    drafter reads (`protocols.target_features`).

    Raises:
      ValueError: the cache was started without `keep_features`.
    """
    if cache.features is None:
      raise ValueError(
          "features: this cache keeps no hidden states; start it from "
          "`T5Model.with_features()` (keep_features=True).")
    return cache.features

  @property
  def interpreted_kernels(self) -> bool:
    """Whether its decode calls run Pallas kernels in interpret mode (the
    'fused' path off a GPU), which the loops compile for (`LoopProgram`)."""
    return decode_paths.get(self.decode_path).fused and gpu.interpret()

  @property
  def flat_chunk_cost(self) -> bool:
    """Whether its K-token calls cost about a 1-token call (its decode
    path's `flat_chunk_cost`: a drafter then never branches on K)."""
    return decode_paths.get(self.decode_path).flat_chunk_cost

  @property
  def unroll_draft_steps(self) -> bool:
    """Whether a drafter unrolls its steps on it (its decode path's)."""
    return decode_paths.get(self.decode_path).unroll_draft_steps

  @property
  def argmax_in_call(self) -> bool:
    """Whether `decode_argmax` takes the argmax in the call's first kernel
    (the 'fused' path) rather than in an XLA kernel of its own."""
    return decode_paths.get(self.decode_path).fused

  @property
  def is_packed(self) -> bool:
    """Whether a decode path's weights are there (`prepared_for_decoding`;
    which path: `decode_path`)."""
    return self.packed is not None

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

    keep = self.keep_features

    def fn(module, tokens):
      return module.init_cache(module.encode(tokens), tokens, max_len, keep)

    with self._under_tiles():  # The cache's barriers: `tiles`' programs.
      return nn.apply(fn, self.module)(self.variables, encoder_input_tokens)

  def encode(self, encoder_input_tokens: Array) -> EncoderOutput:
    """The encoder's output for [B, S] inputs (0 = padding)."""
    encoded = cast(
        Array,
        self.module.apply(self.variables, encoder_input_tokens,
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
    with self._under_tiles():
      return cast(
          DecodeCache,
          self.module.apply(self.variables, encoded, valid, max_len,
                            self.keep_features,
                            method=Transformer.init_cache_from_valid))

  def teacher_forced_logits(self, encoder_input_tokens: Array,
                            decoder_input_tokens: Array,
                            decoder_target_tokens: Array) -> Array:
    """[B, T, V] logits of teacher forcing (T5X's masks)."""
    return cast(
        Array,
        self.module.apply(self.variables, encoder_input_tokens,
                          decoder_input_tokens, decoder_target_tokens))

  def decode_chunk(self, tokens: Array,
                   cache: DecodeCache) -> Tuple[Array, DecodeCache]:
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
    return self._decoding(tokens, cache, method=Transformer.decode_chunk)

  def decode_argmax(self, logits: Array,
                    cache: DecodeCache) -> Tuple[Array, DecodeCache]:
    """`decode_chunk` of the tokens argmax(logits [B, K, V], -1) (as
    `jnp.argmax` takes it): a greedy draft's next step fed its last step's
    logits, the argmax taken in the call's first kernel where
    `argmax_in_call` (no kernel of its own between the two calls)."""
    self._check_chunk_fits(logits.shape[1], cache)
    return self._decoding(logits, cache, method=Transformer.decode_argmax)

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
          f"writes past the cache's max_len={max_len}.", length=cache.length)
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
    return dataclasses.replace(cache, length=jnp.minimum(cache.length, length))

  def decode_tree(self, tokens: Array, parents: Array,
                  cache: DecodeCache) -> Tuple[Array, DecodeCache]:
    """Scores N tree nodes in one call (`protocols.TreeTarget`).

    Node i of row b follows the cached prefix and its ancestors only: it
    sits at position cache.length[b] + depth_i (depth: its ancestors'
    count), attends to the prefix and to itself and its ancestors (a tree
    mask in self-attention; relative positions from depths), and
    cross-attends as any decoder position.

    Args:
      tokens: [B, N] int32 node tokens.
      parents: [B, N] (or [N]) int32 parent node index, -1 for a node right
        after the prefix; parents[i] < i.
      cache: the cache; cache.length + N <= max_len (checked as in
        `decode_chunk`).

    Returns:
      (logits [B, N, V]: logits[b, i] is the distribution after node i's
      root-to-node path; the cache with the nodes' keys/values at slots
      length + i and length unchanged, ready for `commit_path`).
    """
    self._check_chunk_fits(tokens.shape[1], cache)
    _check_parents(parents, tokens.shape)
    parents = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), tokens.shape)
    return self._decoding(tokens, parents, cache,
                          method=Transformer.decode_tree)

  def commit_path(self, cache: DecodeCache, path: Array,
                  path_length: Array) -> DecodeCache:
    """Keeps nodes path[b, :path_length[b]] of the last `decode_tree` as
    positions length, length+1, ...: by index, the rest dropped.

    path: [B, P] int32 node indices; path_length: [B] int32 in [0, P].
    """
    return commit_path(cache, jnp.asarray(path, jnp.int32),
                       jnp.asarray(path_length, jnp.int32))
