"""Each decode loop's test launches nothing of its own (`carried_while`).

The loops carry their test beside their state, computed in the body; the
test computation is then a read of the carried flag. On a GPU a test that
computes is a kernel every iteration (issue 56). The tests compile each
loop on the CPU and count its outermost loop's test's ops the way the
device check counts kernels (`iteration_hlo.iteration_kernels`), and check
that the count sees a computing test (`lax.while_loop`'s) as an op.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tools.benchmarks import iteration_hlo as hlo_ops
from specdec_jax.core import carried_while
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.decoding import loops
from specdec_jax.core.decoding.beam_search import beam_search_loop
from specdec_jax.core.decoding.speculative_beam import speculative_beam_loop
from specdec_jax.core.decoding.tree_loop import tree_loop
from specdec_jax.core.drafters.tree import as_tree_drafter

from conftest import perturbed
from conftest import random_model
from conftest import tiny_config

MAX_LEN = 8


@functools.lru_cache(maxsize=None)
def _setup():
  target = random_model(tiny_config(vocab_size=32), seed=3)
  draft = perturbed(target, scale=0.2, seed=4)
  inputs = np.random.default_rng(0).integers(2, 32, (2, 5)).astype(np.int32)
  return target, draft, inputs


def _test_ops(fn, *args, **static) -> int:
  """The ops the test of `fn`'s outermost while loop runs an iteration,
  compiled for the CPU."""
  jitted = jax.jit(fn, static_argnames=tuple(static))
  text = jitted.lower(*args, **static).compile().as_text()
  return hlo_ops.iteration_kernels(text)["condition"]


def test_baseline_loop_test_runs_nothing():
  target, _, inputs = _setup()
  assert _test_ops(
      functools.partial(loops.temperature_loop,
                        method=sampling.Greedy()), target, inputs,
      jax.random.PRNGKey(0), np.int32(1), max_decode_length=MAX_LEN) == 0


def test_speculative_loop_test_runs_nothing():
  target, draft, inputs = _setup()
  assert _test_ops(
      functools.partial(loops.speculative_loop, method=sampling.Greedy()),
      target, decoding.ModelDrafter(draft), inputs, jax.random.PRNGKey(0),
      np.int32(1), gamma=3, max_decode_length=MAX_LEN, statistics=True) == 0


def test_tree_loop_test_runs_nothing():
  target, draft, inputs = _setup()
  assert _test_ops(functools.partial(tree_loop,
                                     method=sampling.Greedy()), target,
                   as_tree_drafter(draft), inputs, jax.random.PRNGKey(0),
                   np.int32(1), gamma=2, width=2,
                   max_decode_length=MAX_LEN) == 0


def test_beam_loops_tests_run_nothing():
  target, draft, inputs = _setup()
  alpha, eos = np.float32(0.6), np.int32(1)
  assert _test_ops(beam_search_loop, target, inputs, alpha, eos, beam_size=2,
                   max_decode_len=MAX_LEN) == 0
  assert _test_ops(speculative_beam_loop, target, draft, inputs, alpha, eos,
                   beam_size=2, width=2, gamma=2, num_rows=4,
                   max_decode_len=MAX_LEN) == 0


@structs.dataclass
class _Rows:
  done: jax.Array  # [B] bool


def _spread(s: _Rows) -> _Rows:
  """Sets one more row of done each iteration."""
  return s.replace(done=s.done | jnp.roll(s.done, 1).at[0].set(True))


def test_a_computing_test_counts_as_an_op():
  """`lax.while_loop`'s test is an op each iteration, the carried one's
  none, and both end at the same state: the tests above can fail."""

  def computed(done):
    return lax.while_loop(loops._running, _spread, _Rows(done)).done

  def carried(done):
    return carried_while.while_loop(loops._running, _spread, _Rows(done)).done

  done = np.zeros((3,), bool)
  assert _test_ops(computed, done) >= 1
  assert _test_ops(carried, done) == 0
  np.testing.assert_array_equal(jax.jit(carried)(done), jax.jit(computed)(done))
  np.testing.assert_array_equal(jax.jit(carried)(done), [True] * 3)
