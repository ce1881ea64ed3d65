"""JAX's distributed runtime, as T5X uses it: started, coordinated, ended.

`initialize` starts it (T5X's flags, or a Cloud TPU VM; else one process,
nothing exchanged). Values go through the coordination service's key-value
store; every wait fails after `--coordination_timeout_s` naming the process
it waited for, or at once with another's published error (`PeerFailed`).
`failures_end_every_process`: one process's error ends every process with
its message (a watcher thread; `os._exit` once the others saw it, as
`jax.distributed.shutdown` would wait for them forever). The watcher stops
at exit before Python finalizes (`stop_watcher`).
"""
import atexit
import contextlib
import inspect
import json
import logging as std_logging
import os
import sys
import threading
import time
import traceback
from typing import (Any, Callable, Dict, Iterator, List, NoReturn, Optional,
                    Tuple)

from absl import flags
from absl import logging
import jax

DEFAULT_TIMEOUT_S = 600
PREFIX = "specdec_jax"
POLL_S = 0.05  # between two looks at the key-value store while waiting
WATCH_S = 0.5  # between two looks for another process's error
_CHUNK_BYTES = 1 << 20  # values are stored in pieces of this size
_EXIT_WAIT_S = 10.0  # how long a failing process waits for the others to see it
_STOP_WAIT_S = 30.0  # how long exiting waits for the watcher's last look

_state = {"timeout_s": DEFAULT_TIMEOUT_S, "counters": {}, "exiting": False}
_exit_lock = threading.Lock()
_stop_watching = threading.Event()


class CoordinationError(RuntimeError):
  """A process did not reach a coordination point in time, or failed."""


class PeerFailed(CoordinationError):
  """Another process failed; `record` is what it published."""

  def __init__(self, record: Dict[str, Any]):
    super().__init__(f"process {record['process']}: {record['message']}")
    self.record = record


def set_timeout(timeout_s: int) -> None:
  """Sets how long a wait lasts; ValueError (naming the flag) unless an
  integer >= 1."""
  if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or (timeout_s
                                                                       < 1):
    raise ValueError(f"--coordination_timeout_s={timeout_s!r}: allowed: an "
                     "integer >= 1 (seconds).")
  _state["timeout_s"] = timeout_s


def is_multiprocess() -> bool:
  """Whether several processes run this program (starts no JAX backend)."""
  return jax.distributed.is_initialized() and jax.process_count() > 1


def is_first() -> bool:
  """Whether this is process 0, the one that writes (True with one)."""
  return not is_multiprocess() or jax.process_index() == 0


def client():
  # No public API for the key-value store (orbax uses the same client).
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  found = distributed.global_state.client
  if found is None:
    raise CoordinationError("jax.distributed is not initialized.")
  return found


def _next_key(name: str) -> str:
  """The key of the n-th use of `name` (the same n on every process)."""
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
  """The value `process` stored at `key`, waiting up to the timeout
  (CoordinationError), or PeerFailed if a process published an error."""
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
  """`fn()` on process 0; every process returns its (JSON-able) result
  (process 0's errors end every process: `failures_end_every_process`)."""
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


def define_flags() -> None:
  """T5X's multi-host flags (names and meaning of `t5x/train.py`) and the
  coordination timeout (idempotent)."""
  if "multiprocess_gpu" not in flags.FLAGS:
    flags.DEFINE_boolean(
        "multiprocess_gpu", False,
        "Initialize JAX distributed system for multi-host GPU, using "
        "`coordinator_address`, `process_count`, and `process_index` (as "
        "T5X; any backend, CPU included). Not needed on Cloud TPU VMs.")
    flags.DEFINE_string("coordinator_address", None,
                        "IP address:port for multi-host GPU coordinator.")
    flags.DEFINE_integer("process_count", None,
                         "Number of processes for multi-host GPU.")
    flags.DEFINE_integer("process_index", None, "Index of this process.")
  if "coordination_timeout_s" not in flags.FLAGS:
    flags.DEFINE_integer(
        "coordination_timeout_s", DEFAULT_TIMEOUT_S,
        "Seconds a process waits for the others at a coordination point "
        "(and for all of them to start) before failing.")


