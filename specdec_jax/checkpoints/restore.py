"""`load_t5x_params`: a T5X checkpoint's parameters, checked, then read.

Digests are verified, the layout detected and every array opened (metadata
only); names, shapes and shardings are checked against the model before any
array data is read (`reads`). Also a model from its folder alone
(`model_config.json`: `check_model`, `load_model`) and `random_params`.
"""
import dataclasses
import json
import logging
import os
import posixpath
import time
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from flax import traverse_util
import jax
import numpy as np
import tensorstore as ts

from specdec_jax.checkpoints import digests
from specdec_jax.checkpoints import legacy
from specdec_jax.checkpoints import orbax
from specdec_jax.checkpoints import reads
from specdec_jax.checkpoints import sizes
from specdec_jax.checkpoints.layout import MSGPACK_FILE
from specdec_jax.checkpoints.layout import ORBAX_METADATA
from specdec_jax.checkpoints.layout import STATE_DIR
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import ParamPath
from specdec_jax.checkpoints.layout import checkpoint_path
from specdec_jax.checkpoints.layout import join
from specdec_jax.checkpoints.reads import Source
from specdec_jax.checkpoints.reads import open_all
from specdec_jax.config import gin_reader
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params
from specdec_jax.core.models import param_shapes
from specdec_jax.files import io_utils

logger = logging.getLogger(__name__)


def random_params(config: T5Config, rng: jax.Array, *, dtype=None,
                  shardings: Any = None) -> Dict[str, Any]:
  """Random parameters (T5X's initializers) in `load_t5x_params`' layout,
  cast to `dtype` and placed in `shardings` inside one jitted program (an
  XXL model is never whole in float32 on one device)."""

  def init(key):
    params = init_params(config, key)["params"]
    if dtype is None:
      return params
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)

  return jax.jit(init, out_shardings=shardings)(rng)


def checkpoint_sources(ckpt: str) -> Tuple[str, Dict[ParamPath, Source]]:
  """('legacy' | 'orbax' | 'orbax-msgpack', {parameter path: Source}) of
  `ckpt`; CheckpointError: no such directory, or neither layout in it."""
  if not io_utils.isdir(ckpt):
    if io_utils.isfile(ckpt) and posixpath.basename(
        ckpt.rstrip("/")) == MSGPACK_FILE:
      return "legacy", legacy.msgpack_sources(ckpt, ckpt)  # The file itself.
    if io_utils.isfile(ckpt):
      raise CheckpointError(
          f"Checkpoint {ckpt} is a file, not a directory (expected a T5X "
          "checkpoint_<N> directory, or its legacy 'checkpoint' file).")
    raise CheckpointError(
        f"Checkpoint directory {ckpt} does not exist (expected a T5X "
        "checkpoint_<N> directory).")
  state_dir = join(ckpt, STATE_DIR)
  if io_utils.isfile(join(state_dir, ORBAX_METADATA)):
    return "orbax", orbax.orbax_sources(ckpt, state_dir)
  if io_utils.isfile(join(state_dir, MSGPACK_FILE)):
    return "orbax-msgpack", legacy.msgpack_sources(
        ckpt, join(state_dir, MSGPACK_FILE), state_dir)
  if io_utils.isfile(join(ckpt, MSGPACK_FILE)):
    return "legacy", legacy.msgpack_sources(ckpt, join(ckpt, MSGPACK_FILE))
  if io_utils.isdir(state_dir):
    raise CheckpointError(
        f"Checkpoint {ckpt}: {state_dir} has no Orbax metadata file "
        f"'{ORBAX_METADATA}' (incomplete or not an Orbax checkpoint).")
  raise CheckpointError(
      f"Checkpoint {ckpt}: not a T5X checkpoint: neither a '{MSGPACK_FILE}' "
      f"msgpack file (legacy layout) nor '{STATE_DIR}/{ORBAX_METADATA}' "
      "(Orbax layout) found.")


@dataclasses.dataclass(frozen=True)
class OpenedCheckpoint:
  """A checkpoint, digests verified and arrays opened (metadata only)."""
  ckpt: str
  sources: Mapping[ParamPath, Source]
  context: Any

  @property
  def shapes(self) -> Dict[ParamPath, Tuple[int, ...]]:
    """Each parameter's stored shape."""
    return {p: src.shape for p, src in self.sources.items()}


def open_checkpoint(path) -> OpenedCheckpoint:
  """Verifies `path`'s DIGESTS.json (when it has one) and opens its arrays'
  metadata; reads no array data. CheckpointError as `load_t5x_params`."""
  ckpt = os.fspath(path)
  if not io_utils.is_url(ckpt):
    ckpt = os.path.abspath(ckpt)
  if io_utils.isdir(ckpt) and not digests.verify_manifest(ckpt):
    logger.warning(
        "Checkpoint %s has no %s: loaded unverified (a changed or corrupt "
        "file would go unnoticed; T5X's format has no checksums).", ckpt,
        digests.MANIFEST_FILE)
  _, sources = checkpoint_sources(ckpt)
  if not sources:
    raise CheckpointError(f"Checkpoint {ckpt}: it holds no parameters.")
  context = ts.Context({
      "cache_pool": {
          "total_bytes_limit": 64 << 20
      },
      "file_io_concurrency": {
          "limit": 64
      },
  })
  open_all(ckpt, sources, context)
  return OpenedCheckpoint(ckpt, sources, context)


