"""`tools.benchmarks.compare_with_t5x` (and `t5x_pair`, its real-pair mode):
its flags and its pieces.

Flag checks need neither T5X nor a model: a bad --pair or --gammas must fail
with the flag, the value and what is allowed, before T5X is imported or
anything is loaded. The real-pair mode end to end (with a T5X checkout):
tests/e2e/test_pairs_e2e.py.
"""
import os

import numpy as np
import pytest

from specdec_jax.core import decoding
from tools.benchmarks import compare_with_t5x
from tools.benchmarks import t5x_pair
from tools.benchmarks import t5x_reference


def _error(argv, capsys) -> str:
  with pytest.raises(SystemExit) as e:
    compare_with_t5x.parse_args(argv)
  assert e.value.code == 2
  return capsys.readouterr().err


@pytest.mark.parametrize("pair", ["pretrianed", "no_such.gin", ""])
def test_bad_pair_names_flag_value_and_choices(capsys, pair):
  err = _error([f"--pair={pair}"], capsys)
  assert f"--pair={pair!r}" in err
  assert "pretrained" in err and "TARGET_CHECKPOINT_PATH" in err


@pytest.mark.parametrize("gammas", ["3,x", "0", "3,3", "", "2,-1"])
def test_bad_gammas_names_flag_and_value(capsys, gammas):
  err = _error(["--pair=pretrained", f"--gammas={gammas}"], capsys)
  assert f"--gammas={gammas!r}" in err and "integers >= 1" in err


def test_pair_only_and_random_only_flags(capsys):
  err = _error(["--gammas=3"], capsys)
  assert "--gammas=3: only used with --pair" in err
  err = _error(["--pair=pretrained", "--model=tiny", "--seed=1"], capsys)
  assert "--model=tiny, --seed=1: only used with random weights" in err
  err = _error(["--pair=pretrained", "--num_examples=0"], capsys)
  assert "--num_examples=0: must be >= 1" in err


def test_flags_parse():
  args = compare_with_t5x.parse_args(["--pair=pretrained", "--gammas=3,6"])
  assert args.gammas == (3, 6) and args.max_decode_length is None
  assert t5x_pair.resolve_pair("pretrained").endswith(
      os.path.join("gin", "pretrained_multi30k.gin"))
  # The random-weights mode keeps its defaults.
  args = compare_with_t5x.parse_args([])
  assert (args.model, args.dtype, args.max_decode_length, args.input_length,
          args.batch_size, args.eos_id, args.seed) == ("small", "float32", 64,
                                                       64, 1, -1, 0)


def test_bad_pair_fails_before_t5x(capsys):
  # No --t5x_path either: the --pair error comes first, before any import.
  with pytest.raises(SystemExit):
    compare_with_t5x.main(["--pair=nope"])
  assert "--pair='nope'" in capsys.readouterr().err


def test_pair_without_checkpoints_fails_before_loading(clean_gin, no_load):
  args = compare_with_t5x.parse_args(["--pair=local_tiny.gin"])
  with pytest.raises(
      SystemExit, match="binds no TARGET_CHECKPOINT_PATH or "
      "DRAFT_CHECKPOINT_PATH"):
    t5x_pair.pair_experiment(t5x_pair.resolve_pair(args.pair), args)


def test_input_widths_round_up_to_the_bucket():
  inputs = np.zeros((4, 40), np.int32)
  for row, n in enumerate([1, 16, 17, 40]):
    inputs[row, :n] = 5
  np.testing.assert_array_equal(t5x_pair.input_widths(inputs, 16),
                                [16, 16, 32, 40])


def test_t5x_path_errors_name_the_flag_and_what_is_missing(tmp_path):
  with pytest.raises(t5x_reference.T5XPathError, match="--t5x_path is "
                     "required"):
    t5x_reference.check_t5x_path(None)
  inner = tmp_path / "t5x"
  inner.mkdir()
  (inner / "decoding.py").write_text("")
  with pytest.raises(t5x_reference.T5XPathError,
                     match="inner t5x/ package; pass its parent"):
    t5x_reference.check_t5x_path(str(inner))


