"""Sharding T5 parameters and inputs over a ('data', 'model') device mesh.

T5X's rules (`t5x/partitioning.py`): each parameter path gets T5X's logical
axis names (`T5X_PARAM_AXES`: `(regex, axes)`, first `re.search` match
wins, unmatched: replicated), mapped to mesh axes by
`standard_logical_axis_rules` (Megatron-style: `mlp/wi_0/kernel` is
`PartitionSpec(None, 'model')`); both gin-configurable. Unlike T5X, a
dimension the mesh axis does not divide is replicated instead of failing.
"""
import re
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import gin
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from specdec_jax.core.models.t5 import T5Model

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)

# A PartitionSpec-like entry per dimension: a logical or mesh axis name, a
# tuple of mesh axis names, or None (replicated).
AxisEntry = Union[None, str, Tuple[str, ...]]
Rule = Tuple[str, Optional[Sequence[AxisEntry]]]
MeshLike = Union[Mesh, Mapping[str, int], None]

# T5X's kernel_axes of each parameter of t5x/examples/t5/network.py.
T5X_PARAM_AXES: Tuple[Rule, ...] = (
    (r"(^|/)token_embedder/embedding$", ("vocab", "embed")),
    (r"(^|/)relpos_bias/rel_embedding$", ("heads", "relpos_buckets")),
    (r"(^|/)(query|key|value)/kernel$", ("embed", "joined_kv")),
    (r"(^|/)out/kernel$", ("joined_kv", "embed")),
    (r"(^|/)mlp/wi(_\d+)?/kernel$", ("embed", "mlp")),
    (r"(^|/)mlp/wo/kernel$", ("mlp", "embed")),
    (r"(^|/)logits_dense/kernel$", ("embed", "vocab")),
    (r"(^|/)scale$", ("embed",)),
)


