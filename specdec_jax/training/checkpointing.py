"""Training checkpoints, MODEL_DIR's records, and the distillation teacher.

``model_dir/checkpoint_<step>/``: a T5X Orbax checkpoint of the parameters
(read by `run`) with ``train_state.msgpack``, ``model_config.json`` and
``train_settings.json``, renamed into place complete. ``vocabulary.json``
records the vocabulary's digest. MODEL_DIR is claimed as every command
claims its folder (lock, overwrite rule: docs/usage/failures.md). The
teacher's config must agree with its ``model_config.json``.
"""
import contextlib
import dataclasses
import logging as std_logging
import json
import os
import shutil
import time
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

from absl import logging
from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from specdec_jax.checkpoints import digests
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import param_shapes

TRAIN_STATE_FILE = "train_state.msgpack"
MODEL_CONFIG_FILE = "model_config.json"
STAGING_PREFIX = ".staging-"
VOCABULARY_FILE = "vocabulary.json"
SETTINGS_FILE = "train_settings.json"
METRICS_FILE = "train_metrics.json"
# `TrainConfig` fields that do not change what the checkpoints hold.
NOT_SETTINGS = ("model_dir", "num_steps", "save_every_steps",
                "keep_checkpoints", "log_every_steps", "eval_source_file",
                "eval_reference_file", "eval_num_examples", "eval_batch_size",
                "eval_max_decode_length", "gin_search_paths", "spm_model_path",
                "train_vocab", "spm_vocab_size", "spm_options", "overwrite")


@contextlib.contextmanager
def quiet_absl():
  """Hides INFO logs (Orbax logs every file it writes) inside the block,
  then restores the absl logger's own level (NOTSET included: restoring
  the effective one would pin it and hide later progress lines)."""
  logger = logging.get_absl_logger()
  level = logger.level
  if logger.getEffectiveLevel() <= std_logging.INFO:
    logger.setLevel(std_logging.WARNING)
  try:
    yield
  finally:
    logger.setLevel(level)


def write_model_config(directory: str, config: T5Config) -> None:
  """``directory/model_config.json``, atomically."""
  io_utils.atomic_write(
      os.path.join(directory, MODEL_CONFIG_FILE),
      json.dumps(gin_reader.t5_config_fields(config), indent=2))


def read_model_config(path: str) -> T5Config:
  """A ``model_config.json`` file's T5Config (global gin bindings never apply)."""
  return gin_reader.t5_config_from_fields(
      json.loads(io_utils.read_text(path, max_bytes=1 << 20)), "model config")


def vocabulary_record(spm_model_path: str) -> Dict[str, Any]:
  """{'file', 'path', 'bytes', 'sha256'} of a SentencePiece model."""
  record = digests.file_record(spm_model_path)
  record["path"] = (spm_model_path if io_utils.is_url(spm_model_path) else
                    os.path.abspath(spm_model_path))
  return record


def check_vocabulary(model_dir: str, spm_model_path: str) -> None:
  """Refuses to resume `model_dir`'s checkpoints with another vocabulary
  than vocabulary.json's, else DIGESTS.json's (neither: a warning)."""
  last = checkpoints.latest_checkpoint(model_dir)
  if last is None:
    return
  want, where = _recorded_vocabulary(model_dir, last)
  if want is None:
    logging.warning(
        "%s has checkpoints but no %s: the vocabulary %s could not be "
        "verified against them (recorded from now on).", model_dir,
        VOCABULARY_FILE, spm_model_path)
    return
  got = vocabulary_record(spm_model_path)
  if got["sha256"] != want["sha256"]:
    raise ValueError(
        f"spm_model_path: the vocabulary {got['path']!r} (sha256 "
        f"{got['sha256'][:16]}...) is not the one the checkpoints in "
        f"{model_dir} were trained with "
        f"({want.get('path') or want.get('file')!r}, sha256 "
        f"{str(want['sha256'])[:16]}..., recorded in {where}): resuming "
        "would train on ids that now mean other pieces. Allowed: that "
        "SentencePiece model, or a fresh model_dir.")


