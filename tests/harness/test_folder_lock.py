"""Issue 59: every command that writes a folder takes the same lock and
follows the same overwrite rule (`files.output_folder.claim`).

`run` and `sweep` (OUTPUT_DIR) keep their messages
(tests/harness/test_failures.py, test_output_safety.py); here the other
commands: the device check's --out (defect 9), `train`'s MODEL_DIR (defect
11, and the vocabulary check without vocabulary.json) and a bad
SPECDEC_LOCK_STALE_S (defect 10). certify's OUTPUT_DIR: test_certify_checks.py.
"""
import json
import os
import socket
import time

from absl import flags
import gin
import pytest

from specdec_jax import train as train_lib
from specdec_jax.checkpoints import digests
from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.core.models import T5Config
from tools.device_check import cli as device_check
from specdec_jax.experiment import runner
from specdec_jax.files import output_folder
from specdec_jax.training.config import TrainConfig
from specdec_jax.training import checkpointing
from specdec_jax.training import trainer

pytestmark = pytest.mark.usefixtures("clean_gin")


def _another_hosts_lock(folder):
  """A fresh lock of a run on another host: only its age can make it
  stale, so SPECDEC_LOCK_STALE_S is read."""
  folder.mkdir(exist_ok=True)
  (folder / output_folder.LOCK_FILE).write_text(
      json.dumps({
          "program": "run",
          "pid": 1,
          "host": socket.gethostname() + "-elsewhere",
          "started": time.time() - 60,
          "started_utc": "x",
          "token": "t"
      }))


# ---------------------------------------------------------------------------
# The generic claim: the folder, the lock, the rule.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["OUTPUT_DIR", "--out", "MODEL_DIR"])
@pytest.mark.parametrize("inside", [False, True])
def test_a_file_is_refused_in_one_line_naming_the_setting(
    name, inside, tmp_path):
  a_file = tmp_path / "f"
  a_file.write_text("mine")
  folder = str(a_file / "sub" if inside else a_file)
  with pytest.raises(output_folder.FolderError) as e:
    output_folder.claim(folder, {}, name=name)
  message = str(e.value)
  assert message.startswith(f"{name}={folder!r}: not a writable directory")
  assert "\n" not in message and "Allowed: " in message
  assert a_file.read_text() == "mine"


def test_two_claims_of_one_folder_the_second_names_the_first(tmp_path):
  """Two threads or two processes alike: the second `acquire` is refused."""
  folder = str(tmp_path / "out")
  with output_folder.claim(folder, {"a": 1}, name="--out", program="first"):
    with pytest.raises(output_folder.LockedError,
                       match=r"--out=.* is in use by first \(pid "):
      output_folder.claim(folder, {"a": 1}, name="--out", program="second")
  assert not os.path.exists(folder)  # made by the claim, left empty


def test_a_result_of_other_settings_needs_the_overwrite_setting(tmp_path):
  folder = tmp_path / "out"
  folder.mkdir()
  (folder / "r.json").write_text(json.dumps({"settings": {"gamma": 4}}))

  def claim(settings, overwrite=False):
    return output_folder.claim(str(folder), settings, ["r.json"], name="--out",
                               overwrite=overwrite,
                               overwrite_flag="--overwrite")

  claim({"gamma": 4}).release()  # the same settings: again, freely
  with pytest.raises(output_folder.FolderError) as e:
    claim({"gamma": 2})
  assert str(e.value) == (
      f"--out={str(folder)!r} holds r.json, which is from a run with other "
      "settings: gamma: 4 -> 2. Refusing to overwrite it: choose another "
      "--out, or pass --overwrite to replace it.")
  assert not (folder / output_folder.LOCK_FILE).exists()  # released
  claim({"gamma": 2}, overwrite=True).release()
  assert output_folder.how_to_pass("OVERWRITE=True") == "--gin.OVERWRITE=True"


# ---------------------------------------------------------------------------
# Defect 10: SPECDEC_LOCK_STALE_S, one line at start-up.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan"])
def test_a_bad_stale_after_is_a_bad_setting_at_start(value, tmp_path,
                                                     monkeypatch):
  """It was a ValueError traceback (rc 1) when another host's lock was
  met; now a ConfigError (exit 2) naming the variable, before the folder
  is made."""
  monkeypatch.setenv(output_folder.STALE_ENV, value)
  out = tmp_path / "out"
  _another_hosts_lock(out)
  with pytest.raises(ConfigError,
                     match=f"^SPECDEC_LOCK_STALE_S={value!r}: allowed: "):
    runner.check_output_dir(str(out), {"run": {}}, overwrite=False)
  new = tmp_path / "new"
  with pytest.raises(output_folder.FolderError, match="SPECDEC_LOCK_STALE_S"):
    output_folder.claim(str(new), {})
  assert not new.exists()


