"""Pieces the GPU kernels' bodies share (`kernels.gpu`), traced inside a
kernel on its blocks: the RMS-normed projections, the online-softmax
attention over a cache, the dense products, a folded layer's partial sums
and the rows they are added to.

A projection runs on CUDA cores (products summed per row) or, with `dot`,
on tensor cores: rows in tiles of 16 (`TILE_ROWS`, zeros past the call's
rows) times the weights' block, one `jnp.dot` (Triton's `tl.dot`) per
block. A tile is 16 rows whatever the call's rows, so a row's sums are
the same operations in a 1-token and an 8-token call: row-independent as
the CUDA-core products are, given a dot that computes an element alike
wherever its row sits in the tile (XLA:CPU's here; a GPU's mma, which the
device check checks: `paths.rows_identical`). Each row's sum of squares
is a reduction of its own (a tile's row reduction summed a row by its
place, on XLA:CPU).
"""
from typing import Callable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
F32 = jnp.float32
# Rows of a tensor-core tile: the smallest M of Triton's dot.
TILE_ROWS = 16
ALL = slice(None)  # a whole axis, in an index tuple


def pallas():
  """(pallas, pallas.triton), imported on first use: the decoding package
  imports `kernels.gpu` for its option table, and Pallas' Triton API costs
  ~0.1 s to import."""
  # pylint: disable=g-import-not-at-top
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu
  return pl, plgpu


def round_to(x: Array, dtype) -> Array:
  """x rounded to dtype, kept in float32 (where XLA's path rounds)."""
  return x.astype(dtype).astype(F32)


def row_mask(size: int, row, rows_total: int) -> Array:
  """[size] bool: whether `row` is one of the call's rows."""
  return jnp.full((size,), row < rows_total)


def row_loader(x_ref, size: int, first_row, rows_total: int) -> Callable:
  """row(r, span) -> x_ref[r, span] [size], zeros where program row r
  (the call's row first_row + r) is past the call's `rows_total`."""
  _, plgpu = pallas()

  def row(r, span):
    return plgpu.load(x_ref.at[jnp.int32(r), span],
                      mask=row_mask(size, first_row + r, rows_total), other=0.0)

  return row


def summed_row_loader(x_ref, parts_ref, size: int, sum_ref=None,
                      writes=None) -> Callable:
  """`row_loader` of the residual stream of a folded layer
  (`gpu_tiles.Tiles.fold_bytes`): row(r, span) -> x[r, span] + the previous
  kernel's partial sums parts_ref[:, r, span] (float32, loaded as a few
  2-D blocks of powers of 2 and summed over them: each row's the same
  operations in any call; the total rounded to x's dtype, then the sum:
  where the six-kernel layer's `dense_residual` rounds), in x's dtype.
  Where `writes` (one program of the kernel) it also stores the row into
  sum_ref: the stream's residual for the next kernel. parts_ref None:
  `row_loader`'s rows. A program's rows are all the call's (a folded
  kernel's programs take a row of the batch's K tokens)."""
  pl, plgpu = pallas()
  rows = x_ref.shape[0]
  load = row_loader(x_ref, size, 0, rows)
  if parts_ref is None:
    return load
  chunks, first = [], 0
  for bit in reversed(range(parts_ref.shape[0].bit_length())):
    if parts_ref.shape[0] & (1 << bit):
      chunks.append((first, 1 << bit))
      first += 1 << bit

  def row(r, span):
    mask = row_mask(size, r, rows)
    total = None
    for first, count in chunks:
      part = jnp.sum(
          plgpu.load(parts_ref.at[pl.ds(first, count),
                                  jnp.int32(r), span],
                     mask=jnp.broadcast_to(mask[None, :], (count, size)),
                     other=0.0).astype(F32), axis=0)
      total = part if total is None else total + part
    x = round_to(
        load(r, span).astype(F32) + round_to(total, x_ref.dtype),
        x_ref.dtype).astype(x_ref.dtype)
    if sum_ref is not None:
      plgpu.store(sum_ref.at[jnp.int32(r), span], x, mask=mask & writes)
    return x

  return row


