"""The GPU kernels' tiles: block sizes and launch settings (`Tiles`), the
presets the device check times (`TILE_PRESETS`), the float32 weights'
caps (`WIDE_WEIGHT_DEPTHS`), and the context that sets them for the
kernels traced inside it (`tiles`, read by `current_tiles`).
"""
import contextlib
import contextvars
import dataclasses
from typing import Any, Iterator, Optional

import jax.numpy as jnp

from specdec_jax.core.kernels import _gpu_pieces as _pieces


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Block sizes (caps: the block used is the largest power of 2 dividing
  the dimension, at most this) and Triton's launch settings.

  Attributes:
    emb_block: contraction block of the attention kernels' projections
      from the model width (their columns are a head: fixed).
    dense_emb_block: contraction block of `rms_dense` (the MLP's input
      side, the logits).
    in_block: contraction block of the output projections.
    columns: output columns per program of the dense kernels (of a folded
      layer's MLP: its width).
    slots: cache (or encoder) slots per attention step.
    rows: rows per program of the dense kernels (with `dot`: 16, a tile).
    num_warps, num_stages: Triton's.
    dot: the projections on tensor cores (`_gpu_pieces`: rows in tiles of
      16, one `tl.dot` per block; x * scale rounded to the weights' dtype
      first; where a block or its columns are under 16, CUDA cores) rather
      than products summed on CUDA cores: a K-token call then multiplies
      as fast as a one-token call.
    split_heads: the attention kernels' projections (self: q, k, v; cross:
      q) in a kernel of their own (`head_projections`), one program per
      (row of the batch, head, part, block of `columns` columns), and the
      attention kernels reading them: one kernel more per sublayer, but
      ~12x the programs reading those weights (T5-small: 6 programs read
      196 KB each; split, 36-72 read 8-16 KB), where one program per head
      leaves most of the GPU idle (64 heads: XXL's half of an H200's 132
      SMs). The same sums as unsplit, rounded alike: the same bits on CUDA
      cores.
    layer_bytes: consecutive decoder layers whose weights together take
      at most this many bytes run as one kernel
      (`gpu_layers.decoder_layers`, `layer_runs`), one program per row of
      the batch: a small draft's six kernels a layer cost six launches
      (~2 us each on an H200), not their bytes. 0: never.
    fold_bytes: a decoder layer over `layer_bytes` whose weights take at
      most this many bytes runs as three kernels, one a sublayer
      (`gpu_layers.folded_self_attention`, `folded_cross_attention`,
      `folded_mlp`): each program ends with its share of the sublayer's
      output projection (a head's rows of it; a block of `columns` of the
      MLP's width) as float32 partial sums, which the next kernel's
      programs add to the residual as they read it. Half the launches of
      six kernels, where launches cost more than the partial sums' reads
      (a T5-small-shaped layer; not XXL's). Their projections are never split
      (`split_heads`). 0: never.
    out_columns: a folded kernel's partial sums: columns of the model
      width per block of their product.
    programs: the programs a one-kernel run of layers runs on (runs as
      `layer_bytes` groups them; a layer over it runs alone), all rows of
      the batch together (each row gets programs // B, at least 1): each
      stage of a layer (with `split_heads` the attention projections, each
      attention, each dense product) is divided among a row's programs by
      blocks, which wait for each other between stages at a barrier in
      global memory (`_gpu_grid`): a small model's step in a few kernels
      over the whole GPU, not ~8 launches a layer. At most the GPU's
      multiprocessors (every program must be resident: an H200 has 132).
      0: one program per row runs every stage.
    prefetch: with `programs`, each program loads what its first block of
      a stage reads first and no stage before writes (a dense product's
      or split projection's first weights; a self-attention's first
      block of relative-position biases; a cross-attention's first block
      of the encoder's keys, values and mask) before the barrier the
      stage waits at, not after: its memory latency spent while the
      program waits. The same operations: the same bits.
    fold_outputs: with `programs` and `split_heads`, each attention's
      stage also applies the sublayer's output projection: its blocks
      are (head, block of the model width's columns,
      `gpu_layers.out_columns`), each recomputing its head's attention
      and writing that head's share of those columns as float32 partial
      sums, which the next stage's blocks add to the residual as they read
      it (block 0 writing the sum out, as `fold_bytes`' kernels do): six
      stages a layer, not eight, so two barriers fewer (T5-small: 16 of 64
      a step). The sums' order is a head's, then the heads': a row's the
      same bits in any call, not `split_heads`' bits.
    attention_dot: with `dot`, the attention kernels' rows together on
      tensor cores (`_pieces.attend`'s `dot`, where a head and a block of
      slots are at least 16 wide): a block's logits, weights' sums and
      weighted values each one dot for up to 16 rows, not each row's
      reductions in turn (a K-token call's attentions then cost about a
      one-token call's: the shipped target's 4-token call cost 1.30 steps
      on `fused`, 1.09 on `xla`). The weights rounded to the values'
      dtype, as XLA's path rounds its probabilities. Not in the folded
      layers' kernels (`fold_bytes`).
  """
  emb_block: int = 64
  dense_emb_block: int = 64
  in_block: int = 128
  columns: int = 32
  slots: int = 64
  rows: int = 8
  num_warps: int = 4
  num_stages: int = 2
  dot: bool = False
  split_heads: bool = False
  layer_bytes: int = 0
  fold_bytes: int = 0
  out_columns: int = 128
  programs: int = 0
  prefetch: bool = False
  fold_outputs: bool = False
  attention_dot: bool = False

  @property
  def row_block(self) -> int:
    """Rows per program of the dense kernels."""
    return _pieces.TILE_ROWS if self.dot else self.rows

  def for_weights(self, dtype: Any) -> "Tiles":
    """These tiles for weights of `dtype`: 4-byte weights' contraction
    blocks no deeper than `WIDE_WEIGHT_DEPTHS` (their products take twice
    the registers; with `prefetch`, `PREFETCHED_WIDE_DEPTHS` too); 2-byte
    weights' as they are."""
    if jnp.dtype(dtype).itemsize <= 2:
      return self
    caps = {
        **WIDE_WEIGHT_DEPTHS,
        **(PREFETCHED_WIDE_DEPTHS if self.prefetch else {})
    }
    return dataclasses.replace(
        self, **{
            name: min(getattr(self, name), cap) for name, cap in caps.items()
        })


# The deepest contraction blocks of float32 weights (`Tiles.for_weights`):
# the shipped pair's float32 target under 'tall_mma_split' (512 and 1024
# deep) spilled 5 KB a thread in decode_rms_dense and 60-164 B in its MLP's
# output projection (ptxas, compiled here for an H200: 2026-11-29 and
# -30); at 128 and 512 nothing spills. bfloat16 blocks 512 and 1024 deep
# spill nothing.
WIDE_WEIGHT_DEPTHS = {"dense_emb_block": 128, "in_block": 512}
# And with `Tiles.prefetch`, whose first blocks are held in registers
# across a barrier: the shipped pair's float32 target under
# 'tall_mma_persistent_prefetch' spilled 220-356 B a thread with its output
# projections' blocks 512 deep, none at 256 (2026-11-30).
PREFETCHED_WIDE_DEPTHS = {"in_block": 256}

# What the device check compares (`tiles`); "default" is `Tiles()`. On
# CUDA cores Triton pipelines no load (they feed no dot): a program's
# contraction is a chain of dependent loads, one memory latency per block,
# and the 8-token self-attention spills registers. "tall" reads the dense
# kernels' weights in 1-2 blocks (512 and 1024 deep), "tall_wide" also the
# attention projections in 128-deep ones (8 warps). On tensor cores
# (`Tiles.dot`: "mma", "tall_mma") Triton pipelines the weights' loads
# (cp.async, one block ahead) and nothing spills at 8 tokens. ptxas spills
# none at 1 token (`tools.benchmarks.gpu_aot`). "_split" (`Tiles.
# split_heads`): the attention projections over many programs, not one per
# head; "tall_mma_split" reads them 256 deep: a pipelined program keeps
# num_stages blocks in flight, and bandwidth is bytes in flight / latency
# (XXL's 768 projection programs at 16 columns x 64 deep: ~4 KB each).
# "_fold" (`Tiles.fold_bytes`): a small model's layer in 3 kernels; one
# program per head still reads a head's weights (T5-small: 260 KB), so
# "tall_mma_fold" reads them in blocks twice as deep, its MLP's weights 4x
# as deep (at 8 tokens a block of each row's partial sums is in shared
# memory: 256 deep, or 64 MLP programs' sums, exceeded it). "deep_mma_split":
# "mma_split"'s blocks (no float32 spill) over twice the programs (16
# columns), 4 blocks in flight a program, not 2: on the H200 a program of
# 'mma_split' read ~5-8 GB/s (2026-11-30 profile; a block is 2-4 KB).
# "mma_persistent" (`Tiles.programs`): decoder layers up to 12 MB together
# (T5-small's in pairs; a larger one alone) in one kernel over 128
# programs, `mma_split`'s blocks over 16 columns, its stages apart by
# barriers: at T5-small the profile's ~1.9 us gaps and ~2.9 us fixed cost
# of 70 kernels (~0.34 ms of a 0.58 ms step) become 5 kernels and 60
# barriers, each an L2 round trip or two. Not all 8 layers in one:
# compiled here for an H200, its 4-token call took 155 s (three a kernel:
# 38 s, 120 s at 8 tokens; two 18 s and 73 s). "tall_mma_persistent": the
# same with `tall_mma_split`'s blocks: a program's block of a stage is then
# one or two loads in flight at once, not 4-8 in a row two at a time
# (T5-small's MLP input: 32 KB a block of columns).
# "tall_mma_persistent_prefetch" (`Tiles.prefetch`): a stage's first
# block of weights (at T5-small the MLP's whole blocks), biases or encoder
# keys loaded before each barrier, so that the barrier's wait hides their
# round trip to memory (60 barriers a step) and after it a stage first
# reads the rows the stage before wrote (in L2).
TILE_PRESETS = {
    "default": Tiles(),
    "wide": Tiles(emb_block=128, dense_emb_block=128, in_block=256, columns=64,
                  num_warps=8),
    "narrow": Tiles(emb_block=32, dense_emb_block=32, in_block=64, columns=16,
                    slots=32, num_warps=2),
    "tall": Tiles(dense_emb_block=512, in_block=1024, columns=8),
    "tall_wide": Tiles(emb_block=128, dense_emb_block=512, in_block=1024,
                       columns=16, num_warps=8),
    "mma": Tiles(dot=True),
    "tall_mma": Tiles(dot=True, dense_emb_block=512, in_block=1024, columns=16),
    "mma_split": Tiles(dot=True, split_heads=True),
    "deep_mma_split": Tiles(dot=True, columns=16, num_stages=4,
                            split_heads=True),
    "tall_mma_split": Tiles(dot=True, emb_block=256, dense_emb_block=512,
                            in_block=1024, columns=16, split_heads=True),
    "mma_layer": Tiles(dot=True, layer_bytes=1 << 20),
    "mma_fold": Tiles(dot=True, fold_bytes=64 << 20),
    "tall_mma_fold": Tiles(dot=True, emb_block=128, dense_emb_block=256,
                           fold_bytes=64 << 20),
    "mma_layer_fold": Tiles(dot=True, layer_bytes=1 << 20, fold_bytes=64 << 20),
    "mma_persistent": Tiles(dot=True, columns=16, split_heads=True,
                            layer_bytes=12 << 20, programs=128),
    "tall_mma_persistent": Tiles(dot=True, emb_block=256, dense_emb_block=512,
                                 in_block=1024, columns=16, split_heads=True,
                                 layer_bytes=12 << 20, programs=128),
}
# The A/B of `Tiles.prefetch`: 'tall_mma_persistent' with it, nothing else.
TILE_PRESETS["tall_mma_persistent_prefetch"] = dataclasses.replace(
    TILE_PRESETS["tall_mma_persistent"], prefetch=True)
# The A/B of `Tiles.attention_dot`: 'mma_split' with it (the K-token
# call's attentions).
TILE_PRESETS["mma_split_attention"] = dataclasses.replace(
    TILE_PRESETS["mma_split"], attention_dot=True)
# And of `Tiles.fold_outputs` on top: 2 of a layer's 8 barriers fewer.
TILE_PRESETS["tall_mma_persistent_prefetch_fold"] = dataclasses.replace(
    TILE_PRESETS["tall_mma_persistent_prefetch"], fold_outputs=True)

_TILES: contextvars.ContextVar[Optional[Tiles]] = contextvars.ContextVar(
    "specdec_jax_gpu_tiles", default=None)


def current_tiles() -> Tiles:
  """The tiles kernels traced now use: `tiles`' value, else `Tiles()`."""
  return _TILES.get() or Tiles()


@contextlib.contextmanager
def tiles(value: Tiles) -> Iterator[None]:
  """Within it, kernels traced use `value` (trace a fresh function inside:
  jit caches programs traced before)."""
  token = _TILES.set(value)
  try:
    yield
  finally:
    _TILES.reset(token)
