"""A model from its checkpoint folder alone: `model_config.json` and the
parameters, with the wrapping `T5Model` expects.

Every checkpoint `train` and the export scripts write holds the model's
`T5Config` as `model_config.json` beside the arrays; this reads it, then
the parameters at that config's shapes and dtype (`load_t5x_params`), so
no gin file has to repeat the model's sizes. No gin, no seqio.
"""
import json
import os

from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import latest_checkpoint
from specdec_jax.checkpoints.restore import load_t5x_params
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes

MODEL_CONFIG_FILE = "model_config.json"


def checkpoint_path(folder: str) -> str:
  """`folder` itself when it is a checkpoint, else its latest
  `checkpoint_<step>`."""
  if os.path.isfile(os.path.join(folder, MODEL_CONFIG_FILE)):
    return folder
  return latest_checkpoint(folder) or folder


def model_config(folder: str) -> T5Config:
  """The `T5Config` a checkpoint folder records; CheckpointError naming the
  file when it is missing or not a config."""
  path = os.path.join(checkpoint_path(folder), MODEL_CONFIG_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      return T5Config(**json.load(f))
  except FileNotFoundError:
    raise CheckpointError(
        f"{path} not found: a checkpoint folder written by `train` or the "
        "export scripts holds its model's config there; allowed: such a "
        "folder (e.g. pretrained/multi30k/target_38m), or a gin file of "
        "T5Config bindings with `run`.") from None
  except (ValueError, TypeError) as e:
    raise CheckpointError(f"{path}: not a T5Config ({e}).") from None


def load_model(folder: str, prepared: bool = True) -> T5Model:
  """The model in `folder` (a checkpoint, or a folder of them: the latest),
  its parameters in its config's dtype, wrapped as `T5Model` expects
  ({'params': ...}); `prepared`: packed for the CPU kernel where decoding
  uses it (`T5Model.prepared_for_decoding`)."""
  config = model_config(folder)
  params = load_t5x_params(checkpoint_path(folder),
                           expected=param_shapes(config)["params"],
                           dtype=config.dtype)
  model = T5Model(config, {"params": params})
  return model.prepared_for_decoding() if prepared else model
