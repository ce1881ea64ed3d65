"""Reading opened arrays into their shardings, shard by shard.

Every distinct shard of a parameter is read from TensorStore once and only
the shards this process's devices hold are read, so no device needs a full
host copy. Reads of the next parameters overlap with transfers of the
previous ones to devices, within a budget of host buffers in flight.
"""
import collections
from typing import Any, Dict, Mapping, Optional, Tuple

import jax
import numpy as np

from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import ParamPath
from specdec_jax.checkpoints.source import Source
from specdec_jax.checkpoints.source import ts_err

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
  """Reads every opened array into its sharding (or the default device).

  Args:
    ckpt: the checkpoint, for messages.
    sources: opened sources (`source.open_all`) by parameter path.
    shard_flat: a `jax.sharding.Sharding` (or None) by parameter path.
    dtype: numpy dtype to cast to on the host, or None (stored dtype).

  Returns:
    The arrays by parameter path.

  Raises:
    CheckpointError: an array's data cannot be read (missing, truncated or
      corrupt file).
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
