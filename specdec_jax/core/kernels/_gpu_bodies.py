"""The GPU kernels' bodies (`kernels.gpu`), each a function of its
program's refs: the six kernels' (self-attention, cross-attention, the
RMS-normed dense product, the dense product plus residual) and the split
heads' projections, which a run of layers' kernel also runs in turn
(`_gpu_layers_body`), which is why they live apart from their calls; and
a folded layer's three (`gpu_layers`).
"""
import dataclasses
from typing import Any, Callable, List, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core.kernels import _gpu_grid as _grid
from specdec_jax.core.kernels import _gpu_pieces as _pieces

Array = jax.Array
F32 = _pieces.F32
NEG_INF = -1e10  # The models' mask bias (`layers.NEG_INF`).


@dataclasses.dataclass(frozen=True)
class BiasForm:
  """The refs a self-attention kernel's bias is built from
  (`gpu.SelfBias`): a chain's (the learned biases and the bucket table) or
  also a tree's offsets and visibility; and the dtype the biases are
  rounded to."""
  chain: bool
  dtype: Any

  @property
  def refs(self) -> int:
    return 2 if self.chain else 4


def head_projection_kernel(x_ref, scale_ref, w_ref, out_ref, *, eb: int,
                           eps: float, dot: bool):
  """`project` of one head's part (w_ref [1, E, columns]) into out_ref."""
  for m, (value,) in enumerate(
      _pieces.project(x_ref, scale_ref, w_ref, x_ref.shape[0], eb, eps, dot)):
    out_ref[m, :] = value.astype(out_ref.dtype)


def head_projection_block(x_ref, scale_ref, w_ref, out_ref, i, first=None, *,
                          cols: int, eb: int, eps: float, dot: bool,
                          row: Optional[Callable] = None):
  """`head_projection_kernel`'s block i of a one-kernel layer's stage
  (`gpu_tiles.Tiles.programs`): w_ref [H, P, E, D] whole, block i its
  (head, part, `cols` columns), into out_ref [rows, H, P, D] (`first`: its
  first weights, `head_projection_first`'s; `row`: how x's rows are read,
  default x_ref's). The same operations as the kernel's on its block: the
  same bits."""
  h, p, span, weight = _head_block(w_ref, i, cols)
  rows, emb = x_ref.shape
  products = _pieces.normed_products(row or (lambda m, s: x_ref[m, s]), weight,
                                     scale_ref, rows, 1, emb, eb, cols, eps,
                                     dot, first)
  for m, (value,) in enumerate(products):
    out_ref[jnp.int32(m), h, p,
            span] = _pieces.round_to(value, x_ref.dtype).astype(out_ref.dtype)


def head_projection_first(w_ref, i, live=None, *, cols: int, eb: int):
  """Block i's first weights of `head_projection_block`, loaded now (where
  `live`: `_pieces.load`'s)."""
  return _pieces.first_block(_head_block(w_ref, i, cols, live)[3], eb, parts=1)


def _head_block(w_ref, i, cols: int, live=None):
  """Block i of `head_projection_block` (w_ref [H, P, E, D]): its head,
  part, span of D and weight(_, span) [eb, cols] (read where `live`)."""
  pl, _ = _pieces.pallas()
  parts, _, head_dim = w_ref.shape[1:]
  per_part = head_dim // cols
  h, p = i // (parts * per_part), (i // per_part) % parts
  span = pl.ds(_pieces.block_start(i % per_part, cols), cols)
  return h, p, span, lambda _, s: _pieces.load(w_ref, (h, p, s, span), live)


