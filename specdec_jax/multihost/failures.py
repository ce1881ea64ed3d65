"""One process's error ends every process, with its message.

A process that fails publishes its error in the coordination service's
key-value store (`failures_end_every_process`); every other process prints
it ("process I: ...") and exits with its code, from whichever wait or
collective it was in (a watcher thread checks every 0.5 s), instead of
hanging until JAX's own heartbeat timeout. Failing processes leave with
`os._exit` after the others have seen the error (at most 10 s): a normal
exit would wait in `jax.distributed.shutdown`'s barrier for processes that
will never get there.
"""
import contextlib
import json
import logging as std_logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Dict, Iterator, List, NoReturn, Tuple

import jax

from specdec_jax.multihost import coordination
from specdec_jax.multihost.coordination import POLL_S
from specdec_jax.multihost.coordination import PREFIX
from specdec_jax.multihost.coordination import WATCH_S
from specdec_jax.multihost.coordination import PeerFailed

_EXIT_WAIT_S = 10.0  # how long a failing process waits for the others to see it

_state = {"exiting": False}
_exit_lock = threading.Lock()


def _exit_all(record: Dict[str, Any], line: str) -> None:
  """Prints `line`, waits for the others to see the error, exits.

  Only returns if another thread of this process is already exiting.
  """
  with _exit_lock:
    if _state["exiting"]:
      return
    _state["exiting"] = True
  print(line, file=sys.stderr, flush=True)
  sys.stdout.flush()
  for handler in std_logging.getLogger().handlers:
    handler.flush()
  me, count = jax.process_index(), jax.process_count()
  try:
    client = coordination.client()
    client.key_value_set(f"{PREFIX}/ack/{me}", "1")
    _wait_for_all(client, "ack", count)
    if me == 0:
      # Process 0 hosts the key-value store: it leaves last, or the others'
      # JAX clients would abort on losing it instead of exiting.
      _wait_for_all(client, "left", count - 1)
      time.sleep(0.2)
    else:
      client.key_value_set(f"{PREFIX}/left/{me}", "1")
  except Exception:  # pylint: disable=broad-except  # the store is gone
    pass
  os._exit(int(record.get("exit_code") or 1))  # pylint: disable=protected-access


def _exit_now(record: Dict[str, Any], line: str) -> NoReturn:
  """`_exit_all`, or, if another thread is exiting this process, waiting."""
  _exit_all(record, line)
  while True:  # another thread is exiting this process
    time.sleep(1)


def _wait_for_all(client, what: str, count: int) -> None:
  """Until `count` processes set `what` (at most _EXIT_WAIT_S)."""
  deadline = time.monotonic() + _EXIT_WAIT_S
  while time.monotonic() < deadline:
    if len(client.key_value_dir_get(f"{PREFIX}/{what}/")) >= count:
      return
    time.sleep(POLL_S)


def _watch() -> None:
  while not _state["exiting"]:
    time.sleep(WATCH_S)
    try:
      errors = coordination.errors()
    except Exception:  # pylint: disable=broad-except
      errors = []
    if errors:
      record = errors[0]
      _exit_all(
          record, f"{_state.get('program', 'specdec_jax')}: error: "
          f"process {record['process']}: {record['message']}")


def start_watcher() -> None:
  """Starts the thread that ends this process on another's error (once)."""
  if not coordination.is_multiprocess() or _state.get("watcher"):
    return
  thread = threading.Thread(target=_watch, daemon=True,
                            name="multihost-error-watcher")
  _state["watcher"] = thread
  thread.start()


def _peer_errors(e: BaseException,
                 expected: Tuple[type, ...]) -> List[Dict[str, Any]]:
  """The errors other processes published before `e` (which may follow
  from one of them: a collective that lost its peer)."""
  if isinstance(e, PeerFailed):
    return [e.record]
  # A failed peer publishes before it exits: give it a moment.
  deadline = time.monotonic() + 2 * WATCH_S
  peers = coordination.errors()
  while not peers and not isinstance(e, expected) and (time.monotonic()
                                                       < deadline):
    time.sleep(POLL_S)
    peers = coordination.errors()
  return peers


def _publish_and_exit(program: str, e: BaseException,
                      expected: Tuple[type, ...]) -> NoReturn:
  """Publishes this process's error `e` for the others, prints it, exits."""
  me = jax.process_index()
  if isinstance(e, expected):
    record = {"process": me, "message": str(e), "exit_code": 2}
    line = f"{program}: error: {e}"
  else:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    record = {
        "process": me,
        "exit_code": 1,
        "message": f"{type(e).__name__}: {e} (traceback in process "
                   f"{me}'s log)"
    }
    line = text.rstrip()
  try:
    coordination.client().key_value_set(f"{PREFIX}/error/{me}",
                                        json.dumps(record))
  except Exception:  # pylint: disable=broad-except  # the store is gone
    pass
  _exit_now(record, line)


@contextlib.contextmanager
def failures_end_every_process(
    program: str, expected: Tuple[type, ...] = ()) -> Iterator[None]:
  """An exception in the block ends every process with its message.

  With one process, the exception propagates unchanged. With several, this
  process publishes it (an `expected` error as one line, exit code 2;
  anything else with its traceback, exit code 1) and exits; every other
  process prints "`program`: error: process I: ..." and exits with the
  same code. An error that follows another process's failure (a collective
  that lost its peer) yields to that process's error.
  """
  _state["program"] = program
  try:
    yield
  except BaseException as e:  # pylint: disable=broad-except
    if not coordination.is_multiprocess() or (isinstance(e, SystemExit) and
                                              e.code in (0, None)):
      raise
    peers = _peer_errors(e, expected)
    if peers and not isinstance(e, expected):
      record = peers[0]
      _exit_now(
          record, f"{program}: error: process {record['process']}: "
          f"{record['message']}")
    _publish_and_exit(program, e, expected)
