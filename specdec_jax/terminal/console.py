"""What the command-line entry points print before the real work starts.

A newcomer's first screen should hold the run's own lines, not the probing
of hardware this project never asks for:

* JAX tries every backend it knows and, when one is absent (no libtpu on a
  CPU or GPU host), logs `Unable to initialize backend 'tpu': ...` at INFO.
  That probe is expected to fail quietly; JAX raises on its own when a
  backend the user *asked for* (`JAX_PLATFORMS`) cannot start, and those
  errors stay visible. `quiet_backend_probing` drops only the quiet probe's
  lines.
* TensorFlow (imported by seqio for data pipelines; it never runs models
  here and `tasks` hides GPUs from it) prints from C++, on import, that it
  found no CUDA driver, failed `cuInit`, or registered cuDNN/cuFFT/cuBLAS
  twice. `import_tensorflow_quietly` imports it with the process's stderr
  captured and writes back every line except those known, harmless ones.
* With the tpu extra on a machine without a TPU, JAX's first use loads
  libtpu, which prints an error block while it searches for a TPU VM
  (`start_backends_quietly` keeps it off the console).
"""
import contextlib
import importlib.util
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator, List, Sequence, Tuple

from absl import logging as absl_logging

from specdec_jax.files import io_utils

# TensorFlow's import-time lines that say nothing about this program's run
# (TF is used for input pipelines only, on the CPU).
_TF_IMPORT_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written "
    r"to STDERR"
    r"|cudart_stub\.cc.*Could not find cuda drivers"
    r"|cuda_platform\.cc.*failed call to cuInit"
    r"|cuda_(dnn|fft|blas)\.cc.*Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation_placer\.cc.*already registered"
    r"|cpu_feature_guard\.cc.*This TensorFlow binary is optimized"
    r"|port\.cc.*oneDNN custom operations are on"
    r"|^To enable the following instructions: .* rebuild TensorFlow")


def is_tensorflow_import_noise(line: str) -> bool:
  return bool(_TF_IMPORT_NOISE.search(line))


@contextlib.contextmanager
def filtered_stderr(drop: Callable[[str], bool]) -> Iterator[None]:
  """Captures file descriptor 2 (C++ logs too); replays lines not dropped.

  Everything is replayed if the body raises, so nothing real is lost.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  failed = False
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    except BaseException:
      failed = True
      raise
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode("utf-8", errors="replace")
      kept = [
          line for line in text.splitlines(keepends=True)
          if failed or not drop(line)
      ]
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def import_tensorflow_quietly() -> None:
  """Imports seqio (and with it TensorFlow) without its CUDA-probe lines."""
  if "seqio" in sys.modules:
    return
  with filtered_stderr(is_tensorflow_import_noise):
    import seqio  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import


class _DropQuietBackendProbe(logging.Filter):
  """JAX's INFO line for a backend probe that failed quietly."""

  def filter(self, record):
    return not (record.levelno < logging.WARNING and
                str(record.msg).startswith("Unable to initialize backend"))


_PROBE_FILTER = _DropQuietBackendProbe()


def quiet_backend_probing() -> None:
  """Stops JAX logging its expected, quiet backend-probe failures."""
  logger = logging.getLogger("jax._src.xla_bridge")
  if _PROBE_FILTER not in logger.filters:
    logger.addFilter(_PROBE_FILTER)


def setup() -> None:
  """Console set-up for `run`, `sweep` and `certify` (call at the start
  of main, after `multihost`'s initialization: it starts JAX's backends).

  TensorFlow is not imported here: a run that needs neither a seqio task
  nor a seqio vocabulary never imports it (each import site goes through
  `import_tensorflow_quietly`)."""
  quiet_backend_probing()
  start_backends_quietly()


# ---------------------------------------------------------------------------
# One line per error (`run`, `sweep`, `train`): tracebacks behind a flag.
# ---------------------------------------------------------------------------
TRACEBACK_FLAG = "traceback"
EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, as a shell reports it
# gin appends this to any error raised inside a configurable; it names a
# function object, nothing the user typed.
_GIN_CALL_NOTE = re.compile(r"\s*In call to configurable '[^']*' \(<[^>]*>\)")