def projected_rows(refs, rows: int, eb: int, eps: float, dot: bool, split: bool,
                   head: Tuple = ()):
  """(each row's [P] parts [D] float32 rounded to the model's dtype, the
  refs after them): computed here from (x, scale, w), or (`split`) read
  from one [rows, P, D] block of `head_projections` (with `head`: [rows,
  H, P, D], a one-kernel layer's)."""
  if split:
    projected = refs[0]
    parts = projected.shape[1 + len(head)]
    return [[
        projected[(jnp.int32(m),) + head +
                  (jnp.int32(p), _pieces.ALL)].astype(F32) for p in range(parts)
    ] for m in range(rows)], refs[1:]
  x_ref, scale_ref, w_ref = refs[:3]
  return _pieces.project(x_ref, scale_ref, w_ref, rows, eb, eps, dot,
                         head), refs[3:]


def self_attention_kernel(start_ref, *refs, bias: BiasForm, rows: int, eb: int,
                          lb: int, eps: float, on_gpu: bool, dot: bool,
                          split: bool, head: Tuple = (),
                          ctx_cols: Any = _pieces.ALL, copy_cache: bool = True,
                          first: Optional[Tuple] = None,
                          attention_dot: bool = False):
  """One head's self-attention (`head`: its leading index in the weight,
  bias and cache refs, none when they are its blocks; `ctx_cols`: its
  columns of ctx_ref; `copy_cache`: in interpret mode, copy the whole
  cache block in first: once per kernel, before any head writes it;
  `first`: `self_attention_first`'s; `attention_dot`: `_pieces.attend`'s
  `dot`)."""
  projected, refs = projected_rows(refs, rows, eb, eps, dot, split, head)
  bias_refs, refs = refs[:bias.refs], refs[bias.refs:]
  keys_in, values_in, ctx_ref, keys_ref, values_ref = refs
  outs = self_attend(start_ref, projected, bias_refs, keys_in, values_in,
                     keys_ref, values_ref, bias=bias, on_gpu=on_gpu, lb=lb,
                     head=head, copy_cache=copy_cache, first=first,
                     dot=attention_dot)
  for m, out in enumerate(outs):
    ctx_ref[m, ctx_cols] = out.astype(ctx_ref.dtype)


def self_attend(start_ref, projected, bias_refs, keys_in, values_in, keys_ref,
                values_ref, *, bias: BiasForm, on_gpu: bool, lb: int,
                head: Tuple = (), copy_cache: bool = True,
                first: Optional[Tuple] = None, dot: bool = False):
  """The chunk's keys/values (projected[m]: row m's q, k, v) written into
  the cache, then each row's query over it, its bias from bias_refs (the
  refs of a `gpu.SelfBias` of form `bias`; `first`: its first block's,
  `self_attention_first`'s; `dot`: `_pieces.attend`'s): [D] float32 per
  row."""
  pl, plgpu = _pieces.pallas()
  rows = len(projected)
  head_dim, length = keys_ref.shape[len(head):]
  start = start_ref[0]
  if not on_gpu and copy_cache:
    # Interpret mode: the cache is not aliased (Pallas' interpreter notes a
    # correctness issue with aliasing, b/370563936), so the block is copied
    # before the chunk's slots are written. On a GPU the output is the
    # input's buffer.
    keys_ref[...] = keys_in[...]
    values_ref[...] = values_in[...]
  # The chunk's keys and values into the cache (the aliased outputs: read
  # below through the same refs), then attention over the cache, its own
  # slots included: the rows of a chunk see what one-token calls see.
  for m, (_, key, value) in enumerate(projected):
    slot = start + m
    fits = jnp.full((head_dim,), slot < length)
    at = head + (_pieces.ALL, slot)
    plgpu.store(keys_ref.at[at], key.astype(keys_ref.dtype), mask=fits)
    plgpu.store(values_ref.at[at], value.astype(values_ref.dtype), mask=fits)
  if on_gpu:  # The program's threads see each other's cache writes.
    plgpu.debug_barrier()

  # The blocks up to the chunk's last slot: one where the cache is one
  # block (known here: no loop to compile around it).
  steps = 1 if length <= lb else jnp.minimum(pl.cdiv(start + rows, lb),
                                             pl.cdiv(length, lb))
  return _pieces.attend([q for q, _, _ in projected], keys_ref, values_ref,
                        steps, lb,
                        self_bias(start, bias_refs, bias, rows, lb,
                                  head), head, first, dot)


