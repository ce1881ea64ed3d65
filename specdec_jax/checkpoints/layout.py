"""The names in a T5X step directory ``checkpoint_<N>/`` (legacy: a msgpack
``checkpoint``; Orbax: ``state/_METADATA``, or old Orbax's msgpack
``state/checkpoint``), and listing them; local or ``gs://``.
"""
import os
import posixpath
import re
from typing import List, Optional, Tuple

from specdec_jax.files import io_utils

TARGET = "target"  # The model parameters inside T5X's train state.
STATE_DIR = "state"  # Orbax PyTree item written by T5X's Orbax manager.
MSGPACK_FILE = "checkpoint"  # Legacy T5X (flax msgpack) file.
ORBAX_METADATA = "_METADATA"
_CHECKPOINT_DIR_RE = re.compile(r"^checkpoint_(\d+)$")

ParamPath = Tuple[str, ...]  # ('encoder', 'layers_0', ..., 'kernel')


class CheckpointError(ValueError):
  """A checkpoint is missing, malformed, unreadable or does not match."""


def check_inside(ckpt: str, name: str, rel: str) -> None:
  """Refuses an array path that is absolute or climbs out of the
  checkpoint with `..` (a crafted file could read any array)."""
  norm = posixpath.normpath(rel.replace("\\", "/"))
  if (posixpath.isabs(norm) or norm == ".." or norm.startswith("../") or
      "://" in rel or re.match(r"^[A-Za-z]:", rel)):
    raise CheckpointError(
        f"Checkpoint {ckpt}: parameter '{name}' points at {rel!r}, outside "
        "the checkpoint folder; refused (T5X writes paths relative to it, "
        "with no '..' or leading '/').")


def join(*parts: str) -> str:
  """`os.path.join`, or '/'-joined for a URL."""
  if io_utils.is_url(parts[0]):
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
  """``(N, path)`` of the complete ``checkpoint_<N>`` folders in
  `directory`, sorted by N; empty if it does not exist."""
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
  """The complete ``checkpoint_<N>`` with the largest N, or None."""
  found = list_checkpoints(directory)
  return found[-1][1] if found else None


def checkpoint_path(folder) -> str:
  """`folder` if it holds layout files, else its latest
  ``checkpoint_<N>``, else `folder` (for the loader to refuse)."""
  folder = os.fspath(folder)
  if is_checkpoint(folder):
    return folder
  return latest_checkpoint(folder) or folder
