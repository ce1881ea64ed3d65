"""A GPU decoder layer in fewer kernels than `kernels.gpu`'s six.

* `decoder_layers` (`gpu_tiles.Tiles.layer_bytes`): small layers (a draft's) as
  one kernel, one program per row of the batch running each layer's six
  kernels' bodies in turn, each stage's rows through its own scratch, read back
  after a barrier: the same operations on the same blocks, so the same
  bits as the six kernels.
* `folded_self_attention`, `folded_cross_attention`, `folded_mlp`
  (`gpu_tiles.Tiles.fold_bytes`): a layer as one kernel a sublayer. Each program
  ends with its share of the sublayer's output projection (a head's rows
  of it; a block of the MLP's width) as float32 partial sums, and the next
  kernel's programs each add them to the residual as they read it
  (`_gpu_pieces.summed_row_loader`); `summed` adds the last layer's once,
  in XLA. Exact (a row's sums are the same operations in any call), but
  not the six kernels' bits: the projections are summed in another order.
* `Embedded`: the first layer's input as the tokens and the embedding
  table, whose rows either kind of layer gathers in its first kernel
  (`rows`: XLA's gather, for the six kernels).

Their tiles, interpret mode and lowering are `kernels.gpu`'s.
"""
import dataclasses
import functools
from typing import (Any, Callable, Dict, List, Optional, Sequence, Tuple, Union)

import jax
import jax.numpy as jnp

from specdec_jax.core.kernels import _gpu_bodies as _bodies
from specdec_jax.core.kernels import _gpu_layers_body as _run_kernel
from specdec_jax.core.kernels import _gpu_pieces as _pieces
from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_tiles

Array = jax.Array
F32 = gpu.F32


@dataclasses.dataclass(frozen=True)
class Embedded:
  """The residual stream before the first layer as its first kernel reads
  it: the tokens and the embedding table, each row gathered in a folded
  or one-kernel layer's kernel (`Tiles.fold_bytes`, `Tiles.layer_bytes`)
  rather than by an XLA kernel of its own on every call.

  Attributes:
    tokens: [B, K] int32, or [B, K, V] logits whose argmax over V are the
      tokens (a greedy draft's previous step's: the kernel takes it,
      `_pieces.argmax_token`).
    table: [V, E] the embedding (`layers.Embed`'s).
    dtype: the rows' (the model's; `layers.Embed` rounds to it).
  """
  tokens: Array
  table: Array
  dtype: Any

  @property
  def shape(self) -> Tuple[int, int, int]:
    batch, rows = self.tokens.shape[:2]
    return batch, rows, self.table.shape[-1]

  def rows(self) -> Array:
    """[B, K, E] the rows, gathered by XLA as `layers.Embed` does (NaN
    for a token outside the table): for kernels that read rows."""
    return jnp.take(jnp.asarray(self.table, self.dtype), token_ids(self.tokens),
                    axis=0)


def token_ids(tokens: Array) -> Array:
  """[B, K] int32: `Embedded.tokens` as ids, token ids [B, K] or the argmax
  of logits [B, K, V] (XLA's)."""
  if tokens.ndim == 3:
    return jnp.argmax(tokens, axis=-1).astype(jnp.int32)
  return tokens.astype(jnp.int32)


def argmax(logits: Array, block: int = 1024) -> Array:
  """[R] int32 each row's argmax of logits [R, V], as `Embedded`'s kernels
  take it (`_pieces.argmax_token`, in blocks of `block`), one program per
  row: for a check on the GPU against `jnp.argmax` (the device check's
  exactness phase)."""
  rows, vocab = logits.shape

  def kernel(logits_ref, out_ref):
    out_ref[0] = _pieces.argmax_token(logits_ref, 0, block)

  call = gpu.pallas_call(kernel, out_specs=[((rows,), jnp.int32, (1,), lambda r:
                                             (r,))],
                         in_specs=[((1, vocab), lambda r:
                                    (r, 0))], grid=(rows,), name="argmax")
  return call(logits)[0]


def rows(x: Union[Array, Embedded]) -> Array:
  """x's rows [B, K, E]: an `Embedded`'s gathered by XLA."""
  return x.rows() if isinstance(x, Embedded) else x


