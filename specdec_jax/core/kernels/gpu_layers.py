"""A GPU decoder layer in fewer kernels than `kernels.gpu`'s six.

* `decoder_layer` (`gpu.Tiles.layer_bytes`): a small layer (a draft's) as
  one kernel, one program per row of the batch running the six kernels'
  bodies in turn, each stage's rows through its own scratch, read back
  after a barrier: the same operations on the same blocks, so the same
  bits as the six kernels.
* `folded_self_attention`, `folded_cross_attention`, `folded_mlp`
  (`gpu.Tiles.fold_bytes`): a layer as one kernel a sublayer. Each program
  ends with its share of the sublayer's output projection (a head's rows
  of it; a block of the MLP's width) as float32 partial sums, and the next
  kernel's programs each add them to the residual as they read it
  (`_gpu_pieces.summed_row_loader`); `summed` adds the last layer's once,
  in XLA. Exact (a row's sums are the same operations in any call), but
  not the six kernels' bits: the projections are summed in another order.

Their tiles, interpret mode and lowering are `kernels.gpu`'s.
"""
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from specdec_jax.core.kernels import _gpu_bodies as _bodies
from specdec_jax.core.kernels import gpu

Array = jax.Array
F32 = gpu.F32


def _layer_specs(x: Array, keys: Array, cross_keys: Array, bias: Array,
                 weights: Sequence[Array]):
  """`decoder_layer`'s (out_specs, in_specs) for `gpu.pallas_call`: a row of the
  batch's blocks per program, the weights whole; out: the layer's outputs,
  the cache, and the scratch its stages hand rows through (the attention
  context, the two residual streams, the MLP's hidden rows)."""
  batch, rows, emb = x.shape
  heads, head_dim, length = keys.shape[1:]
  enc, mlp = cross_keys.shape[-1], weights[7].shape[-1]

  def per_row(*shape):
    return (None, *shape), lambda b: (b,) + (0,) * len(shape)

  def whole(a):
    return tuple(a.shape), lambda b: (0,) * a.ndim

  def rows_of(width):
    return (batch, rows, width), x.dtype, *per_row(rows, width)

  cache = per_row(heads, head_dim, length)
  encoded = per_row(heads, head_dim, enc)
  out_specs = [
      rows_of(emb), (keys.shape, keys.dtype, *cache),
      (keys.shape, keys.dtype, *cache),
      rows_of(heads * head_dim),
      rows_of(emb),
      rows_of(emb),
      rows_of(mlp)
  ]
  one_bias = bias.shape[0] == 1
  in_specs = [((1,), lambda b: (b,)),
              per_row(rows, emb), *map(whole, weights[:2]),
              ((None, heads, rows, length), lambda b:
               (0 if one_bias else b, 0, 0, 0)), cache, cache,
              *map(whole, weights[2:5]), encoded, encoded,
              per_row(enc), *map(whole, weights[5:])]
  return out_specs, in_specs


def decoder_layer(x: Array, keys: Array, values: Array, start: Array,
                  bias: Array, cross_keys: Array, cross_values: Array,
                  cross_bias: Array, weights: Sequence[Array],
                  activations: Sequence[str], *,
                  eps: float = 1e-6) -> Tuple[Array, Array, Array]:
  """A whole decoder layer in one kernel, one program per row of the
  batch (`Tiles.layer_bytes`): for a small draft, whose six kernels a
  layer each cost a launch, not their bytes. The same operations on the
  same blocks as the six kernels (`self_attention`, `dense_residual`,
  `cross_attention`, `dense_residual`, `rms_dense`, `dense_residual`).

  Args:
    x: [B, K, E]; keys, values: [B, H, D, L] the layer's cache (donated on
      a GPU: written in place); start: [B]; bias: [B or 1, H, K, L] float32;
      cross_keys, cross_values: [B, H, D, S]; cross_bias: [B, S] float32.
    weights: (self-attention norm scale [E], wqkv [H, 3, E, D], its output
      [H*D, E], cross-attention norm scale [E], wq [H, 1, E, D], its output
      [H*D, E], MLP norm scale [E], wi [P, E, M], wo [M, E]).
    activations: the MLP's, one per wi part.

  Returns:
    (outputs [B, K, E] in x's dtype, keys, values).
  """
  (self_scale, wqkv, self_out, cross_scale, wq, cross_out, mlp_scale, wi,
   wo) = weights
  batch, _, emb = x.shape
  heads, _, _, head_dim = wqkv.shape
  length, enc = keys.shape[-1], cross_keys.shape[-1]
  mlp = wi.shape[-1]
  t = gpu.current_tiles()
  kernel = functools.partial(
      _bodies.layer_kernel, heads=heads, eb=gpu.block(emb, t.emb_block),
      lb=min(t.slots,
             gpu.pow2_at_least(length)), cross_lb=min(t.slots,
                                                      gpu.pow2_at_least(enc)),
      kb=gpu.block(heads * head_dim,
                   t.in_block), mlp_kb=gpu.block(mlp, t.in_block),
      nb=gpu.block(emb, t.columns), mb=gpu.block(mlp, t.columns), eps=eps,
      on_gpu=not gpu.interpret(), dot=t.dot, activations=tuple(activations))
  out_specs, in_specs = _layer_specs(x, keys, cross_keys, bias, weights)
  call = gpu.pallas_call(kernel, out_specs=out_specs, in_specs=in_specs,
                         grid=(batch,), name="decode_layer",
                         aliases=None if gpu.interpret() else {
                             5: 1,
                             6: 2
                         })
  y, keys, values, *_ = call(start.astype(jnp.int32), x, self_scale, wqkv,
                             bias.astype(F32), keys, values, self_out,
                             cross_scale, wq, cross_keys, cross_values,
                             cross_bias.astype(F32), cross_out, mlp_scale, wi,
                             wo)
  return y, keys, values


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