def define_traceback_flag() -> None:
  """--traceback on absl's global flags (idempotent)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  if TRACEBACK_FLAG not in flags.FLAGS:
    flags.DEFINE_boolean(
        TRACEBACK_FLAG, False,
        "On an error, print the full traceback instead of "
        "one line (for bug reports).")


def error_text(e: BaseException) -> str:
  """An error's message without gin's "In call to configurable" notes."""
  return _GIN_CALL_NOTE.sub("", str(e)).strip()


def _wants_traceback() -> bool:
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    return bool(getattr(flags.FLAGS, TRACEBACK_FLAG))
  except (AttributeError, flags.Error):
    return False


def run_cli(program: str, body: Callable[[], None], bad_input: tuple,
            failures: tuple = (OSError,)) -> int:
  """Runs an entry point's `body`; its exit status.

  `bad_input` errors (a setting, a checkpoint, a locked folder) print
  "`program`: error: MESSAGE" and give 2; `failures` (a write that failed,
  an unreachable gs://, a diverged training) one line and 1; Ctrl-C one
  line (what was kept) and 130; SIGTERM the same, and 143. Anything else is a bug: its traceback is
  shown. With --traceback every error shows its traceback.
  """
  received = []
  try:
    with sigterm_as_interrupt(received):
      body()
  except bad_input + failures as e:
    if _wants_traceback():
      raise
    line = f"{program}: error: {error_text(e)}"
    print(line, file=sys.stderr)
    if not isinstance(e, bad_input) and not _stdout_is_stderr():
      # A failure after the run printed its summary (a full disk): the
      # summary's last line names the result files, which may not exist.
      # stdout's last line says what happened instead.
      print(line, flush=True)
    return EXIT_BAD_INPUT if isinstance(e, bad_input) else EXIT_FAILED
  except KeyboardInterrupt as e:
    if _wants_traceback():
      raise
    kept = str(e) or "files already written in the output folder are kept"
    how = "SIGTERM" if received else "Ctrl-C"
    print(f"{program}: interrupted ({how}): {kept}.", file=sys.stderr)
    return EXIT_TERMINATED if received else EXIT_INTERRUPTED
  return 0


def _stdout_is_stderr() -> bool:
  """Both streams go to one place (a terminal): one line is enough."""
  try:
    return os.path.sameopenfile(sys.stdout.fileno(), sys.stderr.fileno())
  except (AttributeError, OSError, ValueError):  # not real files (a test)
    return False


# The SIGTERMs `sigterm_as_interrupt` received in its body
# (`raise_if_terminated`).
_PENDING_SIGTERM: list = []


def raise_if_terminated() -> None:
  """Raises KeyboardInterrupt if `sigterm_as_interrupt` received a SIGTERM
  whose KeyboardInterrupt did not end its body: Python runs a handler at
  the next bytecode, and raised while a finalizer or a weakref callback
  runs, the exception is only printed ("Exception ignored") and the body
  goes on. Long loops call it between their units of work (a decode's
  batches)."""
  if _PENDING_SIGTERM:
    raise KeyboardInterrupt()


@contextlib.contextmanager
def sigterm_as_interrupt(received: list) -> Iterator[None]:
  """SIGTERM (what batch schedulers and `kill` send) ends the body as
  Ctrl-C does: a KeyboardInterrupt, so the lock is released and what was
  decoded is kept and named; `received` gets the signal. The previous
  handler is restored afterwards. Only the main thread can set handlers:
  elsewhere (a test's thread) the body runs as it is."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def interrupt(signum, frame):
    del frame
    received.append(signum)
    _PENDING_SIGTERM.append(signum)
    raise KeyboardInterrupt()

  previous = signal.signal(signal.SIGTERM, interrupt)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)
    _PENDING_SIGTERM.clear()


def exit_process(code: int) -> None:
  """`sys.exit(code)`; after Ctrl-C, `os._exit` once output is flushed.

  A KeyboardInterrupt can land while JAX or TensorStore threads are busy
  (loading, compiling); the interpreter's normal shutdown then crashes in
  their destructors (a segfault after the one line). Everything this
  program writes is already flushed or renamed into place, so nothing is
  lost by skipping it.

  A SIGTERM during the shutdown (seconds, with JAX's threads) ends the
  process at once with 143 and a line, instead of the default action's
  silent -15: the work is done by then.
  """
  if code not in (EXIT_INTERRUPTED, EXIT_TERMINATED):
    if threading.current_thread() is threading.main_thread():
      signal.signal(signal.SIGTERM, _terminated_while_exiting)
    sys.exit(code)
  _flush_and_exit(code)


def _terminated_while_exiting(signum, frame) -> None:
  del signum, frame
  print(
      "interrupted (SIGTERM) while exiting: everything was already "
      "written.", file=sys.stderr)
  _flush_and_exit(EXIT_TERMINATED)


def _flush_and_exit(code: int) -> None:
  sys.stdout.flush()
  sys.stderr.flush()
  for handler in logging.getLogger().handlers:
    handler.flush()
  os._exit(code)  # pylint: disable=protected-access


# While a phase runs, a line every this many seconds ("still ...").
# -- progress ------------------------------------------------------------------
# One plain progress line for every phase that takes more than a moment.
#
# `run`, `sweep` and `train` say on stderr (absl logging, as every other
# progress line) what they are doing whenever it takes longer than about
# 2 s, so that no wait is silent (issue 44): compiling (each program, "k/n",
# with its seconds), GAMMA='auto' / TREE_WIDTH='auto' pilots (with their
# sample size), pricing c, reading a checkpoint, the train step's compile
# and first steps, COMPILE_TOPOLOGY.
#
# * `phase(start)`: logs `start` when the phase begins, "... still running"
#   every `HEARTBEAT_S` seconds while it runs, and "`start`: done in X s"
#   when it ends.
# * `numbered(items, verb)`: runs (label, fn) items one by one, logging
#   "compiled 2/4 (the speculative decoder, input width 16) in 3.1 s" after
#   each, with the same heartbeat while one runs.
#
# Each line is one line, in words; nothing here changes what is computed.
HEARTBEAT_S = 30.0


@contextlib.contextmanager
def heartbeat(what: str, every_s: float = HEARTBEAT_S) -> Iterator[None]:
  """Logs "`what`: still running, N s so far" every `every_s` seconds
  until the block ends (a daemon thread; nothing when it ends sooner)."""
  done = threading.Event()
  start = time.perf_counter()

  def beat():
    while not done.wait(every_s):
      absl_logging.info("%s: still running, %.0f s so far", what,
                        time.perf_counter() - start)

  thread = threading.Thread(target=beat, name="progress-heartbeat", daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()


@contextlib.contextmanager
def phase(start: str, every_s: float = HEARTBEAT_S) -> Iterator[None]:
  """Logs `start`, a heartbeat while the block runs, then "`start`: done
  in X s" (nothing more when the block raises: its error says why)."""
  absl_logging.info("%s", start)
  t0 = time.perf_counter()
  with heartbeat(start, every_s):
    yield
  absl_logging.info("%s: done in %.1f s", start, time.perf_counter() - t0)


def numbered(items: Sequence[Tuple[str, Callable[[], Any]]],
             doing: str = "compiling", done: str = "compiled",
             every_s: float = HEARTBEAT_S) -> List[float]:
  """Runs each (label, fn) in order; after each, one line "`done` k/n
  (label) in X s" (while one runs: "`doing` k/n (label): still running").
  Returns each item's seconds."""
  seconds = []
  n = len(items)
  for k, (label, fn) in enumerate(items, 1):
    t0 = time.perf_counter()
    with heartbeat(f"{doing} {k}/{n} ({label})", every_s):
      fn()
    seconds.append(time.perf_counter() - t0)
    absl_logging.info("%s %d/%d (%s) in %.1f s", done, k, n, label, seconds[-1])
  return seconds


# -- libtpu log ----------------------------------------------------------------
# COMPILE_TOPOLOGY without libtpu's start-up noise on the console.
#
# Compiling for a TPU topology on a machine without a TPU, libtpu (C++,
# straight to file descriptor 2) first probes for the TPU VM it is not on,
# and says so in lines that read like a crash:
#
#     WARNING: Logging before InitGoogle() is written to STDERR
#     E0000 00:00:1795786967.017083   31168 common_lib.cc:554] INVALID_ARGUMENT:
#       Error: unexpected worker hostname 'WARNING: could not determine TPU
#       worker hostnames or IP addresses' from env var TPU_WORKER_HOSTNAMES...
#     === Source Location Trace: ===
#     learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327
#
# They are expected here (nothing runs on a TPU: the programs are only
# compiled), so `captured_libtpu_noise` sends fd 2 through a pipe while the
# topology is built and the programs compiled: lines `LibtpuNoise` knows are
# kept aside (then saved to OUTPUT_DIR/libtpu.log and named in one line),
# every other line goes to the console as it comes, at once (progress lines
# included). If the compile fails, the kept lines are written to the console
# too: nothing that might explain a failure is hidden.
#
# Every command meets the same lines, at JAX's first use, wherever the tpu
# extra is installed on a machine without a TPU (CI; a workstation that
# compiles for TPU ahead of time): JAX then runs on the CPU as without
# libtpu. `start_backends_quietly` starts the backends at the command's start
# with them kept aside the same way (COMPILE_TOPOLOGY saves them too).
LOG_FILE = "libtpu.log"
# libtpu's lines about the TPU VM it looks for (accelerator type, worker
# hostnames), and glog's note that it logs before its own initialization.
_NOISE = re.compile(
    r"unexpected worker hostname"
    r"|could not determine TPU (accelerator type|worker hostnames)"
    r"|Failed to find host bounds for accelerator type"
    r"|^WARNING: Logging before InitGoogle\(\) is written to STDERR")
_TRACE_START = re.compile(r"^=== Source Location Trace: ?===\s*$")
# A trace's lines: one source location each (`dir/file.cc:327`).
_TRACE_LINE = re.compile(r"^\s*[\w./+-]+\.(cc|h|c|cpp):\d+\s*$")

# libtpu's lines kept aside by `start_backends_quietly` (once per process).
_STARTUP_NOISE: List[str] = []


def _libtpu_without_a_tpu() -> bool:
  """libtpu installed, no TPU chip on this machine, JAX_PLATFORMS unset
  (a user's choice of backends is theirs) and no backend started yet."""
  if (os.environ.get("JAX_PLATFORMS") or
      importlib.util.find_spec("libtpu") is None):
    return False
  try:  # JAX's own test for TPU chips (PCI vendor ids); private
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
    return chips == 0 and not xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError, OSError):
    return False


def start_backends_quietly() -> None:
  """Starts JAX's backends now with libtpu's noise kept aside
  (`startup_noise`), where libtpu can only fail to find a TPU
  (`_libtpu_without_a_tpu`); elsewhere nothing happens."""
  if not _libtpu_without_a_tpu():
    return
  import jax  # pylint: disable=g-import-not-at-top
  with captured_libtpu_noise(_STARTUP_NOISE):
    jax.devices()


def startup_noise() -> List[str]:
  """The lines `start_backends_quietly` kept aside in this process."""
  return list(_STARTUP_NOISE)


class LibtpuNoise:
  """Says, line by line, whether a line is libtpu's known start-up noise
  (stateful: a `=== Source Location Trace: ===` block is noise up to its
  last source-location line)."""

  def __init__(self):
    self._in_trace = False

  def __call__(self, line: str) -> bool:
    if self._in_trace and _TRACE_LINE.match(line):
      return True
    self._in_trace = bool(_TRACE_START.match(line))
    return self._in_trace or bool(_NOISE.search(line))


def split_noise(text: str):
  """(kept, noise): `text`'s lines, each in one list, in order."""
  is_noise, kept, noise = LibtpuNoise(), [], []
  for line in text.splitlines(keepends=True):
    (noise if is_noise(line) else kept).append(line)
  return kept, noise


@contextlib.contextmanager
def captured_libtpu_noise(noise: List[str]) -> Iterator[None]:
  """Inside the block, fd 2 goes through a pipe: libtpu's noise is
  appended to `noise`, every other line written on at once. On an error
  the noise is written too (after the block's own lines)."""
  sys.stderr.flush()
  saved = os.dup(2)
  read_end, write_end = os.pipe()
  os.dup2(write_end, 2)
  os.close(write_end)
  is_noise = LibtpuNoise()

  def pump():
    with os.fdopen(read_end, "rb") as pipe:
      for raw in pipe:
        line = raw.decode("utf-8", errors="replace")
        if is_noise(line):
          noise.append(line)
        else:
          os.write(saved, raw)

  reader = threading.Thread(target=pump, name="libtpu-stderr", daemon=True)
  reader.start()
  failed = False
  try:
    yield
  except BaseException:
    failed = True
    raise
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)  # closes the pipe's last write end: the reader ends
    reader.join(timeout=10)  # (unless a child process holds a copy)
    os.close(saved)
    if failed and noise:
      sys.stderr.write("".join(noise))
      sys.stderr.flush()


def save_noise(noise: List[str], output_dir: str) -> None:
  """OUTPUT_DIR/libtpu.log, and one line saying what it holds (nothing
  when libtpu said nothing)."""
  if not noise:
    return
  path = os.path.join(output_dir, LOG_FILE)
  io_utils.atomic_write(path, "".join(noise))
  logging.info(
      "libtpu: %d log lines suppressed (its search for a TPU VM's workers, "
      "expected when compiling without a TPU: 'unexpected worker hostname', "
      "'Source Location Trace'); saved in %s", len(noise), path)
