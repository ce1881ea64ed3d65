"""Nothing lost, nothing silent (issue 26): bad input and faults.

Each numbered defect of the issue has a test here or, where it takes a
real run or process (a subprocess), in tests/e2e/test_failures_e2e.py that
reproduced it: (1) two runs on one OUTPUT_DIR (two real processes), (2) a
SentencePiece model that does not belong to the checkpoints, (3) a gs://
endpoint that never answers (loopback only), (4) a negative learning rate
and a diverging loss, (5) a full disk (an injected ENOSPC), (6) one-line
errors and Ctrl-C (a real SIGINT), (7) legacy array paths that leave the
checkpoint folder, (8) a bit flip in a shipped checkpoint, (9) absurd γ
and lengths.
"""
import errno
import json
import os
import pathlib
import signal
import time
import types

from conftest import REPO
import gin
import numpy as np
import pytest
from run_helpers import parse_gin_files
from run_helpers import refused_gcs
from run_helpers import tiny_run_plan

from specdec_jax.config import flag_utils
from specdec_jax import checkpoints
from specdec_jax import run as run_lib
from specdec_jax.checkpoints import digests
from specdec_jax.checkpoints import legacy
from specdec_jax.core.models import T5Config
from specdec_jax.experiment import arguments
from specdec_jax.experiment import loading
from specdec_jax.experiment import plan
from specdec_jax.experiment import predictions as predictions_lib
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from specdec_jax.terminal import console
from specdec_jax.training.config import TrainConfig
from specdec_jax.training import trainer

PRETRAINED = REPO / "pretrained" / "multi30k"

pytestmark = pytest.mark.usefixtures("clean_gin")

# ---------------------------------------------------------------------------
# (1) One run at a time per OUTPUT_DIR: a stale lock.
# ---------------------------------------------------------------------------


def test_lock_of_another_host_is_stale_only_when_old(tmp_path, monkeypatch):
  path = tmp_path / output_folder.LOCK_FILE
  record = {
      "program": "run",
      "pid": 1,
      "host": "elsewhere",
      "started": time.time() - 3600,
      "started_utc": "x",
      "token": "t"
  }
  path.write_text(json.dumps(record))
  with pytest.raises(output_folder.LockedError, match="pid 1 on elsewhere"):
    output_folder.acquire(str(tmp_path))
  # Older than a minute: stale.
  monkeypatch.setenv(output_folder.STALE_ENV, "60")
  output_folder.acquire(str(tmp_path)).release()
  assert not path.exists()


# ---------------------------------------------------------------------------
# (2) A vocabulary that does not belong to the models.
# ---------------------------------------------------------------------------
def _vocab(size):
  return types.SimpleNamespace(vocab_size=size,
                               sentencepiece_model_file="/x/small.model",
                               extra_ids=100)


def test_vocabulary_much_smaller_than_the_models_is_refused():
  model = T5Config(vocab_size=8000)
  with pytest.raises(run_lib.ConfigError) as e:
    loading.check_vocabulary_fits(_vocab(1100), model, model)
  for text in ("1100 ids", "vocab_size = 8000", "more than 1152",
               "allow_size_mismatch"):
    assert text in str(e.value), str(e.value)
  # T5X's padding rule: 32000 pieces + 100 extra ids in 32128 rows.
  t5 = T5Config(vocab_size=32128)
  loading.check_vocabulary_fits(_vocab(32100), t5, t5)
  with pytest.raises(run_lib.ConfigError, match="32129 ids"):
    loading.check_vocabulary_fits(_vocab(32129), t5, t5)
  # Deliberate: an explicit gin binding.
  gin.parse_config("check_vocabulary_fits.allow_size_mismatch = True")
  loading.check_vocabulary_fits(_vocab(1100), model, model)


# ---------------------------------------------------------------------------
# (3) gs:// that never answers: a deadline and the path (loopback only).
# ---------------------------------------------------------------------------


def test_remote_timeout_setting_is_checked(monkeypatch):
  monkeypatch.setenv(io_utils.TIMEOUT_ENV, "-3")
  with pytest.raises(ValueError, match="SPECDEC_GCS_TIMEOUT_S='-3'"):
    io_utils.remote_timeout_s()