# ---------------------------------------------------------------------------
# Defect 9: the device check's --out; its weak spots.
# ---------------------------------------------------------------------------
def _device_check(argv, capsys, monkeypatch):
  """(exit status, stderr lines) of the device check's parent, the phases
  replaced by a stub that only says it ran."""
  ran = []
  monkeypatch.setattr(device_check, "orchestrate",
                      lambda args: ran.append(args) or 0)
  code = device_check.main(["--small", *argv])
  return code, capsys.readouterr().err.strip().splitlines(), ran


@pytest.mark.parametrize("inside", [False, True])
def test_device_check_out_that_is_a_file(inside, tmp_path, capsys, monkeypatch):
  """It was a FileExistsError traceback, rc 1."""
  a_file = tmp_path / "f"
  a_file.write_text("mine")
  out = str(a_file / "sub" if inside else a_file)
  code, err, ran = _device_check(["--out", out], capsys, monkeypatch)
  assert (code, ran) == (2, [])
  assert err == [
      f"device_check: error: --out={out!r}: not a writable directory: " +
      ("Not a directory" if inside else "File exists") + ". Allowed: a "
      "directory this user can write, or a path where one can be created."
  ]


def test_device_check_takes_the_lock_and_the_rule(tmp_path, capsys,
                                                  monkeypatch):
  out = tmp_path / "out"
  out.mkdir()
  with output_folder.hold(str(out), "device_check"):
    code, err, ran = _device_check(["--out", str(out)], capsys, monkeypatch)
  assert (code, ran) == (2, []) and len(err) == 1
  assert "is in use by device_check (pid" in err[0]
  (out / device_check.RESULT_FILE).write_text(
      json.dumps({"settings": {
          "mode": "full",
          "phases": ["env"]
      }}))
  code, err, ran = _device_check(["--out", str(out)], capsys, monkeypatch)
  assert (code, ran) == (2, []) and len(err) == 1
  assert "holds device_check.json, which is from a run with other " in err[0]
  assert "mode: 'full' -> 'small'" in err[0] and "--overwrite" in err[0]
  code, err, ran = _device_check(["--out", str(out), "--overwrite"], capsys,
                                 monkeypatch)
  assert code == 0 and len(ran) == 1
  assert not (out / output_folder.LOCK_FILE).exists()  # released


def test_device_check_refuses_a_bad_environment_first(tmp_path, capsys,
                                                      monkeypatch):
  """SPECDEC_JAX_KERNEL_ISA=avx9000 ran XLA's dot, and said "all checks
  hold"; now the environment is checked before any phase."""
  monkeypatch.setenv("SPECDEC_JAX_KERNEL_ISA", "avx9000")
  code, err, ran = _device_check(["--out", str(tmp_path / "o")], capsys,
                                 monkeypatch)
  assert (code, ran) == (2, [])
  assert err == [
      "device_check: error: SPECDEC_JAX_KERNEL_ISA='avx9000': allowed: "
      "portable, avx2, avx512 (or unset)."
  ]
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_device_check_total_s_must_be_finite(value, capsys):
  """--total_s=inf was accepted and written as null."""
  with pytest.raises(SystemExit) as e:
    device_check.parse_args([f"--total_s={value}"])
  assert e.value.code == 2
  assert "allowed: a finite number of seconds > 0" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Defect 11: `train` holds MODEL_DIR; its overwrite rule.
# ---------------------------------------------------------------------------
_MODEL = T5Config(vocab_size=64, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8,
                  num_encoder_layers=1, num_decoder_layers=1)


def _config(tmp_path, **changes) -> TrainConfig:
  fields = dict(model_dir=str(tmp_path / "model"), num_steps=10,
                model_config=_MODEL, source_file=str(tmp_path / "x.en"),
                spm_model_path=str(tmp_path / "x.model"), seed=0)
  return TrainConfig(**{**fields, **changes})


