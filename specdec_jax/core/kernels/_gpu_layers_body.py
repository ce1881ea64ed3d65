"""The kernel body of a run of decoder layers (`gpu_layers.decoder_layers`):
a row of the batch's tokens through each layer's six kernels' bodies
(`_gpu_bodies`) in turn, as stages that hand rows to each other through
scratch outputs, run by one program or divided among many
(`_gpu_grid.Stages`).
"""
import functools
from typing import Tuple

from specdec_jax.core.kernels import _gpu_grid as _grid
from specdec_jax.core.kernels import _gpu_pieces as _pieces
from specdec_jax.core.kernels import _gpu_bodies as _bodies

# A layer's refs in `layers_kernel`, in order.
LAYER_REFS = ("self_scale", "wqkv", "keys", "values", "self_out", "cross_scale",
              "wq", "cross_keys", "cross_values", "cross_out", "mlp_scale",
              "wi", "wo")


def layers_kernel(start_ref, *refs, layers: int, embedded: bool,
                  bias: _bodies.BiasForm, heads: int, eb: int, mlp_eb: int,
                  lb: int, cross_lb: int, kb: int, mlp_kb: int, nb: int,
                  mb: int, eps: float, on_gpu: bool, dot: bool,
                  activations: Tuple[str, ...], programs: int = 0,
                  split: bool = False, cols: int = 0, prefetch: bool = False):
  """`decoder_layers`: a row of the batch's K tokens through `layers`
  decoder layers in turn, each the six kernels' bodies in turn as stages
  (`_layer`), each stage's rows written to scratch and read back after a
  barrier; a layer's outputs (y_ref) are the next one's input
  (`embedded`: the first's input is the tokens and the embedding table,
  the rows gathered first into the last output). One program runs every
  stage (`programs` 0), or each row's `programs` share each stage's blocks
  (`_gpu_grid.Stages`; `split`: the attention projections a stage of their
  own, blocks of (head, part, `cols` columns), as `head_projections`';
  `prefetch`: `Tiles.prefetch`).

  Refs: start, the input rows (x, or tokens and table), the bias's refs,
  encoder_valid, each layer's `LAYER_REFS`, with programs the barriers'
  counters [B]; out: y, each layer's
  keys and values, the scratch (ctx, mid, mid2, hidden; with programs the
  self- and cross-attention's projections [K, H, 3, D], [K, H, 1, D] and
  the counters) and with `embedded` the gathered rows."""
  pl, plgpu = _pieces.pallas()
  if embedded:
    tokens_ref, table_ref, x_ref = refs[0], refs[1], refs[-1]
    refs = refs[2:-1]
  else:
    x_ref, refs = refs[0], refs[1:]
  bias_refs, refs = refs[:bias.refs], refs[bias.refs:]
  encoder_valid, refs = refs[0], refs[1:]
  count = len(LAYER_REFS)
  weights = [refs[i * count:(i + 1) * count] for i in range(layers)]
  refs = refs[layers * count + (1 if programs else 0):]  # less the zeros
  y_ref, outs = refs[0], refs[1:]
  caches, scratch = outs[:2 * layers], list(outs[2 * layers:])
  counter_ref = scratch.pop() if programs else None
  rows, emb = y_ref.shape
  stages = _grid.Stages(programs, on_gpu, counter_ref, prefetch)
  layer = functools.partial(_layer, stages=stages, bias=bias, heads=heads,
                            eb=eb, mlp_eb=mlp_eb, lb=lb, cross_lb=cross_lb,
                            kb=kb, mlp_kb=mlp_kb, nb=nb, mb=mb, eps=eps,
                            on_gpu=on_gpu, dot=dot, activations=activations,
                            split=split and bool(programs), cols=cols)

  if embedded:  # Each program gathers every row: the same bits stored.
    row = _pieces.embedded_row_loader(tokens_ref, table_ref, x_ref, eb, True)
    for r in range(rows):
      for j in range(emb // eb):
        row(r, pl.ds(j * eb, eb))
    if on_gpu:  # The program's threads see the rows.
      plgpu.debug_barrier()
  for i in range(layers):
    if i:
      stages.wait()
    layer(start_ref, x_ref if i == 0 else y_ref, bias_refs, encoder_valid,
          weights[i], caches[2 * i:2 * i + 2], y_ref, *scratch)


def _layer(start_ref, x_ref, bias_refs, encoder_valid, weights, caches, y_ref,
           ctx_ref, mid_ref, mid2_ref, hidden_ref, self_proj=None,
           cross_proj=None, *, stages: _grid.Stages, bias: _bodies.BiasForm,
           heads: int, eb: int, mlp_eb: int, lb: int, cross_lb: int, kb: int,
           mlp_kb: int, nb: int, mb: int, eps: float, on_gpu: bool, dot: bool,
           activations: Tuple[str, ...], split: bool, cols: int):
  """One layer of `layers_kernel`: x_ref's rows through the six kernels'
  bodies (with `split`, eight: `head_projections`' before each attention)
  as stages into y_ref (which may be x_ref: the stages that read x end
  before the last one writes y)."""
  pl, _ = _pieces.pallas()
  (self_scale, wqkv, keys_in, values_in, self_out, cross_scale, wq, cross_keys,
   cross_values, cross_out, mlp_scale, wi, wo) = weights
  keys_ref, values_ref = caches
  rows, emb = y_ref.shape
  head_dim, mlp = wqkv.shape[-1], wi.shape[-1]
  if not on_gpu:
    # Interpret mode: the cache is not aliased (`self_attend`), so its block
    # is copied in before any head writes it.
    keys_ref[...] = keys_in[...]
    values_ref[...] = values_in[...]

  proj = functools.partial(_projection_stage, stages, heads=heads, cols=cols,
                           eb=eb, eps=eps, dot=dot, split=split)
  residual = functools.partial(_residual_stage, stages, nb=nb, dot=dot)

  def head_at(h):  # head h's index in the weights, its columns of ctx
    return (_grid.index(h),), pl.ds(_pieces.block_start(h, head_dim), head_dim)

  def self_attention(h, refs, first=None):
    index, cols_ = head_at(h)
    _bodies.self_attention_kernel(start_ref, *refs, *bias_refs, keys_in,
                                  values_in, ctx_ref, keys_ref, values_ref,
                                  bias=bias, rows=rows, eb=eb, lb=lb, eps=eps,
                                  on_gpu=on_gpu, dot=dot, split=split,
                                  head=index, ctx_cols=cols_, copy_cache=False,
                                  first=first)

  def cross_attention(h, refs, first=None):
    index, cols_ = head_at(h)
    _bodies.cross_attention_kernel(*refs, cross_keys, cross_values,
                                   encoder_valid, ctx_ref, rows=rows, eb=eb,
                                   lb=cross_lb, eps=eps, dot=dot, split=split,
                                   head=index, ctx_cols=cols_, first=first)

  def mlp_in(j, first=None):
    _bodies.rms_dense_body(mid2_ref, mlp_scale, wi, hidden_ref, 0,
                           rows_total=rows, activations=activations, eb=mlp_eb,
                           eps=eps, dot=dot,
                           first_col=_pieces.block_start(j, mb), nb=mb,
                           first=first)

  refs = proj(x_ref, self_scale, wqkv, self_proj)
  stages.run(
      heads, lambda h, first=None: self_attention(h, refs, first),
      lambda h, live=None: _bodies.self_attention_first(
          start_ref, bias_refs, keys_ref, h, live, bias=bias, rows=rows, lb=lb))
  stages.wait()
  residual(ctx_ref, self_out, x_ref, mid_ref, kb=kb)
  refs = proj(mid_ref, cross_scale, wq, cross_proj)
  stages.run(
      heads, lambda h, first=None: cross_attention(h, refs, first),
      functools.partial(_bodies.cross_attention_first, cross_keys, cross_values,
                        encoder_valid, rows=rows, lb=cross_lb))
  stages.wait()
  residual(ctx_ref, cross_out, mid_ref, mid2_ref, kb=kb)
  stages.run(
      mlp // mb, mlp_in, lambda j, live=None: _bodies.rms_dense_first(
          wi, _pieces.block_start(j, mb), live, eb=mlp_eb, nb=mb))
  stages.wait()
  residual(hidden_ref, wo, mid2_ref, y_ref, kb=mlp_kb, last=True)