def initialize_from_flags() -> None:
  """`initialize` with the values of `define_flags`' flags."""
  f = flags.FLAGS
  initialize(multiprocess_gpu=f.multiprocess_gpu,
             coordinator_address=f.coordinator_address,
             process_count=f.process_count, process_index=f.process_index,
             timeout_s=f.coordination_timeout_s)


def _check_flags(multiprocess_gpu: bool, initialized: bool,
                 coordinator_address: Optional[str],
                 process_count: Optional[int],
                 process_index: Optional[int]) -> None:
  """Raises ValueError naming a missing or inconsistent T5X flag.

  Process flags without --multiprocess_gpu are refused (T5X ignores them,
  so N processes would run as N independent runs); once `initialized`,
  nothing else is checked.
  """
  named = (("--coordinator_address", coordinator_address),
           ("--process_count", process_count), ("--process_index",
                                                process_index))
  given = [f"{name}={value}" for name, value in named if value is not None]
  if given and not multiprocess_gpu:
    raise ValueError(
        f"{', '.join(given)} without --multiprocess_gpu: these flags only "
        "join processes into one run with --multiprocess_gpu (T5X's flag; "
        "on a Cloud TPU VM the processes are found without them). Add "
        "--multiprocess_gpu, or drop them for a one-process run.")
  if not multiprocess_gpu or initialized:
    return
  missing = [name for name, value in named if value is None]
  if missing:
    raise ValueError(
        "--multiprocess_gpu needs --coordinator_address=HOST:PORT, "
        "--process_count=N and --process_index=I (T5X's flags); missing: " +
        ", ".join(missing) + ".")
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(
        f"--process_index={process_index} with --process_count="
        f"{process_count}: allowed: 0 <= process_index < process_count.")