# ---------------------------------------------------------------------------
# (4) Training settings checked up front; a non-finite loss stops the run.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,allowed", [
    ("learning_rate", -1e-3, "a finite number > 0"),
    ("learning_rate", float("nan"), "a finite number > 0"),
    ("batch_size", 0, "an integer >= 1"),
    ("adam_b2", 1.0, "[0, 1)"),
    ("save_every_steps", 0, "an integer >= 1"),
])
def test_bad_training_settings_refused(field, value, allowed):
  fields = dict(model_dir="/nonexistent/m", num_steps=10, source_file="x",
                spm_model_path="x.model")
  fields[field] = value
  with pytest.raises(flag_utils.ConfigError) as e:
    TrainConfig(**fields)
  assert f"train.{field}={value!r}" in str(e.value)
  assert allowed in str(e.value)


def test_non_finite_loss_stops_training_naming_the_step():
  progress = trainer._Progress(
      log_every_steps=10,
      num_steps=300,  # pylint: disable=protected-access
      schedule=lambda step: 1e-3)
  batch = {
      "decoder_target_tokens": np.ones((2, 3), np.int32),
      "encoder_input_tokens": np.ones((2, 3), np.int32)
  }
  metrics = [{
      "loss": np.float32(v),
      "ce": np.float32(v)
  } for v in (7.3, 6.8e8, np.inf)]
  for step, m in enumerate(metrics, start=41):
    progress.record(step, m, batch)
  with pytest.raises(trainer.TrainingDiverged, match="inf at step 43 "):
    progress.flush()
  assert [h["step"] for h in progress.history] == [41, 42, 43]


# ---------------------------------------------------------------------------
# (5) A full disk: the summary first, and the file and what was kept named.
# ---------------------------------------------------------------------------
def test_atomic_write_names_the_file_on_enospc(tmp_path, monkeypatch):

  def full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(io_utils.os, "fsync", full)
  with pytest.raises(OSError) as e:
    io_utils.write_json(tmp_path / "metrics.json", {"a": 1})
  assert e.value.errno == errno.ENOSPC
  assert e.value.filename == str(tmp_path / "metrics.json")
  assert list(tmp_path.iterdir()) == []  # no temp file left


# ---------------------------------------------------------------------------
# (6) One line per error, exit 2 / 1 / 130; --traceback shows it.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("error,code", [
    (checkpoints.CheckpointError("Checkpoint /x: truncated"), 2),
    (flag_utils.ConfigError("GAMMA=0: allowed: ...\n  In call to "
                            "configurable 'run' (<function f at 0x7f>)"), 2),
    (OSError(errno.ENOSPC, "No space left on device", "/x/m.json"), 1),
    (KeyboardInterrupt("kept 3 predictions rows in /x"), 130),
])
def test_run_cli_prints_one_line(error, code, capsys):

  def body():
    raise error

  rc = console.run_cli("run", body,
                       (flag_utils.ConfigError, checkpoints.CheckpointError))
  err = capsys.readouterr().err
  assert rc == code
  assert len(err.strip().splitlines()) == 1, err
  assert "In call to configurable" not in err and "0x7f" not in err
  assert err.startswith("run: interrupted (Ctrl-C): kept 3" if code ==
                        130 else "run: error: ")


# ---------------------------------------------------------------------------
# (7) Legacy array paths stay inside the checkpoint folder.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path", ["/etc/secret/", "../other/x/", "a/../../x/", "gs://b/x/"])
def test_legacy_paths_outside_the_checkpoint_refused(path):
  spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": path}}
  with pytest.raises(checkpoints.CheckpointError, match="outside the "
                     "checkpoint folder"):
    legacy.legacy_spec("/ckpt", "/ckpt", "encoder/x", spec)


def test_legacy_relative_paths_still_resolve():
  spec = {
      "driver": "zarr",
      "kvstore": {
          "driver": "file",
          "path": "target.encoder.x/"
      }
  }
  out = legacy.legacy_spec("/ckpt", "/ckpt", "encoder/x", spec)
  assert out["kvstore"]["path"].rstrip("/") == "/ckpt/target.encoder.x"


# ---------------------------------------------------------------------------
# (8) Digest manifests of the shipped checkpoints.
# ---------------------------------------------------------------------------
def test_shipped_checkpoints_carry_a_matching_manifest():
  for name in ("target", "draft_1m"):
    ckpt = checkpoints.latest_checkpoint(str(PRETRAINED / name))
    assert digests.verify_manifest(ckpt) is True


