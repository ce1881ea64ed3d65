"""Issue 42: bad command lines and sweep specs are one line, before any work.

A sweep whose points share a folder, an OUTPUT_DIR key or a duplicate value
in a sweep grid; `run` without an experiment file, or with a `--gin_file`
that is a folder or a device; `train` with a MODEL_DIR that is a file. Each
is refused with one line naming the setting, the value and what is allowed
(exit 2), before anything is loaded or written.
"""
import os

from absl import flags
import gin
import pytest

from specdec_jax.config import flag_utils
from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax import train as train_lib

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = pytest.mark.usefixtures("clean_gin")


def _cli(cli, argv, capsys):
  """(exit status, stderr lines) of an entry point run in this process."""
  flags.FLAGS.unparse_flags()
  try:
    code = cli(argv)
  finally:
    flags.FLAGS.unparse_flags()
    gin.clear_config()
  return code, capsys.readouterr().err.strip().splitlines()


# ---------------------------------------------------------------------------
# (1) Sweep points that would share a folder.
# ---------------------------------------------------------------------------
def test_sweep_points_sharing_a_folder_are_refused(tmp_path, no_load):
  """Two gin files with one base name: the second point failed late and the
  next sweep counted it as done."""
  for folder, gamma in (("a", 2), ("b", 3)):
    (tmp_path / folder).mkdir()
    (tmp_path / folder /
     "exp.gin").write_text(f"include 'local_tiny.gin'\nGAMMA = {gamma}\n")
  points = [{
      "gin_file": str(tmp_path / "a" / "exp.gin")
  }, {
      "gin_file": str(tmp_path / "b" / "exp.gin")
  }]
  results = tmp_path / "r"
  with pytest.raises(sweep.SweepError) as e:
    sweep.run_sweep(points, str(results), providers=no_load)
  message = str(e.value)
  assert "a/exp.gin" in message and "b/exp.gin" in message, message
  assert repr(str(results / "exp")) in message, message
  assert not results.exists()


@pytest.mark.parametrize("first,second,folder", [
    ({
        "TASK": "a/b"
    }, {
        "TASK": "a_b"
    }, "TASK=a_b"),
    ({
        "target/T5Config.num_decoder_layers": 1
    }, {
        "draft/T5Config.num_decoder_layers": 1
    }, "num_decoder_layers=1"),
])
def test_sweep_values_mapping_to_one_folder_are_refused(first, second, folder,
                                                        tmp_path, no_load):
  results = tmp_path / "r"
  with pytest.raises(sweep.SweepError) as e:
    sweep.run_sweep([first, second], str(results), ["local_tiny.gin"],
                    providers=no_load)
  message = str(e.value)
  assert str(first) in message and str(second) in message, message
  assert repr(str(results / folder)) in message, message
  assert not results.exists()


# ---------------------------------------------------------------------------
# (2) OUTPUT_DIR in a sweep; duplicate grid values.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["OUTPUT_DIR", "run.output_dir"])
def test_sweep_output_dir_key_is_refused(key, tmp_path, no_load):
  results = tmp_path / "r"
  with pytest.raises(sweep.SweepError) as e:
    sweep.run_sweep([{
        key: str(tmp_path / "x")
    }], str(results), ["local_tiny.gin"], providers=no_load)
  message = str(e.value)
  assert f"sweep key {key!r}" in message, message
  assert "--results_dir" in message, message
  assert not results.exists()


def test_sweep_output_dir_binding_is_refused(tmp_path, no_load):
  with pytest.raises(sweep.SweepError, match=r"--gin.OUTPUT_DIR=.*results_dir"):
    sweep.run_sweep([{
        "GAMMA": 1
    }], str(tmp_path / "r"), ["local_tiny.gin"],
                    [f"OUTPUT_DIR='{tmp_path / 'x'}'"], providers=no_load)
  assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("specs,message", [
    (["TEMPERATURE=1,1.0"], "--sweep grid key 'TEMPERATURE' lists 1.0 twice"),
    (["GAMMA=1,2", "GAMMA=2"], "--sweep grid key 'GAMMA' lists 2 twice"),
    (["gin_file=a.gin,a.gin"], "--sweep grid key 'gin_file' lists 'a.gin'"),
])
def test_sweep_duplicate_grid_values_are_refused(specs, message):
  with pytest.raises(sweep.SweepError) as e:
    sweep.parse_sweep_args(specs)
  assert str(e.value).startswith(message), str(e.value)


