"""The kernel body of a run of decoder layers (`gpu_layers.decoder_layers`):
a row of the batch's tokens through each layer's six kernels' bodies
(`_gpu_bodies`) in turn, as stages that hand rows to each other through
scratch outputs, run by one program or divided among many
(`_gpu_grid.Stages`).
"""
import functools
from typing import Callable, Optional, Tuple

import jax.numpy as jnp

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
                  split: bool = False, cols: int = 0, prefetch: bool = False,
                  fold: bool = False, ob: int = 0, attention_dot: bool = False):
  """`decoder_layers`: a row of the batch's K tokens through `layers`
  decoder layers in turn, each the six kernels' bodies in turn as stages
  (`_layer`), each stage's rows written to scratch and read back after a
  barrier; a layer's outputs (y_ref) are the next one's input
  (`embedded`: the first's input is the tokens and the embedding table,
  the rows gathered first into the last output). One program runs every
  stage (`programs` 0), or each row's `programs` share each stage's blocks
  (`_gpu_grid.Stages`; `split`: the attention projections a stage of their
  own, blocks of (head, part, `cols` columns), as `head_projections`';
  `prefetch`: `Tiles.prefetch`; `fold`: `Tiles.fold_outputs`, each
  attention's output projection in its blocks of (head, `ob` columns);
  `attention_dot`: `Tiles.attention_dot`).

  Refs: start, the input rows (x, or tokens and table), the bias's refs,
  encoder_valid, each layer's `LAYER_REFS`, with programs the barriers'
  counters [B]; out: y, each layer's
  keys and values, the scratch (ctx, mid, mid2, hidden; with programs the
  self- and cross-attention's projections [K, H, 3, D], [K, H, 1, D], with
  `fold` the heads' partial sums [H, K, E] float32, and the counters) and
  with `embedded` the gathered rows."""
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
                            split=split and bool(programs), cols=cols,
                            fold=fold, ob=ob, attention_dot=attention_dot)

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
           cross_proj=None, parts_ref=None, *, stages: _grid.Stages,
           bias: _bodies.BiasForm, heads: int, eb: int, mlp_eb: int, lb: int,
           cross_lb: int, kb: int, mlp_kb: int, nb: int, mb: int, eps: float,
           on_gpu: bool, dot: bool, activations: Tuple[str, ...], split: bool,
           cols: int, fold: bool, ob: int, attention_dot: bool):
  """One layer of `layers_kernel`: x_ref's rows through the six kernels'
  bodies (`split`: eight, `head_projections`' before each attention;
  `fold` too: six, an attention's stage ending in its output projection's
  partial sums, added to the residual by the next stage as it reads it)
  as stages into y_ref (may be x_ref: x is read before y is written)."""
  (self_scale, wqkv, keys_in, values_in, self_out, cross_scale, wq, cross_keys,
   cross_values, cross_out, mlp_scale, wi, wo) = weights
  keys_ref, values_ref = caches
  rows = y_ref.shape[0]
  if not on_gpu:
    # Interpret mode: the cache is not aliased (`self_attend`), so its block
    # is copied in before any head writes it.
    keys_ref[...] = keys_in[...]
    values_ref[...] = values_in[...]

  proj = functools.partial(_projection_stage, stages, heads=heads, cols=cols,
                           eb=eb, eps=eps, dot=dot, split=split)
  residual = functools.partial(_residual_stage, stages, nb=nb, dot=dot)

  def self_outs(refs, h, first=None):  # each row's [D], head h's
    index = (_grid.index(h),)
    projected, _ = _bodies.projected_rows(refs, rows, eb, eps, dot, split,
                                          index)
    return _bodies.self_attend(start_ref, projected, bias_refs, keys_in,
                               values_in, keys_ref, values_ref, bias=bias,
                               on_gpu=on_gpu, lb=lb, head=index,
                               copy_cache=False, first=first, dot=attention_dot)

  def cross_outs(refs, h, first=None):
    index = (_grid.index(h),)
    projected, _ = _bodies.projected_rows(refs, rows, eb, eps, dot, split,
                                          index)
    return _bodies.cross_attend(projected, cross_keys, cross_values,
                                encoder_valid, lb=cross_lb, head=index,
                                first=first, dot=attention_dot)

  self_first = lambda h, live=None: _bodies.self_attention_first(
      start_ref, bias_refs, keys_ref, h, live, bias=bias, rows=rows, lb=lb)
  cross_first = functools.partial(_bodies.cross_attention_first, cross_keys,
                                  cross_values, encoder_valid, rows=rows,
                                  lb=cross_lb)
  if fold:
    out_stage = functools.partial(_attention_out_stage, stages, parts_ref,
                                  heads=heads, ob=ob, dot=dot,
                                  dtype=x_ref.dtype)
    proj(x_ref, self_scale, wqkv, self_proj)
    out_stage(functools.partial(self_outs, (self_proj,)), self_first, self_out)
    proj(x_ref, cross_scale, wq, cross_proj,
         _summed_rows(x_ref, parts_ref, mid_ref, eb))
    out_stage(functools.partial(cross_outs, (cross_proj,)), cross_first,
              cross_out)
    mlp_row = _summed_rows(mid_ref, parts_ref, mid2_ref, mlp_eb)
  else:
    attention = functools.partial(_attention_stage, stages, ctx_ref,
                                  heads=heads)
    refs = proj(x_ref, self_scale, wqkv, self_proj)
    attention(functools.partial(self_outs, refs), self_first)
    residual(ctx_ref, self_out, x_ref, mid_ref, kb=kb)
    refs = proj(mid_ref, cross_scale, wq, cross_proj)
    attention(functools.partial(cross_outs, refs), cross_first)
    residual(ctx_ref, cross_out, mid_ref, mid2_ref, kb=kb)
    mlp_row = lambda j: None

  _mlp_stage(stages, mid_ref if fold else mid2_ref, mlp_scale, wi, hidden_ref,
             mlp_row, activations=activations, eb=mlp_eb, eps=eps, dot=dot,
             mb=mb)
  residual(hidden_ref, wo, mid2_ref, y_ref, kb=mlp_kb, last=True)


