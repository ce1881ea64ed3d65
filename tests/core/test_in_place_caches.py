"""The speculative loop updates its KV caches in place on XLA:CPU.

`kernels.CPU_IN_PLACE_COMPILER_OPTIONS`: with XLA's default copy insertion,
every cache array is copied (twice) per call inside the while loop; the
speculative CPU program must hold none. The test also compiles the same
loop with XLA's defaults and finds the copies there, so it can fail. (The
baseline keeps XLA's default, measured faster: `kernels`.)
"""
import jax
import numpy as np

from tools.benchmarks import iteration_hlo as hlo_ops
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops

from conftest import perturbed
from conftest import random_model
from conftest import tiny_config

MAX_LEN = 12
GAMMA = 3


def while_body_copies(hlo: str, shape: str) -> int:
  """Copies of a `shape`-typed array (e.g. 'f32[2,4,8,16]') in the while
  loops' bodies of the optimized HLO text `hlo` (`hlo_ops.loop_bodies`)."""
  return sum(body["copy_shapes"].get(shape, 0)
             for body in hlo_ops.loop_bodies(hlo).values())


def _setup():
  target = random_model(tiny_config(vocab_size=32), seed=3)
  drafter = decoding.ModelDrafter(perturbed(target, scale=0.2, seed=4))
  inputs = np.random.default_rng(0).integers(2, 32, (2, 6)).astype(np.int32)
  return target, drafter, inputs


def _cache_shape(target, inputs, length):
  keys = jax.eval_shape(lambda x: target.start(x, length), inputs).keys[0]
  return f"{keys.dtype}[{','.join(map(str, keys.shape))}]".replace(
      "float32", "f32")


def test_speculative_loop_copies_no_cache():
  target, drafter, inputs = _setup()
  args = (target, drafter, inputs, jax.random.PRNGKey(0), np.int32(1))
  kwargs = dict(gamma=GAMMA, max_decode_length=MAX_LEN,
                method=sampling.Greedy(), acceptance=decoding.ExactAcceptance(),
                statistics=True)
  shape = _cache_shape(target, inputs, MAX_LEN + GAMMA + 1)
  default = jax.jit(
      loops.speculative_loop,
      static_argnames=("gamma", "max_decode_length", "statistics"))
  assert while_body_copies(
      default.lower(*args, **kwargs).compile().as_text(), shape) > 0
  cpu = loops.SPECULATIVE_PROGRAM.jitted()
  assert while_body_copies(
      cpu.lower(*args, **kwargs).compile().as_text(), shape) == 0