def test_sweep_duplicate_yaml_grid_values_are_refused(tmp_path):
  spec = tmp_path / "s.yaml"
  spec.write_text("grid:\n  GAMMA: [3]\n  TEMPERATURE: [1, 1.0]\n")
  with pytest.raises(sweep.SweepError) as e:
    sweep.parse_sweep_args([str(spec)])
  assert str(e.value).startswith(
      f"{spec}: grid key 'TEMPERATURE' lists 1.0 twice"), str(e.value)


def test_sweep_points_equal_by_value_run_once(tmp_path):
  spec = tmp_path / "s.yaml"
  spec.write_text("points:\n  - {GAMMA: 3, TEMPERATURE: 1}\n"
                  "  - {GAMMA: 3, TEMPERATURE: 1.0}\n"
                  "  - {GAMMA: 3, TEMPERATURE: true}\n")
  points = sweep.parse_sweep_args([str(spec)])
  assert points == [{
      "GAMMA": 3,
      "TEMPERATURE": 1
  }, {
      "GAMMA": 3,
      "TEMPERATURE": True
  }]


# ---------------------------------------------------------------------------
# (3) `run` without an experiment file (in a subprocess too:
# tests/e2e/test_run_e2e.py); a --gin_file that is no file.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["run"], ["run", "--gin.GAMMA=3"],
                                  ["run", "--gin_bindings=run.gamma = 3"]])
def test_run_without_gin_file_is_one_line(argv, capsys):
  code, err = _cli(run_lib.cli, argv, capsys)
  assert code == 2, err
  assert len(err) == 1, err
  assert err[0].startswith("run: error: --gin_file is required"), err
  assert "pretrained_multi30k.gin" in err[0] and "local_tiny.gin" in err[0]


def test_run_with_a_model_file_only_names_output_dir(capsys):
  code, err = _cli(run_lib.cli, ["run", "--gin_file=models/t5_1_1_small.gin"],
                   capsys)
  assert code == 2, err
  assert len(err) == 1, err
  assert err[0].startswith("run: error: OUTPUT_DIR is not set"), err
  assert "local_tiny.gin" in err[0]


@pytest.mark.parametrize("name,what", [
    ("DIR", "is a directory"),
    ("models", "is a directory"),
    (os.devnull, "is not a regular file"),
])
def test_gin_file_that_is_no_file_says_what_it_is(name, what, tmp_path):
  name = str(tmp_path) if name == "DIR" else name
  with pytest.raises(flag_utils.ConfigError) as e:
    gin_utils.parse_gin([name], [])
  message = str(e.value)
  assert message.startswith(f"--gin_file={name!r} {what}"), message
  assert "not found" not in message and "allowed: " in message, message


# ---------------------------------------------------------------------------
# (4) `train` with a MODEL_DIR that is a file.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("inside", [False, True])
def test_train_model_dir_that_is_a_file(inside, tmp_path):
  a_file = tmp_path / "model"
  a_file.write_text("mine")
  model_dir = str(a_file / "sub" if inside else a_file)
  with pytest.raises(flag_utils.ConfigError) as e:
    train_lib.train(model_dir=model_dir, num_steps=1,
                    source_file=str(tmp_path / "missing.en"),
                    spm_model_path=str(tmp_path / "missing.model"))
  message = str(e.value)
  assert message.startswith(f"MODEL_DIR={model_dir!r}"), message
  assert "regular file" in message and "allowed: " in message, message
  assert a_file.read_text() == "mine"


def test_train_cli_model_dir_that_is_a_file(tmp_path, capsys):
  a_file = tmp_path / "model"
  a_file.write_text("mine")
  spm = tmp_path / "spm" / "v.model"
  code, err = _cli(train_lib.cli, [
      "train", "--gin_file=train/tiny_ci.gin", f"--gin.MODEL_DIR='{a_file}'",
      f"--gin.SPM_MODEL_PATH='{spm}'"
  ], capsys)
  assert code == 2, err
  assert err[-1].startswith(f"train: error: MODEL_DIR={str(a_file)!r}"), err
  assert not spm.parent.exists()  # refused before the vocabulary is trained
