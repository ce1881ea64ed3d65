"""Nothing lost, nothing silent (issues 26 and 37) end to end: real `run`
processes and real runs meeting faults (the rest, without a model or a
process: tests/harness/test_failures.py).

(1) two runs on one OUTPUT_DIR (two real processes), a killed holder's
stale lock, and (6) Ctrl-C (a real SIGINT); (3) a gs:// endpoint that
never answers or refuses (loopback only); (5) a full disk (an injected
ENOSPC) during a tiny run; (6) a missing checkpoint: one line, exit 2;
issue 37: SIGTERM while decoding, and while the interpreter exits.
"""
import errno
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

from conftest import REPO
import pytest
from run_helpers import gcs_at
from run_helpers import refused_gcs
from run_helpers import subprocess_env
from run_helpers import tiny_run_plan

from specdec_jax.experiment import predictions as predictions_lib
from specdec_jax.experiment import runner
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


# ---------------------------------------------------------------------------
# (1) One run at a time per OUTPUT_DIR; (6) Ctrl-C: one line, exit 130.
# ---------------------------------------------------------------------------
def _default_sigint() -> None:
  """Ctrl-C as in a terminal, whatever the test process did to SIGINT: an
  ignored or blocked signal is inherited by a child (seen only in the whole
  suite under pytest-xdist, where the run then never saw the Ctrl-C)."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _signal_state(pid: int) -> str:
  """The Sig* lines of /proc/<pid>/status (which signals are ignored,
  blocked, caught), for a failure message."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return " ".join(l.strip() for l in f if l.startswith("Sig"))
  except OSError as e:
    return str(e)


def _run_cmd(out, source, *extra, num_examples=5000):
  return [
      sys.executable, "-m", "specdec_jax.run", "--gin_file=local_tiny.gin",
      f"--gin.OUTPUT_DIR='{out}'", f"--gin.SOURCE_FILE='{source}'",
      f"--gin.NUM_EXAMPLES={num_examples}", *extra
  ]


def _wait_for(path: pathlib.Path, proc, seconds: float = 240) -> None:
  deadline = time.monotonic() + seconds
  while not path.exists():
    if proc.poll() is not None:
      raise AssertionError(f"exited {proc.returncode} early: "
                           f"{proc.stderr.read()[-3000:]}")
    assert time.monotonic() < deadline, "the lock never appeared"
    time.sleep(0.2)


def test_stale_lock_of_a_killed_process_is_taken_over(tmp_path):
  holder = subprocess.Popen([
      sys.executable, "-c",
      "import sys, time; from specdec_jax.files import output_folder; "
      "output_folder.acquire(sys.argv[1], 'holder'); print('held', flush=True); "
      "time.sleep(600)",
      str(tmp_path)
  ], cwd=REPO, env=subprocess_env(), text=True, stdout=subprocess.PIPE)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(output_folder.LockedError, match="in use by holder"):
      output_folder.acquire(str(tmp_path))
  finally:
    holder.kill()  # SIGKILL: no cleanup, the lock stays
    holder.wait()
  assert (tmp_path / output_folder.LOCK_FILE).exists()
  with output_folder.hold(str(tmp_path)) as lock:
    assert json.loads(lock.version)["pid"] == os.getpid()
  assert not (tmp_path / output_folder.LOCK_FILE).exists()


def test_concurrent_runs_refused_and_ctrl_c_is_one_line(tmp_path):
  """Two real `run` processes on one folder: the second is refused at
  startup naming the first; Ctrl-C ends the first with one line and 130,
  and its lock is gone."""
  source = tmp_path / "many.tsv"
  # More work than the test waits for (it is interrupted first), so the
  # run cannot finish while the second one starts beside it.
  rows = 20_000
  source.write_text("".join(
      f"a small house number {i}\tein Haus {i}\n" for i in range(rows)))
  out = tmp_path / "same"
  lock = out / output_folder.LOCK_FILE
  first = subprocess.Popen(
      _run_cmd(out, source, "--gin.GAMMA=2", num_examples=rows), cwd=REPO,
      env=subprocess_env(), text=True, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, preexec_fn=_default_sigint)
  # Read its stderr as a terminal would: an unread pipe fills after a few
  # hundred progress lines and blocks the run inside a log write.
  chunks = []
  reader = threading.Thread(target=lambda: chunks.extend(first.stderr),
                            daemon=True)
  reader.start()
  try:
    _wait_for(lock, first)
    record = json.loads(lock.read_text())
    assert record["pid"] == first.pid and record["program"] == "run"
    second = subprocess.run(
        _run_cmd(out, source, "--gin.GAMMA=6",
                 "--gin.TEMPERATURE=1.0"), cwd=REPO, env=subprocess_env(),
        text=True, capture_output=True, timeout=300)
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [
        l for l in second.stderr.splitlines() if l.startswith("run: error")
    ]
    assert len(errors) == 1 and "Traceback" not in second.stderr
    assert f"is in use by run (pid {first.pid}" in errors[0]
    assert first.poll() is None  # the first run goes on
    # Ctrl-C during the long part, the decoding (its progress lines).
    deadline = time.monotonic() + 240
    while not any("walltime.py" in c and " batch " in c for c in chunks):
      assert first.poll() is None and time.monotonic() < deadline, (
          "the first run never started decoding")
      time.sleep(0.2)
    state = _signal_state(first.pid)
    first.send_signal(signal.SIGINT)
    try:
      first.wait(timeout=120)
    except subprocess.TimeoutExpired:
      raise AssertionError(
          f"the run did not stop on Ctrl-C; its signals: {state}") from None
    reader.join(timeout=30)
  finally:
    if first.poll() is None:
      first.kill()
  stderr = "".join(chunks)
  assert first.returncode == 130, stderr[-3000:]
  assert "Traceback" not in stderr
  assert [l for l in stderr.splitlines() if l.startswith("run: ")] == [
      l for l in stderr.splitlines() if l.startswith("run: interrupted")
  ]
  assert not lock.exists()
  assert not (out / "metrics.json").exists()


