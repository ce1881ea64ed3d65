"""A multi-process run exits cleanly: the error watcher has stopped before
JAX's exit handler shuts the distributed client down.

A watcher still inside a key-value call when process 0's coordination
service went away aborted a finished CI run ('terminate called after
throwing an instance of ''', rc -6): the call returned after Python had
started to finalize, and a daemon thread that resumes then is unwound
through C++ frames.
"""
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

# One process, no coordinator: `errors` stands in for the key-value store's
# calls, and JAX's exit handler reports whether the watcher still runs.
_SCRIPT = """
import sys, threading, time
import jax
from jax._src import distributed
from specdec_jax.multihost import coordination

looks = []
def errors():
  looks.append(time.monotonic())
  return []

def shutdown():
  alive = [t.name for t in threading.enumerate()
           if t.name == "multihost-error-watcher" and t.is_alive()]
  print("watcher alive at JAX's shutdown:", bool(alive), flush=True)

coordination.is_multiprocess = lambda: True
coordination.errors = errors
coordination.WATCH_S = 0.001
distributed.global_state.shutdown = shutdown
coordination.start_watcher()
deadline = time.monotonic() + 60
while len(looks) < 3 and time.monotonic() < deadline:
  time.sleep(0.01)
print("looks:", len(looks), flush=True)
sys.exit(0)
"""


def test_the_watcher_stops_before_jax_shuts_down():
  done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert int(lines[0].split()[-1]) >= 3, done.stdout  # it was watching
  assert lines[1] == "watcher alive at JAX's shutdown: False", done.stdout


def test_stop_watcher_is_idempotent_and_start_watcher_restarts(monkeypatch):
  from specdec_jax.multihost import coordination  # pylint: disable=g-import-not-at-top
  looks = []
  monkeypatch.setattr(coordination, "is_multiprocess", lambda: True)
  monkeypatch.setattr(coordination, "errors", lambda: looks.append(1) or [])
  monkeypatch.setattr(coordination, "WATCH_S", 0.001)
  for _ in range(2):
    coordination.start_watcher()
    thread = coordination._state["watcher"]  # pylint: disable=protected-access
    assert thread.is_alive()
    coordination.stop_watcher()
    assert not thread.is_alive()
    coordination.stop_watcher()  # nothing left to stop
  assert "watcher" not in coordination._state  # pylint: disable=protected-access
