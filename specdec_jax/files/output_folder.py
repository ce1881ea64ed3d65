"""The folder a command writes: one command at a time, and what it replaces.

Every command that writes a folder calls `claim` before any work: the
folder is created and probed, its lock taken (stale rule:
docs/usage/failures.md), and a result of other settings (or of none)
refused unless overwrite is on. No JAX, no gin here (the device check's
parent process uses it).
"""
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import socket
import stat
import time
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence
from typing import Union
import uuid

from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.core import environment
from specdec_jax.files import io_utils

logger = logging.getLogger(__name__)


class FolderError(ConfigError):
  """A folder a command cannot use as it is: refused at start-up (exit 2)."""


class LockedError(FolderError):
  """The folder is in use by another command: refused at start-up."""


# -- lock ----------------------------------------------------------------------
# `folder/.specdec.lock`, created only if absent (`io_utils.create_new`),
# holding who took it; deleted at the end only if still ours. A stale one
# (dead pid on this host, or older than `stale_after_s()`) is taken over.
LOCK_FILE = ".specdec.lock"
DEFAULT_STALE_AFTER_S = 24 * 3600.0
STALE_ENV = "SPECDEC_LOCK_STALE_S"


def stale_after_s() -> float:
  """SPECDEC_LOCK_STALE_S (`environment.seconds`), as a bad setting."""
  try:
    return environment.seconds(STALE_ENV, DEFAULT_STALE_AFTER_S)
  except environment.BadEnvironment as e:
    raise FolderError(str(e)) from None


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
  """Why a lock record no longer guards a command (None: it may)."""
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


def _not_a_lock(folder: str, name: str, path: str,
                error: OSError) -> LockedError:
  """One line for a local lock that cannot be read: what it is, what to do."""
  try:
    mode = os.lstat(path).st_mode
  except OSError:
    mode = None
  if mode is None or stat.S_ISREG(mode):
    return LockedError(f"{name}={folder!r}: cannot read its lock {path}: "
                       f"{error.strerror or error}. Check its permissions, or "
                       f"choose another {name}.")
  kind = ("a symbolic link" if stat.S_ISLNK(mode) else io_utils.file_kind(mode))
  remove = "rmdir" if kind == "a folder" else "rm"
  return LockedError(
      f"{name}={folder!r}: {path} is {kind}, not a lock file a run "
      f"writes (allowed: no {LOCK_FILE} there, or a run's lock file), so "
      "whether a run uses the folder cannot be told. If none does, remove "
      f"it (`{remove} {path}`); or choose another {name}.")


class Lock:
  """A held lock: `release()` deletes it if it is still ours."""

  def __init__(self, path: str, version: Any):
    self.path, self.version = path, version

  def release(self) -> None:
    if self.version is None:
      return
    try:
      if not io_utils.remove_if_unchanged(self.path, self.version):
        logger.warning(
            "%s was replaced by another run's lock; left as it "
            "is.", self.path)
    except OSError as e:  # the results are written: only warn
      logger.warning("could not delete the lock %s: %s", self.path, e)
    self.version = None


def acquire(folder: str, program: str = "run",
            name: str = "OUTPUT_DIR") -> Lock:
  """Takes the existing `folder`'s lock (`name`: its setting); LockedError
  naming the holder, FolderError for a bad SPECDEC_LOCK_STALE_S."""
  stale_after_s()  # named now, not at the first stale lock
  path = folder.rstrip("/") + "/" + LOCK_FILE
  data = json.dumps(_record(program), sort_keys=True).encode("utf-8")
  for _ in range(3):  # a stale lock is removed, then created anew
    version = io_utils.create_new(path, data)
    if version is not None:
      return Lock(path, version)
    try:
      held, held_version = io_utils.read_versioned(path)
    except OSError as e:
      if io_utils.is_url(path):
        raise
      raise _not_a_lock(folder, name, path, e) from None
    if held is None:
      continue  # released in between
    record = _parse(held)
    stale = why_stale(record)
    if stale is None:
      raise LockedError(
          f"{name}={folder!r} is in use by {_describe(record)}: two runs "
          "writing one folder would overwrite each other's files. Wait for "
          f"it to end, or choose another {name}. (If no such run exists, "
          f"delete {path}.)")
    # Conditional: another starter's new lock stays.
    if io_utils.remove_if_unchanged(path, held_version):
      logger.warning("Took over the stale lock %s (%s).", path, stale)
  raise LockedError(f"{name}={folder!r}: could not take its lock {path} "
                    "(other runs are starting there at the same time).")


@contextlib.contextmanager
def hold(folder: str, program: str = "run",
         name: str = "OUTPUT_DIR") -> Iterator[Lock]:
  """`acquire`, released when the block ends (an error or Ctrl-C too)."""
  lock = acquire(folder, program, name)
  try:
    yield lock
  finally:
    lock.release()