def load_t5x_params(path, *, expected=None, dtype=None,
                    shardings=None) -> Dict[str, Any]:
  """Loads the model parameters of a T5X checkpoint (either layout).

  Args:
    path: a step directory (local or ``gs://``), the legacy msgpack file
      itself, or an `OpenedCheckpoint`.
    expected: optional tree of leaves with a ``.shape`` (a ``{'params':
      ...}`` wrapper and ``nn.Partitioned`` boxes are accepted): exactly
      these parameters at these shapes, checked from metadata.
    dtype: cast to on the host while restoring (None: as stored).
    shardings: a tree of ``Sharding`` (``None`` leaves: default device),
      or one for all; each array is read shard by shard into it.

  Returns:
    The ``target`` subtree as a nested dict of ``jax.Array`` in T5X's
    layout (kernels 2-D, e.g. attention query ``[emb, heads * head_dim]``).

  Raises:
    CheckpointError: a digest mismatch, a missing directory or metadata, an
      array that cannot be opened or read, or parameters that do not match
      ``expected``; naming the checkpoint and the parameter path.
  """
  start = time.perf_counter()
  opened = path if isinstance(path, OpenedCheckpoint) else open_checkpoint(path)
  ckpt, sources = opened.ckpt, opened.sources
  dtype = None if dtype is None else np.dtype(dtype)
  exp_flat = _expected_shapes(ckpt, sources, expected)
  shard_flat = _shardings_by_param(ckpt, sources, shardings)
  _check_opened(ckpt, sources, exp_flat, shard_flat)
  flat = reads.read_all(ckpt, sources, shard_flat, dtype)
  logger.info("Read checkpoint %s: %d arrays, %.1f MB, in %.1f s", ckpt,
              len(flat),
              sum(getattr(a, "nbytes", 0) for a in flat.values()) / 1e6,
              time.perf_counter() - start)
  return traverse_util.unflatten_dict(flat)


def _expected_shapes(ckpt: str, sources: Mapping[ParamPath, Source],
                     expected: Any) -> Optional[Dict[ParamPath, Any]]:
  """`expected` flattened; CheckpointError when it names other parameters
  than the checkpoint holds."""
  if expected is None:
    return None
  expected = _maybe_unwrap_params(expected, sources)
  exp_flat = _flatten_spec_tree(expected, "expected",
                                lambda x: hasattr(x, "shape"))
  missing = [
      p for p, v in exp_flat.items() if v is not None and p not in sources
  ]
  extra = [p for p in sources if p not in exp_flat]
  problems = [
      f"{len(missing)} expected parameter(s) missing from the checkpoint: " +
      _fmt_paths(missing)
  ] if missing else []
  if extra:
    problems.append(
        f"{len(extra)} parameter(s) in the checkpoint that the model does "
        "not expect: " + _fmt_paths(extra))
  if problems:
    raise CheckpointError(f"Checkpoint {ckpt}: " + "; ".join(problems))
  return exp_flat


def _shardings_by_param(ckpt: str, sources: Mapping[ParamPath, Source],
                        shardings: Any) -> Dict[ParamPath, Any]:
  """One sharding (or None) per parameter, from one Sharding or a tree;
  CheckpointError for shardings of parameters not in the checkpoint."""
  if shardings is None:
    return {}
  if isinstance(shardings, jax.sharding.Sharding):
    return {p: shardings for p in sources}
  shardings = _maybe_unwrap_params(shardings, sources)
  shard_flat = _flatten_spec_tree(
      shardings, "shardings", lambda x: isinstance(x, jax.sharding.Sharding))
  unknown = [
      p for p, s in shard_flat.items() if s is not None and p not in sources
  ]
  if unknown:
    raise CheckpointError(
        f"Checkpoint {ckpt}: shardings given for parameter(s) not in the "
        f"checkpoint: {_fmt_paths(unknown)}")
  return shard_flat


def _check_opened(ckpt: str, sources: Mapping[ParamPath, Source],
                  exp_flat: Optional[Mapping[ParamPath, Any]],
                  shard_flat: Mapping[ParamPath, Any]) -> None:
  """CheckpointError when an opened array's shape is not the expected one
  or its sharding does not fit it."""
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


def _flatten_spec_tree(tree: Any, what: str, is_leaf) -> Dict[ParamPath, Any]:
  """Flattens a nested mapping whose leaves satisfy `is_leaf` (or are None)."""
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
  if (isinstance(tree, Mapping) and set(tree.keys()) == {"params"} and
      isinstance(tree["params"], Mapping) and
      not any(p and p[0] == "params" for p in names)):
    return tree["params"]
  return tree


def _fmt_paths(paths: Iterable[ParamPath], limit: int = 10) -> str:
  names = sorted("/".join(p) for p in paths)
  more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


