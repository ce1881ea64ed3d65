"""The suite frees its compiled programs (conftest.free_compiled_programs):
a worker that kept them all ran out of memory regions and crashed."""
import os

import jax
import jax.numpy as jnp
import pytest

import conftest

MAPS = "/proc/self/maps"


def _regions() -> int:
  with open(MAPS, encoding="ascii", errors="replace") as f:
    return sum(1 for _ in f)


@pytest.mark.skipif(not os.path.exists(MAPS), reason=f"needs Linux's {MAPS}")
def test_freeing_compiled_programs_returns_their_memory_regions():
  conftest.free_compiled_programs()
  before = _regions()
  add = jax.jit(lambda x, n: x + n, static_argnums=1)
  # Distinct programs, each loaded into regions of its own.
  for n in range(40):
    add(jnp.zeros(3), n).block_until_ready()
  held = _regions()
  assert held >= before + 40, (before, held)
  conftest.free_compiled_programs()
  freed = _regions()
  # Most of what the 40 programs mapped is returned.
  assert freed - before < (held - before) / 2, (before, held, freed)
