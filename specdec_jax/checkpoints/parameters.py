"""Random model parameters: the one initialisation path.

A model's parameters come from a T5X checkpoint (`checkpoints.load_t5x_params`)
or from `random_params`; both return the same tree (T5X's layout, without
flax's ``{'params': ...}`` wrapper), so the two are interchangeable. Random
parameters are `models.init_params` (T5X's initializers) run as one jitted
program, cast to the storage dtype and placed in their shardings inside it:
an XXL model is never materialised in float32 on one device first.
"""
from typing import Any, Dict

import jax

from specdec_jax.core.models import T5Config
from specdec_jax.core.models import init_params


def random_params(config: T5Config, rng: jax.Array, *, dtype=None,
                  shardings: Any = None) -> Dict[str, Any]:
  """Randomly initialised parameters of a T5 model.

  Args:
    config: the model.
    rng: PRNG key of the initializers.
    dtype: storage dtype of every array (e.g. ``config.dtype``); None keeps
      the initializers' float32.
    shardings: as `jax.jit`'s ``out_shardings`` for the tree (one
      ``Sharding``, or a matching tree); None: the default device.

  Returns:
    Nested dict of arrays, e.g. ``params['decoder']['logits_dense']['kernel']``
    ([emb, vocab]); use it as ``{'params': tree}`` for flax.
  """

  def init(key):
    params = init_params(config, key)["params"]
    if dtype is None:
      return params
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)

  return jax.jit(init, out_shardings=shardings)(rng)
