"""A run's settings record and the OVERWRITE rule of its OUTPUT_DIR.

`settings_record` is what makes a run's results what they are: every run
argument but OUTPUT_DIR / OVERWRITE / MODE, both model configs and the
vocabulary (metrics.json and alpha.json record it as `settings`).
`check_output_dir` creates and probes OUTPUT_DIR, takes its lock (one run
at a time: `acquire`) and refuses a result file there (metrics.json,
alpha.json, predictions.jsonl or its `.partial`) of other settings than the
run's, unless OVERWRITE=True; the same settings may be re-run freely.
An empty `.partial` (a run killed before its first row) holds nothing and
protects nothing.
"""
import contextlib
import dataclasses
import datetime
import json
import os
import re
import socket
import stat
import time
from typing import Any, Dict, Iterator, Optional
import uuid

from absl import logging
import jax.numpy as jnp

from specdec_jax.config import gin_reader
from specdec_jax.config import paths
from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.core.models import T5Config
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import loading
from specdec_jax.files import io_utils
from specdec_jax.metrics import run_metrics

# -- run lock ------------------------------------------------------------------
# One run at a time per OUTPUT_DIR: a lock object held for the run's life.
#
# `hold(folder)` creates `folder/.specdec.lock` only if it does not exist
# (locally `O_CREAT|O_EXCL`; on gs:// a TensorStore write whose precondition
# is "no such object", which GCS checks on the server, `ifGenerationMatch=0`).
# It holds a JSON record: program, pid, host, start time and a random token.
# A second run on the same folder finds it and is refused at startup, naming
# the holder. The lock is deleted when the run ends (also on an error or
# Ctrl-C), only if it is still the one this run wrote.
#
# A killed run (SIGKILL, power loss) leaves its lock behind. It is *stale*,
# and taken over with a warning, when
# * it names this host and its pid is not a live process here, or
# * it is older than `stale_after_s()` (24 h, or SPECDEC_LOCK_STALE_S): the
#   only test possible for a lock written on another host, or on gs://.
# Otherwise delete the file by hand after checking no run uses the folder.
# Taking over is atomic: locally the check and the unlink run under an
# `flock` of the folder (`io_utils.remove_if_unchanged`), so of several
# starters exactly one takes a stale lock over. A local lock that is not a
# regular file (a folder, a link) is refused, named, and left as it is.
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


# The settings of the run that last started writing here (hidden; read by
# the OVERWRITE rule for predictions files, which record none).
SETTINGS_FILE = ".specdec.settings.json"
# Where `predictions.PredictionsWriter` appends rows until the run ends.
PARTIAL_PREDICTIONS_FILE = "." + run_metrics.PREDICTIONS_FILE + ".partial"
PREDICTIONS_FILES = (run_metrics.PREDICTIONS_FILE, PARTIAL_PREDICTIONS_FILE)
# Every file a run's results are in, whole or partial (the OVERWRITE rule).
RESULT_FILES = (run_metrics.METRICS_FILE, run_metrics.ALPHA_FILE,
                run_metrics.INFER_FILE) + PREDICTIONS_FILES
# Arguments that do not make a run's results different (PRICE_CALL_COST:
# whether c is priced after the same decode; metrics.json says which).
NOT_SETTINGS = ("output_dir", "overwrite", "mode", "compile_topology",
                "price_call_cost")


def settings_record(args: arguments.RunArguments, target_config: T5Config,
                    draft_config: T5Config, vocab) -> Dict[str, Any]:
  """The run's `settings` (see the module docstring), JSON-normalized."""
  run_args = {
      k: v for k, v in dataclasses.asdict(args).items() if k not in NOT_SETTINGS
  }
  if args.mode == "infer":  # its predictions.jsonl rows are T5X's form
    run_args["mode"] = args.mode
  if (args.drafting
      == drafter_registry.DrafterSettings(ngram_corpus=args.ngram_corpus) and
      args.lenience == 1):
    # The paper's setting: recorded as before these options existed, so
    # earlier results still count as the same run.
    for k in arguments.DRAFTER_ARGS + ("lenience",):
      run_args.pop(k)
  # Likewise: each mode's own settings (ACCEPTANCE, a tree's, the beams')
  # in its runs only; Algorithm 1 is the default.
  for k in decode_modes.settings_to_drop(args):
    run_args.pop(k)
  if args.speculation == decode_modes.SPECULATION_ON:  # as before it existed
    run_args.pop("speculation")
  record = {
      "run": run_args,
      "target": gin_reader.t5_config_fields(target_config),
      "draft": gin_reader.t5_config_fields(draft_config),
      "vocabulary": {
          # `vocab.SentencePieceFile` reads as seqio's vocabulary does and
          # is recorded under its name: the same results, the same run.
          "kind": getattr(vocab, "seqio_kind",
                          type(vocab).__name__),
          "size": int(vocab.vocab_size),
          "file": getattr(vocab, "sentencepiece_model_file", None)
      },
  }
  return json.loads(json.dumps(record, sort_keys=True, default=str))