def _summed_rows(x, parts_ref, out, size: int) -> Callable:
  """Block i's row loader of the residual stream after an attention under
  `fold`: x plus the heads' partial sums, summed by every block that reads
  it, written into out by block 0 (read after the next barrier)."""
  return lambda i: _pieces.summed_row_loader(x, parts_ref, size, out, i == 0)


def _mlp_stage(stages: _grid.Stages, x_ref, scale, wi, hidden_ref,
               row_of: Callable, *, activations: Tuple[str, ...], eb: int,
               eps: float, dot: bool, mb: int) -> None:
  """The MLP's input side as a stage, then its barrier: blocks of mb
  columns of its width, x's rows (row_of(j): block j's row loader, or
  None: x_ref's) normed, times wi [P, E, M], activated into hidden_ref."""

  def block(j, first=None):
    _bodies.rms_dense_body(x_ref, scale, wi, hidden_ref, 0,
                           rows_total=x_ref.shape[0], activations=activations,
                           eb=eb, eps=eps, dot=dot,
                           first_col=_pieces.block_start(j, mb), nb=mb,
                           first=first, row=row_of(j))

  stages.run(
      wi.shape[-1] // mb, block, lambda j, live=None: _bodies.rms_dense_first(
          wi, _pieces.block_start(j, mb), live, eb=eb, nb=mb))
  stages.wait()


def _attention_stage(stages: _grid.Stages, ctx_ref, outs_of: Callable,
                     first_of: Callable, *, heads: int) -> None:
  """An attention as a stage, then its barrier: a block a head
  (outs_of(h, first): each row's [D] float32; first_of: what it reads
  first, `Stages.run`'s fetch), its rows into head h's columns of ctx_ref
  [rows, H*D]."""
  pl, _ = _pieces.pallas()
  head_dim = ctx_ref.shape[1] // heads

  def block(h, first=None):
    span = pl.ds(_pieces.block_start(h, head_dim), head_dim)
    for m, out in enumerate(outs_of(h, first)):
      ctx_ref[m, span] = out.astype(ctx_ref.dtype)

  stages.run(heads, block, first_of)
  stages.wait()


def _attention_out_stage(stages: _grid.Stages, parts_ref, outs_of: Callable,
                         first_of: Callable, w_out, *, heads: int, ob: int,
                         dot: bool, dtype) -> None:
  """An attention and its output projection as one stage (`fold`), then
  its barrier: blocks of (head h, block j of `ob` columns of the model
  width), each head's attention (outs_of(h, first): each row's [D]
  float32; first_of(h, live): what it reads first, `Stages.run`'s fetch)
  recomputed by each of its blocks, and parts_ref[h, m, block j] = its
  rows, rounded to `dtype`, times w_out [H*D, E]'s rows of head h, block
  j's columns (float32, unrounded: the partial sums a folded kernel
  writes, `_pieces.partial_products`)."""
  pl, _ = _pieces.pallas()
  per_head = w_out.shape[1] // ob
  head_dim = w_out.shape[0] // heads

  def block(i, first=None):
    h = i // per_head
    values = [_pieces.round_to(o, dtype) for o in outs_of(h, first)]
    span = pl.ds(_pieces.block_start(h, head_dim), head_dim)
    cols = pl.ds(_pieces.block_start(i % per_head, ob), ob)
    sums = _pieces.dense_products(lambda m, _: values[m],
                                  lambda _: w_out[span, cols], len(values), 1,
                                  head_dim, ob, dot)
    for m, total in enumerate(sums):
      parts_ref[h, jnp.int32(m), cols] = total.astype(parts_ref.dtype)

  stages.run(heads * per_head, block,
             lambda i, live=None: first_of(i // per_head, live))
  stages.wait()


def _projection_stage(stages: _grid.Stages, x, scale, w, out,
                      stream: Optional[Callable] = None, *, heads: int,
                      cols: int, eb: int, eps: float, dot: bool,
                      split: bool) -> Tuple:
  """The refs an attention stage reads its heads' projections from: x,
  scale and w (w [H, P, E, D]), or (`split`) `out` [rows, H, P, D],
  written by a stage of their own (then its barrier; `stream`: block i's
  row loader of x, `_pieces.summed_row_loader`'s, else x's rows)."""
  if not split:
    return x, scale, w
  rows_of = stream or (lambda i: None)

  def block(i, first=None):
    _bodies.head_projection_block(x, scale, w, out, i, first, cols=cols, eb=eb,
                                  eps=eps, dot=dot, row=rows_of(i))

  stages.run(
      heads * w.shape[1] * (w.shape[-1] // cols), block,
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