def _recorded_vocabulary(model_dir: str,
                         last: str) -> Tuple[Optional[Dict[str, Any]], str]:
  """(the vocabulary record or None, the file it is in); ValueError if
  vocabulary.json is not a record."""
  path = os.path.join(model_dir, VOCABULARY_FILE)
  if not os.path.lexists(path):
    where = os.path.join(os.path.basename(last), digests.MANIFEST_FILE)
    return digests.vocabulary_record(last), where
  try:
    want = json.loads(io_utils.read_text(path))
    if not isinstance(want.get("sha256"), str):
      raise ValueError("no 'sha256'")
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(
        f"{path} is not a vocabulary record ({e}); allowed: the JSON this "
        "program writes. Delete it to resume with the vocabulary the "
        f"checkpoint's {digests.MANIFEST_FILE} records, if any.") from None
  return want, VOCABULARY_FILE


def settings_record(config: Any, model: T5Config) -> Dict[str, Any]:
  """A training's settings, JSON-normalized: `config`'s (a `TrainConfig`)
  fields but NOT_SETTINGS, its model resolved."""
  fields = {
      f.name: getattr(config, f.name)
      for f in dataclasses.fields(config)
      if f.name not in NOT_SETTINGS
  }
  fields["model_config"] = gin_reader.t5_config_fields(model)
  if isinstance(fields.get("teacher_config"), T5Config):
    fields["teacher_config"] = gin_reader.t5_config_fields(
        fields["teacher_config"])
  return json.loads(json.dumps({"train": fields}, sort_keys=True, default=str))


def _latest_settings(model_dir: str) -> Iterator[output_folder.Result]:
  """The latest checkpoint and the settings it records (none when it
  records none: an older version's, resumed with a warning)."""
  last = checkpoints.latest_checkpoint(model_dir)
  if last is None:
    return
  path = os.path.join(last, SETTINGS_FILE)
  if not os.path.lexists(path):
    logging.warning(
        "%s records no training settings (written by an older version): "
        "resumed without comparing them.", last)
    return
  yield output_folder.Result(os.path.basename(last),
                             output_folder.recorded_settings(path))


def claim_model_dir(model_dir: str, settings: Optional[Dict[str, Any]],
                    overwrite: bool) -> Tuple[output_folder.Claim, bool]:
  """(MODEL_DIR claimed, whether its checkpoints are to be replaced);
  `settings` None: the lock only. FolderError: not a folder, locked, or
  its latest checkpoint records other settings and not `overwrite`."""
  listed = []

  def results(folder: str) -> Iterator[output_folder.Result]:
    if settings is not None:
      listed.extend(_latest_settings(folder))
    return iter(listed)

  held = output_folder.claim(model_dir, settings, results, name="MODEL_DIR",
                             program="train", overwrite=overwrite,
                             overwrite_flag="train.overwrite=True")
  return held, any(r.settings != settings for r in listed)


def remove_checkpoints(model_dir: str) -> None:
  """Removes every checkpoint_<step> and the vocabulary record: a training
  of other settings replaces them (``train.overwrite=True``)."""
  for _, path in checkpoints.list_checkpoints(model_dir):
    shutil.rmtree(path)
  with contextlib.suppress(FileNotFoundError):
    os.unlink(os.path.join(model_dir, VOCABULARY_FILE))


def clean_staging(model_dir: str) -> None:
  """Removes what a crashed `save_checkpoint` left under a staging name."""
  if os.path.isdir(model_dir):
    for name in os.listdir(model_dir):
      if name.startswith(STAGING_PREFIX):
        shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)


def save_checkpoint(model_dir: str, step: int, params, opt_state,
                    config: T5Config, keep: Optional[int] = None,
                    vocabulary_file: Optional[str] = None,
                    settings: Optional[Dict[str, Any]] = None) -> str:
  """Writes checkpoint_<step> atomically (with `settings` if given, and
  DIGESTS.json, `vocabulary_file`'s digest included), keeps the last `keep`
  (None or 0: all); returns its path. CheckpointError if it exists."""
  model_dir = os.path.abspath(model_dir)
  final = os.path.join(model_dir, f"checkpoint_{step}")
  if os.path.exists(final):
    raise checkpoints.CheckpointError(f"Checkpoint {final} already exists.")
  os.makedirs(model_dir, exist_ok=True)
  staging = os.path.join(model_dir, f"{STAGING_PREFIX}{step}-{time.time_ns()}")
  try:
    with quiet_absl():
      path = checkpoints.save_params(jax.device_get(params), staging, step=step)
    state = {
        "step": np.asarray(step, np.int64),
        "opt_state": jax.device_get(opt_state)
    }
    io_utils.atomic_write(os.path.join(path, TRAIN_STATE_FILE),
                          serialization.to_bytes(state))
    write_model_config(path, config)
    if settings is not None:
      io_utils.write_json(os.path.join(path, SETTINGS_FILE),
                          {"settings": settings})
    digests.write_manifest(path, vocabulary_file)  # last: lists the rest
    os.rename(path, final)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  if keep:
    for _, old in checkpoints.list_checkpoints(model_dir)[:-keep]:
      shutil.rmtree(old, ignore_errors=True)
  return final


