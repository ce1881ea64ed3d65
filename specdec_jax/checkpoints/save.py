"""`save_params`: parameters written as a T5X Orbax checkpoint, atomically.

``gs://`` folders are renamed and removed through etils.epath, imported only
when needed, as Orbax itself does.
"""
import json
import os
import shutil
import time
from typing import Any, Mapping

import jax
import numpy as np

from specdec_jax.files import io_utils
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import STATE_DIR
from specdec_jax.checkpoints.layout import TARGET
from specdec_jax.checkpoints.layout import join

_PYTREE_HANDLER = ("orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
                   "PyTreeCheckpointHandler")


def _epath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def _rmtree(path: str) -> None:
  try:
    if io_utils.is_url(path):
      p = _epath(path)
      if p.exists():
        p.rmtree()
    else:
      shutil.rmtree(path, ignore_errors=True)
  except Exception:  # pylint: disable=broad-except  # best-effort cleanup
    pass


def _rename(src: str, dst: str) -> None:
  if io_utils.is_url(src):
    # Not atomic on GCS (copy + delete); see `save_params`.
    _epath(src).rename(dst)
  else:
    os.rename(src, dst)  # Atomic on POSIX file systems.


def _to_plain_dict(tree: Any, prefix: str = "") -> Any:
  if isinstance(tree, Mapping):
    return {str(k): _to_plain_dict(v, f"{prefix}/{k}") for k, v in tree.items()}
  if isinstance(tree, (jax.Array, np.ndarray)):
    return tree
  if isinstance(tree, (np.generic, int, float, bool)):
    return np.asarray(tree)
  raise TypeError(f"save_params: leaf '{prefix.lstrip('/')}' is a "
                  f"{type(tree).__name__}, not an array.")


def _write_checkpoint(tmp: str, tree: Mapping[str, Any]) -> None:
  """`tree` as ``{'target': tree}`` in ``tmp/state/`` and T5X's side files."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  init_ns = time.time_ns()
  io_utils.makedirs(tmp)
  checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True))
  try:
    checkpointer.save(join(tmp, STATE_DIR),
                      args=ocp.args.PyTreeSave({TARGET: tree}))
  finally:
    checkpointer.close()
  io_utils.atomic_write(
      join(tmp, "_CHECKPOINT_METADATA"),
      json.dumps({
          "item_handlers": {
              STATE_DIR: _PYTREE_HANDLER
          },
          "metrics": {},
          "performance_metrics": {},
          "init_timestamp_nsecs": init_ns,
          "commit_timestamp_nsecs": time.time_ns(),
          "custom_metadata": {
              "writer": "specdec_jax.checkpoints.save_params"
          },
      }))
  io_utils.atomic_write(join(tmp, "commit_success.txt"),
                        "Checkpoint commit was successful.")


def _check_t5x_kernels(tree: dict, path: str = "") -> None:
  """Refuses the CPU kernel's packed panels: T5X's kernels are 2-D."""
  for name, value in tree.items():
    where = f"{path}/{name}" if path else name
    if isinstance(value, dict):
      _check_t5x_kernels(value, where)
    elif name == "kernel" and getattr(value, "ndim", 2) != 2:
      raise ValueError(
          f"save_params: {where} has shape {tuple(value.shape)}, but T5X's "
          "kernels are 2-D [in, out]: these look like the CPU kernel's "
          "packed panels. Save `T5Model.params`, which is always in T5X's "
          "layout.")


def save_params(params, directory, *, step: int = 0) -> str:
  """Writes `params` (T5X's layout; a ``{'params': ...}`` wrapper is
  removed) as ``<directory>/checkpoint_<step>/`` in T5X's Orbax layout
  (``state/`` holding ``{'target': params}``, ``_CHECKPOINT_METADATA``,
  ``commit_success.txt``) and returns its path; `load_t5x_params` reads it
  back bit-identically. Written under a temporary name, then renamed
  (atomic locally; a copy on GCS, as with T5X). Single-process only.

  Raises:
    CheckpointError: ``checkpoint_<step>`` already exists.
    ValueError: a `kernel` that is not 2-D (the CPU kernel's packed panels).
  """
  directory = os.fspath(directory)
  if not io_utils.is_url(directory):
    directory = os.path.abspath(directory)
  step = int(step)
  if step < 0:
    raise ValueError(f"step must be >= 0, got {step}")
  if isinstance(params, Mapping) and set(params) == {"params"}:
    params = params["params"]
  tree = _to_plain_dict(params)
  if not isinstance(tree, dict) or not tree:
    raise ValueError("save_params: params must be a non-empty nested dict.")
  _check_t5x_kernels(tree)

  final = join(directory, f"checkpoint_{step}")
  if io_utils.isdir(final) or io_utils.isfile(final):
    raise CheckpointError(f"Checkpoint {final} already exists.")
  io_utils.makedirs(directory)
  tmp = join(directory,
             f"checkpoint_{step}.orbax-checkpoint-tmp-{time.time_ns()}")
  try:
    _write_checkpoint(tmp, tree)
    _rename(tmp, final)
  except BaseException:
    _rmtree(tmp)
    raise
  return final