def _per_row(*block):
  """A block spec over a grid of rows of the batch (and their programs):
  row b's block."""
  return (None, *block), lambda b, *_: (b,) + (0,) * len(block)


def _rows_in(x: Union[Array, Embedded], per_row: Callable):
  """(arrays, block specs) of a kernel's input rows: x [B, K, E] a row of
  the batch's block per program (`per_row(*block)`: its spec), or an
  `Embedded`'s tokens (the row's) and table (whole)."""
  _, count, emb = x.shape
  if isinstance(x, Embedded):
    tokens = x.tokens if x.tokens.ndim == 3 else x.tokens.astype(jnp.int32)
    return ([tokens, x.table],
            [per_row(*tokens.shape[1:]),
             gpu.whole_block(x.table.shape)])
  return [x], [per_row(count, emb)]


def _layers_specs(x: Union[Array, Embedded], layers: Sequence[Sequence[Array]],
                  rows_specs, bias_specs, counters: Optional[Array],
                  fold: bool = False):
  """`decoder_layers`' (out_specs, in_specs) for `gpu.pallas_call`: a row of
  the batch's blocks per program, the weights whole; in: start, the rows,
  the bias, encoder_valid, each layer's `_run_kernel.LAYER_REFS` (with
  `counters`, the barriers' [B]); out: the outputs, each layer's
  cache, and the scratch its stages hand rows through (the attention
  context, the two residual streams, the MLP's hidden rows; with
  `counters` the attention projections, with `fold` the heads' partial
  sums [H, K, E] float32, and the counters; with an `Embedded` x, its
  gathered rows last)."""
  batch, rows, emb = x.shape
  keys, cross_keys, wi = layers[0][2], layers[0][7], layers[0][11]
  heads, head_dim, length = keys.shape[1:]
  enc, mlp = cross_keys.shape[-1], wi.shape[-1]
  dtype = x.dtype

  def whole(a):
    return tuple(a.shape), lambda *_: (0,) * a.ndim

  def rows_of(width):
    return (batch, rows, width), dtype, *_per_row(rows, width)

  cache = _per_row(heads, head_dim, length)
  encoded = _per_row(heads, head_dim, enc)
  out_specs = [rows_of(emb)]
  for _ in layers:
    out_specs += [(keys.shape, keys.dtype, *cache)] * 2
  out_specs += [
      rows_of(heads * head_dim),
      rows_of(emb),
      rows_of(emb),
      rows_of(mlp)
  ]
  if counters is not None:
    for parts in (3, 1):
      out_specs.append(((batch, rows, heads, parts, head_dim), dtype,
                        *_per_row(rows, heads, parts, head_dim)))
    if fold:
      out_specs.append(
          ((batch, heads, rows, emb), F32, *_per_row(heads, rows, emb)))
    out_specs.append((counters.shape, counters.dtype, *whole(counters)))
  if isinstance(x, Embedded):
    out_specs.append(rows_of(emb))
  in_specs = [((1,), lambda b, *_: (b,)), *rows_specs, *bias_specs,
              _per_row(enc)]
  blocks = dict(keys=cache, values=cache, cross_keys=encoded,
                cross_values=encoded)  # the rest whole
  for layer in layers:
    in_specs += [
        blocks[name] if name in blocks else whole(w)
        for name, w in zip(_run_kernel.LAYER_REFS, layer)
    ]
  if counters is not None:
    in_specs.append(whole(counters))
  return out_specs, in_specs


