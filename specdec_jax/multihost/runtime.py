"""Starting JAX's distributed runtime (T5X's flags, or a Cloud TPU VM).

`initialize` must run before anything touches a JAX backend; with neither
`--multiprocess_gpu` nor a Cloud TPU VM it starts nothing (one process).
The coordination timeout also bounds `jax.distributed.initialize`'s wait
for all processes to start and its heartbeat (a process silent that long,
e.g. killed, ends every process).
"""
import inspect
from typing import Any, Dict, Optional

from absl import flags
from absl import logging
import jax

from specdec_jax.multihost import coordination
from specdec_jax.multihost import failures
from specdec_jax.multihost.coordination import DEFAULT_TIMEOUT_S


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


def _check_gpu_flags(coordinator_address: Optional[str],
                     process_count: Optional[int],
                     process_index: Optional[int]) -> None:
  """Raises ValueError naming a missing or inconsistent T5X flag."""
  missing = [
      name for name, value in (("--coordinator_address", coordinator_address),
                               ("--process_count", process_count),
                               ("--process_index", process_index))
      if value is None
  ]
  if missing:
    raise ValueError(
        "--multiprocess_gpu needs --coordinator_address=HOST:PORT, "
        "--process_count=N and --process_index=I (T5X's flags); missing: " +
        ", ".join(missing) + ".")
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(
        f"--process_index={process_index} with --process_count="
        f"{process_count}: allowed: 0 <= process_index < process_count.")


def _check_flags_need_gpu(multiprocess_gpu: bool,
                          coordinator_address: Optional[str],
                          process_count: Optional[int],
                          process_index: Optional[int]) -> None:
  """Refuses T5X's process flags without --multiprocess_gpu.

  T5X ignores them then, and so N processes started with them would run
  as N independent runs (each refused by the others' OUTPUT_DIR lock with
  a message about "another run").
  """
  given = [
      f"{name}={value}" for name, value in (("--coordinator_address",
                                             coordinator_address),
                                            ("--process_count", process_count),
                                            ("--process_index", process_index))
      if value is not None
  ]
  if given and not multiprocess_gpu:
    raise ValueError(
        f"{', '.join(given)} without --multiprocess_gpu: these flags only "
        "join processes into one run with --multiprocess_gpu (T5X's flag; "
        "on a Cloud TPU VM the processes are found without them). Add "
        "--multiprocess_gpu, or drop them for a one-process run.")


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
  coordination.set_timeout(timeout_s)
  _check_flags_need_gpu(multiprocess_gpu, coordinator_address, process_count,
                        process_index)
  if jax.distributed.is_initialized():
    failures.start_watcher()
    return
  if multiprocess_gpu:
    _check_gpu_flags(coordinator_address, process_count, process_index)
    if _config_value("jax_cpu_collectives_implementation", "gloo") is None:
      # Older JAX has no CPU collectives across processes by default.
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logging.info(
        "Initializing JAX distributed: coordinator %s, process %d "
        "of %d.", coordinator_address, process_index, process_count)
    jax.distributed.initialize(coordinator_address, process_count,
                               process_index, **_timeouts(timeout_s))
  elif _on_cloud_tpu_vm():
    logging.info("Cloud TPU VM: jax.distributed.initialize() from the TPU "
                 "metadata.")
    jax.distributed.initialize(**_timeouts(timeout_s))
  else:
    return
  failures.start_watcher()


def _timeouts(timeout_s: int) -> Dict[str, int]:
  """jax.distributed's waits for the processes to start, and its heartbeat
  (a process silent this long is declared dead, and every process ends),
  where this JAX version has them."""
  params = inspect.signature(jax.distributed.initialize).parameters
  return {
      name: timeout_s
      for name in ("initialization_timeout", "heartbeat_timeout_seconds")
      if name in params
  }


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