# ---------------------------------------------------------------------------
# (3) gs:// that never answers: a deadline and the path (loopback only).
# ---------------------------------------------------------------------------
@pytest.fixture
def silent_gcs(monkeypatch):
  """TensorStore pointed at a 127.0.0.1 port that accepts and never
  answers; no real endpoint or credentials server is contacted."""
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(16)
  held = []
  stop = threading.Event()

  def accept():
    server.settimeout(0.2)
    while not stop.is_set():
      try:
        held.append(server.accept()[0])  # kept open, never answered
      except OSError:
        pass

  thread = threading.Thread(target=accept, daemon=True)
  thread.start()
  port = server.getsockname()[1]
  gcs_at(monkeypatch, port)
  monkeypatch.setenv(io_utils.TIMEOUT_ENV, "1.5")
  yield port
  stop.set()
  thread.join()
  for conn in held:
    conn.close()
  server.close()


def test_gcs_without_answer_fails_within_the_deadline(silent_gcs):
  start = time.monotonic()
  with pytest.raises(ValueError) as e:
    io_utils.probe_writable_dir("gs://no-answer-bucket/out")
  assert time.monotonic() - start < 20
  text = str(e.value)
  assert "gs://no-answer-bucket/out/.write_probe." in text
  assert "no answer" in text and "1.5 s" in text
  assert f"127.0.0.1:{silent_gcs}" in text
  with pytest.raises(io_utils.RemoteTimeout, match="gs://no-answer-bucket/x"):
    io_utils.read_bytes("gs://no-answer-bucket/x")


def test_gcs_refused_port_fails_with_the_path(monkeypatch):
  refused_gcs(monkeypatch)
  monkeypatch.setenv(io_utils.TIMEOUT_ENV, "1.5")
  start = time.monotonic()
  with pytest.raises(Exception) as e:
    io_utils.atomic_write("gs://refused-bucket/a.json", "{}")
  assert time.monotonic() - start < 20
  assert "refused-bucket" in str(e.value)


# ---------------------------------------------------------------------------
# (5) A full disk in a run: the summary first, and the file and what was
# kept named.
# ---------------------------------------------------------------------------
class _FullAfter:
  """A text file whose writes fail with ENOSPC after `rows` lines."""

  def __init__(self, f, rows):
    self._f, self._rows = f, rows

  def write(self, text):
    if self._rows < text.count("\n"):
      raise OSError(errno.ENOSPC, "No space left on device")
    self._rows -= text.count("\n")
    return self._f.write(text)

  def __getattr__(self, name):
    return getattr(self._f, name)


def test_full_disk_keeps_summary_and_decoded_rows(tmp_path, monkeypatch):
  real_open = open
  monkeypatch.setattr(predictions_lib, "open",
                      lambda *a, **k: _FullAfter(real_open(*a, **k), 2),
                      raising=False)
  seen = []
  plan = tiny_run_plan(tmp_path)
  with pytest.raises(predictions_lib.OutputWriteError) as e:
    runner.execute(plan, on_result=seen.append)
  out = tmp_path / "out"
  assert len(seen) == 1 and seen[0]["num_examples"] == 5  # summary first
  text = str(e.value)
  assert f"cannot write {out / 'predictions.jsonl'}" in text
  assert "No space left on device" in text
  assert f"2 predictions rows in {out / '.predictions.jsonl.partial'}" in text
  assert "metrics.json was not written" in text
  rows = (out / ".predictions.jsonl.partial").read_text().splitlines()
  assert [json.loads(r)["aux"]["index"] for r in rows] == [0, 1]
  assert not (out / "metrics.json").exists()
  assert not (out / output_folder.LOCK_FILE).exists()