def decoder_layers(
    x: Union[Array, Embedded], keys: Sequence[Array], values: Sequence[Array],
    start: Array, bias: gpu.SelfBias, cross_keys: Sequence[Array],
    cross_values: Sequence[Array], encoder_valid: Array,
    weights: Sequence[Sequence[Array]], activations: Sequence[str], *,
    counters: Optional[Array] = None, eps: float = 1e-6
) -> Tuple[Array, List[Array], List[Array], Optional[Array]]:
  """Decoder layers in one kernel (`Tiles.layer_bytes`), one program per
  row of the batch, or (`Tiles.programs`) each row's share of the
  programs dividing each stage's blocks, apart by barriers
  (`_gpu_grid`): for a small model, whose six kernels a layer each cost a
  launch, not their bytes. Each layer the same operations on the same
  blocks as the six kernels (`self_attention`, `dense_residual`,
  `cross_attention`, `dense_residual`, `rms_dense`, `dense_residual`; with
  programs and `Tiles.split_heads`, eight: `head_projections` before
  each attention), its outputs the next one's input.

  Args:
    x: [B, K, E] or the first layer's `Embedded`; keys, values: each
      layer's [B, H, D, L] cache (donated on a GPU: written in place);
      start: [B]; bias: the self-attention's (`gpu.SelfBias`); cross_keys,
      cross_values: each layer's [B, H, D, S]; encoder_valid: [B, S] bool.
    weights: each layer's (self-attention norm scale [E], wqkv [H, 3, E,
      D], its output [H*D, E], cross-attention norm scale [E], wq [H, 1,
      E, D], its output [H*D, E], MLP norm scale [E], wi [P, E, M], wo [M,
      E]).
    activations: the MLP's, one per wi part.
    counters: with `Tiles.programs`, the barriers' counters [B] int32
      (`barrier_counters`: one array for a call's runs of layers, each
      counting on from the last one's count, so that XLA zeroes one
      buffer, not one a kernel, and the runs' kernels are the same
      program: `_gpu_grid`). None: zeros of its own.

  Returns:
    (the last layer's outputs [B, K, E] in x's dtype, each layer's keys,
    values, the counters (None without programs)).
  """
  layers = [(s, wqkv, k, v, so, cs, wq, ck, cv, co, ms, wi, wo) for (
      s, wqkv, so, cs, wq, co, ms, wi,
      wo), k, v, ck, cv in zip(weights, keys, values, cross_keys, cross_values)]
  batch = x.shape[0]
  programs = programs_per_row(batch)
  fold = _folds(programs, layers[0][1].shape[0], x.shape[-1])  # wqkv's H
  kernel = _layers_body(x, layers, bias, activations, programs, fold, eps)
  rows_in, rows_specs = _rows_in(x, _per_row)
  bias_in, bias_specs = gpu.self_bias_inputs(bias, per_head=False)
  if not programs:
    counters = None
  elif counters is None:
    counters = barrier_counters(batch)
  # The counters' place among the outputs (`_layers_specs`): after y, the
  # caches and the 6 scratch outputs (7 with `fold`).
  counters_out = 1 + 2 * len(layers) + 6 + fold
  out_specs, in_specs = _layers_specs(x, layers, rows_specs, bias_specs,
                                      counters, fold)
  # Layer i's keys and values among the inputs and the outputs; the
  # barriers' counters after the layers' inputs and the scratch.
  first = 2 + len(rows_in) + len(bias_in)
  count = len(_run_kernel.LAYER_REFS)
  aliases = {}
  for i in range(len(layers)):
    aliases[first + i * count + 2] = 1 + 2 * i
    aliases[first + i * count + 3] = 2 + 2 * i
  counted = [] if counters is None else [counters]
  if counted:
    aliases[first + len(layers) * count] = counters_out
  # Interpret mode: one program per row runs the stages for every program.
  grid = (batch,
          programs if not gpu.interpret() else 1) if programs else (batch,)
  call = gpu.pallas_call(kernel, out_specs=out_specs, in_specs=in_specs,
                         grid=grid, name="decode_layers",
                         aliases=None if gpu.interpret() else aliases)
  y, *outs = call(start.astype(jnp.int32), *rows_in, *bias_in,
                  encoder_valid.astype(bool),
                  *[w for layer in layers for w in layer], *counted)
  return (y, outs[0:2 * len(layers):2], outs[1:2 * len(layers):2],
          outs[counters_out - 1] if counted else None)


