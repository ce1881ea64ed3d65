"""`load_t5x_params`: a T5X checkpoint's parameters, checked, then read.

The digests are verified, the layout is detected (`checkpoint_sources`)
and every array opened, metadata only (`open_checkpoint`: what a model's
config is checked against before its shapes are built, `check_model`);
every parameter's name and stored shape is checked against the model's
(`expected`) and its sharding, and only then is array data read (`reads`).
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
from specdec_jax.config import paths
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes
from specdec_jax.files import io_utils

logger = logging.getLogger(__name__)


def checkpoint_sources(ckpt: str) -> Tuple[str, Dict[ParamPath, Source]]:
  """Detects the layout of `ckpt` and lists its parameters' sources.

  Returns:
    ('legacy' | 'orbax' | 'orbax-msgpack', {parameter path: Source}).

  Raises:
    CheckpointError: no such directory, or neither layout's files in it.
  """
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
  """A checkpoint whose digests were verified and whose arrays were opened
  (metadata only: every stored shape known, no array data read).

  Attributes:
    ckpt: the step folder (absolute, or a URL).
    sources: each parameter's opened `Source`, by parameter path.
    context: the TensorStore context the arrays were opened in.
  """
  ckpt: str
  sources: Mapping[ParamPath, Source]
  context: Any

  @property
  def shapes(self) -> Dict[ParamPath, Tuple[int, ...]]:
    """Each parameter's stored shape."""
    return {p: src.shape for p, src in self.sources.items()}


