"""T5X checkpoints, local or gs://: both on-disk layouts read, ours written.

A step directory ``checkpoint_<N>/`` (`layout`) holds the legacy layout (a
msgpack file plus zarr folders: `legacy`) or the Orbax one (`orbax`). Only
the ``target`` parameters are read, at their stored shapes, after every
metadata check (`restore`, `reads`); `save` writes T5X's Orbax layout;
`sizes` checks a config against stored shapes and memory.
"""
from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import checkpoint_path
from specdec_jax.checkpoints.layout import checkpoint_step
from specdec_jax.checkpoints.layout import latest_checkpoint
from specdec_jax.checkpoints.layout import list_checkpoints
from specdec_jax.checkpoints.restore import check_checkpoint
from specdec_jax.checkpoints.restore import check_model
from specdec_jax.checkpoints.restore import load_model
from specdec_jax.checkpoints.restore import model_config
from specdec_jax.checkpoints.restore import load_t5x_params
from specdec_jax.checkpoints.restore import open_checkpoint
from specdec_jax.checkpoints.restore import random_params
from specdec_jax.checkpoints.save import save_params

__all__ = [
    "CheckpointError",
    "load_t5x_params",
    "save_params",
    "latest_checkpoint",
    "list_checkpoints",
    "checkpoint_step",
    "load_model",
    "model_config",
    "check_model",
    "check_checkpoint",
    "checkpoint_path",
    "open_checkpoint",
    "random_params",
]
