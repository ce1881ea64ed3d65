"""A feature-level draft's checkpoint: a T5X Orbax checkpoint of the
`FeatureDecoder` tree plus ``head_tokens`` [K] int32, with its
`FeatureDrafterConfig` beside it as ``feature_config.json``.
"""
import dataclasses
import json
import os
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.core.models.config import json_fields
from specdec_jax.files import io_utils
from specdec_jax.core.models.feature_drafter import FeatureDraftModel
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig
from specdec_jax.core.models.feature_drafter import init_feature_params

FEATURE_CONFIG_FILE = "feature_config.json"
HEAD_TOKENS = "head_tokens"


def config_fields(config: FeatureDrafterConfig) -> Dict[str, Any]:
  """JSON-ready fields of a `FeatureDrafterConfig`."""
  return json_fields(config)


def read_config(ckpt: str) -> FeatureDrafterConfig:
  """The `FeatureDrafterConfig` written beside a checkpoint; ValueError
  naming the file when it is missing or not such a config."""
  path = os.path.join(ckpt, FEATURE_CONFIG_FILE)
  if not io_utils.isfile(path):
    raise ValueError(f"{ckpt}: no {FEATURE_CONFIG_FILE}: not a feature-level "
                     "draft's checkpoint.")
  try:
    fields = json.loads(io_utils.read_text(path))
    if not isinstance(fields, dict):
      raise TypeError(f"a JSON {type(fields).__name__}, not an object")
    return FeatureDrafterConfig(**fields)
  except (ValueError, TypeError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    names = ", ".join(f.name for f in dataclasses.fields(FeatureDrafterConfig))
    raise ValueError(
        f"{path}: not a valid {FEATURE_CONFIG_FILE} ({reason}); allowed: "
        f"the JSON object of FeatureDrafterConfig fields that train writes "
        f"({names}).") from None


def save(directory: str, step: int, params, head_tokens: np.ndarray,
         config: FeatureDrafterConfig) -> str:
  """``directory/checkpoint_<step>``; params as {'params': ...} or bare."""
  tree = dict(jax.device_get(params.get("params", params)))
  tree[HEAD_TOKENS] = np.asarray(head_tokens, np.int32)
  path = checkpoints.save_params(tree, directory, step=step)
  io_utils.atomic_write(os.path.join(path, FEATURE_CONFIG_FILE),
                        json.dumps(config_fields(config), indent=2))
  return path


def load(ckpt: str,
         dtype=jnp.float32) -> Tuple[FeatureDrafterConfig, Dict, np.ndarray]:
  """(config, {'params': ...} in `dtype`, head_tokens [K] int32);
  ValueError / CheckpointError as `read_config` / `load_t5x_params`."""
  config = read_config(ckpt)
  shapes = jax.eval_shape(
      lambda: init_feature_params(config, jax.random.PRNGKey(0)))["params"]
  expected = dict(shapes)
  expected[HEAD_TOKENS] = jax.ShapeDtypeStruct((config.head_size,), jnp.int32)
  tree = dict(checkpoints.load_t5x_params(ckpt, expected=expected))
  head_tokens = np.asarray(tree.pop(HEAD_TOKENS)).astype(np.int32)
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), tree)
  return config, {"params": params}, head_tokens


def load_draft_model(ckpt: str, target: Any) -> FeatureDraftModel:
  """The draft of `ckpt` bound to `target` (a T5Model), float32."""
  config, params, head_tokens = load(ckpt)
  return FeatureDraftModel.for_target(config, params, head_tokens, target)
