"""JAX's persistent compilation cache, on by default for the commands:
~/.cache/specdec_jax/jax-compilation-cache (SPECDEC_JAX_CACHE moves the
parent; SPECDEC_JAX_COMPILATION_CACHE=0 turns it off). Hardened as
docs/usage/failures.md says: entries written whole, bad entries removed
with one line, an unusable folder turns the cache off with one line.
"""
import contextlib
import importlib.util
import os
import re
import sys
import time
from typing import Any, Optional
import warnings

from specdec_jax.core import environment
from specdec_jax.files import io_utils

ENV_OFF = "SPECDEC_JAX_COMPILATION_CACHE"
# jax/_src/compiler.py's warning when an entry fails to load.
_READ_ERROR = re.compile(
    r"Error reading persistent compilation cache entry for '([^']+)'")
# Errors that are not about an entry's bytes; its entries are kept. A
# COMPILE_TOPOLOGY program needs a TPU client to load; a cache JAX cannot
# open (a size limit without filelock, a URL without etils) fails every
# read, valid entries too.
_NOT_THE_ENTRY = ("must be constructed with a Client", "Please install")

# Set only for JAX's lock; nothing is evicted (`skip_eviction_scans`).
MAX_SIZE_BYTES = 32 << 30
# `atomic_writes`' temporary files: `.<key>.<pid>.partial`.
_PARTIAL = ".partial"
# The largest entry read (a compiled program; the shipped pair's are < 10 MB).
MAX_ENTRY_BYTES = 4 << 30


def add_missing_atimes(folder: str) -> int:
  """Gives every entry of a cache folder written without a size limit the
  access-time file a size-limited cache needs; returns how many."""
  added = 0
  try:
    names = set(os.listdir(folder))
  except OSError:  # no folder yet
    return 0
  for name in names:
    if not name.endswith("-cache"):
      continue
    atime = name[:-len("-cache")] + "-atime"
    if atime in names:
      continue
    try:
      mtime = os.stat(os.path.join(folder, name)).st_mtime_ns
      with open(os.path.join(folder, atime), "xb") as f:
        f.write(int(mtime).to_bytes(8, "little"))
      added += 1
    except OSError:  # another process added it, or the entry went
      pass
  return added


def remove_stale_partials(folder: str, older_than_s: float = 3600.0) -> int:
  """Removes the `.<key>.<pid>.partial` files of writers killed mid-write,
  untouched for `older_than_s`; returns how many."""
  removed, now = 0, time.time()
  try:
    names = os.listdir(folder)
  except OSError:  # no folder yet
    return 0
  for name in names:
    if not (name.startswith(".") and name.endswith(_PARTIAL)):
      continue
    path = os.path.join(folder, name)
    try:
      if now - os.stat(path).st_mtime > older_than_s:
        os.remove(path)
        removed += 1
    except OSError:  # another process removed or renamed it
      pass
  return removed


def _lru_cache_class() -> Any:
  """JAX's `LRUCache`, or None when this JAX lacks it or its entry layout
  changed (then JAX keeps its own behaviour)."""
  try:
    from jax._src import lru_cache  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  cache = getattr(lru_cache, "LRUCache", None)
  if (cache is None or not hasattr(cache, "_evict_if_needed") or
      getattr(lru_cache, "_CACHE_SUFFIX", None) != "-cache" or
      getattr(lru_cache, "_ATIME_SUFFIX", None) != "-atime"):
    return None
  return cache


def atomic_writes() -> bool:
  """Makes this process write cache entries whole (a half-written one can
  abort XLA) and read only regular files; returns whether it could."""
  cache = _lru_cache_class()
  if cache is None:
    return False
  cache.put = _atomic_put
  cache.get = _checked_get
  return True


_told_refused = []


def _checked_get(self, key: str) -> Optional[bytes]:
  """`LRUCache.get`; an entry `io_utils.read_bytes` refuses is a miss,
  removed (a folder skipped), with one line per process."""
  if not key:
    raise ValueError("key cannot be empty")
  entry = self.path / f"{key}-cache"
  with _locked(self):
    if io_utils.is_url(str(entry)):  # a remote folder: JAX's own reading
      return entry.read_bytes() if entry.exists() else None
    try:
      value = io_utils.read_bytes(str(entry), max_bytes=MAX_ENTRY_BYTES)
    except FileNotFoundError:
      return None
    except io_utils.RefusedFile as e:
      done = "skipped"
      if not os.path.isdir(entry):
        try:
          os.unlink(entry)  # a link goes, never what it points to
          done = "removed"
        except OSError:
          pass
      if not _told_refused:
        _told_refused.append(entry)
        print(
            f"specdec_jax: compilation cache entry {e}; {done}, compiled "
            "again.", file=sys.stderr)
      return None
    _touch_atime(self, key)
    return value


def _atomic_put(self, key: str, value: bytes) -> None:
  """`LRUCache.put`, the entry renamed into place once written."""
  if not key:
    raise ValueError("key cannot be empty")
  if self.eviction_enabled and len(value) > self.max_size:
    warnings.warn(
        f"Cache value for key {key!r} of size {len(value)} bytes "
        f"exceeds the maximum cache size of {self.max_size} bytes",
        stacklevel=2)
    return
  entry = self.path / f"{key}-cache"
  with _locked(self):
    if entry.exists():
      return
    self._evict_if_needed(additional_size=len(value))
    # Not `*-cache`: never read, listed or evicted as an entry.
    partial = self.path / f".{key}.{os.getpid()}{_PARTIAL}"
    partial.write_bytes(value)
    partial.rename(entry)
    _touch_atime(self, key)


