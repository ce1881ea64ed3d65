"""`checkpoint_<N>/DIGESTS.json`: every file's size and SHA-256 (T5X's
formats have no checksums), verified before any array is read, and the
vocabulary the checkpoint was trained with (docs/usage/failures.md).
"""
import hashlib
import json
import os
import stat
from typing import Any, Dict, List, Optional

from specdec_jax.files import io_utils
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import check_inside
from specdec_jax.checkpoints.layout import join

MANIFEST_FILE = "DIGESTS.json"
VOCABULARY_KEY = "vocabulary"


def _local_files(folder: str) -> List[str]:
  """Every file under `folder`, relative, '/'-separated, sorted."""
  out = []
  for root, _, files in os.walk(folder):
    for name in files:
      rel = os.path.relpath(os.path.join(root, name), folder)
      out.append(rel.replace(os.sep, "/"))
  return sorted(f for f in out if f != MANIFEST_FILE)


def digest(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def write_manifest(folder: str, vocabulary_file: Optional[str] = None) -> str:
  """Writes `folder`/DIGESTS.json for every file in the (local) step
  folder, and `vocabulary_file`'s record if given; returns its path."""
  files = {
      rel: _record(
          io_utils.read_bytes(os.path.join(folder, rel),
                              max_bytes=None)) for rel in _local_files(folder)
  }
  manifest: Dict[str, Any] = {"algorithm": "sha256", "files": files}
  if vocabulary_file is not None:
    manifest[VOCABULARY_KEY] = file_record(vocabulary_file)
  path = os.path.join(folder, MANIFEST_FILE)
  io_utils.write_json(path, manifest)
  return path


def file_record(path: str) -> Dict[str, Any]:
  """{'file': its name, 'bytes': its size, 'sha256': its digest}."""
  return {"file": os.path.basename(path), **_record(io_utils.read_bytes(path))}


def _record(data: bytes) -> Dict[str, Any]:
  return {"bytes": len(data), "sha256": digest(data)}


def _manifest_text(folder: str) -> Optional[str]:
  """`folder`'s DIGESTS.json, or None when there is none; CheckpointError
  when it is not a regular file."""
  try:
    return io_utils.read_text(join(folder, MANIFEST_FILE))
  except (FileNotFoundError, NotADirectoryError):
    return None
  except io_utils.RefusedFile as e:
    raise CheckpointError(
        f"Checkpoint {folder}: {e}. Allowed: the {MANIFEST_FILE} written "
        "with the checkpoint (a regular file), or none.") from None


def vocabulary_record(folder: str) -> Optional[Dict[str, Any]]:
  """The vocabulary `folder`'s DIGESTS.json records, or None;
  CheckpointError when it is not a regular file."""
  text = _manifest_text(folder)
  if text is None:
    return None
  try:
    record = json.loads(text).get(VOCABULARY_KEY)
  except (ValueError, AttributeError):
    return None
  return record if isinstance(record, dict) and "sha256" in record else None


def _check_entries(folder: str, files: Dict[str, Any]) -> None:
  """Refuses an entry that is not a regular file inside `folder`."""
  root = None if io_utils.is_url(folder) else os.path.realpath(folder)
  for rel, want in sorted(files.items()):
    where = f"Checkpoint {folder}: {MANIFEST_FILE} entry {rel!r}"
    if not isinstance(want, dict):
      raise CheckpointError(f"{where} is not a {{'bytes', 'sha256'}} record; "
                            "re-export the checkpoint.")
    try:
      check_inside(folder, rel, rel)
    except CheckpointError:
      raise CheckpointError(
          f"{where} points outside the folder; refused, nothing read. "
          "Allowed: paths relative to the folder, without '..' leaving it "
          "or a leading '/'.") from None
    if root is None:
      continue
    real = os.path.realpath(os.path.join(folder, rel))
    if os.path.commonpath([root, real]) != root:
      raise CheckpointError(
          f"{where} is a symlink (or under one) leading to {real}, outside "
          "the folder; refused, nothing read. Allowed: regular files inside "
          "the folder.")
    try:
      mode = os.stat(real).st_mode
    except FileNotFoundError:
      continue  # `verify_manifest` names it as missing.
    if not stat.S_ISREG(mode):
      raise CheckpointError(
          f"{where} is not a regular file (a folder, device, pipe or "
          "socket); refused, nothing read. Allowed: regular files inside "
          "the folder.")


def verify_manifest(folder: str) -> bool:
  """Checks `folder` against its DIGESTS.json; False when it has none.
  CheckpointError: a bad entry, or the first file missing, changed or
  (locally) not listed."""
  text = _manifest_text(folder)
  if text is None:
    return False
  try:
    manifest = json.loads(text)
    files = manifest["files"]
    assert manifest.get("algorithm") == "sha256" and isinstance(files, dict)
  except (ValueError, KeyError, TypeError, AssertionError) as e:
    raise CheckpointError(f"Checkpoint {folder}: {MANIFEST_FILE} is not a "
                          f"digest manifest this program writes ({e}).") from e
  _check_entries(folder, files)
  for rel, want in sorted(files.items()):
    try:
      data = io_utils.read_bytes(join(folder, rel), max_bytes=None)
    except FileNotFoundError:
      raise CheckpointError(f"Checkpoint {folder}: {rel} is listed in "
                            f"{MANIFEST_FILE} but missing.") from None
    if len(data) != want.get("bytes") or digest(data) != want.get("sha256"):
      raise CheckpointError(
          f"Checkpoint {folder}: {rel} does not match {MANIFEST_FILE} ("
          f"{len(data)} bytes, sha256 {digest(data)[:16]}...; recorded "
          f"{want.get('bytes')} bytes, {str(want.get('sha256'))[:16]}...): "
          "the file is corrupt or was changed; re-download or re-export "
          "the checkpoint.")
  if not io_utils.is_url(folder):
    extra = sorted(set(_local_files(folder)) - set(files))
    if extra:
      raise CheckpointError(
          f"Checkpoint {folder}: {extra[0]} is not listed in {MANIFEST_FILE}"
          f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}: "
          "files were added after the checkpoint was exported.")
  return True
