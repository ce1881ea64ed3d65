"""Reading T5X checkpoints (both on-disk layouts) and writing our own.

T5X has written two checkpoint layouts over time; both live in a step directory
``<model_dir>/checkpoint_<N>/``:

* **Legacy** (``t5x.checkpoints.Checkpointer``; the public
  ``gs://t5-data/pretrained_models/t5x/t5_1_1_*/checkpoint_1000000``
  checkpoints): a msgpack file named ``checkpoint`` written with
  ``flax.serialization``. Its top level is ``{'version': 3, 'optimizer':
  {'target': <params>, 'state': {'step': ..., 'param_states': ...}}}`` (very
  old files lack the ``version``/``optimizer`` wrapper). Each leaf is either a
  small array stored inline in the msgpack (flax msgpack extension type) or the
  JSON of a TensorStore spec such as ``{'driver': 'zarr', 'dtype': 'float32',
  'kvstore': {'driver': 'file', 'path': 'target.encoder.layers_0.mlp.wo.kernel/'},
  'metadata': {'shape': [...], 'chunks': [...], 'compressor': ...}}`` whose
  path is *relative to the checkpoint directory* (the zarr folders sit next to
  the msgpack file). Specs written to GCS use ``{'driver': 'gcs', 'bucket':
  't5x-dummy-bucket'}`` (the bucket is replaced by the real one when read) and,
  with tensorstore < 0.1.14, the relative path at the spec's top level instead
  of in ``kvstore``. Whatever driver was recorded, the data is looked up next to
  the msgpack file (local ``file`` or ``gcs``), as T5X does.
* **Orbax** (``t5x.checkpoints.OrbaxCheckpointManagerInterface``): an Orbax
  PyTree checkpoint in ``checkpoint_<N>/state/`` (plus ``dataset/`` and
  ``_CHECKPOINT_METADATA``). ``state/_METADATA`` is JSON whose
  ``tree_metadata`` maps every leaf, keyed by its key tuple such as
  ``('target', 'encoder', 'layers_0', 'mlp', 'wo', 'kernel')`` or
  ``('state', 'param_states', ..., 'v_row')``, to its value type; the arrays
  are zarr arrays named by the dot-joined key (``target.encoder.layers_0...``)
  inside one OCDBT key-value store rooted at ``state/`` (``use_ocdbt``), or in
  per-array folders ``state/<name>/`` without OCDBT; ``use_zarr3`` selects the
  zarr v3 format.

In both layouts the model parameters are the ``target`` subtree, in flax's
nested-dict layout of T5X's ``t5x/examples/t5/network.py`` Transformer, e.g.
``encoder/layers_0/attention/query/kernel``. Note that T5X's ``DenseGeneral``
stores every kernel flattened to 2-D ``[prod(in axes), prod(out features)]``:
the attention query/key/value kernels are ``[emb, heads * head_dim]`` and the
attention output kernel ``[heads * head_dim, emb]`` (reshaped to
``[emb, heads, head_dim]`` / ``[heads, head_dim, emb]`` only inside the layer).
This module returns exactly the stored shapes.

Everything is read through TensorStore directly, so only the ``target`` arrays
are touched (never the optimizer state, which for Adafactor on T5-XXL is
large), all array metadata is checked before any array data is read, and each
device reads only its own shard when ``shardings`` are given.
"""
from __future__ import annotations

import collections
import json
import os
import posixpath
import re
import shutil
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import jax
import numpy as np
import tensorstore as ts

from specdec_jax import io_utils

__all__ = [
    "CheckpointError",
    "load_t5x_params",
    "save_params",
    "latest_checkpoint",
    "list_checkpoints",
    "checkpoint_step",
]

# The key T5X uses for the model parameters inside the train state.
_TARGET = "target"
_STATE_DIR = "state"  # Orbax PyTree item written by T5X's Orbax manager.
_MSGPACK_FILE = "checkpoint"  # Legacy T5X (flax msgpack) file.
_ORBAX_METADATA = "_METADATA"
_CHECKPOINT_DIR_RE = re.compile(r"^checkpoint_(\d+)$")
# Placeholder leaves of the msgpack tree of old (pre-_METADATA) Orbax versions.
_ORBAX_PLACEHOLDER = "PLACEHOLDER://"
# Bytes of host buffers in flight while restoring (reads of the next
# parameters overlap with transfers of the previous ones up to this budget).
_READ_BUDGET_BYTES = 1 << 30