def initialize(*, multiprocess_gpu: bool = False,
               coordinator_address: Optional[str] = None,
               process_count: Optional[int] = None,
               process_index: Optional[int] = None,
               timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
  """Starts JAX's distributed runtime where one is wanted (module docstring).

  Raises:
    ValueError: a missing or inconsistent flag, or a timeout that is not a
      positive number (naming the flag).
  """
  set_timeout(timeout_s)
  initialized = jax.distributed.is_initialized()
  _check_flags(multiprocess_gpu, initialized, coordinator_address,
               process_count, process_index)
  if initialized:
    start_watcher()
    return
  # jax.distributed's waits for the processes to start and its heartbeat,
  # where this JAX version has them.
  params = inspect.signature(jax.distributed.initialize).parameters
  timeouts = {
      name: timeout_s
      for name in ("initialization_timeout", "heartbeat_timeout_seconds")
      if name in params
  }
  if multiprocess_gpu:
    if getattr(jax.config, "jax_cpu_collectives_implementation",
               "gloo") is None:
      # Older JAX has no CPU collectives across processes by default.
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logging.info(
        "Initializing JAX distributed: coordinator %s, process %d "
        "of %d.", coordinator_address, process_index, process_count)
    jax.distributed.initialize(coordinator_address, process_count,
                               process_index, **timeouts)
  elif _on_cloud_tpu_vm():
    logging.info("Cloud TPU VM: jax.distributed.initialize() from the TPU "
                 "metadata.")
    jax.distributed.initialize(**timeouts)
  else:
    return
  start_watcher()


def _on_cloud_tpu_vm() -> bool:
  """Whether `import jax` found libtpu and TPU chips (set before any backend
  starts, unlike `jax.devices()`)."""
  try:
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def _exit_all(record: Dict[str, Any], line: str) -> NoReturn:
  """Prints `line`, waits for the others to see the error, exits (or waits
  for the thread of this process that is exiting)."""
  with _exit_lock:
    exiting, _state["exiting"] = _state["exiting"], True
  while exiting:
    time.sleep(1)
  print(line, file=sys.stderr, flush=True)
  sys.stdout.flush()
  for handler in std_logging.getLogger().handlers:
    handler.flush()
  me, count = jax.process_index(), jax.process_count()
  try:
    store = client()
    store.key_value_set(f"{PREFIX}/ack/{me}", "1")
    _wait_for_all(store, "ack", count)
    if me == 0:
      # Process 0 hosts the key-value store: it leaves last, or the others'
      # JAX clients would abort on losing it instead of exiting.
      _wait_for_all(store, "left", count - 1)
      time.sleep(0.2)
    else:
      store.key_value_set(f"{PREFIX}/left/{me}", "1")
  except Exception:  # pylint: disable=broad-except  # the store is gone
    pass
  os._exit(int(record.get("exit_code") or 1))  # pylint: disable=protected-access


def _wait_for_all(store, what: str, count: int) -> None:
  """Until `count` processes set `what` (at most _EXIT_WAIT_S)."""
  deadline = time.monotonic() + _EXIT_WAIT_S
  while time.monotonic() < deadline:
    if len(store.key_value_dir_get(f"{PREFIX}/{what}/")) >= count:
      return
    time.sleep(POLL_S)


def _watch() -> None:
  while not _stop_watching.wait(WATCH_S) and not _state["exiting"]:
    try:
      published = errors()
    except Exception:  # pylint: disable=broad-except
      published = []
    if published:
      record = published[0]
      _exit_all(
          record, f"{_state.get('program', 'specdec_jax')}: error: "
          f"process {record['process']}: {record['message']}")


def start_watcher() -> None:
  """Starts the thread that ends this process on another's error (once)."""
  if not is_multiprocess() or _state.get("watcher"):
    return
  thread = threading.Thread(target=_watch, daemon=True,
                            name="multihost-error-watcher")
  _state["watcher"] = thread
  _stop_watching.clear()
  # Runs before JAX's own exit handler (atexit is last in, first out).
  atexit.register(stop_watcher)
  thread.start()


def stop_watcher() -> None:
  """Stops the watcher and waits for its last look (at exit: a daemon
  thread inside a JAX client call when Python finalizes aborts the process,
  'FATAL: exception not rethrown', after all the work was done)."""
  _stop_watching.set()
  thread = _state.pop("watcher", None)
  if thread is not None and thread is not threading.current_thread():
    thread.join(timeout=_STOP_WAIT_S)
  atexit.unregister(stop_watcher)


def _peer_errors(e: BaseException,
                 expected: Tuple[type, ...]) -> List[Dict[str, Any]]:
  """The errors other processes published before `e` (which may follow
  from one of them: a collective that lost its peer)."""
  if isinstance(e, PeerFailed):
    return [e.record]
  # A failed peer publishes before it exits: give it a moment.
  deadline = time.monotonic() + 2 * WATCH_S
  peers = errors()
  while not peers and not isinstance(e, expected) and (time.monotonic()
                                                       < deadline):
    time.sleep(POLL_S)
    peers = errors()
  return peers


def _publish_and_exit(program: str, e: BaseException,
                      expected: Tuple[type, ...]) -> NoReturn:
  """Publishes this process's error `e` for the others, prints it, exits."""
  me = jax.process_index()
  if isinstance(e, expected):
    record = {"process": me, "message": str(e), "exit_code": 2}
    line = f"{program}: error: {e}"
  elif isinstance(e, KeyboardInterrupt):  # Ctrl-C or SIGTERM: no bug
    kept = str(e) or "files already written in the output folder are kept"
    record = {
        "process": me,
        "message": f"interrupted: {kept}",
        "exit_code": 130
    }
    line = f"{program}: interrupted: {kept}."
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
    client().key_value_set(f"{PREFIX}/error/{me}", json.dumps(record))
  except Exception:  # pylint: disable=broad-except  # the store is gone
    pass
  _exit_all(record, line)


@contextlib.contextmanager
def failures_end_every_process(
    program: str, expected: Tuple[type, ...] = ()) -> Iterator[None]:
  """An exception in the block ends every process with its message (with
  one, it propagates): an `expected` error as one line, exit code 2,
  Ctrl-C or SIGTERM one line (what was kept), 130, else its traceback,
  exit code 1; the others print "`program`: error: process I: ...". An
  error following another process's failure yields to it."""
  _state["program"] = program
  try:
    yield
  except BaseException as e:  # pylint: disable=broad-except
    if not is_multiprocess() or (isinstance(e, SystemExit) and
                                 e.code in (0, None)):
      raise
    own = expected + (KeyboardInterrupt,)  # ends with its own line
    peers = _peer_errors(e, own)
    if peers and not isinstance(e, own):
      record = peers[0]
      _exit_all(
          record, f"{program}: error: process {record['process']}: "
          f"{record['message']}")
    _publish_and_exit(program, e, expected)