def test_a_second_train_into_one_model_dir_is_refused_at_start(tmp_path):
  """Two trains into one MODEL_DIR: the loser failed at its first save,
  after rewriting config.gin; now it is refused before reading anything."""
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  with output_folder.hold(str(model_dir), "train"):
    with pytest.raises(output_folder.LockedError) as e:
      trainer.train_and_evaluate(_config(tmp_path))
  assert str(e.value).startswith(f"MODEL_DIR={str(model_dir)!r} is in use by "
                                 "train (pid ")
  assert os.listdir(model_dir) == []  # no config.gin, nothing


def _checkpoint(model_dir, step, settings=None, vocabulary=None):
  """A checkpoint_<step> folder as `train` leaves it (a legacy layout
  file stands for the arrays)."""
  ckpt = model_dir / f"checkpoint_{step}"
  ckpt.mkdir(parents=True)
  (ckpt / "checkpoint").write_bytes(b"x")
  if settings is not None:
    (ckpt / checkpointing.SETTINGS_FILE).write_text(
        json.dumps({"settings": settings}))
  digests.write_manifest(str(ckpt), vocabulary)
  return ckpt


def test_train_settings_leave_out_the_number_of_steps(tmp_path):
  record = checkpointing.settings_record(_config(tmp_path), _MODEL)
  assert record == checkpointing.settings_record(
      _config(tmp_path, num_steps=1000, save_every_steps=7), _MODEL)
  assert record != checkpointing.settings_record(_config(tmp_path, seed=7),
                                                 _MODEL)
  assert record["train"]["model_config"]["emb_dim"] == 8
  assert record["train"]["learning_rate"] == 1e-3


def test_train_refuses_checkpoints_of_other_settings(tmp_path):
  model_dir = tmp_path / "model"
  ours = checkpointing.settings_record(_config(tmp_path), _MODEL)
  theirs = checkpointing.settings_record(_config(tmp_path, seed=7), _MODEL)
  _checkpoint(model_dir, 5, theirs)
  with pytest.raises(output_folder.FolderError) as e:
    checkpointing.claim_model_dir(str(model_dir), ours, overwrite=False)
  assert str(e.value) == (
      f"MODEL_DIR={str(model_dir)!r} holds checkpoint_5, which is from a run "
      "with other settings: train.seed: 7 -> 0. Refusing to overwrite it: "
      "choose another MODEL_DIR, or pass --gin.train.overwrite=True to "
      "replace it.")
  held, replace = checkpointing.claim_model_dir(str(model_dir), theirs, False)
  held.release()
  assert not replace  # the same settings resume (more steps too)
  held, replace = checkpointing.claim_model_dir(str(model_dir), ours, True)
  held.release()
  assert replace
  checkpointing.remove_checkpoints(str(model_dir))
  assert os.listdir(model_dir) == []


def test_resuming_without_vocabulary_json_asks_the_digests(tmp_path):
  """Weak spot: with vocabulary.json deleted, train resumed with another
  vocabulary although DIGESTS.json records the original."""
  model_dir = tmp_path / "model"
  original, other = tmp_path / "a.model", tmp_path / "b.model"
  original.write_bytes(b"pieces a")
  other.write_bytes(b"pieces b")
  _checkpoint(model_dir, 5, vocabulary=str(original))
  checkpointing.check_vocabulary(str(model_dir), str(original))
  with pytest.raises(ValueError) as e:
    checkpointing.check_vocabulary(str(model_dir), str(other))
  message = str(e.value)
  assert message.startswith(f"spm_model_path: the vocabulary {str(other)!r}")
  assert "'a.model', sha256" in message
  assert "recorded in checkpoint_5/DIGESTS.json" in message


def test_train_cli_names_a_bad_stale_after(tmp_path, capsys, monkeypatch):
  """`environment.BadEnvironment` is a bad setting for train: one line,
  exit 2, before the vocabulary is trained."""
  monkeypatch.setenv(output_folder.STALE_ENV, "nan")
  spm = tmp_path / "spm" / "v.model"
  flags.FLAGS.unparse_flags()
  try:
    code = train_lib.cli([
        "train", "--gin_file=train/tiny_ci.gin",
        f"--gin.MODEL_DIR='{tmp_path / 'model'}'",
        f"--gin.SPM_MODEL_PATH='{spm}'"
    ])
  finally:
    flags.FLAGS.unparse_flags()
    gin.clear_config()
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2, err
  assert err[-1].startswith("train: error: SPECDEC_LOCK_STALE_S='nan'"), err
  assert not spm.parent.exists() and not (tmp_path / "model").exists()