def self_attention_first(start_ref, bias_refs, keys_ref, h, live=None, *,
                         bias: BiasForm, rows: int, lb: int) -> Tuple:
  """Head h's first block of self-attention biases (a one-kernel layer's
  keys_ref [H, D, L]), loaded now: not its keys, which its stage writes
  (`live`: `_pieces.attend_first`'s; the chunk's own few biases read
  anyway)."""
  head = (_grid.index(h),)
  bias_at = self_bias(start_ref[0], bias_refs, bias, rows, lb, head)
  return _pieces.attend_first(keys_ref, None, lb, bias_at, rows, head, live)


def self_bias(start, bias_refs, form: BiasForm, rows: int, lb: int,
              head: Tuple = ()):
  """`_pieces.attend`'s bias_at(m, first, valid) of a chunk's rows from the
  refs of a `gpu.SelfBias` (embedding [*head, buckets], buckets [2L - 1],
  a tree's offsets [K] and visible [K, K]; `head` as `self_attend`'s):
  for cache slots a contiguous load of the bucket table, then a gather of
  their learned biases; the chunk's own slots' K x K biases read once. A
  row past the cache's slots (start + offsets[m] >= L: never kept) reads
  nothing before the table."""
  pl, plgpu = _pieces.pallas()
  embedding_ref, buckets_ref = bias_refs[:2]
  centre = (buckets_ref.shape[0] - 1) // 2  # relative position 0

  def learned(bucket):  # the biases of bucket(s), rounded as the model's
    return _pieces.round_to(embedding_ref[head + (bucket,)].astype(F32),
                            form.dtype)

  if form.chain:
    offsets: List[Any] = list(range(rows))
  else:
    offsets_ref, visible_ref = bias_refs[2:]
    offsets = [offsets_ref[jnp.int32(c)] for c in range(rows)]

  def chunk(m, c):  # chunk slot c as chunk row m sees it; None: never
    if form.chain and c > m:
      return None
    # Indices as traced scalars (interpret mode's loads take no Python
    # ints).
    value = learned(buckets_ref[jnp.asarray(offsets[c] - offsets[m] + centre,
                                            jnp.int32)])
    if form.chain:
      return value
    return jnp.where(visible_ref[jnp.int32(m), jnp.int32(c)] != 0, value,
                     NEG_INF)

  chunks = [[chunk(m, c) for c in range(rows)] for m in range(rows)]

  def bias_at(m, first, valid):
    lanes = lax.iota(jnp.int32, lb)
    slots = first + lanes
    at = first - start - offsets[m] + centre  # the table's entry of `first`
    cached = valid & (slots < start) & (at + lanes >= 0)
    buckets = plgpu.load(buckets_ref.at[pl.ds(at, lb)], mask=cached, other=0)
    bias = jnp.where(cached, learned(buckets), NEG_INF)
    for c, value in enumerate(chunks[m]):
      if value is not None:
        bias = jnp.where(valid & (slots == start + c), value, bias)
    return bias

  return bias_at


def cross_attention_kernel(*refs, rows: int, eb: int, lb: int, eps: float,
                           dot: bool, split: bool, head: Tuple = (),
                           ctx_cols: Any = _pieces.ALL,
                           first: Optional[Tuple] = None,
                           attention_dot: bool = False):
  """One head's cross-attention (`head`, `ctx_cols`, `attention_dot`: as
  the self-attention's; `first`: `cross_attention_first`'s)."""
  projected, refs = projected_rows(refs, rows, eb, eps, dot, split, head)
  keys_ref, values_ref, valid_ref, ctx_ref = refs
  outs = cross_attend(projected, keys_ref, values_ref, valid_ref, lb=lb,
                      head=head, first=first, dot=attention_dot)
  for m, out in enumerate(outs):
    ctx_ref[m, ctx_cols] = out.astype(ctx_ref.dtype)


