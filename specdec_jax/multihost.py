"""Runs on several hosts: JAX's multi-controller runtime, as T5X uses it.

Every process (one per host: a TPU VM of a pod slice, or a GPU/CPU machine)
runs the same command. `initialize` starts JAX's distributed runtime:

* on a Cloud TPU VM, `jax.distributed.initialize()` with no arguments (the
  TPU metadata names the workers);
* elsewhere with T5X's flags (`t5x/train.py`): `--multiprocess_gpu`,
  `--coordinator_address=HOST:PORT`, `--process_count=N`,
  `--process_index=I` (on CPU, cross-process collectives use gloo);
* otherwise nothing: one process, exactly the single-host program.

The mesh then spans every process's devices (`jax.devices()` is global), and
the processes share the work as follows (`DataLayout`):

* **Data.** Batch b holds examples b*B .. b*B+B-1 (B = BATCH_SIZE, as on one
  host). The 'data' axis splits a batch's rows into `num_shards` blocks of
  `rows_per_shard` = B / num_shards rows; the processes whose devices hold
  block g read examples g, g + num_shards, g + 2*num_shards, ... (seqio's
  `ShardInfo(g, num_shards)` semantics: a strided slice), and feed them as
  consecutive rows of their block. Processes that share a block (a 'model'
  axis across hosts) read the same slice. Example texts and token counts
  are exchanged once (`share_examples`), so every process knows every
  example; outputs are gathered after each batch (`to_host`).
* **Outputs.** Process 0 alone writes (`run_on_first`); the others wait for
  it, so every process ends with the write's outcome. Walltimes are the
  slowest process's (`slowest`).
* **Decisions** that read shared state (is OUTPUT_DIR another run's? which
  sweep points are done?) are taken by process 0 and sent to all
  (`run_on_first`), so no process can skip a point another one runs.

Coordination goes through the key-value store of JAX's coordination service
(the one `jax.distributed.initialize` starts on process 0). Every wait polls
with a deadline of `--coordination_timeout_s` (default 600 s), past which it
fails naming the process it waited for; the same timeout bounds
`jax.distributed.initialize`'s wait for all processes to start and its
heartbeat (a process silent that long, e.g. killed, ends every process). A process that fails publishes its
error there (`failures_end_every_process`); every other process prints it
("process I: ...") and exits with its code, from whichever wait or
collective it was in (a watcher thread checks every 0.5 s), instead of
hanging until JAX's own heartbeat timeout. Failing processes leave with
`os._exit` after the others have seen the error (at most 10 s): a normal
exit would wait in `jax.distributed.shutdown`'s barrier for processes that
will never get there.

With one process every function here is the identity or runs its argument:
nothing is exchanged and single-host runs are unchanged.
"""
import contextlib
import dataclasses
import inspect
import json
import logging as std_logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from absl import flags
from absl import logging
import jax
import numpy as np

DEFAULT_TIMEOUT_S = 600
_PREFIX = "specdec_jax"
_POLL_S = 0.05  # between two looks at the key-value store while waiting
_WATCH_S = 0.5  # between two looks for another process's error
_EXIT_WAIT_S = 10.0  # how long a failing process waits for the others to see it
_CHUNK_BYTES = 1 << 20  # values are stored in pieces of this size

_state = {"timeout_s": DEFAULT_TIMEOUT_S, "counters": {}, "exiting": False}
_exit_lock = threading.Lock()


class CoordinationError(RuntimeError):
  """A process did not reach a coordination point in time, or failed."""


class PeerFailed(CoordinationError):
  """Another process failed; `record` is what it published."""

  def __init__(self, record: Dict[str, Any]):
    super().__init__(f"process {record['process']}: {record['message']}")
    self.record = record


# ---------------------------------------------------------------------------
# Starting the runtime.
# ---------------------------------------------------------------------------
def define_flags() -> None:
  """T5X's multi-host flags (same names and meaning as `t5x/train.py`), and
  the timeout of coordination waits (idempotent)."""
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