def _locked(cache):
  """The cache folder's lock (a filelock), held with a size limit."""
  if cache.eviction_enabled:
    return cache.lock.acquire(timeout=cache.lock_timeout_secs)
  return contextlib.nullcontext()


def _touch_atime(cache, key: str) -> None:
  if cache.eviction_enabled:
    (cache.path / f"{key}-atime").write_bytes(time.time_ns().to_bytes(
        8, "little"))


def skip_eviction_scans() -> bool:
  """Turns off the eviction scan of every entry on each write (nothing is
  evicted, as without a limit); returns whether it could."""
  cache = _lru_cache_class()
  if cache is None:
    return False
  cache._evict_if_needed = _no_eviction  # pylint: disable=protected-access
  return True


def _no_eviction(self, *, additional_size: int = 0) -> None:
  del self, additional_size


def cache_dir() -> str:
  """The folder the commands cache compiled programs in (BadEnvironment:
  SPECDEC_JAX_CACHE is a file; empty is the default folder)."""
  return os.path.join(environment.cache_dir(), "jax-compilation-cache")


def check_environment() -> None:
  """Reads every SPECDEC_* variable the caches and CPU kernel read later:
  BadEnvironment before anything is loaded."""
  # Not at the top: tests/conftest.py sets JAX's variables after importing
  # this module.
  # pylint: disable=g-import-not-at-top
  from specdec_jax.core import kernels
  # pylint: enable=g-import-not-at-top
  cache_dir()
  environment.flag(ENV_OFF, True)
  environment.flag(environment.PRICE_CACHE, True)
  kernels.check_environment()


def unusable(folder: str) -> Optional[str]:
  """Why `folder` cannot hold the cache (a file, not writable), or None."""
  if io_utils.is_url(folder):
    return None  # JAX's own (etils) reading and writing
  if os.path.exists(folder) and not os.path.isdir(folder):
    return "is a file, not a folder"
  try:
    io_utils.probe_writable_dir(folder)
  except ValueError as e:
    return f"is {e}"
  return None


def enable() -> str:
  """Turns the cache on (before the first compile); its folder, or '' when
  off or unusable (one line says why). BadEnvironment at once."""
  import jax  # pylint: disable=g-import-not-at-top
  check_environment()
  if not environment.flag(ENV_OFF, True):
    return ""
  folder = os.environ.get("JAX_COMPILATION_CACHE_DIR") or cache_dir()
  why = unusable(folder)
  if why is not None:
    jax.config.update("jax_enable_compilation_cache", False)
    print(
        f"specdec_jax: the compilation cache is off for this run: {folder} "
        f"{why.rstrip('.')}. (Or turn it off: {ENV_OFF}=0.)", file=sys.stderr)
    return ""
  jax.config.update("jax_compilation_cache_dir", folder)
  # Every program: a run compiles several fast ones per input width.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  # A size limit makes JAX lock the folder for every read and write, so
  # that processes sharing it never read an entry still being written.
  # Without filelock (an environment not installed from pyproject, e.g.
  # the device check's in a GPU image) JAX refuses every read and write
  # under any limit, one set by JAX_COMPILATION_CACHE_MAX_SIZE too: none
  # then (-1), the entries' atomic writes below keeping readers safe.
  jax.config.update(
      "jax_compilation_cache_max_size", MAX_SIZE_BYTES
      if importlib.util.find_spec("filelock") is not None else -1)
  skip_eviction_scans()
  atomic_writes()
  add_missing_atimes(folder)  # a folder filled before the limit was set
  remove_stale_partials(folder)
  _watch_read_errors(folder)
  return folder


def repair_entry(folder: str, message: str):
  """Removes every entry of the program (`jit_f`) a JAX read-error warning
  names (it names no key); returns the name, or None for another message
  or an error that is not the entry's (`_NOT_THE_ENTRY`)."""
  match = _READ_ERROR.search(message)
  if match is None or any(why in message for why in _NOT_THE_ENTRY):
    return None
  name = re.compile(re.escape(match.group(1)) + r"-[0-9a-f]+-(cache|atime)$")
  for entry in os.listdir(folder) if os.path.isdir(folder) else ():
    if name.match(entry):
      try:
        os.remove(os.path.join(folder, entry))
      except OSError:
        pass  # Another process removed it, or it is read-only: JAX recompiles.
  return match.group(1)


def _watch_read_errors(folder: str) -> None:
  """Replaces JAX's warning per unreadable entry by one line per process,
  and removes the entries."""
  previous = warnings.showwarning
  if getattr(previous, "specdec_cache_folder", None) == folder:
    return  # Already watching (a sweep enables once per point).
  told = []

  def showwarning(message, category, filename, lineno, file=None, line=None):
    program = repair_entry(folder, str(message))
    if program is None:
      previous(message, category, filename, lineno, file, line)
    elif not told:
      told.append(program)
      print(
          f"specdec_jax: the compilation cache {folder} had an unreadable "
          f"entry ({program}; removed, compiled again). If this repeats, "
          f"clear it: rm -rf {folder} (or run with {ENV_OFF}=0).",
          file=sys.stderr)

  showwarning.specdec_cache_folder = folder
  warnings.showwarning = showwarning