def embedded_row_loader(tokens_ref, table_ref, out_ref, size: int,
                        writes) -> Callable:
  """`row_loader` of the residual stream before the first layer: row(r,
  span) -> token r's embedding table_ref[token, span] in out_ref's dtype
  (NaN for a token outside the table, as `jnp.take`'s fill), also stored
  into out_ref[r, span] where `writes` (one program of the kernel):
  gathered in the first kernel, not by an XLA kernel of its own.
  tokens_ref: [K] the token ids, or [K, V] logits whose argmax are
  (`argmax_token`: a greedy draft's previous step's, taken here rather
  than by a kernel of its own). Call it at the kernel's top level: it
  reads the tokens there."""
  _, plgpu = pallas()
  vocab = table_ref.shape[0]
  rows = tokens_ref.shape[0]
  if len(tokens_ref.shape) == 2:
    tokens = [argmax_token(tokens_ref, r) for r in range(rows)]
  else:
    tokens = [tokens_ref[jnp.int32(r)] for r in range(rows)]

  def row(r, span):
    token = tokens[r]
    inside = jnp.full((size,), (token >= 0) & (token < vocab))
    x = plgpu.load(table_ref.at[token, span], mask=inside,
                   other=jnp.nan).astype(out_ref.dtype)
    plgpu.store(out_ref.at[jnp.int32(r), span], x, mask=jnp.full((size,),
                                                                 writes))
    return x

  return row


def argmax_token(logits_ref, r: int, block: int = 1024) -> Array:
  """The argmax of logits_ref[r] ([K, V]) as `jnp.argmax` takes it, int32:
  the first NaN if any, else the first of the equal maxima. The row in
  blocks (`block`, a power of 2, halved while over V), the last one ending
  at V (overlapping the one before: a maximum there that beats the
  earlier blocks' lies past them)."""
  pl, plgpu = pallas()
  vocab = logits_ref.shape[1]
  while block > vocab:
    block //= 2
  best, best_at = jnp.float32(-jnp.inf), jnp.int32(0)
  first_nan = jnp.int32(vocab)
  for first in range(0, vocab, block):
    first = min(first, vocab - block)
    lanes = first + lax.iota(jnp.int32, block)
    values = plgpu.load(logits_ref.at[jnp.int32(r),
                                      pl.ds(first, block)]).astype(F32)
    nan = jnp.isnan(values)
    first_nan = jnp.minimum(first_nan, jnp.min(jnp.where(nan, lanes, vocab)))
    values = jnp.where(nan, -jnp.inf, values)
    top = jnp.max(values)
    at = jnp.min(jnp.where(values == top, lanes, vocab))
    better = top > best  # equal maxima: the earlier block's
    best, best_at = jnp.where(better, top, best), jnp.where(better, at, best_at)
  return jnp.where(first_nan < vocab, first_nan, best_at)


def rows_tile(load: Callable[[int], Array], count: int, width: int) -> Array:
  """[TILE_ROWS, width] float32: load(r) [width] in row r < count, zeros
  below."""
  rows = lax.broadcasted_iota(jnp.int32, (TILE_ROWS, width), 0)
  tile = jnp.zeros((TILE_ROWS, width), F32)
  for r in range(count):
    tile = jnp.where(rows == r, load(r).astype(F32)[None, :], tile)
  return tile


def tile_row(tile: Array, r: int) -> Array:
  """Row r of a [TILE_ROWS, ...] tile (the other rows' exact zeros added)."""
  rows = lax.broadcasted_iota(jnp.int32, tile.shape, 0)
  return jnp.sum(jnp.where(rows == r, tile, 0.0), axis=0)


def use_dot(dot: bool, *dims: int) -> bool:
  """Tensor cores where asked and every dimension of the product (its
  contraction block and its columns) is at least 16 (Triton's `tl.dot`);
  decided by shapes alone, never by the call's rows."""
  return dot and min(dims) >= TILE_ROWS


def _groups(rows: int):
  """(first row, rows) of each tile of a call's rows."""
  return [(g, min(TILE_ROWS, rows - g)) for g in range(0, rows, TILE_ROWS)]