def initialize(*, multiprocess_gpu: bool = False,
               coordinator_address: Optional[str] = None,
               process_count: Optional[int] = None,
               process_index: Optional[int] = None,
               timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
  """Starts JAX's distributed runtime where one is wanted (module docstring).

  Must run before anything touches a JAX backend.

  Raises:
    ValueError: a missing or inconsistent flag, or a timeout that is not a
      positive number (naming the flag).
  """
  if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or (
      timeout_s < 1):
    raise ValueError(f"--coordination_timeout_s={timeout_s!r}: allowed: an "
                     "integer >= 1 (seconds).")
  _state["timeout_s"] = timeout_s
  if jax.distributed.is_initialized():
    _start_watcher()
    return
  if multiprocess_gpu:
    missing = [name for name, value in (
        ("--coordinator_address", coordinator_address),
        ("--process_count", process_count),
        ("--process_index", process_index)) if value is None]
    if missing:
      raise ValueError(
          "--multiprocess_gpu needs --coordinator_address=HOST:PORT, "
          "--process_count=N and --process_index=I (T5X's flags); missing: "
          + ", ".join(missing) + ".")
    if process_count < 1 or not 0 <= process_index < process_count:
      raise ValueError(
          f"--process_index={process_index} with --process_count="
          f"{process_count}: allowed: 0 <= process_index < process_count.")
    if _config_value("jax_cpu_collectives_implementation", "gloo") is None:
      # Older JAX has no CPU collectives across processes by default.
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logging.info("Initializing JAX distributed: coordinator %s, process %d "
                 "of %d.", coordinator_address, process_index, process_count)
    jax.distributed.initialize(coordinator_address, process_count,
                               process_index, **_timeouts(timeout_s))
  elif _on_cloud_tpu_vm():
    logging.info("Cloud TPU VM: jax.distributed.initialize() from the TPU "
                 "metadata.")
    jax.distributed.initialize(**_timeouts(timeout_s))
  else:
    return
  _start_watcher()


def _timeouts(timeout_s: int) -> Dict[str, int]:
  """jax.distributed's waits for the processes to start, and its heartbeat
  (a process silent this long is declared dead, and every process ends),
  where this JAX version has them."""
  params = inspect.signature(jax.distributed.initialize).parameters
  return {name: timeout_s for name in ("initialization_timeout",
                                       "heartbeat_timeout_seconds")
          if name in params}


def _config_value(name: str, default: Any) -> Any:
  try:
    return getattr(jax.config, name)
  except AttributeError:
    return default


def _on_cloud_tpu_vm() -> bool:
  """Whether `import jax` found libtpu and TPU chips (jax's cloud_tpu_init:
  set before any backend starts, unlike `jax.devices()`)."""
  try:
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def is_multiprocess() -> bool:
  """Whether several processes run this program (without starting a JAX
  backend when `initialize` started none)."""
  return jax.distributed.is_initialized() and jax.process_count() > 1


def is_first() -> bool:
  """Whether this is process 0, the one that writes (True with one)."""
  return not is_multiprocess() or jax.process_index() == 0


# ---------------------------------------------------------------------------
# The key-value store: values, waits with deadlines, errors.
# ---------------------------------------------------------------------------
def _client():
  # The coordination service's key-value store: JAX exposes no public API
  # for it (orbax's multihost utilities use the same client).
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  client = distributed.global_state.client
  if client is None:
    raise CoordinationError("jax.distributed is not initialized.")
  return client


def _next_key(name: str) -> str:
  """A fresh key for the n-th use of `name`: every process makes the same
  calls in the same order, so the same n."""
  n = _state["counters"].get(name, 0)
  _state["counters"][name] = n + 1
  return f"{_PREFIX}/{name}/{n}"


def _put(key: str, value: Any) -> None:
  data = json.dumps(value).encode("utf-8")
  client = _client()
  chunks = [data[i:i + _CHUNK_BYTES]
            for i in range(0, len(data), _CHUNK_BYTES)] or [b""]
  for i, chunk in enumerate(chunks):
    client.key_value_set_bytes(f"{key}/{i}", chunk)
  client.key_value_set(f"{key}/n", str(len(chunks)))  # last: all are there


def _try_get(client, key: str) -> Optional[bytes]:
  try:
    return client.key_value_try_get_bytes(key)
  except Exception:  # pylint: disable=broad-except  # NOT_FOUND
    return None


def _errors() -> List[Dict[str, Any]]:
  """Errors other processes have published, in process order."""
  found = []
  try:
    entries = _client().key_value_dir_get(f"{_PREFIX}/error/")
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
  client = _client()
  deadline = time.monotonic() + _state["timeout_s"]
  last_error_check = 0.0
  while True:
    count = _try_get(client, f"{key}/n")
    if count is not None:
      data = b"".join(client.key_value_try_get_bytes(f"{key}/{i}")
                      for i in range(int(count)))
      return json.loads(data)
    now = time.monotonic()
    if now - last_error_check > _WATCH_S:
      last_error_check = now
      errors = _errors()
      if errors:
        raise PeerFailed(errors[0])
    if now > deadline:
      raise CoordinationError(
          f"process {jax.process_index()} waited {_state['timeout_s']} s for "
          f"process {process} at '{what}', which did not get there: it is "
          "stuck or died without a trace (see its log). If it is only slow, "
          "raise --coordination_timeout_s.")
    time.sleep(_POLL_S)


def allgather(name: str, value: Any) -> List[Any]:
  """Every process's `value` (JSON-able), in process order."""
  if not is_multiprocess():
    return [value]
  key = _next_key(name)
  me = jax.process_index()
  _put(f"{key}/{me}", value)
  values = [value if p == me else _get(f"{key}/{p}", name, p)
            for p in range(jax.process_count())]
  # Everyone who stored this round had finished reading the previous one:
  # free its value (the examples of a sweep's points add up on process 0).
  n = int(key.rsplit("/", 1)[1])
  if n:
    try:
      _client().key_value_delete(f"{_PREFIX}/{name}/{n - 1}/{me}")
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


# ---------------------------------------------------------------------------
# Failing every process with one process's error.
# ---------------------------------------------------------------------------
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
    client = _client()
    client.key_value_set(f"{_PREFIX}/ack/{me}", "1")
    _wait_for_all(client, "ack", count)
    if me == 0:
      # Process 0 hosts the key-value store: it leaves last, or the others'
      # JAX clients would abort on losing it instead of exiting.
      _wait_for_all(client, "left", count - 1)
      time.sleep(0.2)
    else:
      client.key_value_set(f"{_PREFIX}/left/{me}", "1")
  except Exception:  # pylint: disable=broad-except  # the store is gone
    pass
  os._exit(int(record.get("exit_code") or 1))  # pylint: disable=protected-access


def _wait_for_all(client, what: str, count: int) -> None:
  """Until `count` processes set `what` (at most _EXIT_WAIT_S)."""
  deadline = time.monotonic() + _EXIT_WAIT_S
  while time.monotonic() < deadline:
    if len(client.key_value_dir_get(f"{_PREFIX}/{what}/")) >= count:
      return
    time.sleep(_POLL_S)


def _watch() -> None:
  while not _state["exiting"]:
    time.sleep(_WATCH_S)
    try:
      errors = _errors()
    except Exception:  # pylint: disable=broad-except
      errors = []
    if errors:
      record = errors[0]
      _exit_all(record, f"{_state.get('program', 'specdec_jax')}: error: "
                f"process {record['process']}: {record['message']}")


def _start_watcher() -> None:
  if not is_multiprocess() or _state.get("watcher"):
    return
  thread = threading.Thread(target=_watch, daemon=True,
                            name="multihost-error-watcher")
  _state["watcher"] = thread
  thread.start()


@contextlib.contextmanager
def failures_end_every_process(program: str,
                               expected: Tuple[type, ...] = ()
                               ) -> Iterator[None]:
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
    if not is_multiprocess() or (isinstance(e, SystemExit) and
                                    e.code in (0, None)):
      raise
    me = jax.process_index()
    if isinstance(e, PeerFailed):
      peers = [e.record]
    else:
      # A failed peer publishes before it exits: give it a moment.
      deadline = time.monotonic() + 2 * _WATCH_S
      peers = _errors()
      while not peers and not isinstance(e, expected) and (
          time.monotonic() < deadline):
        time.sleep(_POLL_S)
        peers = _errors()
    if peers and not isinstance(e, expected):
      record = peers[0]
      _exit_all(record, f"{program}: error: process {record['process']}: "
                f"{record['message']}")
      while True:  # another thread is exiting this process
        time.sleep(1)
    if isinstance(e, expected):
      record = {"process": me, "message": str(e), "exit_code": 2}
      line = f"{program}: error: {e}"
    else:
      text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
      record = {"process": me, "exit_code": 1,
                "message": f"{type(e).__name__}: {e} (traceback in process "
                           f"{me}'s log)"}
      line = text.rstrip()
    try:
      _client().key_value_set(f"{_PREFIX}/error/{me}", json.dumps(record))
    except Exception:  # pylint: disable=broad-except  # the store is gone
      pass
    _exit_all(record, line)
    while True:  # another thread is exiting this process
      time.sleep(1)


# ---------------------------------------------------------------------------
# Data: which examples and rows a process holds.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ShardInfo:
  """seqio.ShardInfo's fields (seqio is not imported for local files)."""
  index: int
  num_shards: int


@dataclasses.dataclass(frozen=True)
class DataLayout:
  """How one process's slice of the examples fills the rows of each batch.

  Attributes:
    shard_index: the block of batch rows this process's devices hold (and
      the slice of the examples it reads).
    num_shards: blocks per batch (the 'data' axis, or 1 when the batch is
      replicated).
    batch_size: rows per batch, all processes together (BATCH_SIZE).
  """
  shard_index: int
  num_shards: int
  batch_size: int

  @property
  def rows_per_shard(self) -> int:
    return self.batch_size // self.num_shards

  @property
  def shard_info(self) -> ShardInfo:
    return ShardInfo(self.shard_index, self.num_shards)

  def shard_size(self, shard: int, num_examples: int) -> int:
    """Examples of `shard` among the first `num_examples`."""
    return len(range(shard, num_examples, self.num_shards))

  def num_batches(self, num_examples: int) -> int:
    return -(-num_examples // self.batch_size)

  def fed_examples(self, batch: int, num_examples: int
                   ) -> Tuple[np.ndarray, np.ndarray]:
    """(example fed to each row [B] (-1: none, an EOS-only row), real [B]).

    Row g*k + j of batch b gets example (b*k + j)*n + g when that exists
    (k = rows_per_shard, n = num_shards). Missing rows repeat the block's
    last real row (a real input, as on one host), or, when the block has
    none in this batch, the shard's last example.
    """
    k, n = self.rows_per_shard, self.num_shards
    fed = np.full((self.batch_size,), -1, np.int64)
    real = np.zeros((self.batch_size,), bool)
    for g in range(n):
      size = self.shard_size(g, num_examples)
      for j in range(k):
        local = batch * k + j
        if local < size:
          fed[g * k + j], real[g * k + j] = local * n + g, True
        elif size:
          fed[g * k + j] = (min(local, size) - 1) * n + g
    return fed, real

  def kept_rows(self, batch: int, num_examples: int) -> np.ndarray:
    """Rows of batch `batch` that hold real examples, in example order."""
    fed, real = self.fed_examples(batch, num_examples)
    rows = np.nonzero(real)[0]
    return rows[np.argsort(fed[rows], kind="stable")]


def data_layout(sharding: jax.sharding.Sharding,
                batch_size: int) -> DataLayout:
  """The `DataLayout` of input batches [batch_size, S] placed with `sharding`.

  Raises:
    ValueError: this process's devices do not hold one block of rows that
      evenly divides the batch (a mesh whose data axis is not split evenly
      over the processes).
  """
  rows = set()
  for index in sharding.addressable_devices_indices_map(
      (batch_size, 1)).values():
    rows.update(range(*index[0].indices(batch_size)[:2]))
  lo, hi = min(rows), max(rows) + 1
  block = hi - lo
  if rows != set(range(lo, hi)) or batch_size % block or lo % block:
    raise ValueError(
        f"process {jax.process_index()} holds rows {sorted(rows)} of a batch "
        f"of BATCH_SIZE={batch_size}: not one of equal blocks. Allowed: a "
        "MESH_SHAPE whose 'data' axis splits evenly over the processes, and "
        "a BATCH_SIZE that it divides.")
  layout = DataLayout(shard_index=lo // block,
                      num_shards=batch_size // block, batch_size=batch_size)
  data_axis = dict(getattr(getattr(sharding, "mesh", None), "shape", {})).get(
      "data", 1)
  if data_axis > 1 and layout.num_shards == 1:
    logging.warning(
        "BATCH_SIZE=%d is not a multiple of the mesh's data axis (%d): the "
        "batch is replicated, and every data replica decodes the same rows.",
        batch_size, data_axis)
  return layout


@dataclasses.dataclass
class SharedExamples:
  """Every example (texts and token counts), from every process's slice.

  Attributes:
    examples: [{'input', 'reference'}] of all examples, in input order.
    lengths: [N] tokens each example is fed with (EOS included, after
      truncation); 1 for none.
    full_lengths: [N] tokens before truncation.
  """
  examples: List[Dict[str, str]]
  lengths: np.ndarray
  full_lengths: np.ndarray


def share_examples(layout: DataLayout, local_examples: Sequence[dict],
                   local_inputs: np.ndarray, local_full_lengths: np.ndarray
                   ) -> SharedExamples:
  """Exchanges the processes' slices (texts and token counts).

  Args:
    local_examples: this process's examples (shard `layout.shard_index`).
    local_inputs: [n_local, S] their token ids (0-padded).
    local_full_lengths: [n_local] their lengths before truncation.
  """
  lengths = np.sum(np.asarray(local_inputs) != 0, axis=1) if len(
      local_inputs) else np.zeros((0,), np.int64)
  mine = {"shard": layout.shard_index, "examples": list(local_examples),
          "lengths": [int(x) for x in lengths],
          "full_lengths": [int(x) for x in local_full_lengths]}
  shards = {}
  for part in allgather("examples", mine):
    shards.setdefault(part["shard"], part)  # replicas of a shard agree
  if sorted(shards) != list(range(layout.num_shards)):
    raise CoordinationError(
        f"shards {sorted(shards)} were read, expected 0..{layout.num_shards - 1}")
  total = sum(len(s["examples"]) for s in shards.values())
  examples: List[Any] = [None] * total
  lengths_all = np.ones((total,), np.int64)
  full_all = np.ones((total,), np.int64)
  for g, part in shards.items():
    order = range(g, total, layout.num_shards)
    if len(order) != len(part["examples"]):
      raise CoordinationError(
          f"shard {g} read {len(part['examples'])} examples, expected "
          f"{len(order)} of {total}: the processes read different data.")
    for i, e, n, f in zip(order, part["examples"], part["lengths"],
                          part["full_lengths"]):
      examples[i], lengths_all[i], full_all[i] = e, n, f
  return SharedExamples(examples, lengths_all, full_all)


class Feeder:
  """Global input batches from one process's slice of the inputs.

  Batch b's width is the batch's longest fed row rounded up to `bucket`
  (at most S), the same on every process; each process supplies only its
  block of rows (`jax.make_array_from_process_local_data`). With one
  process this is `jax.device_put` of the host batch.
  """

  def __init__(self, layout: DataLayout, local_inputs: np.ndarray,
               shared: SharedExamples, sharding: jax.sharding.Sharding,
               bucket: int):
    self.layout = layout
    self.local_inputs = np.asarray(local_inputs)
    self.shared = shared
    self.sharding = sharding
    self.num_examples = len(shared.examples)
    self.width = self.local_inputs.shape[1]
    self.bucket = bucket

  @property
  def num_batches(self) -> int:
    return self.layout.num_batches(self.num_examples)

  def batch_width(self, batch: int) -> int:
    fed, _ = self.layout.fed_examples(batch, self.num_examples)
    longest = max(int(self.shared.lengths[i]) if i >= 0 else 1 for i in fed)
    return min(self.width, -(-longest // self.bucket) * self.bucket)

  def host_rows(self, batch: int) -> np.ndarray:
    """This process's rows of batch `batch` [rows_per_shard, width]."""
    layout = self.layout
    fed, _ = layout.fed_examples(batch, self.num_examples)
    k = layout.rows_per_shard
    block = fed[layout.shard_index * k:(layout.shard_index + 1) * k]
    rows = np.zeros((k, self.width), np.int32)
    for j, example in enumerate(block):
      if example < 0:
        rows[j, 0] = 1  # EOS only: this shard has no example at all
      else:
        rows[j] = self.local_inputs[example // layout.num_shards]
    return rows[:, :self.batch_width(batch)]

  def batch(self, batch: int) -> jax.Array:
    """Batch `batch` [B, width] on the mesh."""
    rows = self.host_rows(batch)
    if not is_multiprocess():
      return jax.device_put(rows, self.sharding)
    shape = (self.layout.batch_size, rows.shape[1])
    return jax.make_array_from_process_local_data(self.sharding, rows, shape)

  def first_of_each_width(self) -> List[int]:
    """The first batch of every distinct width, by width (for warm-up)."""
    firsts = {}
    for b in range(self.num_batches):
      firsts.setdefault(self.batch_width(b), b)
    return [firsts[w] for w in sorted(firsts)]

  def kept_rows(self, batch: int) -> np.ndarray:
    """Rows of batch `batch` with real examples, in example order: the
    outputs to keep (`to_host(out)[rows]`)."""
    return self.layout.kept_rows(batch, self.num_examples)

  def batches(self) -> Iterator[Tuple[jax.Array, np.ndarray]]:
    """(batch [B, width] on the mesh, rows to keep) for every batch."""
    for b in range(self.num_batches):
      yield self.batch(b), self.kept_rows(b)


def to_host(tree: Any) -> Any:
  """Outputs as numpy arrays holding every row (gathered from all processes).

  With one process the tree is returned as it is (numpy converts it where
  it is read).
  """
  if not is_multiprocess():
    return tree
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.process_allgather(tree, tiled=True)
