"""Training checkpoints: parameters, optimizer state, step and model config.

``model_dir/checkpoint_<step>/`` is a T5X Orbax checkpoint of the parameters
(`checkpoints.save_params`, so `checkpoints.load_t5x_params` and `run` read
it) with two files beside its ``state/`` item: ``train_state.msgpack`` (flax
msgpack of {'step', 'opt_state'}) and ``model_config.json``
(`gin_reader.t5_config_fields`). The directory is assembled under a hidden
staging name and renamed into place, so a crash leaves either no
``checkpoint_<step>`` or a complete one. Listing and naming checkpoints is
`checkpoints`' (`list_checkpoints`, `latest_checkpoint`).

``model_dir/vocabulary.json`` records the SentencePiece model the
checkpoints were trained with (its name, path, size and SHA-256): a resumed
run with another one, even of the same size, would train on ids that now
mean other pieces, so `check_vocabulary` refuses it (without that file,
the latest checkpoint's DIGESTS.json, which records it too, is asked).

MODEL_DIR is claimed as every command claims its folder
(`claim_model_dir`, `files.output_folder.claim`): created and probed,
locked for the training's life (a second `train` into it is refused at
start, naming the first, before anything is written), and the overwrite
rule: each checkpoint records its training's settings
(`settings_record`, in ``checkpoint_<step>/train_settings.json``); a
MODEL_DIR whose latest checkpoint records other settings is refused
unless ``train.overwrite=True``, which trains afresh and replaces its
checkpoints. The settings are what makes the checkpoints what they are
(the model, the data, the optimizer and loss, the seed, the teacher), not
num_steps (a resumed run continues to more steps), the saving, logging
and evaluation periods, or where the vocabulary is (it is compared by its
digest, `check_vocabulary`). A checkpoint of an older version (no record)
is resumed with a warning.
"""
import contextlib
import dataclasses
import logging as std_logging
import json
import os
import shutil
import time
from typing import Any, Dict, Iterator, Optional, Tuple

from absl import logging
from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from specdec_jax.config import paths
from specdec_jax.checkpoints import digests
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import param_shapes

TRAIN_STATE_FILE = "train_state.msgpack"
MODEL_CONFIG_FILE = "model_config.json"
STAGING_PREFIX = ".staging-"
VOCABULARY_FILE = "vocabulary.json"
SETTINGS_FILE = "train_settings.json"
# `TrainConfig` fields that do not change what the checkpoints hold (the
# module docstring).
NOT_SETTINGS = ("model_dir", "num_steps", "save_every_steps",
                "keep_checkpoints", "log_every_steps", "eval_source_file",
                "eval_reference_file", "eval_num_examples", "eval_batch_size",
                "eval_max_decode_length", "gin_search_paths", "spm_model_path",
                "train_vocab", "spm_vocab_size", "spm_options", "overwrite")


@contextlib.contextmanager
def quiet_absl():
  """Hides INFO logs (Orbax logs every file it writes) inside the block.

  The absl logger's own level is put back as it was (NOTSET included):
  restoring the *effective* verbosity instead would pin it, and the
  progress lines after the block would vanish.
  """
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
  record["path"] = (spm_model_path if paths.is_url(spm_model_path) else
                    os.path.abspath(spm_model_path))
  return record


def check_vocabulary(model_dir: str, spm_model_path: str) -> None:
  """Refuses to resume `model_dir`'s checkpoints with another vocabulary.

  Checked before anything is written (config.gin included), so the record
  of the first run survives a refused one. A model_dir without checkpoints
  is a fresh start (any record is replaced). Without vocabulary.json the
  latest checkpoint's DIGESTS.json is asked; with neither (written before
  records existed) the checkpoints are resumed with a warning.

  Raises:
    ValueError: naming both vocabularies (the record's and `spm_model_path`)
      and the file that records the first.
  """
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
  """(the vocabulary record, the file it is in): vocabulary.json, else the
  latest checkpoint's DIGESTS.json; (None, '') when neither records one.

  Raises:
    ValueError: vocabulary.json is there but is not a record.
  """
  path = os.path.join(model_dir, VOCABULARY_FILE)
  if not os.path.lexists(path):
    where = os.path.join(os.path.basename(last), digests.MANIFEST_FILE)
    want = digests.vocabulary_record(last)
    return (want, where) if want is not None else (None, "")
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
  """A training's settings (the module docstring), JSON-normalized:
  `config`'s (a `TrainConfig`) fields but NOT_SETTINGS, its model
  resolved."""
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
  """(MODEL_DIR claimed, whether its checkpoints are to be replaced): see
  the module docstring. `settings` None (a feature-level draft, which
  never resumes): the lock only.

  Raises:
    FolderError: MODEL_DIR cannot be a folder, another training holds
      it, or its latest checkpoint records other settings (or none
      readable) and `overwrite` is False.
  """
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


def write_vocabulary_record(model_dir: str, spm_model_path: str) -> None:
  """``model_dir/vocabulary.json``, atomically (`check_vocabulary`)."""
  io_utils.write_json(os.path.join(model_dir, VOCABULARY_FILE),
                      vocabulary_record(spm_model_path))


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
  """Writes checkpoint_<step> (params + optimizer state) atomically, with
  its DIGESTS.json (every file's SHA-256 and, given `vocabulary_file`, the
  SentencePiece model's: `checkpoints.digests`), so `run` loads it
  verified; given `settings` (`settings_record`), its SETTINGS_FILE.

  Then only the last `keep` checkpoints are kept (all if None or 0).

  Returns:
    The checkpoint's path.

  Raises:
    CheckpointError: checkpoint_<step> exists already.
  """
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
  """(step, {'params': ...}, opt_state) from a checkpoint of `save_checkpoint`.

  Raises:
    CheckpointError (a ValueError): parameters do not match `config`, or the
      optimizer state is missing or does not match the optimizer.
  """
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
  """A gin file that makes `model_dir`'s model a run's `role` ('target' or
  'draft'): its T5Config under the role's scope, its checkpoint (the latest
  in `model_dir`), its name (the folder's) and its vocabulary."""
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
  """`model_dir`/as_target.gin and as_draft.gin (`run_gin_text`;
  a model without an encoder only drafts), atomically; {role: path}."""
  model_dir = os.path.abspath(model_dir)
  spm = (spm_model_path
         if paths.is_url(spm_model_path) else os.path.abspath(spm_model_path))
  roles = ("target", "draft") if config.has_encoder else ("draft",)
  written = {}
  for role in roles:
    path = os.path.join(model_dir, RUN_GIN_FILES[role])
    io_utils.atomic_write(path, run_gin_text(role, model_dir, config, spm))
    written[role] = path
  return written
