"""`save_params`: parameters written as a T5X Orbax checkpoint, atomically.

Local paths are written through `os`; ``gs://`` through etils.epath
(tf.io.gfile / gcsfs), imported only when needed, as Orbax itself does.
"""
import json
import os
import shutil
import time
from typing import Any, Mapping

import jax
import numpy as np

from specdec_jax.files import io_utils
from specdec_jax.config import paths
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import STATE_DIR
from specdec_jax.checkpoints.layout import TARGET
from specdec_jax.checkpoints.layout import join

_PYTREE_HANDLER = ("orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
                   "PyTreeCheckpointHandler")


def _epath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def _write_text(path: str, text: str) -> None:
  if paths.is_url(path):
    _epath(path).write_text(text)
  else:
    with open(path, "w") as f:
      f.write(text)


def _makedirs(path: str) -> None:
  if paths.is_url(path):
    _epath(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def _rmtree(path: str) -> None:
  try:
    if paths.is_url(path):
      p = _epath(path)
      if p.exists():
        p.rmtree()
    else:
      shutil.rmtree(path, ignore_errors=True)
  except Exception:  # pylint: disable=broad-except  # best-effort cleanup
    pass


def _rename(src: str, dst: str) -> None:
  if paths.is_url(src):
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
  _makedirs(tmp)
  checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True))
  try:
    checkpointer.save(join(tmp, STATE_DIR),
                      args=ocp.args.PyTreeSave({TARGET: tree}))
  finally:
    checkpointer.close()
  _write_text(
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
  _write_text(join(tmp, "commit_success.txt"),
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
  """Writes `params` as a T5X-compatible Orbax checkpoint.

  The result is ``<directory>/checkpoint_<step>/`` in the layout of T5X's
  Orbax checkpoint manager: an Orbax PyTree checkpoint (OCDBT, zarr) in
  ``state/`` holding ``{'target': params}`` (no optimizer state), plus
  ``_CHECKPOINT_METADATA`` and ``commit_success.txt``. `load_t5x_params`
  reads it back bit-identically (same dtypes, values and tree).

  The checkpoint is first written completely under a temporary name
  (``checkpoint_<step>.orbax-checkpoint-tmp-<ns>``, which neither
  `latest_checkpoint` nor T5X/Orbax treat as a checkpoint) and then renamed,
  which is atomic on local file systems: a crash leaves either no
  ``checkpoint_<step>`` or a complete one. (On GCS a rename is a copy, so a
  crash during it can leave a partial directory, as with T5X/Orbax there.)
  Single-process only.

  Args:
    params: nested dict of arrays (``jax.Array``, possibly sharded, or numpy)
      in T5X's layout, as returned by `load_t5x_params`; a flax
      ``{'params': ...}`` wrapper is removed.
    directory: the model directory (local or ``gs://``); created if needed.
    step: training step, used in the directory name.

  Returns:
    The path of the written ``checkpoint_<step>`` directory.

  Raises:
    CheckpointError: ``checkpoint_<step>`` already exists.
    ValueError: a `kernel` that is not 2-D (the CPU kernel's packed panels).
  """
  directory = os.fspath(directory)
  if not paths.is_url(directory):
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
  _makedirs(directory)
  tmp = join(directory,
             f"checkpoint_{step}.orbax-checkpoint-tmp-{time.time_ns()}")
  try:
    _write_checkpoint(tmp, tree)
    _rename(tmp, final)
  except BaseException:
    _rmtree(tmp)
    raise
  return final
