"""Values exchanged through JAX's coordination service, with deadlines.

The key-value store of the coordination service (the one
`jax.distributed.initialize` starts on process 0) carries JSON values under
keys that every process derives alike (the n-th use of a name). Every wait
polls with a deadline of `--coordination_timeout_s` (default 600 s), past
which it fails naming the process it waited for, and fails at once with
another process's published error (`PeerFailed`, see `failures`).

With one process nothing is exchanged: `allgather` returns [value],
`run_on_first` runs its function.
"""
import json
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax

DEFAULT_TIMEOUT_S = 600
PREFIX = "specdec_jax"
POLL_S = 0.05  # between two looks at the key-value store while waiting
WATCH_S = 0.5  # between two looks for another process's error
_CHUNK_BYTES = 1 << 20  # values are stored in pieces of this size

_state = {"timeout_s": DEFAULT_TIMEOUT_S, "counters": {}}


class CoordinationError(RuntimeError):
  """A process did not reach a coordination point in time, or failed."""


class PeerFailed(CoordinationError):
  """Another process failed; `record` is what it published."""

  def __init__(self, record: Dict[str, Any]):
    super().__init__(f"process {record['process']}: {record['message']}")
    self.record = record


def set_timeout(timeout_s: int) -> None:
  """Sets how long a wait lasts before it fails.

  Raises:
    ValueError: not an integer >= 1 (naming the flag).
  """
  if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or (timeout_s
                                                                       < 1):
    raise ValueError(f"--coordination_timeout_s={timeout_s!r}: allowed: an "
                     "integer >= 1 (seconds).")
  _state["timeout_s"] = timeout_s


def is_multiprocess() -> bool:
  """Whether several processes run this program (without starting a JAX
  backend when `initialize` started none)."""
  return jax.distributed.is_initialized() and jax.process_count() > 1


def is_first() -> bool:
  """Whether this is process 0, the one that writes (True with one)."""
  return not is_multiprocess() or jax.process_index() == 0


def client():
  # The coordination service's key-value store: JAX exposes no public API
  # for it (orbax's multihost utilities use the same client).
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  found = distributed.global_state.client
  if found is None:
    raise CoordinationError("jax.distributed is not initialized.")
  return found


def _next_key(name: str) -> str:
  """A fresh key for the n-th use of `name`: every process makes the same
  calls in the same order, so the same n."""
  n = _state["counters"].get(name, 0)
  _state["counters"][name] = n + 1
  return f"{PREFIX}/{name}/{n}"


def _put(key: str, value: Any) -> None:
  data = json.dumps(value).encode("utf-8")
  store = client()
  chunks = [
      data[i:i + _CHUNK_BYTES] for i in range(0, len(data), _CHUNK_BYTES)
  ] or [b""]
  for i, chunk in enumerate(chunks):
    store.key_value_set_bytes(f"{key}/{i}", chunk)
  store.key_value_set(f"{key}/n", str(len(chunks)))  # last: all are there


def _try_get(store, key: str) -> Optional[bytes]:
  try:
    return store.key_value_try_get_bytes(key)
  except Exception:  # pylint: disable=broad-except  # NOT_FOUND
    return None


def errors() -> List[Dict[str, Any]]:
  """Errors other processes have published, in process order."""
  found = []
  try:
    entries = client().key_value_dir_get(f"{PREFIX}/error/")
  except Exception:  # pylint: disable=broad-except  # none yet
    return found
  for _, value in entries:
    record = json.loads(value)
    if record["process"] != jax.process_index():
      found.append(record)
  return sorted(found, key=lambda r: r["process"])


def _get(key: str, what: str, process: int) -> Any:
  """The value `process` stored at `key`; waits up to the timeout.

  Raises:
    PeerFailed: a process published an error meanwhile.
    CoordinationError: the timeout passed.
  """
  store = client()
  deadline = time.monotonic() + _state["timeout_s"]
  last_error_check = 0.0
  while True:
    count = _try_get(store, f"{key}/n")
    if count is not None:
      data = b"".join(
          store.key_value_try_get_bytes(f"{key}/{i}")
          for i in range(int(count)))
      return json.loads(data)
    now = time.monotonic()
    if now - last_error_check > WATCH_S:
      last_error_check = now
      published = errors()
      if published:
        raise PeerFailed(published[0])
    if now > deadline:
      raise CoordinationError(
          f"process {jax.process_index()} waited {_state['timeout_s']} s for "
          f"process {process} at '{what}', which did not get there: it is "
          "stuck or died without a trace (see its log). If it is only slow, "
          "raise --coordination_timeout_s.")
    time.sleep(POLL_S)


def allgather(name: str, value: Any) -> List[Any]:
  """Every process's `value` (JSON-able), in process order."""
  if not is_multiprocess():
    return [value]
  key = _next_key(name)
  me = jax.process_index()
  _put(f"{key}/{me}", value)
  values = [
      value if p == me else _get(f"{key}/{p}", name, p)
      for p in range(jax.process_count())
  ]
  # Everyone who stored this round had finished reading the previous one:
  # free its value (the examples of a sweep's points add up on process 0).
  n = int(key.rsplit("/", 1)[1])
  if n:
    try:
      client().key_value_delete(f"{PREFIX}/{name}/{n - 1}/{me}")
    except Exception:  # pylint: disable=broad-except  # memory only
      pass
  return values


def run_on_first(name: str, fn: Callable[[], Any]) -> Any:
  """`fn()` on process 0; every process returns its (JSON-able) result.

  Process 0's errors fail every process (`failures_end_every_process`), so
  the others never act on a decision that was not taken.
  """
  if not is_multiprocess():
    return fn()
  key = _next_key(name)
  if jax.process_index() == 0:
    result = fn()
    _put(key, result)
    return result
  return _get(key, name, 0)


def barrier(name: str) -> None:
  """Waits until every process got here (with the timeout)."""
  allgather(name, None)


def slowest(*seconds: float) -> Tuple[float, ...]:
  """Each duration's maximum over the processes (the user waits for it)."""
  every = allgather("slowest", [float(s) for s in seconds])
  return tuple(max(values) for values in zip(*every))