def _projection_stage(stages: _grid.Stages, x, scale, w, out, *, heads: int,
                      cols: int, eb: int, eps: float, dot: bool,
                      split: bool) -> Tuple:
  """The refs an attention stage reads its heads' projections from: x,
  scale and w (w [H, P, E, D]), or (`split`) `out` [rows, H, P, D],
  written by a stage of their own (then its barrier)."""
  if not split:
    return x, scale, w
  stages.run(
      heads * w.shape[1] * (w.shape[-1] // cols),
      lambda i, first=None: _bodies.head_projection_block(
          x, scale, w, out, i, first, cols=cols, eb=eb, eps=eps, dot=dot),
      lambda i, live=None: _bodies.head_projection_first(
          w, i, live, cols=cols, eb=eb))
  stages.wait()
  return (out,)


def _residual_stage(stages: _grid.Stages, x, w, res, out, *, kb: int, nb: int,
                    dot: bool, last: bool = False) -> None:
  """res + x @ w into out (x [rows, F], w [F, E]), a stage in blocks of nb
  columns; then its barrier, unless it is the layer's `last`."""
  rows, emb = out.shape

  def block(j, first=None):
    _bodies.dense_residual_body(x, w, res, out, 0, rows_total=rows, kb=kb,
                                dot=dot, first_col=_pieces.block_start(j, nb),
                                nb=nb, first=first)

  stages.run(
      emb // nb, block, lambda j, live=None: _bodies.dense_first(
          w, _pieces.block_start(j, nb), live, kb=kb, nb=nb))
  if not last:
    stages.wait()