@gin.configurable
def make_mesh(data: int = 1, model: int = 1,
              devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A ('data', 'model') mesh of `devices` (exactly data * model of them;
  default: the first of `jax.devices()`, all of them with several processes).

  Raises:
    ValueError: non-positive sizes, or a device count that does not fit.
  """
  for name, value in (("data", data), ("model", model)):
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or
        value < 1):
      raise ValueError(
          f"make_mesh: {name} must be a positive integer, got {value!r}.")
  data, model = int(data), int(model)
  needed = data * model
  if devices is None:
    # Every process's devices (JAX's multi-controller runtime: `multihost`).
    available = list(jax.devices())
    if needed > len(available):
      raise ValueError(
          f"make_mesh(data={data}, model={model}) needs data*model = "
          f"{needed} devices but only {len(available)} are available "
          f"({available[0].platform}).")
    if jax.process_count() > 1 and needed != len(available):
      # A process without devices in the mesh could not run its programs.
      raise ValueError(
          f"make_mesh(data={data}, model={model}) uses {needed} of the "
          f"{len(available)} devices of {jax.process_count()} processes: "
          "with several processes the mesh must use all of them (data*model "
          f"= {len(available)}).")
    devices = available[:needed]
  else:
    devices = list(devices)
    if needed != len(devices):
      raise ValueError(
          f"make_mesh(data={data}, model={model}) needs data*model = "
          f"{needed} devices but {len(devices)} devices were given "
          f"({jax.device_count()} available).")
  try:  # Topology-aware order on TPU (model axis on nearest neighbours).
    grid = mesh_utils.create_device_mesh((data, model), devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices, dtype=object).reshape(data, model)
  return Mesh(grid, MESH_AXES)


def _axis_sizes(mesh: MeshLike) -> Optional[Mapping[str, int]]:
  if mesh is None:
    return None
  shape = mesh.shape if isinstance(mesh, Mesh) else mesh
  return {str(k): int(v) for k, v in dict(shape).items()}


@gin.configurable
def standard_logical_axis_rules(
    parameter_partitioning_dims: int = 1,
    additional_rules: Optional[Sequence[Tuple[str, AxisEntry]]] = None
) -> Tuple[Tuple[str, AxisEntry], ...]:
  """T5X's logical -> mesh axis rules (activation_partitioning_dims = 1):
  'embed' replicated (`parameter_partitioning_dims` 1) or over 'data' (2);
  `additional_rules` take precedence."""
  if parameter_partitioning_dims not in (1, 2):
    raise ValueError(
        "standard_logical_axis_rules: parameter_partitioning_dims must be 1 "
        f"or 2, got {parameter_partitioning_dims!r}.")
  rules = [
      ("batch", DATA_AXIS),
      ("vocab", MODEL_AXIS),
      ("embed", None if parameter_partitioning_dims == 1 else DATA_AXIS),
      ("mlp", MODEL_AXIS),
      ("heads", MODEL_AXIS),
      ("kv", None),
      ("joined_kv", MODEL_AXIS),
      ("relpos_buckets", None),
      ("abspos_buckets", None),
      ("length", None),
      ("layers", None),
      ("stack", None),
      ("mlp_activations", None),
  ]
  return tuple(additional_rules or ()) + tuple(rules)


def _path_str(path) -> str:
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  if len(parts) > 1 and parts[0] == "params":
    parts = parts[1:]  # flax's collection name, not part of T5X's names.
  return "/".join(parts)


def _as_mesh_axes(entry: Any) -> Tuple[str, ...]:
  if isinstance(entry, str):
    return (entry,)
  return tuple(entry)


def _resolve(path: str, shape: Tuple[int, ...], axes: Sequence[AxisEntry],
             logical_rules: Sequence[Tuple[str, AxisEntry]],
             sizes: Optional[Mapping[str, int]]) -> PartitionSpec:
  """Logical/mesh axis entries -> a PartitionSpec valid for shape and mesh."""
  axes = tuple(axes)
  if len(axes) > len(shape):
    raise ValueError(
        f"Partitioning rule for '{path}' names {len(axes)} axes {axes} but "
        f"the parameter has shape {tuple(shape)}.")
  axes = axes + (None,) * (len(shape) - len(axes))
  logical_names = {name for name, _ in logical_rules}
  used = set()
  spec = []
  for dim, entry in zip(shape, axes):
    if entry is None:
      spec.append(None)
      continue
    if isinstance(entry, str) and entry in logical_names:
      # Flax/T5X semantics: the first rule whose mesh axes are still free
      # wins; here it must also divide the dimension. None means replicate.
      candidates = [m for name, m in logical_rules if name == entry]
    else:
      candidates = [entry]  # A mesh axis name or a tuple of them.
    chosen = None
    for cand in candidates:
      if cand is None:
        break
      mesh_axes = _as_mesh_axes(cand)
      if sizes is not None:
        unknown = [a for a in mesh_axes if a not in sizes]
        if unknown:
          raise ValueError(
              f"Partitioning rule for '{path}': axis {entry!r} maps to mesh "
              f"axis {unknown[0]!r}, which is not a logical axis name nor an "
              f"axis of the mesh {dict(sizes)}.")
      if used.intersection(mesh_axes):
        continue
      if sizes is not None:
        size = int(np.prod([sizes[a] for a in mesh_axes]))
        if dim % size:
          continue  # Not divisible: try the next rule, else replicate.
      chosen = cand
      break
    if chosen is not None:
      used.update(_as_mesh_axes(chosen))
    spec.append(chosen)
  return PartitionSpec(*spec)


@gin.configurable(denylist=["params_or_shapes", "mesh"])
def param_partition_specs(
    params_or_shapes: Any, mesh: MeshLike = None, *,
    rules: Optional[Sequence[Rule]] = None,
    additional_rules: Optional[Sequence[Rule]] = None,
    logical_axis_rules: Optional[Sequence[Tuple[str,
                                                AxisEntry]]] = None) -> Any:
  """A PartitionSpec for every leaf of `params_or_shapes` (arrays or
  `jax.ShapeDtypeStruct`s), by path. `mesh`: a `Mesh` or a dict of axis
  sizes (a dimension its axis does not divide is replicated; None: no
  check). `rules` replace `T5X_PARAM_AXES`, `additional_rules` come first;
  `logical_axis_rules` default to `standard_logical_axis_rules()`."""
  rules = tuple(additional_rules or
                ()) + tuple(T5X_PARAM_AXES if rules is None else rules)
  compiled = [(re.compile(pattern), axes) for pattern, axes in rules]
  logical = tuple(standard_logical_axis_rules() if logical_axis_rules is
                  None else logical_axis_rules)
  sizes = _axis_sizes(mesh)

  def spec_for(path, leaf):
    name = _path_str(path)
    shape = tuple(np.shape(leaf) if not hasattr(leaf, "shape") else leaf.shape)
    for pattern, axes in compiled:
      if pattern.search(name):
        if axes is None:
          return PartitionSpec()
        return _resolve(name, shape, tuple(axes), logical, sizes)
    return PartitionSpec()  # Unmatched: replicated.

  return jax.tree_util.tree_map_with_path(spec_for, params_or_shapes)


def param_shardings(mesh: Mesh, params_or_shapes: Any, **kwargs) -> Any:
  """`NamedSharding`s for `param_partition_specs(params_or_shapes, mesh)`
  (for `checkpoints.load_t5x_params(..., shardings=...)`)."""
  specs = param_partition_specs(params_or_shapes, mesh, **kwargs)
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                is_leaf=lambda x: isinstance(x, PartitionSpec))


def shard_params(mesh: Mesh, params: Any, **kwargs) -> Any:
  """Places (e.g. randomly initialized) params on the mesh by the rules."""
  return jax.device_put(params, param_shardings(mesh, params, **kwargs))


def shard_model(mesh: Mesh, model: T5Model, **kwargs) -> T5Model:
  """A `T5Model` whose params are sharded by `shard_params`."""
  return model.replace(params=shard_params(mesh, model.params, **kwargs))


def param_bytes_per_device(params_or_shapes: Any, mesh: MeshLike,
                           dtype: Any = None, **kwargs) -> int:
  """Bytes of the largest parameter shards one device holds (no devices
  needed: `mesh` may be a dict of axis sizes). `dtype` overrides the
  leaves' dtype (e.g. bfloat16 for serving)."""
  sizes = _axis_sizes(mesh) or {}
  specs = param_partition_specs(params_or_shapes, mesh, **kwargs)
  total = 0
  for leaf, spec in zip(
      jax.tree_util.tree_leaves(params_or_shapes),
      jax.tree_util.tree_leaves(
          specs, is_leaf=lambda x: isinstance(x, PartitionSpec))):
    count = int(np.prod(leaf.shape))
    for entry in spec:
      if entry is not None:
        count //= int(np.prod([sizes.get(a, 1) for a in _as_mesh_axes(entry)]))
    total += count * np.dtype(dtype or leaf.dtype).itemsize
  return total


def data_sharding(mesh: Mesh, batch_size: Optional[int] = None,
                  ndim: int = 2) -> NamedSharding:
  """Inputs [B, S, ...]: batch over 'data' (replicated if it does not divide
  `batch_size`)."""
  if batch_size is None or batch_size % mesh.shape[DATA_AXIS] == 0:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS, *([None] * (ndim - 1))))
  return NamedSharding(mesh, PartitionSpec())


def shard_inputs(mesh: Mesh, tokens: Any) -> jax.Array:
  """Places an input batch [B, ...] on the mesh with `data_sharding`."""
  tokens = np.asarray(tokens) if not isinstance(tokens, jax.Array) else tokens
  return jax.device_put(tokens, data_sharding(mesh, tokens.shape[0],
                                              tokens.ndim))
