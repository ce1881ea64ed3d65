"""The `paths` phase's `barriers` group: what one barrier between the
stages of a run of layers over many programs costs here, and whether
barriers hold (`kernels.gpu_barriers.passes`).

A T5-small step under the `_persistent` presets waits at ~60 barriers
(`Tiles.programs`), against issue 56's 0.10 ms a step: at 1 µs each they
would be most of it. Per number of programs (`Settings.barrier_programs`:
a preset's 128, and a few), the kernel with `barrier_passes` stages and
with none, each `inner_steps` times in a loop, interleaved: a barrier
costs (the first's time - the second's) / passes, launches and the loop
cancelled (each stage also stores and loads one word: two L2 round trips
that a layer's stages make too). `held`: every program's count came out
right in a call after the timing, which it is only if every stage saw
the one before's stores.
"""
from typing import Any, Callable, Dict

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax.core.kernels import gpu_barriers
from tools.device_check import common
from tools.device_check import physics


def _looped(passes: int, programs: int, steps: int) -> Callable[[int], Any]:
  """fn(round) -> [programs] int32: `steps` kernels of `passes` barriers
  over `programs` programs, summed (steps * passes each if they held)."""

  @jax.jit
  def loop(zeros):
    return lax.fori_loop(
        0, steps, lambda _, acc: acc + gpu_barriers.passes(passes, programs),
        zeros)

  zeros = jnp.zeros((programs,), jnp.int32)
  return lambda _: loop(zeros)


def measure(b: physics.Bench, s: common.Settings, record: common.Recorder,
            deadline: common.Deadline, timed_variants: Callable[...,
                                                                Dict]) -> None:
  """The group (its record: `barriers`; `timed_variants`: the paths
  phase's, compiling several at once, then timing)."""
  variants, expected = {}, {}
  for programs in s.barrier_programs:
    for passes in (s.barrier_passes, 0):
      name = f"p{programs}/n{passes}"
      variants[name] = _looped(passes, programs, s.inner_steps)
      expected[name] = passes * s.inner_steps
  common.log(f"paths: barriers, {s.barrier_passes} passes over "
             f"{', '.join(map(str, s.barrier_programs))} programs")
  timed = timed_variants(b, variants, next(iter(variants)), deadline)
  held: Dict[str, bool] = {}  # after the timing: compiled (and timed) once
  for name, fn in variants.items():
    done = common.guarded(lambda f=fn: {"out": np.asarray(f(0))})
    if "out" in done:
      held[name] = bool(np.all(done["out"] == expected[name]))
  ms = timed.get("ms") or {}
  per_barrier = {}
  for programs in s.barrier_programs:
    waited, alone = (ms.get(f"p{programs}/n{n}") for n in (s.barrier_passes, 0))
    if waited is not None and alone is not None and s.barrier_passes:
      per_barrier[str(programs)] = (waited - alone) * 1e3 / s.barrier_passes
  record.set(
      "barriers", {
          "passes": s.barrier_passes,
          "programs": list(s.barrier_programs),
          "held": held,
          "all_held": bool(held) and all(held.values())
                      and len(held) == len(variants),
          "us_per_barrier": per_barrier,
          **timed
      })
