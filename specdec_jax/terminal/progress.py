"""One plain progress line for every phase that takes more than a moment.

`run`, `sweep` and `train` say on stderr (absl logging, as every other
progress line) what they are doing whenever it takes longer than about
2 s, so that no wait is silent (issue 44): compiling (each program, "k/n",
with its seconds), GAMMA='auto' / TREE_WIDTH='auto' pilots (with their
sample size), pricing c, reading a checkpoint, the train step's compile
and first steps, COMPILE_TOPOLOGY.

* `phase(start)`: logs `start` when the phase begins, "... still running"
  every `HEARTBEAT_S` seconds while it runs, and "`start`: done in X s"
  when it ends.
* `numbered(items, verb)`: runs (label, fn) items one by one, logging
  "compiled 2/4 (the speculative decoder, input width 16) in 3.1 s" after
  each, with the same heartbeat while one runs.

Each line is one line, in words; nothing here changes what is computed.
"""
import contextlib
import threading
import time
from typing import Any, Callable, Iterator, List, Sequence, Tuple

from absl import logging

# While a phase runs, a line every this many seconds ("still ...").
HEARTBEAT_S = 30.0


@contextlib.contextmanager
def heartbeat(what: str, every_s: float = HEARTBEAT_S) -> Iterator[None]:
  """Logs "`what`: still running, N s so far" every `every_s` seconds
  until the block ends (a daemon thread; nothing when it ends sooner)."""
  done = threading.Event()
  start = time.perf_counter()

  def beat():
    while not done.wait(every_s):
      logging.info("%s: still running, %.0f s so far", what,
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
  logging.info("%s", start)
  t0 = time.perf_counter()
  with heartbeat(start, every_s):
    yield
  logging.info("%s: done in %.1f s", start, time.perf_counter() - t0)


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
    logging.info("%s %d/%d (%s) in %.1f s", done, k, n, label, seconds[-1])
  return seconds
