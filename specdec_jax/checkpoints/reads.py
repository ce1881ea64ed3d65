"""Stored arrays opened (`Source`, `open_all`: metadata only) and read into
their shardings: each distinct shard once, only this process's shards, the
next reads overlapping the previous transfers within a host-memory budget.
"""
import collections
import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import jax
import numpy as np
import tensorstore as ts

from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import ParamPath
from specdec_jax.files import io_utils


def kvstore(path: str) -> Dict[str, Any]:
  """A TensorStore kvstore spec for a local path or a gs:// URL."""
  m = re.fullmatch(r"gs://([^/]+)/?(.*)", path, re.DOTALL)
  if m is not None:
    return {"driver": "gcs", "bucket": m.group(1), "path": m.group(2)}
  if io_utils.is_url(path):
    raise CheckpointError(
        f"Unsupported checkpoint location {path!r}: only local paths and "
        "gs:// URLs can be read with TensorStore.")
  return {"driver": "file", "path": os.path.abspath(path)}


def as_dir(path: str) -> str:
  return path if path.endswith("/") else path + "/"


class Source:
  """One stored array: an inline numpy array or a TensorStore spec; after
  `open_all`, its stored `shape` and `dtype` (the zarr header's) and `store`."""

  def __init__(self, name: str, *, spec: Optional[Dict[str, Any]] = None,
               array: Optional[np.ndarray] = None, strict_missing: bool = True):
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


def ts_err(e: BaseException) -> str:
  """A TensorStore error message without its long spec dump."""
  msg = str(e)
  cut = msg.find(" [tensorstore_spec=")
  return msg[:cut] if cut >= 0 else msg


def open_all(ckpt: str, sources: Mapping[ParamPath, Source],
             context: ts.Context) -> None:
  """Opens every TensorStore (metadata only) and records shape/dtype;
  CheckpointError: a bad spec, an unopenable or a uint16 array."""
  futures = {}
  for path, src in sources.items():
    if src.spec is None:
      continue
    spec = dict(src.spec)
    if src.strict_missing:
      # A missing chunk is an error, not zeros: T5X and Orbax store every one.
      spec["fill_missing_data_reads"] = False
    try:
      futures[path] = ts.open(spec, open=True, read=True, context=context)
    except Exception as e:  # Invalid spec.
      raise CheckpointError(
          f"Checkpoint {ckpt}: invalid TensorStore spec for parameter "
          f"'{src.name}' ({src.where()}): {ts_err(e)}") from e
  for path, fut in futures.items():
    src = sources[path]
    try:
      store = fut.result()
    except Exception as e:
      raise CheckpointError(
          f"Checkpoint {ckpt}: cannot open the array of parameter "
          f"'{src.name}' ({src.where()}): {ts_err(e)}") from e
    src.store = store
    src.shape = tuple(int(d) for d in store.shape)
    src.dtype = np.dtype(store.dtype.numpy_dtype)
    if src.dtype == np.uint16:
      raise CheckpointError(
          f"Checkpoint {ckpt}: parameter '{src.name}' is stored as uint16 "
          "(old T5X bfloat16 encoding), which is not supported.")


# Bytes of host buffers in flight while restoring.
_READ_BUDGET_BYTES = 1 << 30

_Index = Tuple[Tuple[int, int], ...]  # (start, stop) per dimension


def _norm_index(index: Tuple[slice, ...], shape: Tuple[int, ...]) -> _Index:
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


def _start_reads(path: ParamPath, src: Source,
                 sharding: Optional[jax.sharding.Sharding]) -> _Pending:
  shape = src.shape
  if sharding is None:
    index_list = [tuple((0, d) for d in shape)]
    device_keys = None
  else:
    device_keys = [
        (dev, _norm_index(idx, shape))
        for dev, idx in sharding.addressable_devices_indices_map(shape).items()
    ]
    index_list = list(dict.fromkeys(k for _, k in device_keys))
  reads = {}
  nbytes = 0
  for key in index_list:
    slices = tuple(slice(a, b) for a, b in key)
    if src.store is not None:
      reads[key] = src.store[slices].read() if slices else src.store.read()
    else:
      reads[key] = src.array[slices] if slices else src.array
    nbytes += int(np.prod([b - a for a, b in key],
                          dtype=np.int64)) * (src.dtype.itemsize)
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
            f"'{src.name}' ({src.where()}): {ts_err(e)}") from e
    if dtype is not None and data.dtype != dtype:
      data = data.astype(dtype)
    host[key] = data
  if pend.sharding is None:
    (data,) = host.values()
    return jax.device_put(data)
  shards = [jax.device_put(host[key], dev) for dev, key in pend.device_keys]
  return jax.make_array_from_single_device_arrays(src.shape, pend.sharding,
                                                  shards)


def read_all(ckpt: str, sources: Mapping[ParamPath, Source],
             shard_flat: Mapping[ParamPath,
                                 Any], dtype) -> Dict[ParamPath, jax.Array]:
  """Every source read into its sharding (None: default device), cast on
  the host to `dtype` (None: as stored); CheckpointError if unreadable."""
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
