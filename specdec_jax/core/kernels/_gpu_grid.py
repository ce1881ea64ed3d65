"""A kernel's programs working as one (`gpu_tiles.Tiles.programs`): each
stage's blocks divided among them (`Stages.run`) and a barrier between
stages in global memory (`Stages.wait`).

Triton has no grid-wide barrier, so each program adds one to its row of
the batch's counter (an integer: the order the programs arrive in changes
no sum) and waits until every program of the row has: until the counter
reaches the next multiple of programs above what its add returned (the
count before it: every program passed the last barrier, and those that
came to this one first wait for it, so at most programs - 1 more). The
counter goes on counting from barrier to barrier and from kernel to
kernel of a call (one zeroed array a call, `gpu_layers.
barrier_counters`): no barrier needs to know how many came before it, so
a call's runs of layers of the same shapes are the same kernel, which
XLA compiles once (for an H200 here, T5-small's 4-token call under
'tall_mma_persistent' in 23 s, not 40, when each run had counted in a
counter of its own). Before it a program's threads
finish their stores (`debug_barrier`, CUDA's __syncthreads); the counter's
atomics are acquire-release at the GPU's scope, as CUDA's grid
synchronisation orders the blocks' stores and loads; after it the
program's threads go on together. A program waiting holds its
multiprocessor, so every program of the kernel must be resident at once:
the rows' programs together at most the GPU's multiprocessors
(`gpu_layers.decoder_layers` divides `Tiles.programs` among the rows). A
wait that outlasts `SPIN_LIMIT` reads gives up and marks the counter so
that the kernel's later waits do too (`GAVE_UP`): its results wrong and
the device check's comparison with XLA's path failing, rather than the
GPU hanging.

In interpret mode (the CPU's tests) a kernel's programs run one after
another, so no program could wait for a later one: there one program per
row runs each stage for every program in turn (virtual programs), and a
stage's end is its barrier. The blocks, each program's share of them,
what it loads early (`prefetch`, masked for a program with no block)
and the operations on each are the GPU's: the same bits.
"""
import dataclasses
from typing import Any, Callable, Optional

import jax.numpy as jnp
from jax import lax

from specdec_jax.core.kernels import _gpu_pieces as _pieces

# Reads of the counter before a wait gives up (each an L2 round trip, about
# 0.5-1 us: 30-70 ms, where a wait takes microseconds), and the counter's
# value then: negative, so that every later wait of the kernel (which
# reads it negative) goes on at once, and the kernel ends in one give-up,
# not one a barrier.
SPIN_LIMIT = 1 << 16
GAVE_UP = -(1 << 30)


@dataclasses.dataclass
class Stages:
  """How a kernel's stages run on its programs (traced once per kernel).

  Attributes:
    programs: each row of the batch's programs; 0: one program runs every
      block of each stage, a Python loop over them (`Tiles.layer_bytes`
      alone).
    on_gpu: lowered for a GPU (else interpret mode: virtual programs).
    counter_ref: [B] int32, each a multiple of programs at the kernel's
      start: the rows' barrier counters (written: an aliased output); None
      where programs is 0.
    prefetch: what a stage's first block reads first loaded before the
      barrier it waits at (`Tiles.prefetch`).
    owed: a barrier the next stage waits at (`wait`), once its first
      block's loads are issued.
  """
  programs: int
  on_gpu: bool
  counter_ref: Any = None
  prefetch: bool = False
  owed: bool = False

  def run(self, count: int, block: Callable[..., None],
          fetch: Optional[Callable[..., Any]] = None) -> None:
    """block(i) for each of a stage's `count` blocks: program p of the
    row's runs blocks p, p + programs, ... (i traced); with no programs,
    one program runs all (i a Python int). With `prefetch`, fetch(i[,
    live]) loads what block i reads first (weights, biases, keys: never
    what a stage before writes; `live`: whether to read at all, as
    `_pieces.load`'s) and block(i, fetch(i)) runs on it: a program's first
    block's before the barrier the stage waits at, so that the loads are
    in flight while it waits."""
    if not self.programs:
      for i in range(count):
        block(i)
      return
    pl, _ = _pieces.pallas()
    rounds = -(-count // self.programs)
    fetch = fetch if self.prefetch else None
    early = fetch is not None and self.owed

    def one(i, first=None):

      @pl.when(i < count)
      def _():
        if fetch is None:
          block(i)
        else:
          block(i, fetch(i) if first is None else first)

    def program(p, first=None):
      start = 0
      if first is not None:  # Round 0 on what was loaded already.
        one(p, first)
        start = 1
      if rounds > start:
        lax.fori_loop(start, rounds, lambda j, c:
                      (one(p + j * self.programs), c)[1], 0)

    def early_loads(p):
      return self.first_loads(fetch, p, count) if early else None

    if self.on_gpu:
      p = pl.program_id(1)
      first = early_loads(p)  # in flight through the barrier
      self._pay()
      program(p, first)
    else:  # Virtual programs, each loading first as a GPU's would.
      self._pay()
      lax.fori_loop(0, self.programs, lambda p, c:
                    (program(p, early_loads(p)), c)[1], 0)

  def first_loads(self, fetch: Callable[..., Any], p, count: int) -> Any:
    """fetch's loads of program p's first block of a stage; a program past
    the stage's blocks reads nothing (the last block's addresses,
    masked)."""
    if count >= self.programs:
      return fetch(p)
    return fetch(jnp.minimum(p, count - 1), p < count)

  def wait(self) -> None:
    """The end of a stage: what every program stored before it, every
    program reads after it (the barrier paid by the next `run`, or at
    once where no program waits for another)."""
    if self.programs > 1:
      self.owed = True
    elif self.on_gpu:
      _, plgpu = _pieces.pallas()
      plgpu.debug_barrier()  # This program's threads' stores are done.

  def _pay(self) -> None:
    """The barrier `wait` owes, if any."""
    if not self.owed:
      return
    self.owed = False
    if not self.on_gpu:
      return  # Interpret mode: the stage before ran for every program.
    pl, plgpu = _pieces.pallas()
    plgpu.debug_barrier()  # This program's threads' stores are done.
    slot = (pl.program_id(0),)  # the row's
    before = plgpu.atomic_add(self.counter_ref, slot, jnp.int32(1))
    programs = jnp.int32(self.programs)
    arrived = (lax.div(before, programs) + 1) * programs

    def waiting(carry):
      seen, spins = carry
      return (seen >= 0) & (seen < arrived) & (spins < SPIN_LIMIT)

    def read(carry):
      return (plgpu.atomic_add(self.counter_ref, slot,
                               jnp.int32(0)), carry[1] + 1)

    _, spins = lax.while_loop(waiting, read, (jnp.int32(0), jnp.int32(0)))

    @pl.when(spins >= SPIN_LIMIT)
    def give_up():  # Every wait of the kernel's after it gives up too.
      plgpu.atomic_xchg(self.counter_ref, slot, jnp.int32(GAVE_UP))

    plgpu.debug_barrier()  # The program's threads go on together.


def index(i: Any) -> Any:
  """i as a kernel's traced index (interpret mode's loads take no Python
  ints)."""
  return jnp.int32(i) if isinstance(i, int) else i
