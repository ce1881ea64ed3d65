"""Paths, the filesystem layer (local paths and gs:// alike) and safe writes.

`resolve_path`: a relative path is the current directory's if it exists
there, else the repository's if it exists there, else the current
directory's. gs:// goes through TensorStore's GCS key-value store, each
operation within `remote_timeout_s()` (GCS has no folders). `atomic_write`:
a reader sees the old file or the new one, never half; no local write
follows a link. Reads take only regular files of bounded size
(`RefusedFile`). JSON is always valid: a non-finite float is written null.
"""
import contextlib
import errno
import fcntl
import functools
import json
import logging
import math
import os
import pathlib
import re
import socket
import stat
import tempfile
from typing import IO, Any, Iterator, List, Optional, Tuple, Union
import urllib.parse
import uuid

from specdec_jax.core import environment

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

REPO_DIR = pathlib.Path(__file__).resolve().parents[2]
GIN_DIR = REPO_DIR / "gin"  # Always on the gin search path (`gin_reader`).


def is_url(path: PathLike) -> bool:
  """True for ``gs://...`` and other URLs (never resolved locally)."""
  return "://" in os.fspath(path)


def resolve_path(path: Optional[PathLike],
                 base: Optional[PathLike] = None) -> Optional[str]:
  """An absolute path for `path` (joined to `base` first if relative), as
  the module docstring says; None, URLs and absolute paths as given."""
  if path is None:
    return None
  path = os.fspath(path)
  if base is not None and not os.path.isabs(path) and not is_url(path):
    path = os.path.join(os.fspath(base), path)
  if is_url(path) or os.path.isabs(path):
    return path
  if os.path.exists(path) or not os.path.exists(REPO_DIR / path):
    return os.path.abspath(path)
  return os.path.normpath(REPO_DIR / path)


DEFAULT_REMOTE_TIMEOUT_S = 60.0
TIMEOUT_ENV = "SPECDEC_GCS_TIMEOUT_S"


class RemoteTimeout(TimeoutError):
  """A gs:// operation that got no answer within `remote_timeout_s()`."""


def remote_timeout_s() -> float:
  """Seconds any one gs:// operation may take (SPECDEC_GCS_TIMEOUT_S;
  environment.BadEnvironment unless a finite number > 0)."""
  return environment.seconds(TIMEOUT_ENV, DEFAULT_REMOTE_TIMEOUT_S)


def wait(future, what: str, path: str):
  """`future.result()` within `remote_timeout_s()`; else RemoteTimeout."""
  timeout = remote_timeout_s()
  try:
    return future.result(timeout=timeout)
  except TimeoutError:
    endpoint = os.environ.get("TENSORSTORE_GCS_HTTP_URL")
    where = f" at {endpoint}" if endpoint else ""
    raise RemoteTimeout(
        f"{what} {path}: no answer from Google Cloud Storage{where} within "
        f"{timeout:g} s ({TIMEOUT_ENV}). Check the network, that the bucket "
        "exists, and the credentials (`gcloud auth application-default "
        "login`, or GOOGLE_APPLICATION_CREDENTIALS).") from None


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def _split_gcs(path: str) -> Tuple[str, str]:
  """gs://bucket/a/b -> ('bucket', 'a/b'); other URLs are refused."""
  m = re.fullmatch(r"gs://([^/]+)/?(.*)", path, re.DOTALL)
  if m is None:
    raise ValueError(f"{path!r}: only local paths and gs://bucket/... URLs "
                     "are supported.")
  return m.group(1), m.group(2).rstrip("/")


class RemoteRefused(ConnectionRefusedError):
  """The gs:// endpoint refused the connection: no use waiting for it."""


_DEFAULT_GCS_ENDPOINT = "https://storage.googleapis.com"
_PROXY_ENVS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
               "ALL_PROXY", "all_proxy")


