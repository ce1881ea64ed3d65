"""A phase's compiles several at once (`concurrently`).

A GPU session's minutes go mostly to compiling (the `tiles` group was
killed compiling 17 variants one after another on 2026-11-30), and XLA
and Triton compile a program on about one core while the device machine
has 16: the group's first calls (each a compile) run in threads, a few at
a time, before anything is timed, so that no compile runs while
something is timed.
"""
import concurrent.futures
import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from tools.device_check import common


def workers() -> int:
  """Compiles at once: half the host's cores, 2 to 8."""
  return max(2, min(8, (os.cpu_count() or 2) // 2))


@dataclasses.dataclass
class Done:
  """A task's wall seconds and its result, or its error in one line."""
  seconds: float
  result: Any = None
  error: Optional[str] = None


def _run(task: Callable[[], Any]) -> Done:
  """task() timed; an error logged with its traceback (`common.guarded`)."""
  start = time.perf_counter()
  out = common.guarded(lambda: {"result": task()})
  return Done(time.perf_counter() - start, out.get("result"), out.get("error"))


def concurrently(
    tasks: Dict[str, Callable[[], Any]], fits: Callable[[float], bool], *,
    count: int, on_done: Optional[Callable[[str, Done], None]] = None
) -> Tuple[Dict[str, Done], List[str]]:
  """Each task called in a thread, `count` at a time, started in order
  while fits(the slowest finished task's seconds, 0 before any) holds;
  on_done(name, done) called in this thread as each ends.

  Returns:
    ({name: Done} of the tasks started, in `tasks`' order; the names of
    those never started).
  """
  queue = list(tasks.items())
  done: Dict[str, Done] = {}
  slowest = 0.0
  with concurrent.futures.ThreadPoolExecutor(max(1, count)) as pool:
    running: Dict[concurrent.futures.Future, str] = {}
    while True:
      while queue and len(running) < max(1, count) and fits(slowest):
        name, task = queue.pop(0)
        running[pool.submit(_run, task)] = name
      if not running:
        break
      finished, _ = concurrent.futures.wait(
          running, return_when=concurrent.futures.FIRST_COMPLETED)
      for future in finished:
        name = running.pop(future)
        done[name] = future.result()
        slowest = max(slowest, done[name].seconds)
        if on_done is not None:
          on_done(name, done[name])
  return {n: done[n] for n in tasks if n in done}, [n for n, _ in queue]
