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
mean other pieces, so `check_vocabulary` refuses it.
"""
import contextlib
import logging as std_logging
import json
import os
import shutil
import time
from typing import Any, Dict, Optional, Tuple

from absl import logging
from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.files import io_utils
from specdec_jax.config import paths
from specdec_jax.checkpoints import digests
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import param_shapes

TRAIN_STATE_FILE = "train_state.msgpack"
MODEL_CONFIG_FILE = "model_config.json"
STAGING_PREFIX = ".staging-"
VOCABULARY_FILE = "vocabulary.json"


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
  with open(path, "r", encoding="utf-8") as f:
    return gin_reader.t5_config_from_fields(json.load(f), "model config")


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
  is a fresh start (any record is replaced); checkpoints without a record
  (written before records existed) are resumed with a warning.

  Raises:
    ValueError: naming both vocabularies (the record's and `spm_model_path`).
  """
  path = os.path.join(model_dir, VOCABULARY_FILE)
  if checkpoints.latest_checkpoint(model_dir) is None:
    return
  if not os.path.isfile(path):
    logging.warning(
        "%s has checkpoints but no %s: the vocabulary %s could not be "
        "verified against them (recorded from now on).", model_dir,
        VOCABULARY_FILE, spm_model_path)
    return
  try:
    want = json.loads(io_utils.read_text(path))
    want_sha = want["sha256"]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(
        f"{path} is not a vocabulary record ({e}); allowed: the JSON this "
        "program writes. Delete it to resume with the current vocabulary "
        "unverified.") from None
  got = vocabulary_record(spm_model_path)
  if got["sha256"] != want_sha:
    raise ValueError(
        f"spm_model_path: the vocabulary {got['path']!r} (sha256 "
        f"{got['sha256'][:16]}...) is not the one the checkpoints in "
        f"{model_dir} were trained with ({want.get('path')!r}, sha256 "
        f"{str(want_sha)[:16]}..., recorded in {VOCABULARY_FILE}): resuming "
        "would train on ids that now mean other pieces. Allowed: that "
        "SentencePiece model, or a fresh model_dir.")


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
                    vocabulary_file: Optional[str] = None) -> str:
  """Writes checkpoint_<step> (params + optimizer state) atomically, with
  its DIGESTS.json (every file's SHA-256 and, given `vocabulary_file`, the
  SentencePiece model's: `checkpoints.digests`), so `run` loads it
  verified.

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
  with open(state_file, "rb") as f:
    raw = f.read()
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
