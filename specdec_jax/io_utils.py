"""Crash-safe file writes: a reader sees the old file or the new one, never half.

Every result file the project writes (metrics, predictions, sweep points,
reports, benchmark JSON) goes through `atomic_write`: write a temp file in the
same folder, flush it to disk, then `os.replace` it over the destination.

JSON is always valid JSON: a non-finite float (which `json` would write as
`Infinity` / `NaN`) is written as null, with a warning naming its key.
`probe_writable_dir` lets a command check its output folder at startup.
"""
import json
import logging
import math
import os
import tempfile
from typing import Any, Union

logger = logging.getLogger(__name__)


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


def probe_writable_dir(path: Union[str, os.PathLike]) -> None:
  """Creates `path` if needed and writes and removes a file in it.

  Raises:
    ValueError: `path` (or a parent) is a file, or the folder cannot be
      created or written; the message says why and what is allowed.
  """
  path = os.fspath(path)
  try:
    os.makedirs(path, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".write_probe.",
                               suffix=".tmp")
    try:
      os.write(fd, b"probe")
    finally:
      os.close(fd)
      os.unlink(tmp)
  except OSError as e:
    where = f" ({e.filename})" if e.filename and os.fspath(
        e.filename) != path else ""
    raise ValueError(
        f"not a writable directory: {e.strerror or e}{where}. Allowed: a "
        "directory this user can write, or a path where one can be "
        "created.") from None


def json_safe(obj: Any, where: str = "") -> Any:
  """`obj` with non-finite floats replaced by None (logged with their key)."""
  if isinstance(obj, float) and not math.isfinite(obj):
    logger.warning("%s is %s, not a JSON number: written as null.",
                   where or "a value", obj)
    return None
  if isinstance(obj, dict):
    return {k: json_safe(v, f"{where}.{k}" if where else str(k))
            for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [json_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
  return obj


def write_json(path: Union[str, os.PathLike], obj: Any) -> None:
  """Atomically writes `obj` as indented JSON (non-finite floats -> null)."""
  atomic_write(path, json.dumps(json_safe(obj), indent=2, sort_keys=True,
                                allow_nan=False) + "\n")


def write_jsonl(path: Union[str, os.PathLike], rows) -> None:
  """Atomically writes one JSON object per line (non-finite -> null)."""
  atomic_write(path, "".join(
      json.dumps(json_safe(r), ensure_ascii=False, allow_nan=False) + "\n"
      for r in rows))
