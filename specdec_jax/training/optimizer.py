"""The optimizer: AdamW or Adafactor over a warmup-then-decay schedule.

`OptimizerSettings` is the frozen, hashable description of both (it keys the
cache of compiled train steps, `step.train_step_fn`); `make_schedule` and
`make_optimizer` build them with optax.
"""
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adamw", "adafactor")
DECAYS = ("cosine", "rsqrt", "constant")


def _check_choice(name: str, value: str, allowed) -> None:
  if value not in allowed:
    raise ValueError(f"Unknown {name} {value!r}; expected one of {allowed}.")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """Optimizer and learning-rate schedule (see `TrainConfig` for each field).

  Built by `TrainConfig.optimizer_settings()`: the defaults live there (gin's
  ``train.*``), so this class has none. `decay_steps` is where the cosine
  decay ends; for the other decays it plays no part and is 0, so that runs
  of different lengths share one compiled train step.
  """
  optimizer: str
  learning_rate: float
  warmup_steps: int
  decay: str
  decay_steps: int
  final_learning_rate_fraction: float
  weight_decay: float
  grad_clip_norm: Optional[float]
  adam_b1: float
  adam_b2: float
  adam_eps: float

  def __post_init__(self):
    _check_choice("optimizer", self.optimizer, OPTIMIZERS)
    _check_choice("decay", self.decay, DECAYS)

  def schedule(self):
    """The learning rate as a function of the update count."""
    return make_schedule(
        learning_rate=self.learning_rate, warmup_steps=self.warmup_steps,
        decay=self.decay, decay_steps=self.decay_steps,
        final_learning_rate_fraction=self.final_learning_rate_fraction)

  def make(self) -> optax.GradientTransformation:
    """The optax optimizer over `schedule()`."""
    return make_optimizer(optimizer=self.optimizer, schedule=self.schedule(),
                          weight_decay=self.weight_decay,
                          grad_clip_norm=self.grad_clip_norm,
                          adam_b1=self.adam_b1, adam_b2=self.adam_b2,
                          adam_eps=self.adam_eps)


def make_schedule(*, learning_rate: float, warmup_steps: int, decay: str,
                  decay_steps: int, final_learning_rate_fraction: float = 0.0):
  """Linear warmup to `learning_rate`, then cosine / rsqrt / constant."""
  _check_choice("decay", decay, DECAYS)
  warmup_steps = max(0, int(warmup_steps))
  lr = float(learning_rate)

  def schedule(count):
    step = jnp.asarray(count, jnp.float32)
    warm = jnp.minimum(1.0, (step + 1.0) / max(1, warmup_steps))
    if decay == "constant":
      after = lr
    elif decay == "rsqrt":
      after = lr * jnp.sqrt(
          max(1, warmup_steps) / jnp.maximum(step + 1.0, max(1, warmup_steps)))
    else:
      span = max(1, int(decay_steps) - warmup_steps)
      frac = jnp.clip((step - warmup_steps) / span, 0.0, 1.0)
      cos = 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
      after = lr * (final_learning_rate_fraction +
                    (1.0 - final_learning_rate_fraction) * cos)
    return jnp.where(step < warmup_steps, lr * warm, after)

  return schedule


def make_optimizer(*, optimizer: str, schedule, weight_decay: float,
                   grad_clip_norm: Optional[float], adam_b1: float,
                   adam_b2: float, adam_eps: float):
  """AdamW (decay on >= 2-D kernels only) or Adafactor (T5X-like)."""
  _check_choice("optimizer", optimizer, OPTIMIZERS)
  if optimizer == "adamw":

    def decay_mask(params):
      return jax.tree_util.tree_map(lambda x: x.ndim > 1, params)

    tx = optax.adamw(schedule, b1=adam_b1, b2=adam_b2, eps=adam_eps,
                     weight_decay=weight_decay, mask=decay_mask)
  else:
    tx = optax.adafactor(
        learning_rate=schedule,
        weight_decay_rate=weight_decay if weight_decay else None)
  if grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
  return tx
