"""Sampling values are traced: one compiled loop serves every temperature,
top-k and top-p, with the numbers the constants would give.

Whether a method is greedy and whether top-k/top-p filter at all stay
static (they change the program); a user's method without `tree_flatten`
stays all static, as a static argument was.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops
from specdec_jax.core.protocols import SamplingMethod

from conftest import perturbed
from conftest import random_model
from conftest import tiny_config


def test_values_are_leaves_and_the_filters_are_static():
  method = sampling.Sampling(0.7, top_k=5, top_p=0.9)
  leaves, treedef = jax.tree_util.tree_flatten(method)
  assert leaves == [0.7, 5, 0.9]
  assert jax.tree_util.tree_unflatten(treedef, leaves) == method
  same_program = sampling.Sampling(1.3, top_k=2, top_p=0.5)
  assert jax.tree_util.tree_structure(same_program) == treedef
  # Switching a filter on or off, or going greedy, is another program.
  for other in (sampling.Sampling(0.7, top_p=0.9), sampling.Sampling(0.7, 5),
                sampling.Greedy()):
    assert jax.tree_util.tree_structure(other) != treedef
  assert not jax.tree_util.tree_leaves(sampling.Greedy())


@pytest.mark.parametrize("temperature,top_k,top_p",
                         [(0.7, 3, 1.0), (1.3, 0, 0.8), (0.5, 2, 0.9),
                          (1.0, 9, 1.0)])
def test_traced_values_give_the_constants_numbers(temperature, top_k, top_p):
  logits = jax.random.normal(jax.random.PRNGKey(3), (4, 9)) * 3.0
  method = sampling.Sampling(temperature, top_k, top_p)
  traced = jax.jit(lambda m, x: m.standardize(x))(method, logits)
  # Constants folded into the program (the former static method).
  constant = jax.jit(
      lambda x: sampling.standardize(x, temperature, top_k, top_p))(logits)
  np.testing.assert_allclose(traced, constant, rtol=2e-7, atol=1e-8)
  # The same support: a filter never keeps or drops another token.
  np.testing.assert_array_equal(
      np.asarray(traced) > 0,
      np.asarray(constant) > 0)


def _count(program) -> int:
  return program.jitted()._cache_size()  # pylint: disable=protected-access


def test_a_sweep_over_sampling_values_compiles_each_loop_once():
  config = tiny_config(vocab_size=32)
  target = random_model(config, seed=31)
  draft = perturbed(target, scale=0.3, seed=32)
  inputs = np.random.default_rng(0).integers(2, 32, (2, 5)).astype(np.int32)
  settings = [(0.6, 4, 0.95), (1.4, 7, 0.7), (1.0, 4, 0.95)]
  before = {
      p: _count(p) for p in (loops.BASELINE_PROGRAM, loops.SPECULATIVE_PROGRAM)
  }
  outputs = []
  for temperature, top_k, top_p in settings:
    method = sampling.Sampling(temperature, top_k, top_p)
    rng = jax.random.PRNGKey(0)
    base = decoding.temperature_sample(target, inputs, rng, max_decode_length=8,
                                       method=method, eos_id=-1)
    spec = decoding.speculative_sample(target, draft, inputs, rng, gamma=3,
                                       max_decode_length=8, method=method,
                                       eos_id=-1)
    outputs.append((np.asarray(base.tokens), np.asarray(spec.tokens)))
  for program, count in before.items():
    assert _count(program) <= count + 1, program.loop.__name__
  # The values reach the program: other settings, other samples.
  assert not np.array_equal(outputs[0][0], outputs[1][0])
  assert not np.array_equal(outputs[0][1], outputs[1][1])


@dataclasses.dataclass(frozen=True)
class _Scaled(SamplingMethod):
  """A user's method without `tree_flatten`: all static."""
  scale: float

  @property
  def is_greedy(self) -> bool:
    return False

  def standardize(self, logits):
    return jax.nn.softmax(logits.astype(jnp.float32) * self.scale, axis=-1)

  def draw(self, rng, logits):
    probs = self.standardize(logits)
    return sampling.sample_from(rng, probs), probs


def test_a_method_without_tree_flatten_is_static():
  assert not jax.tree_util.tree_leaves(_Scaled(2.0))
  traces = []

  @jax.jit
  def probs(method, logits):
    traces.append(method.scale)  # A Python float: the method is static.
    return method.standardize(logits)

  logits = jnp.array([0.0, 1.0, 2.0])
  probs(_Scaled(2.0), logits)
  probs(_Scaled(2.0), logits)
  np.testing.assert_allclose(probs(_Scaled(0.5), logits),
                             jax.nn.softmax(logits * 0.5), rtol=1e-6)
  assert traces == [2.0, 0.5]


def test_a_variant_of_a_traced_method_is_built_with_replace():
  """A user's rule inside the jitted loop builds `method.replace(...)`; the
  constructor refuses traced values with a line saying so."""
  logits = jax.random.normal(jax.random.PRNGKey(5), (3, 9)) * 3.0
  method = sampling.Sampling(0.7, top_k=3, top_p=0.9)

  @jax.jit
  def without_top_k(m, x):
    return m.replace(top_k=0).standardize(x)

  # The reference with its constants folded, jitted as in the test above
  # (one program instead of one per eager operation).
  constant = jax.jit(lambda x: sampling.standardize(x, 0.7, 0, 0.9))(logits)
  np.testing.assert_allclose(without_top_k(method, logits), constant, rtol=2e-7,
                             atol=1e-8)
  assert method.replace(top_p=1.0) == sampling.Sampling(0.7, 3, 1.0)
  assert jax.tree_util.tree_structure(method.replace(
      top_p=1.0)) == jax.tree_util.tree_structure(sampling.Sampling(0.7, 3))
  with pytest.raises(ValueError, match="top_k"):
    method.replace(top_k=-1)
  with pytest.raises(ValueError, match="unknown fields"):
    method.replace(temp=1.0)
  with pytest.raises(ValueError, match="method.replace"):
    jax.jit(lambda m: sampling.Sampling(m.temperature, 0, 1.0).top_k)(method)