ParamPath = Tuple[str, ...]


class CheckpointError(ValueError):
  """A checkpoint is missing, malformed, unreadable or does not match."""


# ----------------------------------------------------------------------------
# Small filesystem layer: local paths through `os`. gs:// is read through
# `io_utils` (TensorStore's GCS key-value store, the one the arrays are read
# with: one client, one endpoint setting); it is written (`save_params`)
# through etils.epath (tf.io.gfile / gcsfs), imported only when needed.
# ----------------------------------------------------------------------------


def _is_url(path: str) -> bool:
  return "://" in path


def _epath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def _join(*parts: str) -> str:
  if _is_url(parts[0]):
    return posixpath.join(*parts)
  return os.path.join(*parts)


def _isdir(path: str) -> bool:
  return io_utils.isdir(path)


def _isfile(path: str) -> bool:
  return io_utils.isfile(path)


def _listdir(path: str) -> List[str]:
  return io_utils.listdir(path)


def _read_bytes(path: str) -> bytes:
  return io_utils.read_bytes(path)


def _write_text(path: str, text: str) -> None:
  if _is_url(path):
    _epath(path).write_text(text)
  else:
    with open(path, "w") as f:
      f.write(text)


def _makedirs(path: str) -> None:
  if _is_url(path):
    _epath(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def _rmtree(path: str) -> None:
  try:
    if _is_url(path):
      p = _epath(path)
      if p.exists():
        p.rmtree()
    else:
      shutil.rmtree(path, ignore_errors=True)
  except Exception:  # pylint: disable=broad-except  # best-effort cleanup
    pass


def _rename(src: str, dst: str) -> None:
  if _is_url(src):
    # Not atomic on GCS (copy + delete); see `save_params`.
    _epath(src).rename(dst)
  else:
    os.rename(src, dst)  # Atomic on POSIX file systems.


def _kvstore(path: str) -> Dict[str, Any]:
  """A TensorStore kvstore spec for a local path or a gs:// URL."""
  m = re.fullmatch(r"gs://([^/]+)/?(.*)", path, re.DOTALL)
  if m is not None:
    return {"driver": "gcs", "bucket": m.group(1), "path": m.group(2)}
  if _is_url(path):
    raise CheckpointError(
        f"Unsupported checkpoint location {path!r}: only local paths and "
        "gs:// URLs can be read with TensorStore.")
  return {"driver": "file", "path": os.path.abspath(path)}


def _as_dir(path: str) -> str:
  return path if path.endswith("/") else path + "/"


# ----------------------------------------------------------------------------
# Array sources: where one parameter's data lives.
# ----------------------------------------------------------------------------


class _Source:
  """One stored array: an inline numpy array or a TensorStore spec.

  After `open()`, `shape` and `dtype` hold the array's stored metadata (read
  from the zarr header, not from the possibly stale msgpack copy).
  """

  def __init__(self, name: str, *, spec: Optional[Dict[str, Any]] = None,
               array: Optional[np.ndarray] = None,
               strict_missing: bool = True):
    self.name = name  # Slash-joined parameter path, for messages.
    self.spec = spec
    self.array = array
    self.strict_missing = strict_missing
    self.store = None
    if array is not None:
      self.shape: Tuple[int, ...] = tuple(array.shape)
      self.dtype: np.dtype = array.dtype
    else:
      self.shape, self.dtype = None, None

  def where(self) -> str:
    if self.spec is None:
      return "inline in the msgpack file"
    kv = self.spec.get("kvstore", {})
    base = kv.get("base")
    if isinstance(base, dict):
      return f"{kv.get('path')!r} in OCDBT store {_kv_str(base)}"
    return _kv_str(kv)


def _kv_str(kv: Mapping[str, Any]) -> str:
  if kv.get("driver") == "gcs":
    return f"gs://{kv.get('bucket')}/{kv.get('path', '')}"
  return str(kv.get("path"))


def _ts_err(e: BaseException) -> str:
  """A TensorStore error message without its long spec dump."""
  msg = str(e)
  cut = msg.find(" [tensorstore_spec=")
  return msg[:cut] if cut >= 0 else msg


def _open_all(ckpt: str, sources: Mapping[ParamPath, _Source],
              context: ts.Context) -> None:
  """Opens every TensorStore (metadata only) and records shape/dtype."""
  futures = {}
  for path, src in sources.items():
    if src.spec is None:
      continue
    spec = dict(src.spec)
    if src.strict_missing:
      # A missing chunk file is an error rather than silently reading the fill
      # value (zeros). Valid for T5X/Orbax arrays: zarr v2 with fill_value null
      # stores every chunk, and Orbax sets store_data_equal_to_fill_value.
      spec["fill_missing_data_reads"] = False
    try:
      futures[path] = ts.open(spec, open=True, read=True, context=context)
    except Exception as e:  # Invalid spec.
      raise CheckpointError(
          f"Checkpoint {ckpt}: invalid TensorStore spec for parameter "
          f"'{src.name}' ({src.where()}): {_ts_err(e)}") from e
  for path, fut in futures.items():
    src = sources[path]
    try:
      store = fut.result()
    except Exception as e:
      raise CheckpointError(
          f"Checkpoint {ckpt}: cannot open the array of parameter "
          f"'{src.name}' ({src.where()}): {_ts_err(e)}") from e
    src.store = store
    src.shape = tuple(int(d) for d in store.shape)
    src.dtype = np.dtype(store.dtype.numpy_dtype)
    if src.dtype == np.uint16:
      raise CheckpointError(
          f"Checkpoint {ckpt}: parameter '{src.name}' is stored as uint16 "
          "(old T5X bfloat16 encoding), which is not supported.")


# ----------------------------------------------------------------------------
# Layout readers: each returns {param path tuple: _Source} for `target` only.
# ----------------------------------------------------------------------------


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


def _legacy_spec(ckpt: str, base_dir: str, name: str,
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
  # Like T5X, always resolve the path relative to the checkpoint directory,
  # whichever driver was recorded at write time (local copies of GCS
  # checkpoints and vice versa both work).
  spec["kvstore"] = _kvstore(_as_dir(_join(base_dir, rel)))
  # The zarr header on disk is authoritative; chunking/compression in the
  # msgpack copy may differ from what is stored. Keep shape/dtype (TensorStore
  # then verifies the header agrees with the msgpack).
  meta = {k: v for k, v in (spec.get("metadata") or {}).items()
          if k in ("shape",)}
  if meta:
    spec["metadata"] = meta
  else:
    spec.pop("metadata", None)
  return spec


def _orbax_sources(ckpt: str, state_dir: str) -> Dict[ParamPath, _Source]:
  """Sources of the `target` leaves of an Orbax PyTree checkpoint dir."""
  meta_path = _join(state_dir, _ORBAX_METADATA)
  try:
    meta = json.loads(_read_bytes(meta_path))
    tree_meta = meta["tree_metadata"]
  except Exception as e:
    raise CheckpointError(
        f"Checkpoint {ckpt}: cannot read Orbax metadata {meta_path}: {e}"
    ) from e
  use_ocdbt = meta.get("use_ocdbt")
  if use_ocdbt is None:
    use_ocdbt = _isfile(_join(state_dir, "manifest.ocdbt"))
  driver = "zarr3" if meta.get("use_zarr3") else "zarr"
  strict = bool(meta.get("store_array_data_equal_to_fill_value", True))
  sources = {}
  for key_str, entry in tree_meta.items():
    try:
      keys = tuple(str(k["key"]) for k in entry["key_metadata"])
      value_type = entry["value_metadata"]["value_type"]
    except (KeyError, TypeError) as e:
      raise CheckpointError(
          f"Checkpoint {ckpt}: malformed entry {key_str!r} in {meta_path}"
      ) from e
    if not keys or keys[0] != _TARGET:
      continue  # Optimizer state, step, ...: never read.
    path = keys[1:]
    name = "/".join(path)
    if value_type in ("None", "Dict", "List", "Tuple", "NamedTuple"):
      continue  # Empty containers / None placeholders.
    if value_type not in ("jax.Array", "np.ndarray", "scalar"):
      raise CheckpointError(
          f"Checkpoint {ckpt}: parameter '{name}' has unsupported Orbax value "
          f"type {value_type!r}.")
    sources[path] = _orbax_array_source(state_dir, ".".join(keys), name,
                                        driver, use_ocdbt, strict)
  return sources


def _orbax_array_source(state_dir: str, stored_name: str, name: str,
                        driver: str, use_ocdbt: bool, strict: bool) -> _Source:
  if use_ocdbt:
    kv = {"driver": "ocdbt", "base": _kvstore(_as_dir(state_dir)),
          "path": stored_name + "/"}
  else:
    kv = _kvstore(_as_dir(_join(state_dir, stored_name)))
  return _Source(name, spec={"driver": driver, "kvstore": kv},
                 strict_missing=strict)


def _msgpack_sources(ckpt: str, msgpack_path: str,
                     state_dir: Optional[str] = None
                     ) -> Dict[ParamPath, _Source]:
  """Sources of the `target` leaves listed in a T5X/flax msgpack file.

  `state_dir` is set for old Orbax checkpoints (msgpack `state/checkpoint`
  with `PLACEHOLDER://<name>` leaves instead of `_METADATA`).
  """
  from flax import serialization  # pylint: disable=g-import-not-at-top
  try:
    raw = _read_bytes(msgpack_path)
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
  if not isinstance(state, Mapping) or _TARGET not in state:
    raise CheckpointError(
        f"Checkpoint {ckpt}: no '{_TARGET}' (model parameters) in "
        f"{msgpack_path}; top-level keys: {sorted(contents)}")
  base_dir = posixpath.dirname(msgpack_path) if _is_url(msgpack_path) else (
      os.path.dirname(msgpack_path))
  sources = {}
  for path, leaf in _flatten_state(state[_TARGET]).items():
    name = "/".join(path)
    if leaf is None or (isinstance(leaf, Mapping) and not leaf):
      continue  # Empty subtree.
    if _is_ts_spec(leaf):
      sources[path] = _Source(name, spec=_legacy_spec(ckpt, base_dir, name,
                                                      leaf))
    elif (isinstance(leaf, str) and leaf.startswith(_ORBAX_PLACEHOLDER)
          and state_dir is not None):
      stored = leaf[len(_ORBAX_PLACEHOLDER):]
      use_ocdbt = _isfile(_join(state_dir, "manifest.ocdbt"))
      sources[path] = _orbax_array_source(state_dir, stored, name, "zarr",
                                          use_ocdbt, strict=False)
    elif isinstance(leaf, (np.ndarray, np.generic, int, float, bool)):
      sources[path] = _Source(name, array=np.asarray(leaf))
    else:
      raise CheckpointError(
          f"Checkpoint {ckpt}: unsupported leaf of type {type(leaf).__name__} "
          f"for parameter '{name}' in {msgpack_path}.")
  return sources


def _checkpoint_sources(ckpt: str) -> Tuple[str, Dict[ParamPath, _Source]]:
  """Detects the layout of `ckpt` and lists its parameters' sources."""
  if not _isdir(ckpt):
    if _isfile(ckpt) and posixpath.basename(ckpt.rstrip("/")) == _MSGPACK_FILE:
      return "legacy", _msgpack_sources(ckpt, ckpt)  # Path to the file itself.
    raise CheckpointError(
        f"Checkpoint directory {ckpt} does not exist (expected a T5X "
        "checkpoint_<N> directory).")
  state_dir = _join(ckpt, _STATE_DIR)
  if _isfile(_join(state_dir, _ORBAX_METADATA)):
    return "orbax", _orbax_sources(ckpt, state_dir)
  if _isfile(_join(state_dir, _MSGPACK_FILE)):
    return "orbax-msgpack", _msgpack_sources(
        ckpt, _join(state_dir, _MSGPACK_FILE), state_dir)
  if _isfile(_join(ckpt, _MSGPACK_FILE)):
    return "legacy", _msgpack_sources(ckpt, _join(ckpt, _MSGPACK_FILE))
  if _isdir(state_dir):
    raise CheckpointError(
        f"Checkpoint {ckpt}: {state_dir} has no Orbax metadata file "
        f"'{_ORBAX_METADATA}' (incomplete or not an Orbax checkpoint).")
  raise CheckpointError(
      f"Checkpoint {ckpt}: not a T5X checkpoint: neither a '{_MSGPACK_FILE}' "
      f"msgpack file (legacy layout) nor '{_STATE_DIR}/{_ORBAX_METADATA}' "
      "(Orbax layout) found.")


# ----------------------------------------------------------------------------
# Pytree helpers for `expected` / `shardings` (nested mappings of leaves).
# ----------------------------------------------------------------------------


def _flatten_spec_tree(tree: Any, what: str,
                       is_leaf) -> Dict[ParamPath, Any]:
  """Flattens a nested mapping whose leaves satisfy `is_leaf`."""
  out = {}

  def rec(node, prefix):
    if hasattr(node, "unbox") and not is_leaf(node):
      node = node.unbox()  # flax AxisMetadata (nn.Partitioned, ...).
    if is_leaf(node):
      out[prefix] = node
    elif isinstance(node, Mapping):
      for k, v in node.items():
        rec(v, prefix + (str(k),))
    elif node is None:
      out[prefix] = None
    else:
      raise TypeError(
          f"{what}: unexpected {type(node).__name__} at "
          f"'{'/'.join(prefix)}'; expected a nested dict of leaves.")

  rec(tree, ())
  return out


def _maybe_unwrap_params(tree: Any, names: Iterable[ParamPath]) -> Any:
  """Drops a flax `{'params': ...}` wrapper if the checkpoint has none."""
  if (isinstance(tree, Mapping) and set(tree.keys()) == {"params"}
      and isinstance(tree["params"], Mapping)
      and not any(p and p[0] == "params" for p in names)):
    return tree["params"]
  return tree


def _unflatten(flat: Mapping[ParamPath, Any]) -> Dict[str, Any]:
  out: Dict[str, Any] = {}
  for path, value in flat.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = value
  return out


def _fmt_paths(paths: Iterable[ParamPath], limit: int = 10) -> str:
  names = sorted("/".join(p) for p in paths)
  more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


# ----------------------------------------------------------------------------
# Restore.
# ----------------------------------------------------------------------------


def _norm_index(index: Tuple[slice, ...],
                shape: Tuple[int, ...]) -> Tuple[Tuple[int, int], ...]:
  out = []
  for sl, dim in zip(index, shape):
    start, stop, step = sl.indices(dim)
    if step != 1:
      raise ValueError(f"strided shard index {index}")
    out.append((start, stop))
  return tuple(out)


class _Pending:
  """Reads in flight for one parameter."""

  def __init__(self, path, src, sharding, reads, device_keys, nbytes):
    self.path = path
    self.src = src
    self.sharding = sharding
    self.reads = reads  # {normalized index: ts future or np array}
    self.device_keys = device_keys  # [(device, normalized index)] or None
    self.nbytes = nbytes


def _start_reads(path: ParamPath, src: _Source,
                 sharding: Optional[jax.sharding.Sharding]) -> _Pending:
  shape = src.shape
  if sharding is None:
    index_list = [tuple((0, d) for d in shape)]
    device_keys = None
  else:
    device_keys = [(dev, _norm_index(idx, shape)) for dev, idx in
                   sharding.addressable_devices_indices_map(shape).items()]
    index_list = list(dict.fromkeys(k for _, k in device_keys))
  reads = {}
  nbytes = 0
  for key in index_list:
    slices = tuple(slice(a, b) for a, b in key)
    if src.store is not None:
      reads[key] = src.store[slices].read() if slices else src.store.read()
    else:
      reads[key] = src.array[slices] if slices else src.array
    nbytes += int(np.prod([b - a for a, b in key], dtype=np.int64)) * (
        src.dtype.itemsize)
  return _Pending(path, src, sharding, reads, device_keys, nbytes)


def _finish(ckpt: str, pend: _Pending, dtype) -> jax.Array:
  src = pend.src
  host = {}
  for key, r in pend.reads.items():
    if isinstance(r, np.ndarray):
      data = r
    else:
      try:
        data = np.asarray(r.result())
      except Exception as e:
        raise CheckpointError(
            f"Checkpoint {ckpt}: cannot read the data of parameter "
            f"'{src.name}' ({src.where()}): {_ts_err(e)}") from e
    if dtype is not None and data.dtype != dtype:
      data = data.astype(dtype)
    host[key] = data
  if pend.sharding is None:
    (data,) = host.values()
    return jax.device_put(data)
  shards = [jax.device_put(host[key], dev) for dev, key in pend.device_keys]
  return jax.make_array_from_single_device_arrays(src.shape, pend.sharding,
                                                  shards)


def load_t5x_params(path, *, expected=None, dtype=None, shardings=None
                    ) -> Dict[str, Any]:
  """Loads the model parameters of a T5X checkpoint (either layout).

  Args:
    path: a T5X step directory ``.../checkpoint_<N>`` (local path or
      ``gs://bucket/...``), in the legacy layout (msgpack ``checkpoint`` file
      plus zarr folders) or the Orbax layout (``state/`` PyTree checkpoint).
      The legacy msgpack file itself may also be given.
    expected: optional nested dict with the same structure as the result whose
      leaves have a ``.shape`` (e.g. ``jax.ShapeDtypeStruct`` from
      ``jax.eval_shape(model.init, ...)``; a ``{'params': ...}`` wrapper and
      flax ``nn.Partitioned`` boxes are accepted). Every expected parameter
      must exist with exactly that shape and the checkpoint may hold no other
      parameters; dtypes are not compared. All of this is checked from
      metadata before any array data is read.
    dtype: if given (e.g. ``jnp.bfloat16``), every array is cast to it on the
      host while restoring; otherwise arrays keep their stored dtype (T5X
      stores float32).
    shardings: optional nested dict (same structure) of
      ``jax.sharding.Sharding`` (``None`` leaves: default device), or one
      ``Sharding`` for all parameters. Each array is restored directly into
      its sharding: every distinct shard is read from TensorStore once and
      only the addressable shards are read, so no device needs a full host
      copy. Without it, arrays are placed on the default device.

  Returns:
    The ``target`` subtree of the checkpoint (without the ``target`` key) as a
    nested dict of ``jax.Array`` in T5X's parameter layout, e.g.
    ``params['encoder']['layers_0']['attention']['query']['kernel']``
    (``[emb, heads * head_dim]``), ``params['encoder']['layers_0']['mlp']
    ['wi_0']['kernel']`` (``[emb, mlp]``), ``params['decoder']
    ['logits_dense']['kernel']`` (``[emb, vocab]``),
    ``params['token_embedder']['embedding']`` (``[vocab, emb]``),
    ``params['encoder']['relpos_bias']['rel_embedding']``
    (``[heads, num_buckets]``). Use it as ``{'params': tree}`` for flax.
    Optimizer state is never read.

  Raises:
    CheckpointError: the directory or its ``checkpoint`` / Orbax metadata is
      missing, an array cannot be opened or read (missing, truncated or
      corrupt file), or the parameters do not match ``expected``. The message
      names the checkpoint and the slash-joined parameter path.
  """
  ckpt = os.fspath(path)
  if not _is_url(ckpt):
    ckpt = os.path.abspath(ckpt)
  _, sources = _checkpoint_sources(ckpt)
  if not sources:
    raise CheckpointError(f"Checkpoint {ckpt}: it holds no parameters.")
  dtype = None if dtype is None else np.dtype(dtype)
  # Every check reads metadata only; array data is read last.
  exp_flat = _expected_shapes(ckpt, sources, expected)
  shard_flat = _shardings_by_param(ckpt, sources, shardings)
  context = ts.Context({
      "cache_pool": {"total_bytes_limit": 64 << 20},
      "file_io_concurrency": {"limit": 64},
  })
  _open_all(ckpt, sources, context)
  _check_opened(ckpt, sources, exp_flat, shard_flat)
  return _unflatten(_read_all(ckpt, sources, shard_flat, dtype))


def _expected_shapes(ckpt: str, sources: Mapping[ParamPath, _Source],
                     expected: Any) -> Optional[Dict[ParamPath, Any]]:
  """`expected` flattened, after checking that it names the same parameters.

  Raises:
    CheckpointError: parameters missing from the checkpoint, or in it but
      not expected.
  """
  if expected is None:
    return None
  expected = _maybe_unwrap_params(expected, sources)
  exp_flat = _flatten_spec_tree(expected, "expected",
                                lambda x: hasattr(x, "shape"))
  missing = [p for p, v in exp_flat.items() if v is not None and
             p not in sources]
  extra = [p for p in sources if p not in exp_flat]
  problems = []
  if missing:
    problems.append(
        f"{len(missing)} expected parameter(s) missing from the checkpoint: "
        + _fmt_paths(missing))
  if extra:
    problems.append(
        f"{len(extra)} parameter(s) in the checkpoint that the model does "
        "not expect: " + _fmt_paths(extra))
  if problems:
    raise CheckpointError(f"Checkpoint {ckpt}: " + "; ".join(problems))
  return exp_flat


def _shardings_by_param(ckpt: str, sources: Mapping[ParamPath, _Source],
                        shardings: Any) -> Dict[ParamPath, Any]:
  """One sharding (or None) per parameter, from one Sharding or a tree.

  Raises:
    CheckpointError: shardings given for parameters not in the checkpoint.
  """
  if shardings is None:
    return {}
  if isinstance(shardings, jax.sharding.Sharding):
    return {p: shardings for p in sources}
  shardings = _maybe_unwrap_params(shardings, sources)
  shard_flat = _flatten_spec_tree(
      shardings, "shardings", lambda x: isinstance(x, jax.sharding.Sharding))
  unknown = [p for p, s in shard_flat.items()
             if s is not None and p not in sources]
  if unknown:
    raise CheckpointError(
        f"Checkpoint {ckpt}: shardings given for parameter(s) not in the "
        f"checkpoint: {_fmt_paths(unknown)}")
  return shard_flat


def _check_opened(ckpt: str, sources: Mapping[ParamPath, _Source],
                  exp_flat: Optional[Mapping[ParamPath, Any]],
                  shard_flat: Mapping[ParamPath, Any]) -> None:
  """Every opened array's shape against `expected` and its sharding.

  Raises:
    CheckpointError: a shape differs from the expected one, or a sharding
      does not fit its array.
  """
  for p in sorted(sources):
    src = sources[p]
    if exp_flat is not None and exp_flat.get(p) is not None:
      want = tuple(int(d) for d in exp_flat[p].shape)
      if want != src.shape:
        raise CheckpointError(
            f"Checkpoint {ckpt}: parameter '{src.name}' has shape "
            f"{list(src.shape)} in the checkpoint but the model expects "
            f"{list(want)}.")
    sharding = shard_flat.get(p)
    if sharding is not None:
      try:
        sharding.shard_shape(src.shape)
        sharding.addressable_devices_indices_map(src.shape)
      except Exception as e:
        raise CheckpointError(
            f"Checkpoint {ckpt}: sharding {sharding} does not fit parameter "
            f"'{src.name}' of shape {list(src.shape)}: {e}") from e


def _read_all(ckpt: str, sources: Mapping[ParamPath, _Source],
              shard_flat: Mapping[ParamPath, Any], dtype
              ) -> Dict[ParamPath, jax.Array]:
  """Reads every array into its sharding, by parameter path.

  The next parameters' reads overlap with the current ones' transfers to
  devices, within `_READ_BUDGET_BYTES` of host buffers in flight.
  """
  flat_out: Dict[ParamPath, jax.Array] = {}
  pending: collections.deque = collections.deque()
  in_flight = 0
  for p in sorted(sources):
    pend = _start_reads(p, sources[p], shard_flat.get(p))
    pending.append(pend)
    in_flight += pend.nbytes
    while pending and in_flight > _READ_BUDGET_BYTES:
      done = pending.popleft()
      in_flight -= done.nbytes
      flat_out[done.path] = _finish(ckpt, done, dtype)
  while pending:
    done = pending.popleft()
    flat_out[done.path] = _finish(ckpt, done, dtype)
  return flat_out


# ----------------------------------------------------------------------------
# Save.
# ----------------------------------------------------------------------------


def _to_plain_dict(tree: Any, prefix: str = "") -> Any:
  if isinstance(tree, Mapping):
    return {str(k): _to_plain_dict(v, f"{prefix}/{k}") for k, v in
            tree.items()}
  if isinstance(tree, (jax.Array, np.ndarray)):
    return tree
  if isinstance(tree, (np.generic, int, float, bool)):
    return np.asarray(tree)
  raise TypeError(f"save_params: leaf '{prefix.lstrip('/')}' is a "
                  f"{type(tree).__name__}, not an array.")


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
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  directory = os.fspath(directory)
  if not _is_url(directory):
    directory = os.path.abspath(directory)
  step = int(step)
  if step < 0:
    raise ValueError(f"step must be >= 0, got {step}")
  if isinstance(params, Mapping) and set(params) == {"params"}:
    params = params["params"]
  tree = _to_plain_dict(params)
  if not isinstance(tree, dict) or not tree:
    raise ValueError("save_params: params must be a non-empty nested dict.")

  final = _join(directory, f"checkpoint_{step}")
  if _isdir(final) or _isfile(final):
    raise CheckpointError(f"Checkpoint {final} already exists.")
  _makedirs(directory)
  tmp = _join(directory,
              f"checkpoint_{step}.orbax-checkpoint-tmp-{time.time_ns()}")
  init_ns = time.time_ns()
  try:
    _makedirs(tmp)
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True))
    try:
      checkpointer.save(_join(tmp, _STATE_DIR),
                        args=ocp.args.PyTreeSave({_TARGET: tree}))
    finally:
      checkpointer.close()
    _write_text(_join(tmp, "_CHECKPOINT_METADATA"), json.dumps({
        "item_handlers": {
            _STATE_DIR: "orbax.checkpoint._src.handlers."
                        "pytree_checkpoint_handler.PyTreeCheckpointHandler"},
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": init_ns,
        "commit_timestamp_nsecs": time.time_ns(),
        "custom_metadata": {"writer": "specdec_jax.checkpoints.save_params"},
    }))
    _write_text(_join(tmp, "commit_success.txt"),
                "Checkpoint commit was successful.")
    _rename(tmp, final)
  except BaseException:
    _rmtree(tmp)
    raise
  return final


