"""One jitted training step: loss, gradients, an optimizer update."""
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import optax

from specdec_jax.core.models.config import T5Config
from specdec_jax.training.loss import LossSettings
from specdec_jax.training.loss import compute_losses
from specdec_jax.training.optimizer import OptimizerSettings


@functools.lru_cache(maxsize=16)
def train_step_fn(config: T5Config, teacher_config: Optional[T5Config],
                  loss: LossSettings, optimizer: OptimizerSettings):
  """(optax optimizer, jitted step), cached so repeated runs reuse compilations.

  The step is ``step_fn(params, opt_state, batch, rng, step, teacher_params)
  -> (params, opt_state, metrics)``: `compute_losses`' metrics plus
  grad_norm and input_tokens; dropout's key is `rng` folded with `step`, so
  a resumed run draws the keys an uninterrupted one would.
  """
  tx = optimizer.make()

  def step_fn(params, opt_state, batch, rng, step, teacher_params):
    dropout_rng = jax.random.fold_in(rng, step)
    grad_fn = jax.value_and_grad(
        functools.partial(compute_losses, config=config, settings=loss,
                          teacher_config=teacher_config,
                          teacher_params=teacher_params), has_aux=True)
    (_, metrics), grads = grad_fn(params, batch, dropout_rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics["grad_norm"] = jnp.sqrt(
        sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
    metrics["input_tokens"] = (batch["encoder_input_tokens"] > 0).sum()
    return params, opt_state, metrics

  return tx, jax.jit(step_fn)
