"""A kernel's programs working as one (`gpu_tiles.Tiles.programs`): each
stage's blocks divided among them (`Stages.run`) and a barrier between
stages in global memory (`Stages.wait`).

Triton has no grid-wide barrier, so each program adds one to its row of
the batch's counter (an integer: the order the programs arrive in changes
no sum) and waits until every program of the row has: the k-th barrier
ends when the counter reaches k x programs. Before it a program's threads
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
stage's end is its barrier. The blocks, each program's share of them and
the operations on each are the GPU's: the same bits.
"""
import dataclasses
from typing import Any, Callable

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
    counter_ref: [R, B] int32, row `counter_row` zeros at the kernel's
      start: the rows' barrier counters (written: an aliased output); None
      where programs is 0.
    counter_row: this kernel's row of counter_ref.
    waits: the barriers traced so far.
  """
  programs: int
  on_gpu: bool
  counter_ref: Any = None
  counter_row: int = 0
  waits: int = 0

  def run(self, count: int, block: Callable[[Any], None]) -> None:
    """block(i) for each of a stage's `count` blocks: program p of the
    row's runs blocks p, p + programs, ... (i traced); with no programs,
    one program runs all (i a Python int)."""
    if not self.programs:
      for i in range(count):
        block(i)
      return
    pl, _ = _pieces.pallas()
    rounds = -(-count // self.programs)

    def program(p):

      def one(j, carry):
        i = p + j * self.programs

        @pl.when(i < count)
        def _():
          block(i)

        return carry

      lax.fori_loop(0, rounds, one, 0)

    if self.on_gpu:
      program(pl.program_id(1))
    else:
      lax.fori_loop(0, self.programs, lambda p, c: (program(p), c)[1], 0)

  def wait(self) -> None:
    """The end of a stage: what every program stored before it, every
    program reads after it."""
    if not self.on_gpu:
      return  # Interpret mode: the stage ran for every program.
    pl, plgpu = _pieces.pallas()
    plgpu.debug_barrier()  # This program's threads' stores are done.
    if self.programs <= 1:
      return
    self.waits += 1
    slot = (jnp.int32(self.counter_row), pl.program_id(0))  # run's, row's
    arrived = self.waits * self.programs
    plgpu.atomic_add(self.counter_ref, slot, jnp.int32(1))

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


def at(i: Any, size: int) -> Any:
  """Block i's first index, blocks of `size`: a Python int for a Python
  int; traced, marked a multiple of size (Triton's loads vectorise)."""
  if isinstance(i, int):
    return i * size
  pl, _ = _pieces.pallas()
  return pl.multiple_of(i * size, size)


def index(i: Any) -> Any:
  """i as a kernel's traced index (interpret mode's loads take no Python
  ints)."""
  return jnp.int32(i) if isinstance(i, int) else i