def normed_products(row: Callable, weight: Callable, scale_ref, rows: int,
                    parts: int, emb: int, eb: int, width: int, eps: float,
                    dot: bool = False,
                    first: Optional[List[Array]] = None) -> List[List[Array]]:
  """RMS-normed rows times weights: out[m][p] [width] float32, unrounded.

  row(m, span) -> x[m, span] [eb]; weight(p, span) -> [eb, width]. One pass
  over the model width: the norm's sum of squares beside the products
  (the norm's factor is a scalar per row, applied at the end). `dot`
  (`use_dot`): the products on tensor cores, x * scale rounded to the
  weights' dtype first). `first`: block 0's weights, loaded already
  (`first_block`).
  """
  if use_dot(dot, eb, width):
    return _normed_products_dot(row, weight, scale_ref, rows, parts, emb, eb,
                                width, eps, first)

  def body(i, carry, loaded=None):
    sums, accs = carry
    span = block_span(i, eb)
    scale = scale_ref[span].astype(F32)
    weights = [
        w.astype(F32)
        for w in loaded or [weight(p, span) for p in range(parts)]
    ]
    new_sums, new_accs = [], []
    for m in range(rows):
      x = row(m, span).astype(F32)
      new_sums.append(sums[m] + jnp.sum(x * x))
      scaled = (x * scale)[:, None]
      for p in range(parts):
        new_accs.append(accs[m * parts + p] +
                        jnp.sum(scaled * weights[p], axis=0))
    return tuple(new_sums), tuple(new_accs)

  init = (tuple(jnp.zeros((), F32) for _ in range(rows)),
          tuple(jnp.zeros((width,), F32) for _ in range(rows * parts)))
  sums, accs = blocks_loop(emb // eb, body, init, first)
  out = []
  for m in range(rows):
    inv = lax.rsqrt(sums[m] / emb + eps)
    out.append([accs[m * parts + p] * inv for p in range(parts)])
  return out


def _normed_products_dot(row, weight, scale_ref, rows, parts, emb, eb, width,
                         eps, first) -> List[List[Array]]:
  """`normed_products` on tensor cores: per tile of 16 rows and block of
  the width one dot per weight; each row's sum of squares on its own, as
  on CUDA cores (a tile's row reduction may sum a row by its place)."""
  groups = _groups(rows)

  def body(i, carry, loaded=None):
    sums, accs = carry
    span = block_span(i, eb)
    scale = scale_ref[span].astype(F32)
    weights = loaded or [weight(p, span) for p in range(parts)]
    xs = [row(m, span).astype(F32) for m in range(rows)]
    new_sums = [total + jnp.sum(x * x) for total, x in zip(sums, xs)]
    new_accs = []
    for g, (first, count) in enumerate(groups):
      x = rows_tile(lambda r, f=first: xs[f + r], count, eb)
      scaled = (x * scale[None, :]).astype(weights[0].dtype)
      for p in range(parts):
        new_accs.append(accs[g * parts + p] +
                        jnp.dot(scaled, weights[p], preferred_element_type=F32))
    return tuple(new_sums), tuple(new_accs)

  init = (tuple(jnp.zeros((), F32) for _ in range(rows)),
          tuple(
              jnp.zeros((TILE_ROWS, width), F32)
              for _ in range(len(groups) * parts)))
  sums, accs = blocks_loop(emb // eb, body, init, first)
  out = []
  for g, (first, count) in enumerate(groups):
    for r in range(count):
      inv = lax.rsqrt(sums[first + r] / emb + eps)
      out.append([tile_row(accs[g * parts + p], r) * inv for p in range(parts)])
  return out


def project(x_ref, scale_ref, w_ref, rows: int, eb: int, eps: float,
            dot: bool = False, head: Tuple = (),
            row: Optional[Callable] = None) -> List[List[Array]]:
  """RMS-normed rows x[m] [E] times w[*head, p] [E, D] (p: the parts, e.g.
  q, k, v; `head`: leading indices of w_ref, none when it is one head's
  block): out[m][p] [D] float32, rounded to x's dtype (`row`: how a row's
  block is read, default x_ref's)."""
  products = normed_products(row or (lambda m, span: x_ref[m, span]),
                             lambda p, span: w_ref[head + (p, span, ALL)],
                             scale_ref, rows, w_ref.shape[len(head)],
                             x_ref.shape[-1], eb, w_ref.shape[-1], eps, dot)
  return [[round_to(v, x_ref.dtype) for v in row] for row in products]


def dense_products(row: Callable, weight: Callable, rows: int, steps: int,
                   kb: int, width: int, dot: bool = False,
                   first: Optional[List[Array]] = None) -> List[Array]:
  """x[m] @ w over `steps` blocks of kb: out[m] [width] float32 (row(m,
  span) -> x[m, span] [kb], weight(span) -> [kb, width]); `dot` and
  `first` ([block 0's weights]) as in `normed_products`."""
  tensor_cores = use_dot(dot, kb, width)
  groups = _groups(rows)

  def body(i, accs, loaded=None):
    span = block_span(i, kb)
    weight_block = loaded[0] if loaded else weight(span)
    if tensor_cores:
      return tuple(acc + jnp.dot(
          rows_tile(lambda r, f=first: row(f + r, span), count, kb).astype(
              weight_block.dtype), weight_block, preferred_element_type=F32)
                   for acc, (first, count) in zip(accs, groups))
    weight_block = weight_block.astype(F32)
    return tuple(
        acc + jnp.sum(row(m, span).astype(F32)[:, None] * weight_block, axis=0)
        for m, acc in enumerate(accs))

  if tensor_cores:
    tiles = blocks_loop(
        steps, body, tuple(jnp.zeros((TILE_ROWS, width), F32) for _ in groups),
        first)
    return [
        tile_row(tile, r)
        for tile, (_, count) in zip(tiles, groups)
        for r in range(count)
    ]
  return list(
      blocks_loop(steps, body,
                  tuple(jnp.zeros((width,), F32) for _ in range(rows)), first))


def load(ref, at: Tuple, live=None) -> Array:
  """ref[at]; with `live` (a traced bool: whether the program has the
  block, `_gpu_grid.Stages.run`'s), zeros where it does not, not read."""
  if live is None:
    return ref[at]
  _, plgpu = pallas()
  # Indices traced (interpret mode's masked loads take no Python ints).
  view = ref.at[tuple(jnp.int32(a) if isinstance(a, int) else a for a in at)]
  return plgpu.load(view, mask=jnp.full(view.shape, live), other=0)


def first_block(weight: Callable, depth: int, parts: int = 0) -> List[Array]:
  """A contraction's block 0 of weights, loaded now (`Tiles.prefetch`: before
  a barrier, for `blocks_loop`'s `first`): [weight(span)] [depth, width],
  or with `parts`, weight(p, span) for each part."""
  span = block_span(0, depth)
  if parts:
    return [weight(p, span) for p in range(parts)]
  return [weight(span)]


def blocks_loop(steps: int, body: Callable, init, first: Optional[List[Array]]):
  """lax.fori_loop(0, steps, body, init) over a contraction's blocks; with
  `first` (block 0's weights, `first_block`'s), block 0 on them, then the
  loop from 1: the same operations, so the same bits."""
  if first is None:
    return lax.fori_loop(0, steps, body, init)
  carry = body(0, init, first)
  if isinstance(steps, int) and steps <= 1:
    return carry  # No loop of no steps: its body would be compiled too.
  return lax.fori_loop(1, steps, body, carry)


def block_span(i, size: int):
  """Block i of `size`: a slice from `block_start`."""
  pl, _ = pallas()
  return pl.ds(block_start(i, size), size)


def block_start(i, size: int):
  """Block i's first index, blocks of `size`: a Python int for a Python
  int (Triton's lowering marks no constant); traced, marked a multiple of
  size (Triton's loads vectorise)."""
  if isinstance(i, int):
    return i * size
  pl, _ = pallas()
  return pl.multiple_of(i * size, size)


def partial_products(values: Sequence[Array], w_ref, out_ref, nb: int,
                     dot: bool = False) -> None:
  """out_ref[m, :] = values[m] @ w_ref, float32, unrounded: a folded
  layer's partial sums of an output projection (a head's, or a block of
  the MLP's width). values[m] [N] float32 (rounded to the model's dtype),
  w_ref [N, E], out_ref [rows, E]; E in blocks of nb columns, N in one."""
  pl, _ = pallas()
  width, emb = w_ref.shape

  def columns(c, carry):
    cols = pl.ds(pl.multiple_of(c * nb, nb), nb)
    sums = dense_products(lambda m, span: values[m],
                          lambda span: w_ref[span, cols], len(values), 1, width,
                          nb, dot)
    for m, total in enumerate(sums):
      out_ref[m, cols] = total.astype(out_ref.dtype)
    return carry

  lax.fori_loop(0, emb // nb, columns, 0)


def attend(queries: Sequence[Array], keys_ref, values_ref, steps, lb: int,
           bias_at: Callable, head: Tuple = (), first: Optional[Tuple] = None,
           dot: bool = False) -> List[Array]:
  """Each query [D] over keys/values [*head, D, slots] (`head`: leading
  indices, as in `project`), online softmax over blocks of lb slots (steps
  of them, from slot 0); bias_at(m, first, valid) -> [lb] float32 bias of
  query m's slots first..first+lb-1 (valid: which exist). Masked slots
  (bias -1e10) add exact zeros once a slot counted, so trailing masked
  blocks change nothing. `first`: block 0's biases (and keys and values),
  loaded already (`attend_first`): each step then loads the next block's
  before it computes (carried: no block is compiled twice). `dot`
  (`use_dot` of D and lb): every row at once on tensor cores
  (`_attend_tiles`), not one row after another."""
  head_dim = keys_ref.shape[len(head)]
  rows = len(queries)
  if use_dot(dot, head_dim, lb):
    return _attend_tiles(queries, keys_ref, values_ref, steps, lb, bias_at,
                         head, first)

  def step(j, state, loaded):
    kv, biases = loaded
    start, valid, load_block = _slots(keys_ref, j, lb, head)
    keys, values = (x.astype(F32) for x in kv or (load_block(keys_ref),
                                                  load_block(values_ref)))
    new = []
    for m, query in enumerate(queries):
      top, total, acc = state[3 * m:3 * m + 3]
      logits = (jnp.sum(query[:, None] * keys, axis=0) +
                (biases[m] if biases else bias_at(m, start, valid)))
      new_top = jnp.maximum(top, jnp.max(logits))
      decay = jnp.exp(top - new_top)
      weights = jnp.exp(logits - new_top)
      new += [
          new_top, total * decay + jnp.sum(weights),
          acc * decay + jnp.sum(values * weights[None, :], axis=1)
      ]
    return tuple(new)

  init = []
  for _ in queries:
    init += [
        jnp.full((), -jnp.inf, F32),
        jnp.zeros((), F32),
        jnp.zeros((head_dim,), F32)
    ]
  done = _over_blocks(step, tuple(init), steps, first, keys_ref, values_ref, lb,
                      bias_at, rows, head)
  return [done[3 * m + 2] / done[3 * m + 1] for m in range(rows)]


def _over_blocks(step: Callable, init, steps, first: Optional[Tuple], keys_ref,
                 values_ref, lb: int, bias_at: Callable, rows: int,
                 head: Tuple):
  """`attend`'s loop: step(j, state, loaded) over `steps` blocks of slots
  from `init`; with `first` (block 0's loads) each step's loaded is the
  block's, loaded while the block before computed (else (None, None):
  the step loads its own)."""
  if first is None:
    return lax.fori_loop(0, steps, lambda j, c: step(j, c, (None, None)), init)
  kv_too = first[0] is not None

  def pipelined(j, carry):
    state, loaded = carry
    following = _block_loads(keys_ref, values_ref if kv_too else None, j + 1,
                             lb, bias_at, rows, head)  # in flight while j runs
    return step(j, state, loaded), following

  done, _ = lax.fori_loop(0, steps, pipelined, (init, first))
  return done


def _attend_tiles(queries: Sequence[Array], keys_ref, values_ref, steps,
                  lb: int, bias_at: Callable, head: Tuple,
                  first: Optional[Tuple]) -> List[Array]:
  """`attend` per tile of 16 rows: a block's logits one dot (the queries,
  the model's dtype's values, in the keys' dtype), each row's running max
  (exact in any order), the weights rounded to the values' dtype (as
  XLA's path rounds its probabilities) and both their sums (a dot with
  ones) and the weighted values (a dot) on tensor cores: a row's the same
  operations in any place of a tile, so its bits do not depend on the
  call's rows; and K rows cost about one, not K in a row."""
  head_dim = keys_ref.shape[len(head)]
  groups = _groups(len(queries))
  ones = jnp.ones((lb, TILE_ROWS), values_ref.dtype)
  first_column = lax.broadcasted_iota(jnp.int32, (TILE_ROWS, TILE_ROWS), 1) == 0

  def step(j, state, loaded):
    kv, biases = loaded
    start, valid, load_block = _slots(keys_ref, j, lb, head)
    keys, values = kv or (load_block(keys_ref), load_block(values_ref))
    new = []
    for g, (row0, count) in enumerate(groups):
      top, total, acc = state[3 * g:3 * g + 3]
      q = rows_tile(lambda r, f=row0: queries[f + r], count, head_dim)
      bias = rows_tile(
          lambda r, f=row0: biases[f + r]
          if biases else bias_at(f + r, start, valid), count, lb)
      logits = jnp.dot(q.astype(keys.dtype), keys,
                       preferred_element_type=F32) + bias
      new_top = jnp.maximum(top, jnp.max(logits, axis=1))
      decay = jnp.exp(top - new_top)
      weights = jnp.exp(logits - new_top[:, None]).astype(values.dtype)
      # Each row's sum in column 0 of a dot with ones (the other columns'
      # exact zeros added: Triton's lowering takes no slice).
      sums = jnp.sum(
          jnp.where(first_column,
                    jnp.dot(weights, ones, preferred_element_type=F32), 0.0),
          axis=1)
      new += [
          new_top, total * decay + sums, acc * decay[:, None] +
          lax.dot_general(weights, values,
                          (((1,), (1,)), ((), ())), preferred_element_type=F32)
      ]
    return tuple(new)

  init = []
  for _ in groups:
    init += [
        jnp.full((TILE_ROWS,), -jnp.inf, F32),
        jnp.zeros((TILE_ROWS,), F32),
        jnp.zeros((TILE_ROWS, head_dim), F32)
    ]
  done = _over_blocks(step, tuple(init), steps, first, keys_ref, values_ref, lb,
                      bias_at, len(queries), head)
  out = []
  rows = lax.broadcasted_iota(jnp.int32, (TILE_ROWS,), 0)
  for g, (_, count) in enumerate(groups):
    for r in range(count):
      total = jnp.sum(jnp.where(rows == r, done[3 * g + 1], 0.0))
      out.append(tile_row(done[3 * g + 2], r) / total)
  return out


def attend_first(keys_ref, values_ref, lb: int, bias_at: Callable, rows: int,
                 head: Tuple = (), live=None) -> Tuple:
  """`attend`'s `first`, loaded now (`Tiles.prefetch`): block 0's (keys
  and values [D, lb], or None where values_ref is None: the biases alone;
  each of `rows` queries' bias [lb]); `live` as `load`'s (its slots all
  masked where it is False)."""
  return _block_loads(keys_ref, values_ref, 0, lb, bias_at, rows, head, live)


def _block_loads(keys_ref, values_ref, j, lb: int, bias_at: Callable, rows: int,
                 head: Tuple, live=None) -> Tuple:
  """Block j's (keys and values, or None where values_ref is None; each
  row's bias)."""
  start, valid, load_block = _slots(keys_ref, j, lb, head, live)
  loaded = None
  if values_ref is not None:
    loaded = (load_block(keys_ref), load_block(values_ref))
  return loaded, [bias_at(m, start, valid) for m in range(rows)]


def _slots(keys_ref, j, lb: int, head: Tuple, live=None):
  """`attend`'s block j of lb slots of keys_ref [*head, D, L]: (its first
  slot, which exist [lb] (none where `live` is False), a loader of a keys'
  or values' ref's block [D, lb], zeros where none)."""
  plgpu = pallas()[1]
  head_dim, length = keys_ref.shape[len(head):]
  start = block_start(j, lb)
  valid = start + lax.iota(jnp.int32, lb) < length
  if live is not None:
    valid = valid & live
  mask = jnp.broadcast_to(valid[None, :], (head_dim, lb))
  at = head + (ALL, block_span(j, lb))
  return start, valid, lambda ref: plgpu.load(ref.at[at], mask=mask, other=0.0)
