"""Reading T5X checkpoints (both on-disk layouts) and writing our own.

T5X has written two checkpoint layouts over time; both live in a step
directory ``<model_dir>/checkpoint_<N>/`` (`layout`):

* **Legacy** (``t5x.checkpoints.Checkpointer``; the public
  ``gs://t5-data/pretrained_models/t5x/t5_1_1_*/checkpoint_1000000``
  checkpoints): a flax msgpack file named ``checkpoint`` whose leaves are
  small inline arrays or TensorStore specs of zarr folders beside it
  (`legacy`).
* **Orbax** (``t5x.checkpoints.OrbaxCheckpointManagerInterface``): an Orbax
  PyTree checkpoint in ``checkpoint_<N>/state/`` whose ``_METADATA`` lists
  every leaf, stored as zarr arrays in one OCDBT store or in per-array
  folders (`orbax`).

In both layouts the model parameters are the ``target`` subtree, in flax's
nested-dict layout of T5X's ``t5x/examples/t5/network.py`` Transformer, e.g.
``encoder/layers_0/attention/query/kernel``. Note that T5X's ``DenseGeneral``
stores every kernel flattened to 2-D ``[prod(in axes), prod(out features)]``:
the attention query/key/value kernels are ``[emb, heads * head_dim]`` and the
attention output kernel ``[heads * head_dim, emb]`` (reshaped to
``[emb, heads, head_dim]`` / ``[heads, head_dim, emb]`` only inside the layer).
This package returns exactly the stored shapes.

Everything is read through TensorStore directly (`reads`), so only the
``target`` arrays are touched (never the optimizer state, which for
Adafactor on T5-XXL is large), all array metadata is checked before any
array data is read (`restore`), and each device reads only its own shard
when ``shardings`` are given (`reads`). `save` writes T5X's Orbax layout.

Public names (``from specdec_jax import checkpoints``): `load_t5x_params`,
`open_checkpoint`, `save_params`, `list_checkpoints`, `latest_checkpoint`,
`checkpoint_path`, `checkpoint_step`, `CheckpointError`; from a checkpoint
folder alone (its `model_config.json`, `restore`): `model_config`,
`check_model` (everything checked, nothing built or read), `load_model`;
and `check_checkpoint`: any config against a checkpoint's stored shapes
and this machine's memory (`sizes`), before any shape is built.
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
]