def _check_endpoint(bucket: str, endpoint: str) -> None:
  """RemoteRefused at once when the endpoint refuses connections (which
  TensorStore would retry until the deadline)."""
  if any(os.environ.get(name) for name in _PROXY_ENVS):
    return
  url = urllib.parse.urlsplit(endpoint or _DEFAULT_GCS_ENDPOINT)
  try:
    port = url.port or (443 if url.scheme == "https" else 80)
  except ValueError:
    return
  try:
    conn = socket.create_connection((url.hostname, port),
                                    timeout=min(5.0, remote_timeout_s()))
  except ConnectionRefusedError as e:
    raise RemoteRefused(
        f"opening bucket gs://{bucket}: {url.hostname}:{port} refused the "
        f"connection ({e.strerror or e}). Check the network, and "
        "TENSORSTORE_GCS_HTTP_URL if it is set.") from None
  except OSError:
    return
  conn.close()


@functools.lru_cache(maxsize=None)
def _bucket(bucket: str, endpoint: str):
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  _check_endpoint(bucket, endpoint)
  return wait(ts.KvStore.open({
      "driver": "gcs",
      "bucket": bucket
  }), "opening bucket", f"gs://{bucket}")


def _gcs(path: str):
  bucket, key = _split_gcs(path)
  return _bucket(bucket, os.environ.get("TENSORSTORE_GCS_HTTP_URL", "")), key