def test_token_agreement_and_identity():
  ours = np.array([[5, 6, 1, 0], [5, 7, 8, 1]])
  theirs = np.array([[5, 6, 1, 0], [5, 9, 8, 1]])
  assert t5x_reference.token_agreement(ours, theirs) == {
      "tokens_equal": False,
      "tokens_equal_count": 7,
      "tokens_total": 8,
      "first_difference_per_row": [None, 1]
  }
  outputs = {"t5x": [theirs[:1], theirs[1:]], "baseline": [ours[:1], ours[1:]]}
  checked, error = t5x_pair.identity(outputs)
  assert checked == {
      "tokens_generated": 7,
      "identical_to_baseline": {
          "t5x": 1
      },
      "all_identical": False,
      "mismatches_sentence_and_first_position": {
          "t5x": [(1, 1)]
      }
  }
  assert error.startswith("error: greedy tokens differ") and "t5x: 1 " in (
      error)
  checked, error = t5x_pair.identity({"t5x": [ours], "baseline": [ours]})
  assert checked["all_identical"] and error is None


def _speculative_output(histogram, beta_count, lengths, calls):
  batch, width = len(lengths), len(histogram[0])
  zeros = np.zeros((batch, 4), np.int32)
  stats = decoding.SpeculativeStatistics(
      target_calls=np.array(calls, np.int32),
      accepted_histogram=np.array(histogram, np.int32),
      beta_sum=np.zeros(batch, np.float32),
      beta_count=np.array(beta_count, np.int32), trace_draft_tokens=np.zeros(
          (batch, 4, width - 1),
          np.int32), trace_num_accepted=zeros, trace_next_token=zeros)
  return decoding.SpeculativeOutput(tokens=zeros,
                                    lengths=np.array(lengths,
                                                     np.int32), stats=stats)


def test_speculative_statistics_pool_the_sentences():
  # α = kept guesses / acceptance trials over all sentences (not the mean
  # of per-sentence α's): (2 + 1·1 + 2·2) / (3 + 4) = 1.
  outs = [
      _speculative_output([[0, 0, 1]], [3], [4], [2]),
      _speculative_output([[1, 1, 2]], [4], [9], [4])
  ]
  stats = t5x_pair.speculative_statistics(outs)
  assert stats == {
      "target_calls": 6,
      "tokens_generated": 13,
      "tokens_per_target_call": pytest.approx(13 / 6),
      "alpha": pytest.approx(7 / 7),
      "accepted_histogram": [1, 1, 3]
  }


def test_time_rounds_rotates_and_takes_per_round_ratios():
  calls = []
  seconds = iter([1.0] * 3 + [2.0, 1.0, 1.0, 4.0, 4.0, 2.0])
  programs = {
      name: (lambda x, key, name=name: calls.append((name, x)))
      for name in ("t5x", "baseline", "speculative_gamma3")
  }
  pair = t5x_pair.Pair(exp=None, gin_file="", gammas=(3,), num_examples=2,
                       inputs=None, max_decode_length=8, t5x_module=None,
                       t5x_params=None, param_leaves=0, programs=programs,
                       rows=["x0", "x1"], keys=[0, 1], widths=None)
  timed = t5x_pair.time_rounds(pair, 2, log=lambda _: None, clock=lambda fn, r:
                               (fn(r), next(seconds)))
  # Round 0 in order, round 1 from the second program; each decodes both
  # sentences.
  assert [n for n, _ in calls[6:]] == [
      "t5x", "t5x", "baseline", "baseline", "speculative_gamma3",
      "speculative_gamma3", "baseline", "baseline", "speculative_gamma3",
      "speculative_gamma3", "t5x", "t5x"
  ]
  per_round = {k: v.tolist() for k, v in timed["per_round"].items()}
  # Round 0: t5x 2, baseline 1, spec 1; round 1: baseline 4, spec 4, t5x 2.
  assert per_round == {
      "t5x_over_baseline": [2.0, 0.5],
      "t5x_over_speculative_gamma3": [2.0, 0.5],
      "baseline_over_speculative_gamma3": [1.0, 1.0]
  }
