"""benchmarking.tree's (scripts/benchmark_tree.py) bounded memory: inputs
padded to a bucket decode as the unpadded ones do (so one program serves
every length), and `free_programs` empties the jit caches and records the
resident set size. No timing asserted (the machine may be shared)."""
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.benchmarking import loop_overhead
from specdec_jax.benchmarking import timing_noise
from specdec_jax.benchmarking import tree
from specdec_jax.core import decoding

from conftest import random_model, tiny_config


def test_importing_the_benchmarks_defines_no_flag():
  """Their absl flags share names (--target, --gamma): defined on the
  global FLAGS only when a command runs, so the library imports them side
  by side."""
  for module in (loop_overhead, timing_noise, tree):
    assert not flags.FLAGS.flags_by_module_dict().get(module.__name__)


def test_inputs_are_padded_to_the_bucket():
  for length, width in ((3, 16), (16, 16), (17, 32)):
    ids = [2 + i % 13 for i in range(length - 1)] + [1]
    padded = tree.pad_to_bucket(ids)
    assert padded.shape == (1, width) and padded.dtype == np.int32
    assert padded[0, :len(ids)].tolist() == ids
    assert not padded[0, len(ids):].any()


def test_padding_decodes_as_the_unpadded_input():
  target = random_model(tiny_config(), seed=0)
  draft = random_model(tiny_config(num_decoder_layers=1), seed=1)
  rng = jax.random.PRNGKey(0)
  ids = [5, 7, 12, 9, 1]
  for x in (np.asarray([ids], np.int32), tree.pad_to_bucket(ids)):
    base = decoding.temperature_sample(target, x, rng, max_decode_length=8)
    out = decoding.tree_speculative_sample(target, draft, x, rng, gamma=2,
                                           tree_width=2, max_decode_length=8)
    if x.shape[1] == len(ids):
      want = np.asarray(base.tokens)
    np.testing.assert_array_equal(np.asarray(base.tokens), want)
    np.testing.assert_array_equal(np.asarray(out.tokens), want)


def test_free_programs_empties_the_jit_caches():
  double = jax.jit(lambda x: 2 * x)
  double(jnp.ones(3))
  assert double._cache_size() == 1  # pylint: disable=protected-access
  log = {}
  tree.free_programs("part", log)
  assert double._cache_size() == 0  # pylint: disable=protected-access
  current, peak = log["part"]["rss_mib"], log["part"]["peak_rss_mib"]
  assert peak > 0 and (current is None or 0 < current <= peak + 1)