def restore_checkpoint(ckpt: str, config: T5Config,
                       opt_state_template) -> Tuple[int, Any, Any]:
  """(step, {'params': ...}, opt_state) of a `save_checkpoint` checkpoint;
  CheckpointError if they do not match `config` or the optimizer."""
  with quiet_absl():
    params = checkpoints.load_t5x_params(ckpt, expected=param_shapes(config))
  state_file = os.path.join(ckpt, TRAIN_STATE_FILE)
  if not os.path.isfile(state_file):
    raise checkpoints.CheckpointError(
        f"Checkpoint {ckpt} has no optimizer state ({TRAIN_STATE_FILE}); it "
        "was not written by specdec_jax.train. Use a fresh model_dir (or "
        "delete the checkpoint) to train from scratch.")
  raw = io_utils.read_bytes(state_file, max_bytes=None)
  template = {"step": np.asarray(0, np.int64), "opt_state": opt_state_template}
  try:
    state = serialization.from_bytes(template, raw)
  except Exception as e:  # pylint: disable=broad-except
    raise checkpoints.CheckpointError(
        f"Checkpoint {ckpt}: the optimizer state in {TRAIN_STATE_FILE} does "
        f"not match the configured optimizer: {e}") from e
  opt_state = jax.tree_util.tree_map(jnp.asarray, state["opt_state"])
  return int(state["step"]), {"params": params}, opt_state


# The gin files `train` writes beside its checkpoints (`write_run_gin_files`).
RUN_GIN_FILES = {"target": "as_target.gin", "draft": "as_draft.gin"}


def run_gin_text(role: str, model_dir: str, config: T5Config,
                 spm_model_path: str) -> str:
  """A gin file that makes `model_dir`'s model (its latest checkpoint) a
  run's `role` ('target' or 'draft')."""
  macro = role.upper()
  name = os.path.basename(os.path.normpath(model_dir))
  files = {
      r: (os.path.join(model_dir, f) if r == role else f"<{r} model dir>/{f}")
      for r, f in RUN_GIN_FILES.items()
  }
  lines = [
      f"# Written by `python -m specdec_jax.train`: {name} as a run's {role}",
      "# (its sizes from model_config.json; rewritten by every train here).",
      "# Give it after an experiment file, which sets the data and OUTPUT_DIR:",
      "#   python -m specdec_jax.run --gin_file=pretrained_multi30k.gin \\",
      f"#     --gin_file={files['target']} \\",
      f"#     --gin_file={files['draft']}",
  ]
  for key, value in gin_reader.t5_config_fields(config).items():
    value = tuple(value) if isinstance(value, list) else value
    lines.append(f"{role}/T5Config.{key} = {value!r}")
  lines += [
      f"{macro}_CHECKPOINT_PATH = {model_dir!r}  # its latest checkpoint_N",
      f"{macro}_NAME = {name!r}",
      f"SPM_MODEL_PATH = {spm_model_path!r}",
      "EXTRA_IDS = 0  # train's vocabularies have no sentinel ids",
  ]
  if role == "draft" and not config.has_encoder:
    lines.append("DRAFTER = 'shared_encoder'  # reads the target's encoder")
  return "\n".join(lines) + "\n"


def write_run_gin_files(model_dir: str, config: T5Config,
                        spm_model_path: str) -> Dict[str, str]:
  """`model_dir`/as_target.gin and as_draft.gin (a model without an
  encoder only drafts), atomically; {role: path}."""
  model_dir = os.path.abspath(model_dir)
  spm = (spm_model_path if io_utils.is_url(spm_model_path) else
         os.path.abspath(spm_model_path))
  roles = ("target", "draft") if config.has_encoder else ("draft",)
  written = {}
  for role in roles:
    path = os.path.join(model_dir, RUN_GIN_FILES[role])
    io_utils.atomic_write(path, run_gin_text(role, model_dir, config, spm))
    written[role] = path
  return written


