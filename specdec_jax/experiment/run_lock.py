"""One run at a time per OUTPUT_DIR: a lock object held for the run's life.

`hold(folder)` creates `folder/.specdec.lock` only if it does not exist
(locally `O_CREAT|O_EXCL`; on gs:// a TensorStore write whose precondition
is "no such object", which GCS checks on the server, `ifGenerationMatch=0`).
It holds a JSON record: program, pid, host, start time and a random token.
A second run on the same folder finds it and is refused at startup, naming
the holder. The lock is deleted when the run ends (also on an error or
Ctrl-C), only if it is still the one this run wrote.

A killed run (SIGKILL, power loss) leaves its lock behind. It is *stale*,
and taken over with a warning, when
* it names this host and its pid is not a live process here, or
* it is older than `stale_after_s()` (24 h, or SPECDEC_LOCK_STALE_S): the
  only test possible for a lock written on another host, or on gs://.
Otherwise delete the file by hand after checking no run uses the folder.
Taking over is atomic: locally the check and the unlink run under an
`flock` of the folder (`io_utils.remove_if_unchanged`), so of several
starters exactly one takes a stale lock over. A local lock that is not a
regular file (a folder, a link) is refused, named, and left as it is.
"""
import contextlib
import datetime
import json
import os
import socket
import stat
import time
import uuid
from typing import Any, Dict, Iterator, Optional

from absl import logging

from specdec_jax.files import io_utils
from specdec_jax.config import paths
from specdec_jax.config.flag_utils import ConfigError

LOCK_FILE = ".specdec.lock"
DEFAULT_STALE_AFTER_S = 24 * 3600.0
STALE_ENV = "SPECDEC_LOCK_STALE_S"


class LockedError(ConfigError):
  """The folder is in use by another run: refused at startup (exit 2)."""


def stale_after_s() -> float:
  text = os.environ.get(STALE_ENV, "")
  try:
    value = float(text) if text else DEFAULT_STALE_AFTER_S
  except ValueError:
    value = -1.0
  if not value > 0:
    raise ValueError(f"{STALE_ENV}={text!r}: allowed: seconds > 0.")
  return value


def _record(program: str) -> Dict[str, Any]:
  now = time.time()
  return {
      "program": program,
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": now,
      "started_utc": datetime.datetime.fromtimestamp(
          now, datetime.timezone.utc).isoformat(timespec="seconds"),
      "token": uuid.uuid4().hex
  }


def _pid_alive(pid: Any) -> bool:
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def why_stale(record: Optional[Dict[str, Any]]) -> Optional[str]:
  """Why a lock record no longer guards a run (None: it may)."""
  if not isinstance(record, dict):
    return "it is not a lock record this program writes"
  if (record.get("host") == socket.gethostname() and
      not _pid_alive(record.get("pid"))):
    return f"process {record.get('pid')} on this host is not running"
  started = record.get("started")
  age = time.time() - started if isinstance(started, (int, float)) else None
  if age is None or age > stale_after_s():
    return (f"it is older than {stale_after_s():g} s ({STALE_ENV})"
            if age is not None else "it records no start time")
  return None


def _parse(data: Optional[bytes]) -> Optional[Dict[str, Any]]:
  try:
    record = json.loads(data.decode("utf-8"))
  except (AttributeError, UnicodeDecodeError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def _describe(record: Dict[str, Any]) -> str:
  return (f"{record.get('program', '?')} (pid {record.get('pid')} on "
          f"{record.get('host')}, started {record.get('started_utc')})")


def _not_a_lock(folder: str, path: str, error: OSError) -> LockedError:
  """One line for a local lock that cannot be read: what it is, what to do."""
  try:
    mode = os.lstat(path).st_mode
  except OSError:
    mode = None
  if mode is None or stat.S_ISREG(mode):
    return LockedError(
        f"OUTPUT_DIR={folder!r}: cannot read its lock {path}: "
        f"{error.strerror or error}. Check its permissions, or choose "
        "another OUTPUT_DIR.")
  kind = ("a folder" if stat.S_ISDIR(mode) else
          "a symbolic link" if stat.S_ISLNK(mode) else "a special file")
  remove = "rmdir" if kind == "a folder" else "rm"
  return LockedError(
      f"OUTPUT_DIR={folder!r}: {path} is {kind}, not a lock file a run "
      f"writes (allowed: no {LOCK_FILE} there, or a run's lock file), so "
      "whether a run uses the folder cannot be told. If none does, remove "
      f"it (`{remove} {path}`); or choose another OUTPUT_DIR.")


class Lock:
  """A held lock: `release()` deletes it if it is still ours."""

  def __init__(self, path: str, version: Any):
    self.path, self.version = path, version

  def release(self) -> None:
    if self.version is None:
      return
    try:
      if not io_utils.remove_if_unchanged(self.path, self.version):
        logging.warning(
            "%s was replaced by another run's lock; left as it "
            "is.", self.path)
    except OSError as e:  # the run's results are written: only warn
      logging.warning("could not delete the lock %s: %s", self.path, e)
    self.version = None


def acquire(folder: str, program: str = "run") -> Lock:
  """Takes `folder`'s lock (the folder must exist; gs://: any prefix).

  Raises:
    LockedError: another run holds it (named in the message).
  """
  path = folder.rstrip("/") + "/" + LOCK_FILE
  data = json.dumps(_record(program), sort_keys=True).encode("utf-8")
  for _ in range(3):  # a stale lock is removed, then created anew
    version = io_utils.create_new(path, data)
    if version is not None:
      return Lock(path, version)
    try:
      held, held_version = io_utils.read_versioned(path)
    except OSError as e:
      if paths.is_url(path):
        raise
      raise _not_a_lock(folder, path, e) from None
    if held is None:
      continue  # released in between
    record = _parse(held)
    stale = why_stale(record)
    if stale is None:
      raise LockedError(
          f"OUTPUT_DIR={folder!r} is in use by {_describe(record)}: two runs "
          "writing one folder would overwrite each other's files. Wait for "
          "it to end, or choose another OUTPUT_DIR. (If no such run exists, "
          f"delete {path}.)")
    # Conditional and serialized: if another starter took it over
    # meanwhile, its new lock stays.
    if io_utils.remove_if_unchanged(path, held_version):
      logging.warning("Took over the stale lock %s (%s).", path, stale)
  raise LockedError(f"OUTPUT_DIR={folder!r}: could not take its lock {path} "
                    "(other runs are starting there at the same time).")


@contextlib.contextmanager
def hold(folder: str, program: str = "run") -> Iterator[Lock]:
  """`acquire`, released when the block ends (an error or Ctrl-C too)."""
  lock = acquire(folder, program)
  try:
    yield lock
  finally:
    lock.release()
