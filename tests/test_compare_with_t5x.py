"""scripts/compare_with_t5x.py: its flags, and its real-pair mode end to end.

Flag checks need neither T5X nor a model: a bad --pair or --gammas must fail
with the flag, the value and what is allowed, before T5X is imported or
anything is loaded. The end-to-end test needs a T5X checkout (not a
dependency) at $T5X_PATH or /tmp/t5x and skips without one.
"""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "compare_with_t5x.py"
T5X_PATH = pathlib.Path(os.environ.get("T5X_PATH", "/tmp/t5x"))


@pytest.fixture(scope="module")
def script():
  spec = importlib.util.spec_from_file_location("compare_with_t5x", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _error(script, argv, capsys) -> str:
  with pytest.raises(SystemExit) as e:
    script.parse_args(argv)
  assert e.value.code == 2
  return capsys.readouterr().err


@pytest.mark.parametrize("pair", ["pretrianed", "no_such.gin", ""])
def test_bad_pair_names_flag_value_and_choices(script, capsys, pair):
  err = _error(script, [f"--pair={pair}"], capsys)
  assert f"--pair={pair!r}" in err
  assert "pretrained" in err and "TARGET_CHECKPOINT_PATH" in err


@pytest.mark.parametrize("gammas", ["3,x", "0", "3,3", "", "2,-1"])
def test_bad_gammas_names_flag_and_value(script, capsys, gammas):
  err = _error(script, ["--pair=pretrained", f"--gammas={gammas}"], capsys)
  assert f"--gammas={gammas!r}" in err and "integers >= 1" in err


def test_pair_only_and_random_only_flags(script, capsys):
  err = _error(script, ["--gammas=3"], capsys)
  assert "--gammas=3: only used with --pair" in err
  err = _error(script, ["--pair=pretrained", "--model=tiny", "--seed=1"],
               capsys)
  assert "--model=tiny, --seed=1: only used with random weights" in err
  err = _error(script, ["--pair=pretrained", "--num_examples=0"], capsys)
  assert "--num_examples=0: must be >= 1" in err


def test_flags_parse(script):
  args = script.parse_args(["--pair=pretrained", "--gammas=3,6"])
  assert args.gammas == (3, 6) and args.max_decode_length is None
  assert script.resolve_pair("pretrained").endswith(
      os.path.join("gin", "pretrained_multi30k.gin"))
  # The random-weights mode keeps its defaults.
  args = script.parse_args([])
  assert (args.model, args.dtype, args.max_decode_length, args.input_length,
          args.batch_size, args.eos_id, args.seed) == (
              "small", "float32", 64, 64, 1, -1, 0)


def test_bad_pair_fails_before_t5x(script, capsys):
  # No --t5x_path either: the --pair error comes first, before any import.
  with pytest.raises(SystemExit):
    script.main(["--pair=nope"])
  assert "--pair='nope'" in capsys.readouterr().err


def test_pair_without_checkpoints_fails_before_loading(script, clean_gin,
                                                      no_load):
  args = script.parse_args(["--pair=local_tiny.gin"])
  with pytest.raises(SystemExit, match="binds no TARGET_CHECKPOINT_PATH or "
                     "DRAFT_CHECKPOINT_PATH"):
    script.pair_experiment(script.resolve_pair(args.pair), args)


def test_input_widths_round_up_to_the_bucket(script):
  inputs = np.zeros((4, 40), np.int32)
  for row, n in enumerate([1, 16, 17, 40]):
    inputs[row, :n] = 5
  np.testing.assert_array_equal(script.input_widths(inputs, 16),
                                [16, 16, 32, 40])


def test_pretrained_pair_against_t5x(tmp_path):
  if not (T5X_PATH / "t5x" / "decoding.py").is_file():
    pytest.skip(f"no T5X checkout at {T5X_PATH} (set T5X_PATH): T5X is not "
                "a dependency of this project.")
  output = tmp_path / "t5x_pair.json"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(REPO), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run(
      [sys.executable, str(SCRIPT), f"--t5x_path={T5X_PATH}",
       "--pair=pretrained", "--num_examples=2", "--gammas=2",
       "--max_decode_length=8", "--repeats=1", f"--output={output}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  pair = json.loads(output.read_text())["pair"]
  assert pair["all_identical"] and pair["params_tree_matches_t5x_init"]
  assert pair["identical_to_baseline"] == {"t5x": 2, "speculative_gamma2": 2}
  assert set(pair["ratio_median"]) == {
      "t5x_over_baseline", "t5x_over_speculative_gamma2",
      "baseline_over_speculative_gamma2"}