def test_bit_flip_is_caught(tmp_path, caplog):
  import shutil  # pylint: disable=g-import-not-at-top
  src = checkpoints.latest_checkpoint(str(PRETRAINED / "draft_1m"))
  ckpt = tmp_path / "checkpoint_1800"
  shutil.copytree(src, ckpt)
  data_files = sorted((ckpt / "state" / "ocdbt.process_0" / "d").iterdir())
  victim = data_files[0]
  raw = bytearray(victim.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  victim.write_bytes(bytes(raw))
  rel = victim.relative_to(ckpt).as_posix()
  with pytest.raises(checkpoints.CheckpointError,
                     match=f"{rel} does not match DIGESTS.json"):
    checkpoints.load_t5x_params(str(ckpt))
  (ckpt / digests.MANIFEST_FILE).unlink()  # no manifest: loads as before,
  with caplog.at_level("WARNING"):
    assert checkpoints.load_t5x_params(str(ckpt))
  # but says so (issue 37: deleting it turned verification off silently).
  assert f"Checkpoint {ckpt} has no DIGESTS.json: loaded unverified" in (
      caplog.text)


def test_unlisted_file_is_caught(tmp_path):
  (tmp_path / "a").write_bytes(b"1")
  digests.write_manifest(str(tmp_path))
  assert digests.verify_manifest(str(tmp_path))
  (tmp_path / "b").write_bytes(b"2")
  with pytest.raises(checkpoints.CheckpointError, match="b is not listed"):
    digests.verify_manifest(str(tmp_path))


# ---------------------------------------------------------------------------
# (9) Absurd γ and lengths, refused before loading.
# ---------------------------------------------------------------------------
def test_gamma_beyond_the_decode_length_refused(tmp_path, no_load):
  parse_gin_files(["local_tiny.gin"],
                  [f"OUTPUT_DIR = '{tmp_path / 'o'}'", "GAMMA = 1000"])
  with pytest.raises(
      run_lib.ConfigError, match=r"GAMMA=1000 is more than TASK_FEATURE_LENGTHS"
      r"\['targets'\]=32.*Allowed: 1 to 32"):
    run_lib.run(providers=no_load)
  arguments.run_arguments(overrides={"gamma": 32})  # the most allowed
  assert not (tmp_path / "o").exists()


def test_lengths_beyond_memory_refused(tmp_path, no_load):
  parse_gin_files(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{tmp_path / 'o'}'",
      "TASK_FEATURE_LENGTHS = {'inputs': 1000000, 'targets': 32}"
  ])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  text = str(e.value)
  assert "'inputs': 1000000" in text and "encoder attention logits" in text
  assert "GiB" in text and "this machine has" in text
  assert not (tmp_path / "o").exists()


def test_memory_estimate_counts_the_cache():
  config = T5Config(vocab_size=16, emb_dim=8, num_heads=2, head_dim=4,
                    mlp_dim=8, num_encoder_layers=1, num_decoder_layers=3)
  parts = plan.estimate(config, batch=2, inputs=10, targets=7)
  assert parts["decoder cache"] == 3 * 2 * 2 * 7 * 8 * 4
  assert parts["encoder attention logits"] == 2 * 2 * 10 * 10 * 4
  plan.check_fits({"t": config}, 2, 10, 7, available=10**6)
  with pytest.raises(run_lib.ConfigError, match="BATCH_SIZE=2"):
    plan.check_fits({"t": config}, 2, 10, 7, available=100)


# ---------------------------------------------------------------------------
# Smaller, same issue.
# ---------------------------------------------------------------------------
def test_sweep_mismatch_names_what_differs(tmp_path):
  from specdec_jax import sweep  # pylint: disable=g-import-not-at-top
  (tmp_path / sweep.SWEEP_FILE).write_text(
      json.dumps({
          "gin_files": ["local_tiny.gin"],
          "gin_bindings": ["GAMMA = 2"]
      }))
  with pytest.raises(sweep.SweepError) as e:
    sweep._check_results_dir(
        str(tmp_path),
        [],
        ["local_tiny.gin"],  # pylint: disable=protected-access
        ["GAMMA = 3"])
  assert "gin_bindings: ['GAMMA = 2'] in its sweep.json" in str(e.value)
  assert "gin_files" not in str(e.value)


