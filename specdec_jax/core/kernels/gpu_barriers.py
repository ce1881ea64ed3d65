"""A kernel of barriers and nothing else (`passes`): what one of a run of
layers' barriers costs (`gpu_tiles.Tiles.programs`: a T5-small step
waits at ~60), and whether they hold, which the device check measures on
a GPU (the `paths` phase's `barriers` group).

Its programs pass a token around: at each of `count` stages program p
writes what program p + 1 wrote at the stage before, plus one, so that
after the last stage every program holds `count` only if every stage
saw every store of the one before it (a program that read too early
reads a smaller number), and a stage costs a barrier and two L2 round
trips of one word each.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core.kernels import _gpu_grid as _grid
from specdec_jax.core.kernels import gpu

Array = jax.Array


def passes(count: int, programs: int) -> Array:
  """[programs] int32: `count` stages over `programs` programs, apart by
  barriers (`_gpu_grid.Stages`, one row), each program's number after
  them: `count` everywhere if the barriers held.

  Raises:
    ValueError: programs below 2 (no barrier between programs) or a
      negative count.
  """
  if programs < 2 or count < 0:
    raise ValueError(f"passes: count={count}, programs={programs}; allowed: "
                     "count >= 0 and programs >= 2.")
  kernel = functools.partial(_passes_kernel, count=count, programs=programs,
                             on_gpu=not gpu.interpret())
  whole = gpu.whole_block
  call = gpu.pallas_call(
      kernel, out_specs=[((2, programs), jnp.int32, *whole((2, programs))),
                         ((1,), jnp.int32, *whole((1,)))],
      in_specs=[whole((1,))], grid=(1, programs if not gpu.interpret() else 1),
      name="barrier_passes", aliases=None if gpu.interpret() else {0: 1})
  tokens, _ = call(jnp.zeros((1,), jnp.int32))
  return tokens[count % 2]


def _passes_kernel(counter_in, tokens_ref, counter_ref, *, count: int,
                   programs: int, on_gpu: bool):
  """`passes`' body: tokens_ref [2, programs] (stage j reads row j % 2 and
  writes the other), counter_ref [1] the barriers' (counter_in its
  input: zeros, aliased on a GPU)."""
  del counter_in
  stages = _grid.Stages(programs, on_gpu, counter_ref)

  def first(p):  # stage 0: nothing read yet
    tokens_ref[0, p] = jnp.int32(0)

  stages.run(programs, first)

  def stage(j, carry):
    stages.wait()
    src, dst = lax.rem(j, 2), 1 - lax.rem(j, 2)

    def block(p):
      following = lax.rem(p + 1, programs)
      tokens_ref[dst, p] = tokens_ref[src, following] + 1

    stages.run(programs, block)
    return carry

  if count:
    lax.fori_loop(0, count, stage, 0)