def _stream(x: Array, partials: Optional[Array]):
  """(arrays, block specs, out_specs) of a folded kernel over (row of the
  batch, head or part): the stream's x and partials in, and with partials
  the summed rows out (written by the programs of head or part 0)."""
  batch, rows, emb = x.shape
  arrays = [x]
  specs: List[Any] = [((None, rows, emb), lambda b, j: (b, 0, 0))]
  outs = []
  if partials is not None:
    arrays.append(partials)
    specs.append(((partials.shape[0], None, rows, emb), lambda b, j:
                  (0, b, 0, 0)))
    outs.append(((batch, rows, emb), x.dtype, (None, rows, emb), lambda b, j:
                 (b, 0, 0)))
  return arrays, specs, outs


def _partials_out(x: Array, parts: int):
  """The out_spec of a folded kernel's partial sums [parts, B, K, E]: one
  [K, E] block per program (row of the batch, part)."""
  batch, rows, emb = x.shape
  return ((parts, batch, rows, emb), F32, (None, None, rows, emb), lambda b, j:
          (j, b, 0, 0))


def _folded_attention_blocks(emb: int, length: int) -> Dict[str, Any]:
  """A folded attention kernel's blocks: of its projections' contraction
  (eb), of cache slots (lb), of its partial sums' columns (nb), and
  whether on tensor cores."""
  t = gpu.current_tiles()
  return dict(eb=gpu.block(emb, t.emb_block), lb=min(t.slots,
                                                     gpu.pow2_at_least(length)),
              nb=gpu.block(emb, t.out_columns), dot=t.dot)


def _folded(x: Array, partials: Optional[Array], results) -> Tuple:
  """(the stream's x after the kernel, its partial sums, the rest)."""
  if partials is not None:
    x, *results = results
  return (x, *results)


def folded_self_attention(x: Array, partials: Optional[Array], scale: Array,
                          wqkv: Array, w_out: Array, keys: Array, values: Array,
                          start: Array, bias: Array, *, eps: float = 1e-6):
  """A folded layer's self-attention sublayer in one kernel, one program
  per (row of the batch, head).

  Args:
    x, partials: the residual stream ([B, K, E]; [P, B, K, E] float32 or
      None: `summed`).
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
                             summed=partials is not None, eps=eps,
                             on_gpu=not gpu.interpret(),
                             **_folded_attention_blocks(emb, length))
  one_bias = bias.shape[0] == 1
  cache = ((None, None, head_dim, length), lambda b, h: (b, h, 0, 0))
  cached = 4 + len(stream)  # keys' and values' places among the inputs
  outs = len(sum_out) + 1
  call = gpu.pallas_call(
      kernel, out_specs=[
          *sum_out,
          _partials_out(x, heads), (keys.shape, keys.dtype) + cache,
          (values.shape, values.dtype) + cache
      ], in_specs=[((1,), lambda b, h: (b,)), *stream_specs,
                   gpu.whole_block(scale.shape),
                   ((None, 3, emb, head_dim), lambda b, h: (h, 0, 0, 0)),
                   ((None, None, rows, length), lambda b, h:
                    (0 if one_bias else b, h, 0, 0)), cache, cache,
                   ((head_dim, emb), lambda b, h: (h, 0))], grid=(batch, heads),
      name="decode_folded_self_attention",
      aliases=None if gpu.interpret() else {
          cached: outs,
          cached + 1: outs + 1
      })
  return _folded(
      x, partials,
      call(start.astype(jnp.int32), *stream, scale, wqkv, bias.astype(F32),
           keys, values, w_out))


def folded_cross_attention(x: Array, partials: Optional[Array], scale: Array,
                           wq: Array, w_out: Array, keys: Array, values: Array,
                           bias: Array, *, eps: float = 1e-6):
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
      x, partials,
      call(*stream, scale, wq, keys, values, bias.astype(F32), w_out))


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
  t = gpu.current_tiles()
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
  return _folded(x, partials, call(*stream, scale, wi, wo))
