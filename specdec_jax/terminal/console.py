"""What the commands print: their own lines, one line per error, progress.

The libraries' probing noise is kept off the first screen (JAX's quiet
backend probes, TensorFlow's CUDA lines, libtpu's search for a TPU VM);
`run_cli` turns errors into one line and an exit status; `phase` and
`numbered` give every phase over a moment a progress line.
"""
import contextlib
import importlib.util
import logging
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from absl import logging as absl_logging

from specdec_jax.files import io_utils

# TensorFlow's import-time lines (it runs input pipelines only, on the CPU).
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


def import_tensorflow_quietly() -> None:
  """Imports seqio (and with it TensorFlow) without its CUDA-probe lines."""
  if "seqio" in sys.modules:
    return
  with filtered_stderr(is_tensorflow_import_noise):
    import seqio  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import


def _keep_unless_quiet_probe(record: logging.LogRecord) -> bool:
  """False for JAX's INFO line for a backend probe that failed quietly."""
  return not (record.levelno < logging.WARNING and
              str(record.msg).startswith("Unable to initialize backend"))


def quiet_backend_probing() -> None:
  """Stops JAX logging its expected, quiet backend-probe failures."""
  logger = logging.getLogger("jax._src.xla_bridge")
  if _keep_unless_quiet_probe not in logger.filters:
    logger.addFilter(_keep_unless_quiet_probe)


def setup() -> None:
  """Console set-up for `run`, `sweep` and `certify`, after `multihost`'s
  initialization (it starts JAX's backends)."""
  quiet_backend_probing()
  start_backends_quietly()


# -- one line per error: tracebacks behind --traceback ------------------------
TRACEBACK_FLAG = "traceback"
EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, as a shell reports it
# gin's note on errors raised in a configurable: nothing the user typed.
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

  `bad_input` errors print "`program`: error: MESSAGE" and give 2;
  `failures` one line and 1; Ctrl-C one line (what was kept) and 130;
  SIGTERM the same and 143; anything else (a bug) its traceback, as does
  every error with --traceback.
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
      # After the summary (a full disk): stdout's last line must not name
      # result files that were not written.
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


# The SIGTERMs `sigterm_as_interrupt` received in its body.
_PENDING_SIGTERM: list = []


def raise_if_terminated() -> None:
  """KeyboardInterrupt if a SIGTERM's did not end `sigterm_as_interrupt`'s
  body (raised in a finalizer, it is only printed)."""
  if _PENDING_SIGTERM:
    raise KeyboardInterrupt()


@contextlib.contextmanager
def sigterm_as_interrupt(received: list) -> Iterator[None]:
  """SIGTERM, appended to `received`, ends the body as Ctrl-C does (off the
  main thread, which cannot set handlers, the body runs as it is)."""
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
  """`sys.exit(code)`; after Ctrl-C or SIGTERM, `os._exit` once output is
  flushed (the normal shutdown can crash in busy JAX or TensorStore
  threads' destructors; everything is written already). A SIGTERM during
  the shutdown ends it at once with 143 and a line."""
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


# -- progress ------------------------------------------------------------------
# No wait over ~2 s is silent (absl logging, stderr); while a phase runs, a
# "still running" line every HEARTBEAT_S seconds.
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
  """Runs each (label, fn), logging "`done` k/n (label) in X s" after each
  and a heartbeat while it runs; returns each item's seconds."""
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
# On a machine without a TPU, libtpu (C++, fd 2) searches for the TPU VM it
# is not on, in lines that read like a crash ("unexpected worker hostname",
# a "Source Location Trace"). They are kept aside while JAX starts and while
# COMPILE_TOPOLOGY compiles (saved to OUTPUT_DIR/libtpu.log), every other
# line passing at once; on a failure they are shown too.
LOG_FILE = "libtpu.log"
_NOISE = re.compile(
    r"unexpected worker hostname"
    r"|could not determine TPU (accelerator type|worker hostnames)"
    r"|Failed to find host bounds for accelerator type"
    r"|^WARNING: Logging before InitGoogle\(\) is written to STDERR")
_TRACE_START = re.compile(r"^=== Source Location Trace: ?===\s*$")
_TRACE_LINE = re.compile(r"^\s*[\w./+-]+\.(cc|h|c|cpp):\d+\s*$")

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
  (`startup_noise`) where libtpu can only fail to find a TPU."""
  if not _libtpu_without_a_tpu():
    return
  import jax  # pylint: disable=g-import-not-at-top
  with captured_libtpu_noise(_STARTUP_NOISE):
    jax.devices()


def startup_noise() -> List[str]:
  """The lines `start_backends_quietly` kept aside in this process."""
  return list(_STARTUP_NOISE)


class LibtpuNoise:
  """Whether each line is libtpu's start-up noise (stateful: a trace block
  is noise up to its last source-location line)."""

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


def captured_libtpu_noise(noise: List[str]):
  """`filtered_stderr` of libtpu's start-up noise."""
  return filtered_stderr(LibtpuNoise(), noise)


@contextlib.contextmanager
def filtered_stderr(drop: Callable[[str],
                                   bool], dropped: Optional[List[str]] = None,
                    join_s: float = 10.0) -> Iterator[None]:
  """fd 2 through a pipe for the block: `drop`'s lines go to `dropped`
  (written out on an error), the others pass at once.

  A child process started in the block keeps a copy of the pipe's write
  end: the reader then outlives the block (`join_s` waited) and goes on
  passing the child's lines to the real stderr, whose descriptor it closes
  itself when the pipe ends (closed here, the number could be reused by a
  file opened next, and the child's lines written into that file).
  """
  dropped = [] if dropped is None else dropped
  sys.stderr.flush()
  saved = os.dup(2)
  read_end, write_end = os.pipe()
  os.dup2(write_end, 2)
  os.close(write_end)
  lock, state = threading.Lock(), {"done": False, "handed_over": False}

  def pump():
    with os.fdopen(read_end, "rb") as pipe:
      for raw in pipe:
        line = raw.decode("utf-8", errors="replace")
        if drop(line):
          dropped.append(line)
        else:
          os.write(saved, raw)
    with lock:
      state["done"] = True
      if state["handed_over"]:
        os.close(saved)

  reader = threading.Thread(target=pump, name="stderr-filter", daemon=True)
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
    reader.join(timeout=join_s)  # (unless a child process holds a copy)
    with lock:
      if state["done"]:
        os.close(saved)
      else:
        state["handed_over"] = True
    if failed and dropped:
      sys.stderr.write("".join(dropped))
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