def _gcs_keys(path: str) -> List[str]:
  """Every object name under the folder `path` (relative to it)."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  kv, key = _gcs(path)
  prefix = key + "/" if key else ""
  end = prefix[:-1] + "0" if prefix else ""  # '0' follows '/'
  found = wait(kv.list(ts.KvStore.KeyRange(prefix, end)), "listing", path)
  # Some emulators ignore the range and answer every object: filter too.
  keys = (k.decode("utf-8") for k in found)
  return [k[len(prefix):] for k in keys if k.startswith(prefix)]


def _gcs_read(path: str, byte_range=None):
  kv, key = _gcs(path)
  result = wait(kv.read(key, byte_range=byte_range), "reading", path)
  return result.value if result.state == "value" else None


# Files read back (metrics, configs, manifests) are far smaller.
DEFAULT_MAX_BYTES = 256 << 20


class RefusedFile(OSError):
  """A file not read: not a regular file, or over the size limit."""

  def __str__(self) -> str:
    return f"{self.filename}: {self.strerror}"


def file_kind(mode: int) -> str:
  """'a folder', 'a FIFO', ... for a file that is not a regular file."""
  kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
           (stat.S_ISCHR, "a character device"),
           (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
  return next((name for test, name in kinds if test(mode)), "a special file")


def _refuse(path: str, mode: int) -> RefusedFile:
  """The error for `path`, which is not a regular file (`mode`)."""
  what = file_kind(mode)
  if os.path.islink(path):
    what = f"a link to {os.path.realpath(path)}, {what}"
  return RefusedFile(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
                     f"{what}, not a regular file; not read", path)


def _too_large(path: str, size: int, max_bytes: int) -> RefusedFile:
  return RefusedFile(
      errno.EFBIG, f"{size} bytes, over the {max_bytes}-byte "
      "limit of what is read there; not read", path)


def _open_regular(path: str, max_bytes: Optional[int],
                  follow: bool = True) -> Tuple[int, int]:
  """(a descriptor, the size) of the local regular file `path`, opened
  without blocking and checked by descriptor (else RefusedFile);
  `follow=False` refuses a link too."""
  flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
  try:
    fd = os.open(path, flags)
  except OSError as e:
    if e.errno != errno.ENXIO:  # a socket cannot be opened
      raise
    raise _refuse(path, os.stat(path).st_mode) from None
  try:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
      raise _refuse(path, info.st_mode)
    if max_bytes is not None and info.st_size > max_bytes:
      raise _too_large(path, info.st_size, max_bytes)
  except BaseException:
    os.close(fd)
    raise
  return fd, info.st_size


def _read_regular(path: str, max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
                  follow: bool = True) -> bytes:
  """The bytes of the regular file `path` (`_open_regular`)."""
  fd, expected = _open_regular(path, max_bytes, follow)
  try:
    chunks, size = [], 0
    while True:  # the file may grow while it is read
      chunk = os.read(fd, max(expected + 1 - size, 1 << 16))
      if not chunk:
        return b"".join(chunks)
      size += len(chunk)
      if max_bytes is not None and size > max_bytes:
        raise _too_large(path, size, max_bytes)
      chunks.append(chunk)
  finally:
    os.close(fd)


def open_text(path: str, max_bytes: Optional[int] = None) -> IO[str]:
  """The local regular file `path` opened as UTF-8 text (refused as
  `read_bytes` refuses)."""
  fd, _ = _open_regular(path, max_bytes)
  return os.fdopen(fd, "r", encoding="utf-8")


def read_bytes(path: PathLike,
               max_bytes: Optional[int] = DEFAULT_MAX_BYTES) -> bytes:
  """The bytes of a regular file or gs:// object of at most `max_bytes`
  (None: no limit); else RefusedFile naming it and why."""
  path = os.fspath(path)
  if not is_url(path):
    return _read_regular(path, max_bytes)
  data = _gcs_read(path)
  if data is None:
    raise FileNotFoundError(f"No such object: {path}")
  if max_bytes is not None and len(data) > max_bytes:
    raise _too_large(path, len(data), max_bytes)
  return data


def read_text(path: PathLike,
              max_bytes: Optional[int] = DEFAULT_MAX_BYTES) -> str:
  """`read_bytes` decoded as UTF-8 (UnicodeDecodeError: not UTF-8)."""
  return read_bytes(path, max_bytes).decode("utf-8")


def isfile(path: PathLike) -> bool:
  path = os.fspath(path)
  if not is_url(path):
    return os.path.isfile(path)
  return _gcs_read(path, byte_range=slice(0, 0)) is not None  # no data read


def isdir(path: PathLike) -> bool:
  path = os.fspath(path)
  if not is_url(path):
    return os.path.isdir(path)
  return bool(_gcs_keys(path))


def exists(path: PathLike) -> bool:
  path = os.fspath(path)
  if not is_url(path):
    return os.path.exists(path)
  return isfile(path) or isdir(path)


def listdir(path: PathLike) -> List[str]:
  """Names in a folder (on GCS: the first part of each object name under
  it); FileNotFoundError if there is none."""
  path = os.fspath(path)
  if not is_url(path):
    return os.listdir(path)
  names = sorted({k.split("/", 1)[0] for k in _gcs_keys(path)})
  if not names:
    raise FileNotFoundError(f"No such folder: {path}")
  return names


def makedirs(path: PathLike) -> None:
  """`os.makedirs(path, exist_ok=True)`; nothing on GCS (no folders)."""
  path = os.fspath(path)
  if not is_url(path):
    os.makedirs(path, exist_ok=True)
  else:
    _split_gcs(path)


def remove(path: PathLike) -> None:
  path = os.fspath(path)
  if not is_url(path):
    os.unlink(path)
    return
  kv, key = _gcs(path)
  wait(kv.write(key, None), "deleting", path)


def atomic_write(path: PathLike, data: Union[str, bytes]) -> None:
  """Writes `data` to `path` atomically (creating parent folders)."""
  path = os.fspath(path)
  if isinstance(data, str):
    data = data.encode("utf-8")
  if is_url(path):
    kv, key = _gcs(path)
    wait(kv.write(key, data), "writing", path)  # one upload: all or nothing
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory,
                             prefix="." + os.path.basename(path) + ".",
                             suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
      # mkstemp's 0600, by descriptor (the path could be a link by now).
      os.fchmod(f.fileno(), 0o666 & ~_umask())
    os.replace(tmp, path)  # replaces a link at `path`, never follows it
  except BaseException as e:
    if os.path.exists(tmp):
      os.unlink(tmp)
    if isinstance(e, OSError) and e.filename is None:
      # A failed write (ENOSPC, EIO) names no file: name the destination.
      raise OSError(e.errno, e.strerror, path) from e
    raise


# -- create-if-absent and conditional delete (`output_folder`'s lock) --------
@functools.lru_cache(maxsize=None)
def _no_value_generation() -> bytes:
  """TensorStore's generation of a missing key ("must not exist")."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  kv = ts.KvStore.open({"driver": "memory"}).result()
  return kv.read("missing").result().stamp.generation