# -- the overwrite rule --------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Result:
  """A result in the folder, the settings it records (None: none), and
  whether an unfinished run kept it."""
  name: str
  settings: Any
  kept: bool = False


def recorded_settings(path: str) -> Any:
  """The `settings` a JSON result file records (None: none, unreadable)."""
  try:
    return json.loads(io_utils.read_text(path)).get("settings")
  except (OSError, ValueError, AttributeError):
    return None


def json_results(names: Sequence[str]) -> Callable[[str], Iterator[Result]]:
  """The results: the JSON files `names` in the folder."""

  def results(folder: str) -> Iterator[Result]:
    for file_name in names:
      path = os.path.join(folder, file_name)
      if io_utils.isfile(path):
        yield Result(file_name, recorded_settings(path))

  return results


def settings_diff(old: Any, new: Any, prefix: str = "", limit: int = 6) -> str:
  """'run.gamma: 7 -> 4, ...': where two settings records differ."""
  diffs = []

  def walk(a, b, where):
    if isinstance(a, dict) and isinstance(b, dict):
      for key in sorted(set(a) | set(b)):
        walk(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    elif a != b:
      diffs.append(f"{where}: {a!r} -> {b!r}")

  walk(old, new, prefix)
  more = f" (and {len(diffs) - limit} more)" if len(diffs) > limit else ""
  return ", ".join(diffs[:limit]) + more


def how_to_pass(overwrite_flag: str) -> str:
  """'OVERWRITE=True' -> '--gin.OVERWRITE=True'; a flag stays as it is."""
  return (overwrite_flag
          if overwrite_flag.startswith("-") else f"--gin.{overwrite_flag}")


def refuse_others(folder: str, settings: Any, results: Iterable[Result], *,
                  name: str, overwrite: bool, overwrite_flag: str) -> None:
  """FolderError for a result of other settings (or none) unless
  `overwrite` (then a warning), naming it, the diff and `overwrite_flag`."""
  for result in results:
    if result.settings == settings:
      continue
    if overwrite:
      logger.warning("%s: replacing %s (a run with other settings).",
                     overwrite_flag, os.path.join(folder, result.name))
      continue
    diff = (settings_diff(result.settings, settings)
            if result.settings is not None else None)
    if result.kept:
      what = ("was kept from a run that did not finish, of other settings "
              "or of unknown ones" + (f" ({diff})" if diff else ""))
    elif diff is None:
      what = ("records no settings (written by another program or an older "
              "version)")
    else:
      what = "is from a run with other settings: " + diff
    raise FolderError(
        f"{name}={folder!r} holds {result.name}, which {what}. Refusing to "
        f"overwrite it: choose another {name}, or pass "
        f"{how_to_pass(overwrite_flag)} to replace it.")


# -- claim ---------------------------------------------------------------------
def _remove_if_empty(folder: str) -> None:
  try:
    os.rmdir(folder)
  except OSError:
    pass


def prepare(folder: str, name: str = "OUTPUT_DIR") -> bool:
  """Creates and probes `folder`; whether this call created it.
  FolderError naming `name`, the folder and what is allowed."""
  created = not io_utils.is_url(folder) and not os.path.exists(folder)
  try:
    io_utils.probe_writable_dir(folder)
  except ValueError as e:
    if created:  # e.g. a full disk: made, then not writable
      _remove_if_empty(folder)
    raise FolderError(f"{name}={folder!r}: {e}") from None
  return created


class Claim:
  """A claimed folder: `release` gives the lock back and removes the
  folder when the claim created it and it stayed empty."""

  def __init__(self, lock: Lock, folder: str, created: bool):
    self.lock, self.folder, self.created = lock, folder, created

  def release(self) -> None:
    self.lock.release()
    if self.created:
      _remove_if_empty(self.folder)

  def __enter__(self) -> "Claim":
    return self

  def __exit__(self, *exc) -> bool:
    self.release()
    return False


ResultsOf = Union[Sequence[str], Callable[[str], Iterable[Result]]]


def claim(folder: str, settings: Any, results: ResultsOf = (), *,
          name: str = "OUTPUT_DIR", program: str = "run",
          overwrite: bool = False,
          overwrite_flag: str = "OVERWRITE=True") -> Claim:
  """Claims `folder` (local or gs://) for `program`, as the module says:
  `settings` is this run's record, `results` the JSON result files it
  protects (or a function listing `Result`s), `name` the setting the user
  gave the folder by, `overwrite_flag` how the user sets `overwrite`.
  FolderError (LockedError: in use) for any of the module's refusals."""
  stale_after_s()
  created = prepare(folder, name)
  listed = (results if callable(results) else json_results(tuple(results)))
  try:
    lock = acquire(folder, program, name)
  except BaseException:
    if created:
      _remove_if_empty(folder)
    raise
  held = Claim(lock, folder, created)
  try:
    refuse_others(folder, settings, listed(folder), name=name,
                  overwrite=overwrite, overwrite_flag=overwrite_flag)
  except BaseException:
    held.release()
    raise
  return held
