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
"""
import contextlib
import logging
import os
import re
import sys
import tempfile
from typing import Callable, Iterator

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
      kept = [line for line in text.splitlines(keepends=True)
              if failed or not drop(line)]
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def import_tensorflow_quietly() -> None:
  """Imports seqio (and with it TensorFlow) without its CUDA-probe lines."""
  if "seqio" in sys.modules:
    return
  with filtered_stderr(is_tensorflow_import_noise):
    import seqio  # pylint: disable=g-import-not-at-top,unused-import


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
  """Console set-up for `run` and `sweep` (call at the start of main)."""
  quiet_backend_probing()
  import_tensorflow_quietly()