def create_new(path: str, data: bytes) -> Any:
  """Writes `path` only if absent (atomically); a version for
  `remove_if_unchanged`, or None when it existed."""
  if not is_url(path):
    return data if _create_new_local(path, data) else None
  kv, key = _gcs(path)
  stamp = wait(kv.write(key, data, if_equal=_no_value_generation()), "creating",
               path)
  return stamp.generation or None  # b'': the precondition failed


def _create_new_local(path: str, data: bytes) -> bool:
  """Creates `path` whole only if absent: a temporary file hard-linked to
  it, so no reader sees it empty (an empty lock looks stale)."""
  folder = os.path.dirname(path) or "."
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".create.", suffix=".tmp")
  try:
    try:
      os.write(fd, data)
      os.fsync(fd)
      os.fchmod(fd, 0o644 & ~_umask())
    finally:
      os.close(fd)
    try:
      os.link(tmp, path)
    except FileExistsError:
      return False
    except OSError:  # no hard links here (some network or FUSE mounts)
      return _create_exclusive(path, data)
    return True
  finally:
    os.unlink(tmp)


def _create_exclusive(path: str, data: bytes) -> bool:
  """`O_CREAT | O_EXCL`, then the data: where `link` is not supported (a
  reader may see the file empty for a moment)."""
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW,
                 0o644)
  except FileExistsError:
    return False
  try:
    os.write(fd, data)
    os.fsync(fd)
  finally:
    os.close(fd)
  return True


@contextlib.contextmanager
def _folder_locked(folder: str) -> Iterator[None]:
  """An exclusive `flock` of the local `folder` for the block (none where
  `flock` is not supported)."""
  try:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
  except OSError:
    fd = None
  try:
    if fd is not None:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX)
      except OSError:
        pass
    yield
  finally:
    if fd is not None:
      os.close(fd)  # releases the flock


def read_versioned(path: str) -> Tuple[Any, Any]:
  """(bytes, version) of `path` (locally a regular file, not a link), or
  (None, None) when it does not exist."""
  if not is_url(path):
    try:
      data = _read_regular(path, follow=False)
      return data, data
    except FileNotFoundError:
      return None, None
  kv, key = _gcs(path)
  result = wait(kv.read(key), "reading", path)
  if result.state != "value":
    return None, None
  return result.value, result.stamp.generation


def remove_if_unchanged(path: str, version: Any) -> bool:
  """Deletes `path` if it is still `version`; whether it did. Checked by
  the server on gs://; locally under the folder's `flock`, which every
  remover takes (else two takers of a stale lock could both hold it)."""
  if not is_url(path):
    with _folder_locked(os.path.dirname(path) or "."):
      try:
        if _read_regular(path, follow=False) != version:
          return False
        os.unlink(path)
        return True
      except FileNotFoundError:
        return False
  kv, key = _gcs(path)
  stamp = wait(kv.write(key, None, if_equal=version), "deleting", path)
  return bool(stamp.generation)


def probe_writable_dir(path: PathLike) -> None:
  """Creates `path` if needed and writes and removes a file (or gs://
  object) in it; ValueError saying why not and what is allowed."""
  path = os.fspath(path)
  if is_url(path):
    remote_timeout_s()  # a bad SPECDEC_GCS_TIMEOUT_S is named as such
    probe = path.rstrip("/") + f"/.write_probe.{uuid.uuid4().hex}.tmp"
    try:
      atomic_write(probe, b"probe")
      remove(probe)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
          f"cannot write an object there: {str(e).rstrip('.')}. Allowed: a "
          "gs://bucket/folder "
          "whose bucket exists and that these credentials can write, or a "
          "local directory.") from None
    return
  try:
    os.makedirs(path, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".write_probe.", suffix=".tmp")
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
    logger.warning("%s is %s, not a JSON number: written as null.", where or
                   "a value", obj)
    return None
  if isinstance(obj, dict):
    return {
        k: json_safe(v, f"{where}.{k}" if where else str(k))
        for k, v in obj.items()
    }
  if isinstance(obj, (list, tuple)):
    return [json_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
  return obj


def write_json(path: PathLike, obj: Any) -> None:
  """Atomically writes `obj` as indented JSON (non-finite floats -> null)."""
  atomic_write(
      path,
      json.dumps(json_safe(obj), indent=2, sort_keys=True, allow_nan=False) +
      "\n")