def cross_attend(projected, keys_ref, values_ref, valid_ref, *, lb: int,
                 head: Tuple = (), first: Optional[Tuple] = None,
                 dot: bool = False):
  """Each row's query (projected[m]: its [q]) over the encoder's keys and
  values, masked where valid_ref [S] (bool) is False (`first`: the first
  block's, `cross_attention_first`'s; `dot`: `_pieces.attend`'s): [D]
  float32 per row."""
  pl, _ = _pieces.pallas()
  length = keys_ref.shape[-1]
  return _pieces.attend([q for (q,) in projected], keys_ref, values_ref,
                        pl.cdiv(length, lb), lb, _cross_bias(valid_ref, lb),
                        head, first, dot)


def cross_attention_first(keys_ref, values_ref, valid_ref, h, live=None, *,
                          rows: int, lb: int) -> Tuple:
  """Head h's first block of the encoder's keys, values and mask (keys_ref
  [H, D, S]), loaded now (`live`: `_pieces.attend_first`'s)."""
  return _pieces.attend_first(keys_ref, values_ref, lb,
                              _cross_bias(valid_ref, lb), rows,
                              (_grid.index(h),), live)


def _cross_bias(valid_ref, lb: int) -> Callable:
  """`_pieces.attend`'s bias_at: 0 where valid_ref [S] (bool), else
  NEG_INF."""
  pl, plgpu = _pieces.pallas()

  def bias_at(m, first, valid):
    del m  # Every query sees the same encoder positions.
    seen = plgpu.load(valid_ref.at[pl.ds(first, lb)], mask=valid, other=False)
    return jnp.where(seen, 0.0, NEG_INF).astype(F32)

  return bias_at


# ---------------------------------------------------------------------------
# A folded layer's three kernels (`gpu_tiles.Tiles.fold_bytes`). Each reads the
# residual stream as x plus the previous kernel's partial sums (`summed`:
# whether there are any; its program 0 then writes the summed rows out)
# and ends with its own output projection's partial sums.
# ---------------------------------------------------------------------------
def _stream_refs(refs, summed: bool):
  """(x_ref, parts_ref or None, the refs after them)."""
  if summed:
    return refs[0], refs[1], refs[2:]
  return refs[0], None, refs[1:]


def _stream_row(x_ref, parts_ref, sum_ref, eb: int):
  """A folded kernel's row loader: x + the partial sums, written out by
  the kernel's program 0 along its second grid axis."""
  pl, _ = _pieces.pallas()
  return _pieces.summed_row_loader(x_ref, parts_ref, eb, sum_ref,
                                   pl.program_id(1) == 0)


def _embedded_row(tokens_ref, table_ref, x_ref, eb: int):
  """A first folded kernel's row loader: the tokens' embeddings, written
  out (into x_ref) by the kernel's program 0 along its second grid axis."""
  pl, _ = _pieces.pallas()
  return _pieces.embedded_row_loader(tokens_ref, table_ref, x_ref, eb,
                                     pl.program_id(1) == 0)


def folded_self_attention_kernel(start_ref, *refs, bias: BiasForm, summed: bool,
                                 embedded: bool, eb: int, lb: int, nb: int,
                                 eps: float, on_gpu: bool, dot: bool):
  """One (row of the batch, head): the stream's rows normed and projected
  to q, k, v, the cache written, attention, and the head's share of the
  output projection (its rows of w_out) into its partial sums. `embedded`:
  the stream is the tokens and the embedding table (the first layer's),
  its rows gathered here and written out."""
  if embedded:
    tokens_ref, table_ref, refs = refs[0], refs[1], refs[2:]
  else:
    x_ref, parts_ref, refs = _stream_refs(refs, summed)
  scale_ref, w_ref, *rest = refs
  bias_refs = rest[:bias.refs]
  keys_in, values_in, wo_ref, *outs = rest[bias.refs:]
  sum_ref = outs.pop(0) if summed or embedded else None
  partial_ref, keys_ref, values_ref = outs
  if embedded:
    x_ref = sum_ref  # the stream's rows: their shape and dtype
    row = _embedded_row(tokens_ref, table_ref, sum_ref, eb)
  else:
    row = _stream_row(x_ref, parts_ref, sum_ref, eb)
  rows = x_ref.shape[0]
  projected = _pieces.project(x_ref, scale_ref, w_ref, rows, eb, eps, dot,
                              row=row)
  outs = self_attend(start_ref, projected, bias_refs, keys_in, values_in,
                     keys_ref, values_ref, bias=bias, on_gpu=on_gpu, lb=lb)
  _pieces.partial_products([_pieces.round_to(o, x_ref.dtype) for o in outs],
                           wo_ref, partial_ref, nb, dot)