# The teacher. Fields that do not change the parameters' shapes or values:
_SHAPE_FREE_FIELDS = ("dtype", "dropout_rate", "float32_attention_logits")


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A loaded teacher: its checkpoint, config (no dropout) and parameters."""
  checkpoint: str
  config: T5Config
  params: Any  # {'params': ...}


def teacher_config(distill_from: str, config: Optional[T5Config],
                   model_gin: Optional[str],
                   search_paths: Sequence[str]) -> Tuple[str, T5Config]:
  """(checkpoint, config without dropout) of the teacher; ValueError: no
  checkpoint, no config, or two (a given one disagreeing with the stored)."""
  distill_from = os.fspath(distill_from)
  if checkpoints.checkpoint_step(distill_from) is not None:
    ckpt = distill_from
    if not os.path.isdir(ckpt):
      raise ValueError(f"distill_from: checkpoint {ckpt} does not exist.")
  else:
    ckpt = checkpoints.latest_checkpoint(distill_from)
    if ckpt is None:
      raise ValueError(
          f"distill_from: no checkpoint_<step> found in {distill_from} (train "
          "the teacher first).")
  # model_config.json in the checkpoint, else beside it.
  json_path = next((os.path.join(d, MODEL_CONFIG_FILE)
                    for d in (ckpt, os.path.dirname(os.path.normpath(ckpt)))
                    if os.path.isfile(os.path.join(d, MODEL_CONFIG_FILE))),
                   None)
  stored = (None if json_path is None else read_model_config(json_path))
  if config is not None and model_gin is not None:
    raise ValueError("Give at most one of teacher_config and "
                     "teacher_model_gin.")
  if model_gin is not None:
    config = gin_reader.read_t5_config(model_gin, search_paths=search_paths)
  if config is None:
    if stored is None:
      raise ValueError(
          f"distill_from={distill_from}: no "
          f"{MODEL_CONFIG_FILE} next to {ckpt}; give the "
          "teacher's config with teacher_model_gin or teacher_config (e.g. "
          "@teacher/T5Config()).")
    config = stored
  elif stored is not None:
    diff = [
        f.name
        for f in dataclasses.fields(T5Config)
        if f.name not in _SHAPE_FREE_FIELDS and
        getattr(stored, f.name) != getattr(config, f.name)
    ]
    if diff:
      raise ValueError(
          f"Teacher config mismatch: {json_path} (written with the teacher "
          f"checkpoint) differs from the given teacher config in {diff}: " +
          ", ".join(f"{k}={getattr(stored, k)!r} vs "
                    f"{getattr(config, k)!r}" for k in diff))
  return ckpt, config.replace(dropout_rate=0.0)


def load_teacher(distill_from: str, config: Optional[T5Config],
                 model_gin: Optional[str], search_paths: Sequence[str], *,
                 student: T5Config) -> Teacher:
  """The teacher, checked against the student before its weights are read."""
  ckpt, t_config = teacher_config(distill_from, config, model_gin, search_paths)
  if t_config.vocab_size != student.vocab_size:
    raise ValueError(
        f"Distillation teacher {ckpt} has vocab_size "
        f"{t_config.vocab_size} but the student has {student.vocab_size}: "
        "the KL loss compares their distributions token by token, so both "
        "must use the same vocabulary.")
  if not student.has_encoder and student.encoder_width != t_config.emb_dim:
    raise ValueError(
        f"The student has no encoder and reads the teacher's (width "
        f"T5Config.encoder_width={student.encoder_width}), but teacher "
        f"{ckpt} has emb_dim {t_config.emb_dim}: set encoder_width to it.")
  # float32 whatever the stored dtype: a shipped bfloat16 checkpoint would
  # otherwise run the teacher in bfloat16 matmuls (slow on CPU).
  with quiet_absl():
    params = {
        "params": checkpoints.load_t5x_params(ckpt,
                                              expected=param_shapes(t_config),
                                              dtype=jnp.float32)
    }
  return Teacher(checkpoint=ckpt, config=t_config, params=params)
