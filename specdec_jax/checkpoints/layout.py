"""The names in a T5X step directory, and listing ``checkpoint_<N>``.

A model directory holds ``checkpoint_<N>/`` step directories. A legacy one
holds a msgpack file ``checkpoint``; an Orbax one a ``state/`` PyTree item
with its ``_METADATA`` (or, written by old Orbax versions, a msgpack
``state/checkpoint``). Paths are local or ``gs://`` URLs (`io_utils`).
"""
import os
import posixpath
import re
from typing import List, Optional, Tuple

from specdec_jax.files import io_utils
from specdec_jax.config import paths

# The key T5X uses for the model parameters inside the train state.
TARGET = "target"
STATE_DIR = "state"  # Orbax PyTree item written by T5X's Orbax manager.
MSGPACK_FILE = "checkpoint"  # Legacy T5X (flax msgpack) file.
ORBAX_METADATA = "_METADATA"
_CHECKPOINT_DIR_RE = re.compile(r"^checkpoint_(\d+)$")

ParamPath = Tuple[str, ...]  # ('encoder', 'layers_0', ..., 'kernel')


class CheckpointError(ValueError):
  """A checkpoint is missing, malformed, unreadable or does not match."""


def check_inside(ckpt: str, name: str, rel: str) -> None:
  """Refuses an array path that leaves the checkpoint folder.

  Every layout names its arrays by paths relative to the checkpoint: T5X's
  msgpack specs, old Orbax's `PLACEHOLDER://<name>` leaves, the keys of
  Orbax's `_METADATA` (joined into a folder name). An absolute path or a
  `..` that climbs out (a crafted file) could read any array on the
  machine. Symlinks inside the folder are followed as the filesystem
  does (only the written path is checked).
  """
  norm = posixpath.normpath(rel.replace("\\", "/"))
  if (posixpath.isabs(norm) or norm == ".." or norm.startswith("../") or
      "://" in rel or re.match(r"^[A-Za-z]:", rel)):
    raise CheckpointError(
        f"Checkpoint {ckpt}: parameter '{name}' points at {rel!r}, outside "
        "the checkpoint folder; refused (T5X writes paths relative to it, "
        "with no '..' or leading '/').")


def join(*parts: str) -> str:
  """`os.path.join`, or '/'-joined for a URL."""
  if paths.is_url(parts[0]):
    return posixpath.join(*parts)
  return os.path.join(*parts)


def checkpoint_step(path) -> Optional[int]:
  """N for a path whose last component is ``checkpoint_<N>``, else None."""
  name = posixpath.basename(os.fspath(path).rstrip("/"))
  m = _CHECKPOINT_DIR_RE.match(name)
  return int(m.group(1)) if m else None


def is_checkpoint(ckpt: str) -> bool:
  """A legacy ``checkpoint`` file or an Orbax ``state/`` checkpoint exists
  in `ckpt` (a complete step folder)."""
  state = join(ckpt, STATE_DIR)
  return (io_utils.isfile(join(ckpt, MSGPACK_FILE)) or
          io_utils.isfile(join(state, ORBAX_METADATA)) or
          io_utils.isfile(join(state, MSGPACK_FILE)))


def list_checkpoints(directory) -> List[Tuple[int, str]]:
  """(N, path) of the complete ``checkpoint_<N>`` subdirectories, by N.

  Args:
    directory: a model directory (local or ``gs://``) holding T5X step
      directories.

  Returns:
    ``(N, <directory>/checkpoint_<N>)`` for every N whose directory holds a
    legacy ``checkpoint`` file or an Orbax ``state/`` checkpoint, sorted by
    N (temporary ``*.orbax-checkpoint-tmp-*`` / ``*.tmp-*`` directories are
    ignored); empty if `directory` does not exist.
  """
  directory = os.fspath(directory)
  if not io_utils.isdir(directory):
    return []
  found = []
  for name in io_utils.listdir(directory):
    step = checkpoint_step(name)
    if step is not None and is_checkpoint(join(directory, name)):
      found.append((step, join(directory, name)))
  return sorted(found)


def latest_checkpoint(directory) -> Optional[str]:
  """The complete ``checkpoint_<N>`` subdirectory with the largest N, or None.

  See `list_checkpoints` for what counts as complete.
  """
  found = list_checkpoints(directory)
  return found[-1][1] if found else None


def checkpoint_path(folder) -> str:
  """The step folder that `folder` stands for: itself when it is one (its
  own layout files), else its latest ``checkpoint_<N>``, else `folder` (for
  the loader to say what is wrong with it).

  A model dir that `train` writes holds its own ``model_config.json``
  beside its ``checkpoint_<N>`` folders: only layout files make a
  checkpoint, so that folder stands for its latest step.
  """
  folder = os.fspath(folder)
  if is_checkpoint(folder):
    return folder
  return latest_checkpoint(folder) or folder
