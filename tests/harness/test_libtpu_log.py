"""Issue 44: COMPILE_TOPOLOGY (and every command: `console.setup`) keeps
libtpu's start-up noise (its search for a TPU VM, which reads like a
crash) off the console, saves it, and says so in one line; every other
stderr line passes at once. Tested on libtpu's real text, not on a TPU."""
import os
import sys

import pytest

from specdec_jax.terminal import console

# What libtpu 0.0.42 wrote on fd 2 for `get_topology_desc('v4:2x2x1')` on a
# CPU host (copied from a real run).
LIBTPU = (
    "Failed to find host bounds for accelerator type: WARNING: could not "
    "determine TPU accelerator type, please set env var "
    "`TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly "
    "initialize.\n"
    "WARNING: Logging before InitGoogle() is written to STDERR\n"
    "E0000 00:00:1795786967.017083   31168 common_lib.cc:554] "
    "INVALID_ARGUMENT: Error: unexpected worker hostname 'WARNING: could not "
    "determine TPU worker hostnames or IP addresses' from env var "
    "TPU_WORKER_HOSTNAMES. Expecting a valid hostname or IP address without "
    "port number, or hostname:port:address triple.\n"
    "=== Source Location Trace: ===\n"
    "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n")
# Lines that are not that noise: a real libtpu error, absl's progress
# lines (glog's format too), a Python warning.
REAL = ("E0000 00:00:1795786967.1 1 tpu_compiler.cc:99] RESOURCE_EXHAUSTED: "
        "out of memory\n"
        "I1127 13:47:24.776026 140363844807552 progress.py:55] "
        "COMPILE_TOPOLOGY: compiling\n"
        "UserWarning: something else\n")


def test_known_noise_is_split_from_everything_else():
  kept, noise = console.split_noise(LIBTPU + REAL)
  assert "".join(noise) == LIBTPU
  assert "".join(kept) == REAL


def test_a_trace_block_ends_at_its_last_source_location():
  text = ("=== Source Location Trace: ===\n"
          "learning/a/b.cc:1\n"
          "third_party/x/y.h:22\n"
          "real line after the trace\n"
          "learning/a/b.cc:1\n")  # no longer in a trace: kept
  kept, noise = console.split_noise(text)
  assert noise == text.splitlines(keepends=True)[:3]
  assert kept == ["real line after the trace\n", "learning/a/b.cc:1\n"]


def test_fd2_noise_is_kept_aside_and_the_rest_passes(capfd, tmp_path):
  noise = []
  with console.captured_libtpu_noise(noise):
    os.write(2, (LIBTPU + REAL).encode())  # as C++ writes: fd 2
    print("python's own stderr line", file=sys.stderr)
  err = capfd.readouterr().err
  assert "unexpected worker hostname" not in err
  assert "Source Location Trace" not in err
  assert "RESOURCE_EXHAUSTED" in err and "python's own stderr line" in err
  assert "".join(noise) == LIBTPU
  console.save_noise(noise, str(tmp_path))
  assert (tmp_path / console.LOG_FILE).read_text() == LIBTPU


def test_save_noise_names_the_file_in_one_line(tmp_path, caplog):
  caplog.set_level("INFO")
  console.save_noise(["a\n", "b\n"], str(tmp_path))
  lines = [r.getMessage() for r in caplog.records]
  assert len(lines) == 1 and lines[0].startswith("libtpu: 2 log lines "
                                                 "suppressed")
  assert str(tmp_path / console.LOG_FILE) in lines[0]
  console.save_noise([], str(tmp_path / "none"))  # nothing said: nothing
  assert not (tmp_path / "none").exists()


def test_on_a_failure_the_noise_is_shown_too(capfd):
  noise = []
  with pytest.raises(RuntimeError):
    with console.captured_libtpu_noise(noise):
      os.write(2, LIBTPU.encode())
      raise RuntimeError("compile failed")
  assert "unexpected worker hostname" in capfd.readouterr().err
