"""A manifest of SHA-256 digests beside a checkpoint: bit flips are caught.

T5X's formats carry no checksums (zarr chunks and OCDBT data files are
read as they are), so a flipped bit changes a weight silently. For the
checkpoints this repository ships and exports (`tools/export_pretrained.py`)
`write_manifest` records every file of the step folder, its size and its
SHA-256, in `checkpoint_<N>/DIGESTS.json`; `load_t5x_params` calls
`verify_manifest` when that file is there, before reading any array, and
refuses a missing, resized, changed or unlisted file, naming it. Every
entry must name a regular file inside the folder (`_check_entries`, before
anything is read): a crafted manifest cannot make the loader read, and
print the digest of, a file elsewhere or a device. Checkpoints without a
manifest load as before, with a warning that they are unverified. The
manifest may also record the SentencePiece model the checkpoint was
trained with (`vocabulary_record`): a run refuses another one, even of the
same size.

The cost: every byte of the checkpoint is read once more and hashed
(SHA-256, roughly 0.5-1 GB/s per core): milliseconds for the shipped 19 MB
pair, about 1 s per GB otherwise. On gs:// the files are downloaded twice.
"""
import hashlib
import json
import os
import stat
from typing import Any, Dict, List, Optional

from specdec_jax.files import io_utils
from specdec_jax.config import paths
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import check_inside
from specdec_jax.checkpoints.layout import join

MANIFEST_FILE = "DIGESTS.json"
# DIGESTS.json's record of the vocabulary the checkpoint was trained with.
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
  """Writes `folder`/DIGESTS.json for every file in it (a local folder);
  returns its path.

  Args:
    folder: the checkpoint's step folder.
    vocabulary_file: the SentencePiece model the checkpoint was trained
      with: its size and digest are recorded too (`vocabulary_record`), so
      a run can refuse another vocabulary of the same size.
  """
  files: Dict[str, Dict[str, object]] = {}
  for rel in _local_files(folder):
    data = io_utils.read_bytes(os.path.join(folder, rel), max_bytes=None)
    files[rel] = {"bytes": len(data), "sha256": digest(data)}
  manifest: Dict[str, Any] = {"algorithm": "sha256", "files": files}
  if vocabulary_file is not None:
    manifest[VOCABULARY_KEY] = file_record(vocabulary_file)
  path = os.path.join(folder, MANIFEST_FILE)
  io_utils.write_json(path, manifest)
  return path


def file_record(path: str) -> Dict[str, Any]:
  """{'file': its name, 'bytes': its size, 'sha256': its digest}."""
  data = io_utils.read_bytes(path)
  return {
      "file": os.path.basename(path),
      "bytes": len(data),
      "sha256": digest(data)
  }


def _manifest_text(folder: str) -> Optional[str]:
  """`folder`'s DIGESTS.json, or None when there is none.

  Raises:
    CheckpointError: something else is there (a FIFO, a link to /dev/zero,
      a folder: `io_utils.read_text` refuses it), not read.
  """
  try:
    return io_utils.read_text(join(folder, MANIFEST_FILE))
  except (FileNotFoundError, NotADirectoryError):
    return None
  except io_utils.RefusedFile as e:
    raise CheckpointError(
        f"Checkpoint {folder}: {e}. Allowed: the {MANIFEST_FILE} written "
        "with the checkpoint (a regular file), or none.") from None


def vocabulary_record(folder: str) -> Optional[Dict[str, Any]]:
  """The vocabulary `folder`'s DIGESTS.json records (`write_manifest`);
  None when it has no manifest, or one without a vocabulary.

  Raises:
    CheckpointError: its DIGESTS.json is not a regular file.
  """
  text = _manifest_text(folder)
  if text is None:
    return None
  try:
    record = json.loads(text).get(VOCABULARY_KEY)
  except (ValueError, AttributeError):
    return None
  return record if isinstance(record, dict) and "sha256" in record else None


def _check_entries(folder: str, files: Dict[str, Any]) -> None:
  """Refuses an entry that is not a regular file inside `folder`.

  The names are read from a file, so a crafted one could point anywhere:
  `../x` or `/etc/x` (the error would print its size and digest prefix),
  `/dev/zero` (read without end). Locally the path is resolved, symlinks
  included, and must stay under the folder's own resolved path; on gs://
  (no symlinks or devices) the written path is checked.
  """
  root = None if paths.is_url(folder) else os.path.realpath(folder)
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

  Raises:
    CheckpointError: DIGESTS.json or an entry is not a regular file inside
      the folder (before any entry is read), or the first file that is
      missing, has another size or digest, or (locally) is not listed.
  """
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
    try:  # its size is compared with the record's
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
  if not paths.is_url(folder):
    extra = sorted(set(_local_files(folder)) - set(files))
    if extra:
      raise CheckpointError(
          f"Checkpoint {folder}: {extra[0]} is not listed in {MANIFEST_FILE}"
          f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}: "
          "files were added after the checkpoint was exported.")
  return True
