"""tools.benchmarks.tree's bounded memory: inputs padded to a bucket
(`common.pad_to_bucket`) decode as the unpadded ones do (so one program
serves every length), and `free_programs` empties the jit caches and
records the resident set size. No timing asserted (the machine may be
shared). And the benchmarks' shared flags: a bad one is one line, exit 2."""
import jax
import jax.numpy as jnp
import numpy as np

import pytest

from specdec_jax.core import decoding
from tools.benchmarks import common
from tools.benchmarks import loop_overhead
from tools.benchmarks import timing_noise
from tools.benchmarks import tree

from conftest import random_model, tiny_config


@pytest.mark.parametrize("module, argv, words", [
    (tree, ["--widths=0,2"], "--widths must be"),
    (tree, ["--temperatures=-1"], "--temperatures must be"),
    (tree, ["--steps=0"], "--steps must be >= 1"),
    (tree, ["--target=/no/such/dir"], "--target: /no/such/dir does not"),
    (loop_overhead, ["--lengths=40,8"], "--lengths must be two integers"),
    (loop_overhead, ["--sentences=0"], "--sentences must be >= 1"),
    (timing_noise, ["--fill=99"], "--fill must be in [0, 64]"),
    (timing_noise, ["--target=gigantic"], "--target: invalid value"),
])
def test_a_bad_flag_is_one_line_and_exit_2(module, argv, words, capsys):
  with pytest.raises(SystemExit) as e:
    module.parse_args(argv)
  assert e.value.code == 2
  assert words in capsys.readouterr().err.splitlines()[-1]


def test_the_benchmarks_defaults_parse():
  """One flag style (argparse) for every benchmark: the defaults are
  valid, and the booleans have a --no- form."""
  assert tree.parse_args([]).widths == [1, 2, 3, 4]
  assert not tree.parse_args(["--no-without_replacement"]).without_replacement
  assert loop_overhead.parse_args([]).lengths == [8, 40]
  assert not timing_noise.parse_args(["--no-background_load"]).background_load


def test_inputs_are_padded_to_the_bucket():
  for length, width in ((3, 16), (16, 16), (17, 32)):
    ids = [2 + i % 13 for i in range(length - 1)] + [1]
    padded = common.pad_to_bucket(ids, tree.INPUT_BUCKET)
    assert padded.shape == (1, width) and padded.dtype == np.int32
    assert padded[0, :len(ids)].tolist() == ids
    assert not padded[0, len(ids):].any()


def test_padding_decodes_as_the_unpadded_input():
  target = random_model(tiny_config(), seed=0)
  draft = random_model(tiny_config(num_decoder_layers=1), seed=1)
  rng = jax.random.PRNGKey(0)
  ids = [5, 7, 12, 9, 1]
  for x in (np.asarray([ids],
                       np.int32), common.pad_to_bucket(ids, tree.INPUT_BUCKET)):
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