def open_checkpoint(path) -> OpenedCheckpoint:
  """Verifies `path`'s DIGESTS.json (when it has one) and opens its arrays'
  metadata; reads no array data. What a caller checks a model's config
  against before building any shape (`check_model`).

  Raises:
    CheckpointError: as `load_t5x_params`, for everything but the checks
      against `expected`.
  """
  ckpt = os.fspath(path)
  if not paths.is_url(ckpt):
    ckpt = os.path.abspath(ckpt)
  # DIGESTS.json, when exported with one; without, nothing is verified.
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
    path: a T5X step directory ``.../checkpoint_<N>`` (local path or
      ``gs://bucket/...``), in the legacy layout (msgpack ``checkpoint`` file
      plus zarr folders) or the Orbax layout (``state/`` PyTree checkpoint).
      The legacy msgpack file itself may also be given. Or the
      `OpenedCheckpoint` of one (`open_checkpoint`: verified and opened
      already).
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
    CheckpointError: a file differs from the checkpoint's DIGESTS.json
      (`digests`; checked first, when there is one), the directory or its
      ``checkpoint`` / Orbax metadata is missing, an array cannot be opened
      or read (missing, truncated or corrupt file), or the parameters do not
      match ``expected``. The message names the checkpoint and the
      slash-joined parameter path.
  """
  start = time.perf_counter()
  opened = path if isinstance(path, OpenedCheckpoint) else open_checkpoint(path)
  ckpt, sources = opened.ckpt, opened.sources
  dtype = None if dtype is None else np.dtype(dtype)
  # Every check reads metadata only; array data is read last.
  exp_flat = _expected_shapes(ckpt, sources, expected)
  shard_flat = _shardings_by_param(ckpt, sources, shardings)
  _check_opened(ckpt, sources, exp_flat, shard_flat)
  flat = reads.read_all(ckpt, sources, shard_flat, dtype)
  # One progress line per read (issue 44): what, how much, how long.
  logger.info("Read checkpoint %s: %d arrays, %.1f MB, in %.1f s", ckpt,
              len(flat),
              sum(getattr(a, "nbytes", 0) for a in flat.values()) / 1e6,
              time.perf_counter() - start)
  return traverse_util.unflatten_dict(flat)


def _expected_shapes(ckpt: str, sources: Mapping[ParamPath, Source],
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
  missing = [
      p for p, v in exp_flat.items() if v is not None and p not in sources
  ]
  extra = [p for p in sources if p not in exp_flat]
  problems = []
  if missing:
    problems.append(
        f"{len(missing)} expected parameter(s) missing from the checkpoint: " +
        _fmt_paths(missing))
  if extra:
    problems.append(
        f"{len(extra)} parameter(s) in the checkpoint that the model does "
        "not expect: " + _fmt_paths(extra))
  if problems:
    raise CheckpointError(f"Checkpoint {ckpt}: " + "; ".join(problems))
  return exp_flat


def _shardings_by_param(ckpt: str, sources: Mapping[ParamPath, Source],
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
# A model from its checkpoint folder alone: `model_config.json` and the
# parameters, with the wrapping `T5Model` expects.
#
# Every checkpoint `train` and the export scripts write holds the model's
# `T5Config` as `model_config.json` beside the arrays; this reads it, then
# the parameters at that config's shapes and dtype (`load_t5x_params`), so
# no gin file has to repeat the model's sizes. No gin configuration, no seqio.
#
# Everything that can refuse a model is checked before its shapes are
# built or an array is read (`check_model`): the folder and its config
# (each bad field named with the file), the checkpoint's digests (a copied
# folder with an edited config is a digest mismatch), the config against
# the shapes the checkpoint stores and the parameters against this
# machine's memory (`sizes`): a config edited to 10^7 layers is refused in
# a second, not after a minute and gigabytes.
MODEL_CONFIG_FILE = "model_config.json"
FOLDER_EXAMPLE = "pretrained/multi30k/target_38m"
# `T5Config.mlp_activations`' names: 'linear', or a flax.linen activation
# applied elementwise (`layers.MlpBlock`).
ACTIVATIONS = ("linear", "celu", "elu", "gelu", "hard_sigmoid", "hard_silu",
               "hard_swish", "hard_tanh", "leaky_relu", "log_sigmoid", "relu",
               "relu6", "selu", "sigmoid", "silu", "soft_sign", "softplus",
               "swish", "tanh")


def check_folder(folder: str, what: str = "folder") -> str:
  """`folder` (a path relative to here or to the repository, as the
  commands resolve it: `paths.resolve_path`), resolved; CheckpointError
  naming `what` and the resolved path when it is missing or a file."""
  resolved = paths.resolve_path(os.fspath(folder))
  if paths.is_url(resolved) or io_utils.isdir(resolved):
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
  """The `T5Config` a checkpoint folder records (`folder` as `check_folder`
  takes it); CheckpointError naming the file (and the field) when it is
  missing or not a config."""
  return _read_config(
      os.path.join(checkpoint_path(check_folder(folder, what)),
                   MODEL_CONFIG_FILE))


def _read_config(path: str) -> T5Config:
  """`model_config`'s reading of the file at `path`."""
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
  """A model folder checked (`check_model`), nothing built or read yet.

  Attributes:
    config: its `model_config.json`.
    checkpoint: its step folder, digests verified, arrays opened (metadata).
  """
  config: T5Config
  checkpoint: OpenedCheckpoint

  @property
  def path(self) -> str:
    """The step folder."""
    return self.checkpoint.ckpt

  def load(self, prepared: bool = True) -> T5Model:
    """Its parameters in its config's dtype, wrapped as `T5Model` expects
    ({'params': ...}); `prepared`: packed for the CPU kernel where decoding
    uses it (`T5Model.prepared_for_decoding`)."""
    params = load_t5x_params(self.checkpoint,
                             expected=param_shapes(self.config)["params"],
                             dtype=self.config.dtype)
    model = T5Model(self.config, {"params": params})
    return model.prepared_for_decoding() if prepared else model


def check_checkpoint(path: str, config: T5Config, fields: str,
                     available: Optional[int] = None) -> OpenedCheckpoint:
  """`path`'s digests verified and its arrays opened (metadata only), then
  `config` against their stored shapes and the parameters against
  `available` bytes (`sizes`); nothing is built or read."""
  opened = open_checkpoint(path)
  sizes.check_against_checkpoint(config, opened.shapes, fields, opened.ckpt)
  sizes.check_fits_memory(config, fields, available)
  return opened


def check_model(folder: str, what: str = "folder") -> CheckedModel:
  """The model in `folder` (a checkpoint, or a folder of them: the latest),
  checked as the module docstring says; `what` names the folder in
  messages (an argument's name)."""
  path = checkpoint_path(check_folder(folder, what))
  config_file = os.path.join(path, MODEL_CONFIG_FILE)
  config = _read_config(config_file)
  return CheckedModel(config, check_checkpoint(path, config,
                                               f"{config_file}: "))


def load_model(folder: str, prepared: bool = True) -> T5Model:
  """The model in `folder` (a checkpoint, or a folder of them: the latest),
  checked (`check_model`), its parameters in its config's dtype, wrapped as
  `T5Model` expects ({'params': ...}); `prepared`: packed for the CPU
  kernel where decoding uses it (`T5Model.prepared_for_decoding`)."""
  return check_model(folder).load(prepared)
