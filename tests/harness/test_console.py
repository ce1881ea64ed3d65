"""First impressions (issue 13): console noise, valid JSON, output probing."""
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from specdec_jax.terminal import console
from specdec_jax.files import io_utils

# Lines TensorFlow prints from C++ while being imported on a CPU-only host.
TF_NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR\n",
    "I0000 00:00:1795382621.848718    5147 cudart_stub.cc:31] Could not find "
    "cuda drivers on your machine, GPU will not be used.\n",
    "E0000 00:00:1795382625.180212    5147 cuda_platform.cc:52] failed call "
    "to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR "
    "(303)\n",
    "E0000 00:00:1795382625.1 1 cuda_dnn.cc:8310] Unable to register cuDNN "
    "factory: Attempting to register factory for plugin cuDNN when one has "
    "already been registered\n",
    # Issue 44: twice on every command.
    "I0000 00:00:1795781022.363320    4366 port.cc:153] oneDNN custom "
    "operations are on. You may see slightly different numerical results due "
    "to floating-point round-off errors from different computation orders. "
    "To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.\n",
]
REAL = "E0000 00:00:1795382625.1 1 some_op.cc:1] disk full\n"


def test_tensorflow_import_noise_dropped_real_lines_kept(capfd):
  with console.filtered_stderr(console.is_tensorflow_import_noise):
    for line in TF_NOISE + [REAL]:
      os.write(2, line.encode())
  assert capfd.readouterr().err == REAL


def test_everything_replayed_when_the_body_fails(capfd):
  with pytest.raises(RuntimeError):
    with console.filtered_stderr(console.is_tensorflow_import_noise):
      os.write(2, TF_NOISE[1].encode())
      raise RuntimeError("import failed")
  assert capfd.readouterr().err == TF_NOISE[1]


def test_a_childs_late_lines_reach_stderr_not_a_file_opened_after(
    capfd, tmp_path):
  """A child that outlives the block keeps the pipe open: its late line
  still goes to stderr, never into a file that took the number of the
  block's saved stderr (closed too early, it was the lowest free one)."""
  with console.filtered_stderr(lambda line: False, join_s=0.1):
    child = subprocess.Popen([
        sys.executable, "-c",
        "import sys, time; time.sleep(1); sys.stderr.write('late\\n')"
    ])
  opened = open(tmp_path / "after.txt", "w", encoding="utf-8")
  try:
    assert child.wait(timeout=30) == 0
    time.sleep(0.5)  # The reader passes the line on.
  finally:
    opened.close()
  assert (tmp_path / "after.txt").read_text(encoding="utf-8") == ""
  assert "late" in capfd.readouterr().err


def test_quiet_backend_probe_dropped_real_errors_kept():
  logger = logging.getLogger("jax._src.xla_bridge")
  seen = []

  class Keep(logging.Handler):

    def emit(self, record):
      seen.append(record.getMessage())

  handler = Keep()
  logger.addHandler(handler)
  level = logger.level
  logger.setLevel(logging.INFO)
  try:
    console.quiet_backend_probing()
    console.quiet_backend_probing()  # idempotent
    logger.info("Unable to initialize backend 'tpu': INTERNAL: Failed to "
                "open libtpu.so")
    logger.warning("Unable to initialize backend 'cuda': driver too old")
    logger.info("Something else")
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
  assert seen == [
      "Unable to initialize backend 'cuda': driver too old", "Something else"
  ]


def _strict_loads(text):

  def reject(name):
    raise ValueError(f"not JSON: {name}")

  return json.loads(text, parse_constant=reject)


def test_non_finite_values_written_as_null(tmp_path, caplog):
  path = tmp_path / "m.json"
  io_utils.write_json(
      path, {
          "speedup": float("inf"),
          "nested": {
              "alpha": float("nan")
          },
          "list": [1.0, float("-inf")],
          "ok": 0.5
      })
  data = _strict_loads(path.read_text())
  assert data == {
      "speedup": None,
      "nested": {
          "alpha": None
      },
      "list": [1.0, None],
      "ok": 0.5
  }
  assert "speedup is inf" in caplog.text and "nested.alpha" in caplog.text


def test_probe_writable_dir(tmp_path):
  io_utils.probe_writable_dir(tmp_path / "new" / "dir")
  assert os.listdir(tmp_path / "new" / "dir") == []  # probe file removed
  a_file = tmp_path / "file"
  a_file.write_text("x")
  for path in (a_file, a_file / "sub"):
    with pytest.raises(ValueError, match="not a writable directory"):
      io_utils.probe_writable_dir(path)
  assert a_file.read_text() == "x"


def test_a_sigterm_whose_interrupt_was_swallowed_still_ends_the_loop():
  """`sigterm_as_interrupt`: a SIGTERM's KeyboardInterrupt that something
  swallowed (here an except clause; in a run, a finalizer that was
  running) is raised again by `raise_if_terminated`, and only inside."""
  received, before = [], signal.getsignal(signal.SIGTERM)
  with console.sigterm_as_interrupt(received):
    console.raise_if_terminated()  # nothing received yet
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(1)  # the handler runs at the next bytecode
    except KeyboardInterrupt:
      pass  # swallowed
    assert received == [signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt):
      console.raise_if_terminated()
  console.raise_if_terminated()  # the body is over: nothing pending
  assert signal.getsignal(signal.SIGTERM) is before
