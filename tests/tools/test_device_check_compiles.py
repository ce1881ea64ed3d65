"""A phase's compiles several at once (`tools.device_check.compiles`)."""
import threading

from tools.device_check import compiles


def test_tasks_run_at_once_in_order_and_stop_when_time_runs_out(capsys):
  """Two tasks that each wait for the other end only if they run at once
  (count 2; one at a time the first's wait breaks); results come back in
  the tasks' order with their errors in one line (logged with their
  tracebacks), on_done in the calling thread; once `fits` says no, nothing
  more starts."""
  meet = threading.Barrier(2, timeout=5)
  tasks = {"a": lambda: meet.wait() * 0 + 1, "b": lambda: meet.wait() * 0 + 2}
  seen = []
  done, skipped = compiles.concurrently(
      tasks, lambda _: True, count=2, on_done=lambda n, d: seen.append(
          (n, threading.get_ident())))
  assert [(n, d.result, d.error) for n, d in done.items()
         ] == [("a", 1, None), ("b", 2, None)] and skipped == []
  assert sorted(n for n, _ in seen) == ["a", "b"]
  assert {t for _, t in seen} == {threading.get_ident()}
  alone = threading.Barrier(2, timeout=0.2)
  done, _ = compiles.concurrently({"a": alone.wait}, lambda _: True, count=1)
  assert done["a"].error.startswith("BrokenBarrierError")

  def fail():
    raise ValueError("first line\nsecond line")

  done, skipped = compiles.concurrently(
      {
          "x": fail,
          "y": lambda: 3,
          "z": lambda: 4
      }, lambda slowest: slowest == 0.0, count=1)
  assert list(done) == ["x"] and skipped == ["y", "z"]
  assert done["x"].error == "ValueError: first line" and done["x"].seconds > 0
  logged = capsys.readouterr().err
  assert "error: ValueError: first line" in logged and "in fail" in logged
  assert 2 <= compiles.workers() <= 8