def folded_cross_attention_kernel(*refs, summed: bool, eb: int, lb: int,
                                  nb: int, eps: float, dot: bool):
  """`folded_self_attention_kernel`'s cross-attention: the head's query
  over the encoder's keys/values, then its share of the output
  projection."""
  x_ref, parts_ref, refs = _stream_refs(refs, summed)
  (scale_ref, w_ref, keys_ref, values_ref, valid_ref, wo_ref, *outs) = refs
  sum_ref = outs.pop(0) if summed else None
  partial_ref, = outs
  rows = x_ref.shape[0]
  projected = _pieces.project(x_ref, scale_ref, w_ref, rows, eb, eps, dot,
                              row=_stream_row(x_ref, parts_ref, sum_ref, eb))
  outs = cross_attend(projected, keys_ref, values_ref, valid_ref, lb=lb)
  _pieces.partial_products([_pieces.round_to(o, x_ref.dtype) for o in outs],
                           wo_ref, partial_ref, nb, dot)


def folded_mlp_kernel(*refs, summed: bool, activations: Tuple[str, ...],
                      eb: int, nb: int, eps: float, dot: bool):
  """One (row of the batch, block of the MLP's width): the stream's rows
  normed, times the block's columns of each input weight through its
  activation, multiplied, then times the block's rows of wo into its
  partial sums."""
  x_ref, parts_ref, refs = _stream_refs(refs, summed)
  scale_ref, wi_ref, wo_ref, *outs = refs
  sum_ref = outs.pop(0) if summed else None
  partial_ref, = outs
  rows, emb = x_ref.shape
  parts, _, width = wi_ref.shape
  products = _pieces.normed_products(
      _stream_row(x_ref, parts_ref, sum_ref,
                  eb), lambda p, span: wi_ref[p, span, _pieces.ALL], scale_ref,
      rows, parts, emb, eb, width, eps, dot)
  hidden = [gated(accs, activations, x_ref.dtype) for accs in products]
  _pieces.partial_products(hidden, wo_ref, partial_ref, nb, dot)


def rms_dense_kernel(x_ref, scale_ref, w_ref, out_ref, **kw):
  pl, _ = _pieces.pallas()
  rms_dense_body(x_ref, scale_ref, w_ref, out_ref,
                 pl.program_id(0) * x_ref.shape[0], **kw)


def rms_dense_body(x_ref, scale_ref, w_ref, out_ref, first_row, *,
                   rows_total: int, activations: Tuple[str, ...], eb: int,
                   eps: float, dot: bool, first_col=0, nb: Optional[int] = None,
                   first=None, row: Optional[Callable] = None):
  """`rms_dense` on a program's rows (the call's first_row onwards) and nb
  columns from first_col (default: all of w_ref's) of w_ref and out_ref
  (`first`: the columns' first weights, `rms_dense_first`'s; `row`: how
  x's rows are read, default `_pieces.row_loader`'s)."""
  pl, plgpu = _pieces.pallas()
  rb, emb = x_ref.shape
  parts, _, width = w_ref.shape
  nb = nb or width
  cols = pl.ds(first_col, nb)
  row = row or _pieces.row_loader(x_ref, eb, first_row, rows_total)
  products = _pieces.normed_products(row, _columns(w_ref, first_col,
                                                   nb), scale_ref, rb, parts,
                                     emb, eb, nb, eps, dot, first)
  dtype = out_ref.dtype  # XLA's path: the MLP in the model's, logits in f32.
  for r, accs in enumerate(products):
    plgpu.store(out_ref.at[jnp.int32(r), cols],
                gated(accs, activations, dtype).astype(dtype),
                mask=_pieces.row_mask(nb, first_row + r, rows_total))


