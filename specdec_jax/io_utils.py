"""Crash-safe file writes: a reader sees the old file or the new one, never half.

Every result file the project writes (metrics, predictions, sweep points,
reports, benchmark JSON) goes through `atomic_write`: write a temp file in the
same folder, flush it to disk, then `os.replace` it over the destination.
"""
import json
import os
import tempfile
from typing import Any, Union


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def atomic_write(path: Union[str, os.PathLike], data: Union[str, bytes]) -> None:
  """Writes `data` to `path` atomically (creating parent folders)."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  if isinstance(data, str):
    data = data.encode("utf-8")
  fd, tmp = tempfile.mkstemp(dir=directory,
                             prefix="." + os.path.basename(path) + ".",
                             suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates files with 0600.
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def write_json(path: Union[str, os.PathLike], obj: Any) -> None:
  """Atomically writes `obj` as indented JSON."""
  atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_jsonl(path: Union[str, os.PathLike], rows) -> None:
  """Atomically writes one JSON object per line."""
  atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                             for r in rows))
