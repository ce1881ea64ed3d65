"""The Orbax layout: ``checkpoint_<N>/state/_METADATA`` maps every leaf's
key tuple to its value type; arrays are zarr (v3 with ``use_zarr3``) named
by the dot-joined key, in one OCDBT store or per-array folders.
"""
import json
from typing import Dict

from specdec_jax.checkpoints.layout import ORBAX_METADATA
from specdec_jax.checkpoints.layout import TARGET
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import ParamPath
from specdec_jax.checkpoints.layout import check_inside
from specdec_jax.checkpoints.layout import join
from specdec_jax.checkpoints.reads import Source
from specdec_jax.checkpoints.reads import as_dir
from specdec_jax.checkpoints.reads import kvstore
from specdec_jax.files import io_utils

_CONTAINERS = ("None", "Dict", "List", "Tuple", "NamedTuple")
_ARRAYS = ("jax.Array", "np.ndarray", "scalar")


def orbax_sources(ckpt: str, state_dir: str) -> Dict[ParamPath, Source]:
  """Sources of the `target` leaves of an Orbax PyTree checkpoint dir;
  CheckpointError: bad metadata, or a parameter that is not an array."""
  meta_path = join(state_dir, ORBAX_METADATA)
  try:
    meta = json.loads(io_utils.read_bytes(meta_path))
    tree_meta = meta["tree_metadata"]
  except Exception as e:
    raise CheckpointError(
        f"Checkpoint {ckpt}: cannot read Orbax metadata {meta_path}: {e}"
    ) from e
  use_ocdbt = meta.get("use_ocdbt")
  if use_ocdbt is None:
    use_ocdbt = uses_ocdbt(state_dir)
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
    if not keys or keys[0] != TARGET:
      continue  # Optimizer state, step, ...: never read.
    path = keys[1:]
    name = "/".join(path)
    if value_type in _CONTAINERS:
      continue  # Empty containers / None placeholders.
    if value_type not in _ARRAYS:
      raise CheckpointError(
          f"Checkpoint {ckpt}: parameter '{name}' has unsupported Orbax value "
          f"type {value_type!r}.")
    sources[path] = array_source(state_dir, ".".join(keys), name, driver,
                                 use_ocdbt, strict)
  return sources


def uses_ocdbt(state_dir: str) -> bool:
  """Whether the arrays are in one OCDBT store (it has a manifest)."""
  return io_utils.isfile(join(state_dir, "manifest.ocdbt"))


def array_source(state_dir: str, stored_name: str, name: str, driver: str,
                 use_ocdbt: bool, strict: bool) -> Source:
  """The array stored as `stored_name` ('target.encoder...') in `state_dir`
  (CheckpointError if it leaves it)."""
  check_inside(state_dir, name, stored_name)
  if use_ocdbt:
    kv = {
        "driver": "ocdbt",
        "base": kvstore(as_dir(state_dir)),
        "path": stored_name + "/"
    }
  else:
    kv = kvstore(as_dir(join(state_dir, stored_name)))
  return Source(name, spec={
      "driver": driver,
      "kvstore": kv
  }, strict_missing=strict)