def _layers_body(x: Union[Array, Embedded], layers: Sequence[Sequence[Array]],
                 bias: gpu.SelfBias, activations: Sequence[str], programs: int,
                 fold: bool, eps: float) -> Callable:
  """`decoder_layers`' kernel: `_run_kernel.layers_kernel` with its blocks
  (the current tiles', for the layers' weights' dtype); `fold`:
  `_folds`'."""
  _, _, emb = x.shape
  _, wqkv, keys, _, _, _, _, cross_keys, _, _, _, wi, _ = layers[0]
  heads, _, _, head_dim = wqkv.shape
  length, enc, mlp = keys.shape[-1], cross_keys.shape[-1], wi.shape[-1]
  t = gpu_tiles.current_tiles().for_weights(wi.dtype)
  return functools.partial(
      _run_kernel.layers_kernel, layers=len(layers), fold=fold,
      ob=out_columns(emb, heads, programs) if fold else 0,
      embedded=isinstance(x, Embedded), bias=bias.form, heads=heads,
      eb=gpu.block(emb, t.emb_block), mlp_eb=gpu.block(emb, t.dense_emb_block),
      lb=min(t.slots,
             gpu.pow2_at_least(length)), cross_lb=min(t.slots,
                                                      gpu.pow2_at_least(enc)),
      kb=gpu.block(heads * head_dim,
                   t.in_block), mlp_kb=gpu.block(mlp, t.in_block),
      nb=gpu.block(emb, t.columns), mb=gpu.block(mlp, t.columns), eps=eps,
      on_gpu=not gpu.interpret(), dot=t.dot, activations=tuple(activations),
      programs=programs, split=t.split_heads, cols=gpu.block(
          head_dim, t.columns), prefetch=t.prefetch, attention_dot=t.dot and
      t.attention_dot)


# `Tiles.fold_outputs` folds layers whose heads' partial sums take at most
# this many bytes a row, which every block of the stage after an
# attention reads: T5-small's, base's and large's (6 x 512, 12 x 768,
# 16 x 1024 float32: 12, 36, 64 KB; their 1- and 8-token calls compile for
# an H200: benchmarks/issue56_gpu_aot_jax0112_fold_sizes.json). XXL's are
# 1 MB a row (64 x 4096), and its folded kernels asked for more shared
# memory than an H200 has (227 KB): 264 KB at 1 token (a head's [64, 2048]
# block of the output projection), 1.1 MB at 8 (each row's sums at the
# stages' 256- and 512-deep blocks; with 64-deep ones 264 KB). Wider layers
# run unfolded: eight stages.
FOLD_PARTS_BYTES = 64 << 10


def _folds(programs: int, heads: int, emb: int) -> bool:
  """Whether a run of layers over `programs`, of `heads` heads and width
  `emb`, folds its attentions' output projections (`Tiles.fold_outputs`,
  with `split_heads`; partial sums [heads, emb] float32 a row of at most
  `FOLD_PARTS_BYTES`). The model's shape decides, never the call's
  tokens: a token's bits are the same in a call of any length."""
  t = gpu_tiles.current_tiles()
  return bool(t.fold_outputs and t.split_heads and programs and
              heads * emb * 4 <= FOLD_PARTS_BYTES)