def rms_dense_first(w_ref, first_col, live=None, *, eb: int, nb: int):
  """`rms_dense_body`'s first weights of nb columns from first_col (w_ref
  [P, E, F]), loaded now (where `live`: `_pieces.load`'s)."""
  return _pieces.first_block(_columns(w_ref, first_col, nb, live), eb,
                             parts=w_ref.shape[0])


def dense_first(w_ref, first_col, live=None, *, kb: int, nb: int):
  """`dense_residual_body`'s first weights of nb columns from first_col
  (w_ref [F, E]), loaded now (where `live`)."""
  return _pieces.first_block(_columns(w_ref, first_col, nb, live), kb)


def _columns(w_ref, first_col, nb: int, live=None) -> Callable:
  """weight([p,] span) [depth, nb]: nb columns of w_ref from first_col
  (read where `live`: `_pieces.load`'s)."""
  pl, _ = _pieces.pallas()
  cols = pl.ds(first_col, nb)
  if len(w_ref.shape) == 3:
    return lambda p, span: _pieces.load(w_ref, (p, span, cols), live)
  return lambda span: _pieces.load(w_ref, (span, cols), live)


def gated(accs, activations: Tuple[str, ...], dtype) -> Array:
  """prod_p act_p(accs[p]), each product and activation rounded to dtype
  (where XLA's path rounds), float32."""
  values = []
  for acc, name in zip(accs, activations):
    h = _pieces.round_to(acc, dtype)
    values.append(h if name ==
                  "linear" else _pieces.round_to(activation(name)(h), dtype))
  out = values[0]
  for h in values[1:]:
    out = _pieces.round_to(out * h, dtype)
  return out


def activation(name: str) -> Callable[[Array], Array]:
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return getattr(nn, name)


def dense_residual_kernel(x_ref, w_ref, res_ref, out_ref, **kw):
  pl, _ = _pieces.pallas()
  dense_residual_body(x_ref, w_ref, res_ref, out_ref,
                      pl.program_id(0) * x_ref.shape[0], **kw)


def dense_residual_body(x_ref, w_ref, res_ref, out_ref, first_row, *,
                        rows_total: int, kb: int, dot: bool, first_col=0,
                        nb: Optional[int] = None, first=None):
  """`dense_residual` on a program's rows (the call's first_row onwards)
  and nb columns from first_col (default: all of w_ref's) of w_ref,
  res_ref and out_ref (columns by offset, not a view: a view of a view
  is misread in interpret mode; `first`: `dense_first`'s)."""
  pl, plgpu = _pieces.pallas()
  rb, width = x_ref.shape
  nb = nb or w_ref.shape[1]
  cols = pl.ds(first_col, nb)
  row = _pieces.row_loader(x_ref, kb, first_row, rows_total)
  accs = _pieces.dense_products(row, _columns(w_ref, first_col, nb), rb,
                                width // kb, kb, nb, dot, first)
  dtype = out_ref.dtype
  for r in range(rb):
    mask = _pieces.row_mask(nb, first_row + r, rows_total)
    residual = plgpu.load(res_ref.at[jnp.int32(r), cols], mask=mask,
                          other=0.0).astype(F32)
    out = _pieces.round_to(residual + _pieces.round_to(accs[r], dtype), dtype)
    plgpu.store(out_ref.at[jnp.int32(r), cols], out.astype(dtype), mask=mask)