def test_table2_names_an_unset_target_and_the_measured_call_prediction():
  from specdec_jax.reporting import tables  # pylint: disable=g-import-not-at-top
  row = {
      "task": "local",
      "target_model": "",
      "draft_model": "tiny",
      "temperature": 0.0,
      "gamma": 4,
      "alpha": 0.5,
      "speedup": 1.2,
      "theoretical_speedup": 1.8,
      "theoretical_speedup_measured_call_cost": 1.3,
      "cost_coefficient_c": 0.1,
      "run_name": "a"
  }
  md, csv_text = tables.render_table2([row])
  assert "M_p: unnamed (TARGET_NAME unset)" in md
  assert "| 1.20X | 1.80X | 1.30X |" in md
  assert "theoretical_speedup_measured_call_cost" in csv_text.splitlines()[0]


# ---------------------------------------------------------------------------
# Issue 37: the defects and weak spots a 160-case probe found.
# ---------------------------------------------------------------------------
def _foreign_spm(tmp_path) -> pathlib.Path:
  """A SentencePiece model of the shipped one's size whose ids mean other
  pieces (two pieces swapped): what a wrong SPM_MODEL_PATH looks like."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString((PRETRAINED / "multi30k.model").read_bytes())
  a, b = proto.pieces[100], proto.pieces[200]
  a.piece, b.piece = b.piece, a.piece
  path = tmp_path / "foreign.model"
  path.write_bytes(proto.SerializeToString())
  return path


def _pretrained(tmp_path, no_load, *bindings):
  """RunPlan.build of pretrained_multi30k.gin: every startup check."""
  parse_gin_files(["pretrained_multi30k.gin"],
                  [f"OUTPUT_DIR = '{tmp_path / 'o'}'", *bindings])
  return RunPlan.build(arguments.run_arguments(), no_load)


def test_foreign_vocabulary_of_the_same_size_refused(tmp_path, no_load):
  """Issue 37 (1): it decoded "mq andu captionsti", BLEU 0.00, exit 0."""
  foreign = _foreign_spm(tmp_path)
  with pytest.raises(run_lib.ConfigError) as e:
    _pretrained(tmp_path, no_load, f"SPM_MODEL_PATH = '{foreign}'")
  text = str(e.value)
  assert text.startswith(f"SPM_MODEL_PATH: the vocabulary '{foreign}'")
  assert "TARGET_CHECKPOINT_PATH's checkpoint" in text
  assert "'multi30k.model', sha256 00cd30d6916ff495" in text
  assert not (tmp_path / "o").exists()  # before OUTPUT_DIR is made
  _pretrained(tmp_path, no_load)  # the shipped one passes


def test_checkpoint_without_a_vocabulary_record_is_unverified(
    tmp_path, caplog, no_load):
  ckpt = tmp_path / "m" / "checkpoint_1"
  ckpt.mkdir(parents=True)
  (ckpt / "checkpoint").write_bytes(b"x")  # a (legacy) checkpoint here
  digests.write_manifest(str(ckpt))  # files only, no vocabulary
  with caplog.at_level("WARNING"):
    _pretrained(tmp_path, no_load, f"TARGET_CHECKPOINT_PATH = '{ckpt}'",
                f"DRAFT_CHECKPOINT_PATH = '{tmp_path / 'm'}'")
  warnings = [r.getMessage() for r in caplog.records]
  assert sum("could not be verified" in w for w in warnings) == 2, warnings
  assert any(f"TARGET_CHECKPOINT_PATH: {ckpt} records no vocabulary" in w
             for w in warnings), warnings


def test_topk_beyond_the_vocabulary_refused(tmp_path):
  with pytest.raises(
      run_lib.ConfigError,
      match=r"TOPK=300 is more than the vocabulary's 259 ids "
      r"\(ByteVocabulary.*allowed: 0 \(off\) to 259"):
    tiny_run_plan(tmp_path, top_k=300, temperature=1.0)  # RunPlan.build
  assert not (tmp_path / "out").exists()


def test_task_kind_is_checked_before_loading(tmp_path, no_load):
  """Issue 37 (6): TASK_KIND='foo' failed after 30 s of decoding."""
  parse_gin_files(["local_tiny.gin"],
                  [f"OUTPUT_DIR = '{tmp_path / 'o'}'", "TASK_KIND = 'foo'"])
  with pytest.raises(run_lib.ConfigError, match="TASK_KIND='foo': allowed"):
    run_lib.run(providers=no_load)
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("binding,message", [
    ("EXTRA_IDS = -3", "EXTRA_IDS=-3: allowed: an integer >= 0"),
    ("EXTRA_IDS = 'x'", "EXTRA_IDS='x': allowed: an integer >= 0"),
    ("SPM_MODEL_PATH = 5", "SPM_MODEL_PATH=5: allowed: the path of a "
     "SentencePiece .model file (a string), got int"),
])
def test_vocabulary_arguments_checked(binding, message):
  """Issue 37 (9, 7): seqio took EXTRA_IDS=-3 as 0; 'x' blamed the file."""
  parse_gin_files(["pretrained_multi30k.gin"], [binding])
  with pytest.raises(run_lib.ConfigError, match=re_escape(message)):
    loading.vocabulary()


def re_escape(text):
  import re  # pylint: disable=g-import-not-at-top
  return re.escape(text)


def _settings(gamma):
  return {"run": {"gamma": gamma}}


@pytest.mark.parametrize("kept",
                         ["predictions.jsonl", ".predictions.jsonl.partial"])
def test_kept_predictions_are_protected(tmp_path, kept):
  """Issue 37 (8): after a full disk or Ctrl-C the error said the rows were
  kept; a run of other settings replaced them silently."""
  from specdec_jax.experiment import runner  # pylint: disable=g-import-not-at-top
  out = str(tmp_path)
  # The run that kept them: its settings are recorded before it writes.
  runner.check_output_dir(out, _settings(4), overwrite=False)  # held...
  (tmp_path / kept).write_text('{"index": 0}\n')
  (tmp_path / output_folder.LOCK_FILE).unlink()  # ...and killed
  with pytest.raises(run_lib.ConfigError) as e:
    runner.check_output_dir(out, _settings(7), overwrite=False)
  text = str(e.value)
  assert f"holds {kept}, which was kept from a run that did not finish" in text
  assert "run.gamma: 4 -> 7" in text and "OVERWRITE=True" in text
  assert (tmp_path / kept).read_text() == '{"index": 0}\n'
  # The same settings may resume; OVERWRITE=True may replace.
  runner.check_output_dir(out, _settings(4), overwrite=False).release()
  runner.check_output_dir(out, _settings(7), overwrite=True).release()
  # Without a record (an older version, another program): refused too.
  (tmp_path / runner.SETTINGS_FILE).unlink()
  with pytest.raises(run_lib.ConfigError, match="of unknown ones"):
    runner.check_output_dir(out, _settings(7), overwrite=False)


def test_partial_file_name_is_the_writers(tmp_path):
  from specdec_jax.experiment import runner  # pylint: disable=g-import-not-at-top
  writer = predictions_lib.PredictionsWriter(str(tmp_path))
  writer.close()
  assert os.path.basename(writer.partial) == predictions_lib.PARTIAL_FILE
  assert predictions_lib.PARTIAL_FILE in runner.PREDICTIONS_FILES  # protected


def test_settings_record_is_dropped_when_nothing_was_kept(tmp_path):
  from specdec_jax.experiment import runner  # pylint: disable=g-import-not-at-top
  out = tmp_path / "new"
  lock = runner.check_output_dir(str(out), _settings(4), overwrite=False)
  assert (out / runner.SETTINGS_FILE).is_file()
  lock.release()
  assert not out.exists()  # nothing kept: the folder it made is removed


def test_full_disk_at_the_start_removes_the_folder(tmp_path, monkeypatch):
  """Weak spot: docs/usage/failures.md said so; the empty folder stayed."""
  from specdec_jax.experiment import runner  # pylint: disable=g-import-not-at-top

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(io_utils.tempfile, "mkstemp", full)
  out = tmp_path / "new"
  with pytest.raises(run_lib.ConfigError, match="No space left on device"):
    runner.check_output_dir(str(out), _settings(4), overwrite=False)
  assert not out.exists()


def test_sigterm_is_handled_as_ctrl_c(capsys):
  """Weak spot: SIGTERM (batch schedulers) exited 143 with no message and
  left the lock and `.partial` behind; now the run unwinds as on Ctrl-C."""
  unwound = []

  def body():
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(30)
    finally:
      unwound.append(True)  # the run's `finally`s (the lock) run

  before = signal.getsignal(signal.SIGTERM)
  code = console.run_cli("run", body, (flag_utils.ConfigError,))
  assert code == 143 and unwound == [True]
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
      "run: interrupted (SIGTERM): files already written in the output "
      "folder are kept."
  ]
  assert signal.getsignal(signal.SIGTERM) is before  # restored


def test_lock_is_never_seen_empty(tmp_path, monkeypatch):
  """Weak spot: the lock was created empty (O_EXCL) and written after; a
  second run reading it in between took an empty lock over as stale."""
  real_write, raced = os.write, []

  def racing_write(fd, data):
    if not raced:  # another run starts while the first writes its record
      raced.append(True)
      try:
        raced.append(output_folder.acquire(str(tmp_path), "second"))
      except output_folder.LockedError as e:
        raced.append(e)
    return real_write(fd, data)

  monkeypatch.setattr(io_utils.os, "write", racing_write)
  try:
    first = output_folder.acquire(str(tmp_path), "first")
  except output_folder.LockedError as e:
    first = e
  holders = [x for x in (first, raced[1]) if isinstance(x, output_folder.Lock)]
  assert len(holders) == 1, (first, raced)  # exactly one run holds it
  record = json.loads((tmp_path / output_folder.LOCK_FILE).read_text())
  assert record["program"] == ("first" if holders[0] is first else "second")
  assert [p for p in os.listdir(tmp_path) if p != output_folder.LOCK_FILE] == []


def test_lock_without_hard_links_still_works(tmp_path, monkeypatch):
  """A file system without `link` (some network or FUSE mounts) falls
  back to O_EXCL: the lock is still taken once, whole."""

  def no_link(src, dst):
    raise PermissionError(1, "Operation not permitted")

  monkeypatch.setattr(io_utils.os, "link", no_link)
  lock = output_folder.acquire(str(tmp_path), "first")
  with pytest.raises(output_folder.LockedError, match="is in use by first"):
    output_folder.acquire(str(tmp_path), "second")
  assert json.loads((tmp_path / output_folder.LOCK_FILE).read_text())["program"] \
      == "first"
  lock.release()
  assert os.listdir(tmp_path) == []


def test_gcs_refused_port_fails_in_seconds(monkeypatch):
  """Weak spot: a refused connection waited out the 60 s deadline."""
  port = refused_gcs(monkeypatch)
  for name in io_utils._PROXY_ENVS:  # pylint: disable=protected-access
    monkeypatch.delenv(name, raising=False)
  start = time.monotonic()
  with pytest.raises(ValueError) as e:
    io_utils.probe_writable_dir("gs://refused-bucket/out")
  assert time.monotonic() - start < 10
  text = str(e.value)
  assert f"127.0.0.1:{port} refused the connection" in text
  assert "gs://refused-bucket" in text and ".." not in text


def test_bad_gcs_timeout_setting_is_named(monkeypatch):
  monkeypatch.setenv(io_utils.TIMEOUT_ENV, "abc")
  with pytest.raises(ValueError) as e:
    io_utils.probe_writable_dir("gs://any-bucket/out")
  assert str(e.value).startswith("SPECDEC_GCS_TIMEOUT_S='abc': allowed")


def test_checkpoint_path_that_is_a_file_is_named(tmp_path):
  (tmp_path / "checkpoint_5").write_text("not a folder")
  with pytest.raises(checkpoints.CheckpointError,
                     match="checkpoint_5 is a file, not a directory"):
    checkpoints.load_t5x_params(str(tmp_path / "checkpoint_5"))


def test_failed_write_is_stdout_last_line(capsys):
  """Weak spot: after a full disk, stdout's last line still listed
  metrics.json and predictions.jsonl as the results."""

  def body():
    print("results: /o/metrics.json, /o/predictions.jsonl")
    raise predictions_lib.OutputWriteError(
        "cannot write /o/metrics.json: No space left on device")

  assert console.run_cli("run", body, (flag_utils.ConfigError,)) == 1
  out = capsys.readouterr().out.strip().splitlines()
  assert out[-1] == ("run: error: cannot write /o/metrics.json: No space "
                     "left on device")

  def bad():
    raise flag_utils.ConfigError("GAMMA=0: allowed: ...")

  assert console.run_cli("run", bad, (flag_utils.ConfigError,)) == 2
  assert capsys.readouterr().out == ""  # nothing was printed before it
