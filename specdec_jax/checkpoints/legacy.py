"""The legacy layout (``t5x.checkpoints.Checkpointer``): a msgpack file
``checkpoint`` whose ``target`` leaves are inline arrays or TensorStore
specs of zarr folders, looked up beside it whatever driver was recorded
(as T5X). Old Orbax wrote it as ``state/checkpoint`` (``PLACEHOLDER://``).
"""
import json
import os
import posixpath
from typing import Any, Dict, Mapping, Optional

import numpy as np

from specdec_jax.checkpoints import orbax
from specdec_jax.checkpoints.layout import TARGET
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import ParamPath
from specdec_jax.checkpoints.layout import check_inside
from specdec_jax.checkpoints.layout import join
from specdec_jax.checkpoints.reads import Source
from specdec_jax.checkpoints.reads import as_dir
from specdec_jax.checkpoints.reads import kvstore
from specdec_jax.files import io_utils

_ORBAX_PLACEHOLDER = "PLACEHOLDER://"


def _is_ts_spec(x: Any) -> bool:
  return (isinstance(x, Mapping) and "driver" in x and
          ("kvstore" in x or "path" in x))


def _flatten_state(tree: Any, prefix: ParamPath = ()) -> Dict[ParamPath, Any]:
  """Flattens nested mappings; TensorStore spec dicts count as leaves."""
  if isinstance(tree, Mapping) and not _is_ts_spec(tree):
    out = {}
    for k, v in tree.items():
      out.update(_flatten_state(v, prefix + (str(k),)))
    return out
  return {prefix: tree}


def legacy_spec(ckpt: str, base_dir: str, name: str,
                spec_json: Mapping[str, Any]) -> Dict[str, Any]:
  """Turns a stored (relative-path) TensorStore spec into an absolute one."""
  spec = json.loads(json.dumps(spec_json))  # Deep copy, plain types.
  kv = spec.get("kvstore")
  if isinstance(kv, str):  # URL form, e.g. "file://target.x/" (unusual).
    kv = {"driver": kv.split("://")[0], "path": kv.split("://", 1)[-1]}
  kv = dict(kv or {})
  rel = kv.get("path")
  if rel is None:
    rel = spec.pop("path", None)  # tensorstore < 0.1.14 put it at top level.
  else:
    spec.pop("path", None)
  if not rel:
    raise CheckpointError(
        f"Checkpoint {ckpt}: the TensorStore spec of parameter '{name}' has no "
        f"path: {spec_json}")
  if kv.get("driver", "file") not in ("file", "gfile", "gcs"):
    raise CheckpointError(
        f"Checkpoint {ckpt}: unsupported kvstore driver {kv.get('driver')!r} "
        f"for parameter '{name}'.")
  check_inside(ckpt, name, rel)
  # Relative to the checkpoint, whatever driver was recorded (as T5X).
  spec["kvstore"] = kvstore(as_dir(join(base_dir, rel)))
  # The zarr header on disk is authoritative; the shape kept here is
  # checked against it by TensorStore.
  meta = {
      k: v for k, v in (spec.get("metadata") or {}).items() if k in ("shape",)
  }
  if meta:
    spec["metadata"] = meta
  else:
    spec.pop("metadata", None)
  return spec


def _read_state(ckpt: str, msgpack_path: str) -> Mapping[str, Any]:
  """The msgpack file's train state: a mapping with the `target` key."""
  from flax import serialization  # pylint: disable=g-import-not-at-top
  try:
    raw = io_utils.read_bytes(msgpack_path, max_bytes=None)  # GBs
  except Exception as e:
    raise CheckpointError(
        f"Checkpoint {ckpt}: cannot read {msgpack_path}: {e}") from e
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:
    raise CheckpointError(
        f"Checkpoint {ckpt}: {msgpack_path} is not a valid msgpack file "
        f"(truncated or corrupt?): {e}") from e
  if not isinstance(contents, Mapping):
    raise CheckpointError(
        f"Checkpoint {ckpt}: {msgpack_path} does not hold a state dict.")
  # Version >= 1 files wrap the flax optimizer as {'version', 'optimizer'}.
  state = contents.get("optimizer", contents)
  if not isinstance(state, Mapping) or TARGET not in state:
    raise CheckpointError(
        f"Checkpoint {ckpt}: no '{TARGET}' (model parameters) in "
        f"{msgpack_path}; top-level keys: {sorted(contents)}")
  return state


def msgpack_sources(ckpt: str, msgpack_path: str,
                    state_dir: Optional[str] = None) -> Dict[ParamPath, Source]:
  """Sources of the `target` leaves listed in a T5X/flax msgpack file
  (`state_dir`: an old Orbax ``state/checkpoint``). CheckpointError: the
  file is unreadable, not msgpack, holds no `target`, or an unknown leaf."""
  state = _read_state(ckpt, msgpack_path)
  base_dir = posixpath.dirname(msgpack_path) if io_utils.is_url(
      msgpack_path) else os.path.dirname(msgpack_path)
  sources = {}
  for path, leaf in _flatten_state(state[TARGET]).items():
    name = "/".join(path)
    if leaf is None or (isinstance(leaf, Mapping) and not leaf):
      continue  # Empty subtree.
    if _is_ts_spec(leaf):
      sources[path] = Source(name, spec=legacy_spec(ckpt, base_dir, name, leaf))
    elif (isinstance(leaf, str) and leaf.startswith(_ORBAX_PLACEHOLDER) and
          state_dir is not None):
      stored = leaf[len(_ORBAX_PLACEHOLDER):]
      sources[path] = orbax.array_source(state_dir, stored, name, "zarr",
                                         orbax.uses_ocdbt(state_dir),
                                         strict=False)
    elif isinstance(leaf, (np.ndarray, np.generic, int, float, bool)):
      sources[path] = Source(name, array=np.asarray(leaf))
    else:
      raise CheckpointError(
          f"Checkpoint {ckpt}: unsupported leaf of type {type(leaf).__name__} "
          f"for parameter '{name}' in {msgpack_path}.")
  return sources