def comparable(settings: Any) -> Any:
  """A settings record as today's version writes it, for comparison.

  Earlier versions wrote a model's dtype as `str` of its type ("<class
  'numpy.float32'>") and a vocabulary file as the path resolved from the
  current directory (possibly relative); both name the same thing as
  today's "float32" and resolved path.
  """
  if not isinstance(settings, dict):
    return settings
  out = json.loads(json.dumps(settings))
  for role in ("target", "draft"):
    config = out.get(role)
    dtype = config.get("dtype") if isinstance(config, dict) else None
    match = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", str(dtype))
    if match:
      try:
        config["dtype"] = jnp.dtype(match.group(1)).name
      except TypeError:
        pass
  vocab = out.get("vocabulary")
  if isinstance(vocab, dict) and isinstance(vocab.get("file"), str):
    vocab["file"] = loading.resolve(vocab["file"])
  return out


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


def _recorded_settings(path: str) -> Any:
  """The `settings` a results file records (None: none, or unreadable)."""
  try:
    return comparable(json.loads(io_utils.read_text(path)).get("settings"))
  except (OSError, ValueError, AttributeError):
    return None


def check_output_dir(out: str, settings: Dict[str, Any], overwrite: bool,
                     program: str = "run") -> "_ResultsLock":
  """Creates and probes `out`, takes its lock, refuses another run's
  results there; returns the lock (the caller releases it).

  Raises:
    ConfigError: `out` is not a writable directory, another run holds it
      (`acquire`), or it holds a metrics.json / alpha.json of other
      settings (or of none) and `overwrite` is False.
  """
  created = not paths.is_url(out) and not os.path.exists(out)
  try:
    io_utils.probe_writable_dir(out)
  except ValueError as e:
    if created:  # e.g. a full disk: made, then not writable
      _remove_if_empty(out)
    raise ConfigError(f"OUTPUT_DIR={out!r}: {e}") from None
  lock = acquire(out, program)
  try:
    _check_results(out, settings, overwrite)
    # Whose results the folder will hold, before any is written: a
    # predictions file kept by this run (full disk, Ctrl-C) is protected
    # from a later run of other settings as metrics.json is.
    io_utils.write_json(os.path.join(out, SETTINGS_FILE),
                        {"settings": settings})
  except BaseException:
    lock.release()
    raise
  return _ResultsLock(lock, out)


class _ResultsLock:
  """The folder's lock; `release` also drops SETTINGS_FILE when the run
  kept no result file (nothing to protect: a folder the run created is
  then empty again, and removed)."""

  def __init__(self, lock: Lock, out: str):
    self.lock, self.out = lock, out

  def release(self) -> None:
    record = os.path.join(self.out, SETTINGS_FILE)
    try:
      if io_utils.isfile(record) and not any(
          _holds_results(self.out, name) for name in RESULT_FILES):
        io_utils.remove(record)
    except OSError as e:  # the results are written: only warn
      logging.warning("could not remove %s: %s", SETTINGS_FILE, e)
    self.lock.release()


def _holds_results(out: str, name: str) -> bool:
  """Whether `out/name` is a result file to protect: an empty `.partial`
  (killed before its first row) is not one, and would otherwise refuse
  every run of other settings for nothing."""
  path = os.path.join(out, name)
  if not io_utils.isfile(path):
    return False
  if name == PARTIAL_PREDICTIONS_FILE and not paths.is_url(path):
    try:
      return os.path.getsize(path) > 0
    except OSError:
      return False
  return True


def _remove_if_empty(folder: str) -> None:
  try:
    os.rmdir(folder)
  except OSError:
    pass


def _check_results(out: str, settings: Dict[str, Any], overwrite: bool) -> None:
  """The OVERWRITE rule (see `check_output_dir`): every result file, whole
  or partial. metrics.json and alpha.json record their settings; the
  predictions files are the run's that SETTINGS_FILE (or metrics.json)
  names."""
  settings = comparable(settings)
  for name in RESULT_FILES:
    path = os.path.join(out, name)
    if not _holds_results(out, name):
      continue
    old = _recorded_settings(path)
    if name in PREDICTIONS_FILES:
      old = _recorded_settings(os.path.join(out, run_metrics.METRICS_FILE))
      if old is None:
        old = _recorded_settings(os.path.join(out, SETTINGS_FILE))
    if old == settings or overwrite:
      if old != settings:
        logging.warning(
            "OVERWRITE=True: replacing %s (a run with other "
            "settings).", path)
      continue
    what = ("records no settings (written by another program or an older "
            "version)" if old is None else "is from a run with other "
            "settings: " + settings_diff(old, settings))
    if name in PREDICTIONS_FILES:
      what = ("was kept from a run that did not finish, of other settings "
              "or of unknown ones" +
              (f" ({settings_diff(old, settings)})" if old is not None else ""))
    raise ConfigError(
        f"OUTPUT_DIR={out!r} holds {name}, which {what}. Refusing to "
        "overwrite it: choose another OUTPUT_DIR, or pass "
        "--gin.OVERWRITE=True to replace it.")