# -- model folder --------------------------------------------------------------
# `train` and the export scripts write the model's `T5Config` beside the
# arrays as `model_config.json`: a model loads from its folder alone. All
# that can refuse it (folder, config fields, digests, stored shapes, memory)
# is checked before a shape is built or an array read (`check_model`).
MODEL_CONFIG_FILE = "model_config.json"
FOLDER_EXAMPLE = "pretrained/multi30k/target_38m"
# 'linear', or a flax.linen activation (`layers.MlpBlock`).
ACTIVATIONS = ("linear", "celu", "elu", "gelu", "hard_sigmoid", "hard_silu",
               "hard_swish", "hard_tanh", "leaky_relu", "log_sigmoid", "relu",
               "relu6", "selu", "sigmoid", "silu", "soft_sign", "softplus",
               "swish", "tanh")


def check_folder(folder: str, what: str = "folder") -> str:
  """`folder` resolved (`io_utils.resolve_path`); CheckpointError naming
  `what` and the resolved path when it is missing or a file."""
  resolved = io_utils.resolve_path(os.fspath(folder))
  if io_utils.is_url(resolved) or io_utils.isdir(resolved):
    return resolved
  problem = ("is a file, not a folder"
             if os.path.lexists(resolved) else "does not exist")
  raise CheckpointError(
      f"{what}={os.fspath(folder)!r}: {resolved} {problem}; allowed: a "
      "checkpoint folder written by `train` or the export scripts (its "
      f"checkpoint_<N>, or the folder of them; e.g. {FOLDER_EXAMPLE}).")


def _check_activations(value: Any, where: str) -> None:
  """`mlp_activations` must be a list of names (a bare string would be
  read as one activation per letter)."""
  if isinstance(value, (list, tuple)) and value and all(
      isinstance(a, str) and a in ACTIVATIONS for a in value):
    return
  raise CheckpointError(
      f"{where}mlp_activations = {value!r}: allowed: a non-empty list of "
      f"activation names, each one of {', '.join(ACTIVATIONS)} (T5 v1.1: "
      "['gelu', 'linear'], T5: ['relu']).")


def model_config(folder: str, what: str = "folder") -> T5Config:
  """The `T5Config` a checkpoint folder records; CheckpointError naming the
  file (and the field) when it is missing or not a config."""
  return _read_config(
      os.path.join(checkpoint_path(check_folder(folder, what)),
                   MODEL_CONFIG_FILE))


def _read_config(path: str) -> T5Config:
  try:
    fields = json.loads(io_utils.read_text(path))
  except FileNotFoundError:
    raise CheckpointError(
        f"{path} not found: a checkpoint folder written by `train` or the "
        "export scripts holds its model's config there; allowed: such a "
        f"folder (e.g. {FOLDER_EXAMPLE}), or a gin file of T5Config "
        "bindings with `run`.") from None
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: not a T5Config ({e}).") from None
  if not isinstance(fields, dict):
    raise CheckpointError(f"{path}: not a T5Config (a JSON "
                          f"{type(fields).__name__}, not an object).")
  if "mlp_activations" in fields:
    _check_activations(fields["mlp_activations"], f"{path}: ")
  try:
    return gin_reader.t5_config_from_fields(fields, path)
  except ValueError as e:
    raise CheckpointError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class CheckedModel:
  """A model folder checked (`check_model`), nothing built or read yet."""
  config: T5Config
  checkpoint: OpenedCheckpoint

  @property
  def path(self) -> str:
    return self.checkpoint.ckpt

  def load(self, prepared: bool = True) -> T5Model:
    """Its parameters in its config's dtype as a `T5Model`; `prepared`:
    packed for decoding (`T5Model.prepared_for_decoding`)."""
    params = load_t5x_params(self.checkpoint,
                             expected=param_shapes(self.config)["params"],
                             dtype=self.config.dtype)
    model = T5Model(self.config, {"params": params})
    return model.prepared_for_decoding() if prepared else model


def check_checkpoint(path: str, config: T5Config, fields: str,
                     available: Optional[int] = None) -> OpenedCheckpoint:
  """`open_checkpoint(path)`, then `config` against its stored shapes and
  `available` bytes (`sizes`); nothing is built or read."""
  opened = open_checkpoint(path)
  sizes.check_against_checkpoint(config, opened.shapes, fields, opened.ckpt)
  sizes.check_fits_memory(config, fields, available)
  return opened


def check_model(folder: str, what: str = "folder") -> CheckedModel:
  """The model in `folder` (a checkpoint, or a folder of them: the latest),
  checked; `what` names the folder in messages."""
  path = checkpoint_path(check_folder(folder, what))
  config_file = os.path.join(path, MODEL_CONFIG_FILE)
  config = _read_config(config_file)
  return CheckedModel(config, check_checkpoint(path, config,
                                               f"{config_file}: "))


def load_model(folder: str, prepared: bool = True) -> T5Model:
  """`check_model(folder).load(prepared)`."""
  return check_model(folder).load(prepared)
