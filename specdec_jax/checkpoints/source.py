"""One stored array: inline in a msgpack file, or a TensorStore spec.

`kvstore` turns a local path or ``gs://`` URL into a TensorStore key-value
store spec; `open_all` opens every spec (metadata only) and records the
stored shape and dtype, before any array data is read.
"""
import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import tensorstore as ts

from specdec_jax.config import paths
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import ParamPath


def kvstore(path: str) -> Dict[str, Any]:
  """A TensorStore kvstore spec for a local path or a gs:// URL."""
  m = re.fullmatch(r"gs://([^/]+)/?(.*)", path, re.DOTALL)
  if m is not None:
    return {"driver": "gcs", "bucket": m.group(1), "path": m.group(2)}
  if paths.is_url(path):
    raise CheckpointError(
        f"Unsupported checkpoint location {path!r}: only local paths and "
        "gs:// URLs can be read with TensorStore.")
  return {"driver": "file", "path": os.path.abspath(path)}


def as_dir(path: str) -> str:
  return path if path.endswith("/") else path + "/"


class Source:
  """One stored array: an inline numpy array or a TensorStore spec.

  After `open_all`, `shape` and `dtype` hold the array's stored metadata
  (read from the zarr header, not from the possibly stale msgpack copy) and
  `store` the opened TensorStore.
  """

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
  """Opens every TensorStore (metadata only) and records shape/dtype.

  Raises:
    CheckpointError: an invalid spec, an array that cannot be opened, or
      one stored as uint16 (old T5X bfloat16 encoding).
  """
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