def out_columns(emb: int, heads: int, programs: int) -> int:
  """`Tiles.fold_outputs`' blocks of the model width: the narrowest (at
  least 16 columns, a tensor core's tile) for which a row's `programs`
  take every (head, block) at once, where they can (T5-small, 6 heads on
  128: 32 columns, 96 blocks)."""
  per_head = max(1, programs // heads)
  return gpu.block(emb, max(16, gpu.pow2_at_least(-(-emb // per_head))))


def barrier_counters(batch: int) -> Optional[Array]:
  """[B] int32 zeros: the barriers' counters of a call's runs of layers
  over many programs (`decoder_layers`' `counters`); None without
  `Tiles.programs`."""
  if not programs_per_row(batch):
    return None
  return jnp.zeros((batch,), jnp.int32)


def programs_per_row(batch: int) -> int:
  """Each row of the batch's programs in a one-kernel run of layers:
  `Tiles.programs` divided among the rows, at least 1; 0 without
  (one program per row)."""
  total = gpu_tiles.current_tiles().programs
  return max(1, total // batch) if total else 0


# ---------------------------------------------------------------------------
# A folded layer (`Tiles.fold_bytes`): three kernels, the residual stream
# between them as (x [B, K, E], partials [P, B, K, E] float32 or None).
# ---------------------------------------------------------------------------
def summed(x: Array, partials: Optional[Array]) -> Array:
  """The residual stream's rows: x [B, K, E] + the partial sums [P, B, K,
  E] (float32; the total rounded to x's dtype, then the sum, as a folded
  kernel's programs add them: `_pieces.summed_row_loader`, whose order of
  summing may differ); x itself where there are none. Once, before the
  final norm: the logits' ~1000 programs would each re-read them. Added
  one by one, in order: a reduction's order may depend on the shape on
  XLA:CPU, and a row's bits must not depend on the call's rows."""
  if partials is None:
    return x
  total = partials[0]
  for part in partials[1:]:
    total = total + part
  return (x.astype(F32) + total.astype(x.dtype).astype(F32)).astype(x.dtype)


def _stream(x: Union[Array, Embedded], partials: Optional[Array]):
  """(arrays, block specs, out_specs) of a folded kernel over (row of the
  batch, head or part): the stream's x (or the first layer's `Embedded`)
  and partials in, and with partials (or embedded) the summed (gathered)
  rows out, written by the programs of head or part 0."""
  batch, rows, emb = x.shape

  def per_row(*block):
    return (None, *block), lambda b, j: (b,) + (0,) * len(block)

  arrays, specs = _rows_in(x, per_row)
  if partials is not None:
    arrays.append(partials)
    specs.append(((partials.shape[0], None, rows, emb), lambda b, j:
                  (0, b, 0, 0)))
  outs = []
  if partials is not None or isinstance(x, Embedded):
    outs.append(((batch, rows, emb), x.dtype, *per_row(rows, emb)))
  return arrays, specs, outs


def _partials_out(x: Union[Array, Embedded], parts: int):
  """The out_spec of a folded kernel's partial sums [parts, B, K, E]: one
  [K, E] block per program (row of the batch, part)."""
  batch, rows, emb = x.shape
  return ((parts, batch, rows, emb), F32, (None, None, rows, emb), lambda b, j:
          (j, b, 0, 0))


def _folded_attention_blocks(emb: int, length: int) -> Dict[str, Any]:
  """A folded attention kernel's blocks: of its projections' contraction
  (eb), of cache slots (lb), of its partial sums' columns (nb), and
  whether on tensor cores."""
  t = gpu_tiles.current_tiles()
  return dict(eb=gpu.block(emb, t.emb_block), lb=min(t.slots,
                                                     gpu.pow2_at_least(length)),
              nb=gpu.block(emb, t.out_columns), dot=t.dot)


def _folded(x: Union[Array, Embedded], rows_out: Sequence[Any],
            results) -> Tuple:
  """(the stream's x after the kernel: its rows out if it wrote them
  (`_stream`'s rows_out), its partial sums, the rest)."""
  if rows_out:
    x, *results = results
  return (x, *results)


def folded_self_attention(x: Union[Array, Embedded], partials: Optional[Array],
                          scale: Array, wqkv: Array, w_out: Array, keys: Array,
                          values: Array, start: Array, bias: gpu.SelfBias, *,
                          eps: float = 1e-6):
  """A folded layer's self-attention sublayer in one kernel, one program
  per (row of the batch, head).

  Args:
    x, partials: the residual stream ([B, K, E] or the first layer's
      `Embedded`; [P, B, K, E] float32 or None: `summed`).
    scale, wqkv, keys, values, start, bias: as `self_attention`'s.
    w_out: [H*D, E] the output projection.

  Returns:
    (x [B, K, E]: the stream's rows before the sublayer, its partial sums
    [H, B, K, E] float32 (a head's each), keys, values).
  """
  batch, rows, emb = x.shape
  heads, _, _, head_dim = wqkv.shape
  length = keys.shape[-1]
  stream, stream_specs, sum_out = _stream(x, partials)
  kernel = functools.partial(_bodies.folded_self_attention_kernel,
                             bias=bias.form, summed=partials is not None,
                             embedded=isinstance(x, Embedded), eps=eps,
                             on_gpu=not gpu.interpret(),
                             **_folded_attention_blocks(emb, length))
  bias_in, bias_specs = gpu.self_bias_inputs(bias, per_head=True)
  cache = ((None, None, head_dim, length), lambda b, h: (b, h, 0, 0))
  # keys' and values' places among the inputs
  cached = 3 + len(stream) + len(bias_in)
  outs = len(sum_out) + 1
  call = gpu.pallas_call(
      kernel, out_specs=[
          *sum_out,
          _partials_out(x, heads), (keys.shape, keys.dtype) + cache,
          (values.shape, values.dtype) + cache
      ], in_specs=[((1,), lambda b, h: (b,)), *stream_specs,
                   gpu.whole_block(scale.shape),
                   ((None, 3, emb, head_dim), lambda b, h: (h, 0, 0, 0)),
                   *bias_specs, cache, cache,
                   ((head_dim, emb), lambda b, h: (h, 0))], grid=(batch, heads),
      name="decode_folded_self_attention",
      aliases=None if gpu.interpret() else {
          cached: outs,
          cached + 1: outs + 1
      })
  return _folded(
      x, sum_out,
      call(start.astype(jnp.int32), *stream, scale, wqkv, *bias_in, keys,
           values, w_out))


def folded_cross_attention(x: Array, partials: Optional[Array], scale: Array,
                           wq: Array, w_out: Array, keys: Array, values: Array,
                           encoder_valid: Array, *, eps: float = 1e-6):
  """A folded layer's cross-attention sublayer in one kernel, one program
  per (row of the batch, head): `cross_attention`'s arguments, the stream
  and the output projection w_out [H*D, E] as `folded_self_attention`'s.

  Returns:
    (x [B, K, E], partial sums [H, B, K, E] float32).
  """
  batch, rows, emb = x.shape
  heads, _, _, head_dim = wq.shape
  length = keys.shape[-1]
  stream, stream_specs, sum_out = _stream(x, partials)
  kernel = functools.partial(_bodies.folded_cross_attention_kernel,
                             summed=partials is not None, eps=eps,
                             **_folded_attention_blocks(emb, length))
  encoded = ((None, None, head_dim, length), lambda b, h: (b, h, 0, 0))
  call = gpu.pallas_call(
      kernel, out_specs=[*sum_out, _partials_out(x, heads)], in_specs=[
          *stream_specs,
          gpu.whole_block(scale.shape),
          ((None, 1, emb, head_dim), lambda b, h: (h, 0, 0, 0)), encoded,
          encoded, ((None, length), lambda b, h: (b, 0)),
          ((head_dim, emb), lambda b, h: (h, 0))
      ], grid=(batch, heads), name="decode_folded_cross_attention")
  return _folded(
      x, sum_out,
      call(*stream, scale, wq, keys, values, encoder_valid.astype(bool), w_out))


def folded_mlp(x: Array, partials: Optional[Array], scale: Array, wi: Array,
               wo: Array, activations: Sequence[str], *, eps: float = 1e-6):
  """A folded layer's MLP in one kernel, one program per (row of the
  batch, block of `Tiles.columns` of the MLP's width).

  Args:
    x, partials: the residual stream, as `folded_self_attention`'s.
    scale: [E]; wi: [P, E, M] the input weights, one per activation; wo:
      [M, E].

  Returns:
    (x [B, K, E], partial sums [M / block, B, K, E] float32).
  """
  batch, rows, emb = x.shape
  parts, _, mlp = wi.shape
  t = gpu_tiles.current_tiles().for_weights(wi.dtype)
  mb = gpu.block(mlp, t.columns)
  stream, stream_specs, sum_out = _stream(x, partials)
  kernel = functools.partial(_bodies.folded_mlp_kernel, summed=partials
                             is not None, activations=tuple(activations),
                             eb=gpu.block(emb, t.dense_emb_block),
                             nb=gpu.block(emb,
                                          t.out_columns), eps=eps, dot=t.dot)
  call = gpu.pallas_call(
      kernel, out_specs=[*sum_out, _partials_out(x, mlp // mb)], in_specs=[
          *stream_specs,
          gpu.whole_block(scale.shape),
          ((parts, emb, mb), lambda b, j: (0, 0, j)),
          ((mb, emb), lambda b, j: (j, 0))
      ], grid=(batch, mlp // mb), name="decode_folded_mlp")
  return _folded(x, sum_out, call(*stream, scale, wi, wo))