def test_full_disk_at_metrics_json(tmp_path, monkeypatch):
  real = io_utils.atomic_write

  def full(path, data):
    if str(path).endswith("metrics.json"):
      raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return real(path, data)

  monkeypatch.setattr(io_utils, "atomic_write", full)
  with pytest.raises(
      predictions_lib.OutputWriteError,
      match="metrics.json: No space left on device. Kept: "
      "the summary above and predictions.jsonl"):
    runner.execute(tiny_run_plan(tmp_path))
  lines = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
  assert len(lines) == 5


# ---------------------------------------------------------------------------
# (6) One line per error, exit 2, from the command line.
# ---------------------------------------------------------------------------
def test_checkpoint_error_is_one_line_exit_2(tmp_path):
  proc = subprocess.run([
      sys.executable, "-m", "specdec_jax.run", "--gin_file=local_tiny.gin",
      f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'", "--gin.NUM_EXAMPLES=1",
      f"--gin.TARGET_CHECKPOINT_PATH='{tmp_path / 'nothing'}'"
  ], cwd=REPO, env=subprocess_env(), text=True, capture_output=True,
                        timeout=300)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith("run: ")]
  assert len(errors) == 1 and "does not exist" in errors[0], proc.stderr
  assert not (tmp_path / "out").exists()  # the empty folder is removed


# ---------------------------------------------------------------------------
# Issue 37: SIGTERM while decoding keeps the rows, and they are protected.
# ---------------------------------------------------------------------------
def test_sigterm_mid_decode_keeps_rows_and_they_are_protected(tmp_path):
  """A real `run` sent SIGTERM while decoding: one line, exit 143, the lock
  released, the rows kept in `.partial`; a run of other settings into the
  folder is then refused rather than replacing them (issue 37 (8))."""
  source = tmp_path / "many.tsv"
  rows = 20_000
  source.write_text("".join(
      f"a small house number {i}\tein Haus {i}\n" for i in range(rows)))
  out = tmp_path / "o"
  run = subprocess.Popen(
      _run_cmd(out, source, "--gin.GAMMA=2", "--gin.BATCH_SIZE=4",
               num_examples=rows), cwd=REPO, env=subprocess_env(), text=True,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  chunks = []
  reader = threading.Thread(target=lambda: chunks.extend(run.stderr),
                            daemon=True)
  reader.start()
  partial = out / ".predictions.jsonl.partial"
  try:
    deadline = time.monotonic() + 240
    while not (partial.exists() and partial.stat().st_size > 0):
      assert run.poll() is None and time.monotonic() < deadline, (
          "".join(chunks)[-3000:])
      time.sleep(0.2)
    run.send_signal(signal.SIGTERM)
    run.wait(timeout=120)
    reader.join(timeout=30)
  finally:
    if run.poll() is None:
      run.kill()
  stderr = "".join(chunks)
  assert run.returncode == 143, stderr[-3000:]
  lines = [l for l in stderr.splitlines() if l.startswith("run: ")]
  assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
  assert lines[0].startswith("run: interrupted (SIGTERM): kept ")
  assert f"predictions rows in {partial}" in lines[0]
  assert not (out / output_folder.LOCK_FILE).exists()
  kept = partial.read_text()
  other = subprocess.run(_run_cmd(out, source, "--gin.GAMMA=3"), cwd=REPO,
                         env=subprocess_env(), text=True, capture_output=True,
                         timeout=300)
  assert other.returncode == 2, other.stderr[-3000:]
  assert "holds .predictions.jsonl.partial, which was kept" in other.stderr
  assert partial.read_text() == kept


def test_sigterm_while_exiting_is_143_with_a_line():
  """The soak's kill/resume run: a SIGTERM after the sweep had finished,
  during the interpreter's shutdown, ended it with -15 and no line."""
  code = textwrap.dedent("""
      import atexit, os, signal, threading, time
      from specdec_jax.terminal import console
      atexit.register(time.sleep, 20)  # a slow shutdown (JAX's threads)
      threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
      console.exit_process(0)
  """)
  start = time.monotonic()
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                        env=subprocess_env(), text=True, capture_output=True,
                        timeout=60)
  assert proc.returncode == 143, proc.stderr[-2000:]
  assert time.monotonic() - start < 15
  assert proc.stderr.strip().splitlines()[-1] == (
      "interrupted (SIGTERM) while exiting: everything was already written.")
