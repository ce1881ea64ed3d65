"""COMPILE_TOPOLOGY without libtpu's start-up noise on the console.

Compiling for a TPU topology on a machine without a TPU, libtpu (C++,
straight to file descriptor 2) first probes for the TPU VM it is not on,
and says so in lines that read like a crash:

    WARNING: Logging before InitGoogle() is written to STDERR
    E0000 00:00:1795786967.017083   31168 common_lib.cc:554] INVALID_ARGUMENT:
      Error: unexpected worker hostname 'WARNING: could not determine TPU
      worker hostnames or IP addresses' from env var TPU_WORKER_HOSTNAMES...
    === Source Location Trace: ===
    learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327

They are expected here (nothing runs on a TPU: the programs are only
compiled), so `captured_libtpu_noise` sends fd 2 through a pipe while the
topology is built and the programs compiled: lines `LibtpuNoise` knows are
kept aside (then saved to OUTPUT_DIR/libtpu.log and named in one line),
every other line goes to the console as it comes, at once (progress lines
included). If the compile fails, the kept lines are written to the console
too: nothing that might explain a failure is hidden.

Every command meets the same lines, at JAX's first use, wherever the tpu
extra is installed on a machine without a TPU (CI; a workstation that
compiles for TPU ahead of time): JAX then runs on the CPU as without
libtpu. `start_backends_quietly` starts the backends at the command's start
with them kept aside the same way (COMPILE_TOPOLOGY saves them too).
"""
import contextlib
import importlib.util
import os
import re
import sys
import threading
from typing import Iterator, List

from absl import logging

from specdec_jax.files import io_utils

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