def checkpoint_step(path) -> Optional[int]:
  """N for a path whose last component is ``checkpoint_<N>``, else None."""
  name = posixpath.basename(os.fspath(path).rstrip("/"))
  m = _CHECKPOINT_DIR_RE.match(name)
  return int(m.group(1)) if m else None


def _is_complete(ckpt: str) -> bool:
  """A legacy ``checkpoint`` file or an Orbax ``state/`` checkpoint exists."""
  state = _join(ckpt, _STATE_DIR)
  return (_isfile(_join(ckpt, _MSGPACK_FILE))
          or _isfile(_join(state, _ORBAX_METADATA))
          or _isfile(_join(state, _MSGPACK_FILE)))


def list_checkpoints(directory) -> List[Tuple[int, str]]:
  """(N, path) of the complete ``checkpoint_<N>`` subdirectories, by N.

  Args:
    directory: a model directory (local or ``gs://``) holding T5X step
      directories.

  Returns:
    ``(N, <directory>/checkpoint_<N>)`` for every N whose directory holds a
    legacy ``checkpoint`` file or an Orbax ``state/`` checkpoint, sorted by
    N (temporary ``*.orbax-checkpoint-tmp-*`` / ``*.tmp-*`` directories are
    ignored); empty if `directory` does not exist.
  """
  directory = os.fspath(directory)
  if not _isdir(directory):
    return []
  found = []
  for name in _listdir(directory):
    step = checkpoint_step(name)
    if step is not None and _is_complete(_join(directory, name)):
      found.append((step, _join(directory, name)))
  return sorted(found)


def latest_checkpoint(directory) -> Optional[str]:
  """The complete ``checkpoint_<N>`` subdirectory with the largest N, or None.

  See `list_checkpoints` for what counts as complete.
  """
  found = list_checkpoints(directory)
  return found[-1][1] if found else None
