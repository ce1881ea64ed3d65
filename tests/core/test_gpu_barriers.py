"""`kernels.gpu_barriers.passes`: stages apart by barriers and nothing
else, which the device check times and checks on a GPU (interpret mode
here: the programs run one after another, so this checks the passing,
not the barriers)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_barriers


@pytest.mark.parametrize("count,programs", [(5, 4), (0, 3), (1, 2)])
def test_every_program_counts_the_stages(count, programs):
  out = jax.jit(lambda: gpu_barriers.passes(count, programs))()
  np.testing.assert_array_equal(out, np.full((programs,), count, np.int32))


def test_a_kernel_of_barriers_lowers_for_cuda_over_its_programs():
  """One Triton call, its barriers atomics on a counter (a GPU program
  whose stages wait for each other)."""
  with gpu.lowering_for_gpu():
    text = jax.jit(lambda z: gpu_barriers.passes(3, 8) + z).trace(
        jax.ShapeDtypeStruct(
            (8,), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count(gpu.TRITON_CALL) == 1
  assert "barrier_passes" in text and "atomic_rmw" in text


@pytest.mark.parametrize("count,programs", [(3, 1), (-1, 4)])
def test_bad_sizes_are_refused(count, programs):
  with pytest.raises(
      ValueError, match=f"passes: count={count}, programs={programs}; "
      "allowed: count >= 0 and programs >= 2"):
    gpu_barriers.passes(count, programs)
