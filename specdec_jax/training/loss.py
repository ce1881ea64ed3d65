"""The training loss: cross-entropy on the references, or distillation.

Teacher forcing: the decoder reads the targets shifted right (start token 0)
and is scored at every non-pad target position. The loss is the
cross-entropy (optionally label-smoothed), or with a teacher
``w T^2 KL(p_teacher^T || q_student^T) + (1 - w) CE`` per non-pad position
(``p^T``: softmax of logits / T), plus T5X's z-loss ``z_loss * log(Z)^2``.

A shared-encoder student (`T5Config.num_encoder_layers = 0`: a draft
decoder that reads the target's encoder) is trained on the teacher's
encoder output: the teacher encodes each batch once (frozen: its
parameters are an argument of the step, never differentiated), and that
encoding feeds both the teacher's decoder and the student's.
"""
import dataclasses
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import Transformer

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class LossSettings:
  """The loss's weights (frozen, hashable: part of a compiled step's key).

  Built by `TrainConfig.loss_settings()`, where the defaults live (gin's
  ``train.*``).

  Attributes:
    label_smoothing: on the reference cross-entropy.
    z_loss: T5X's auxiliary log(Z)^2 loss weight.
    distill: whether a teacher's distribution is the target.
    distill_temperature: T, applied to teacher and student logits; > 0.
    distill_weight: w in ``w T^2 KL + (1 - w) CE``; in [0, 1].
  """
  label_smoothing: float
  z_loss: float
  distill: bool
  distill_temperature: float
  distill_weight: float

  def __post_init__(self):
    if not 0.0 <= self.distill_weight <= 1.0:
      raise ValueError(f"distill_weight must be in [0, 1], got "
                       f"{self.distill_weight}.")
    if not self.distill_temperature > 0:
      raise ValueError(f"distill_temperature must be > 0, got "
                       f"{self.distill_temperature}.")


def _logits(config: T5Config, params, batch, *, dropout_rng=None,
            encoded: Optional[Array] = None) -> Array:
  """[B, T, V] float32 teacher-forced logits (dropout iff `dropout_rng`),
  from the model's own encoder, or from `encoded` [B, S, d] when given."""
  kwargs = dict(deterministic=dropout_rng is None,
                rngs=None if dropout_rng is None else {"dropout": dropout_rng})
  module = Transformer(config)
  if encoded is None:
    logits = module.apply(params, batch["encoder_input_tokens"],
                          batch["decoder_input_tokens"],
                          batch["decoder_target_tokens"], **kwargs)
  else:
    logits = module.apply(params, encoded, batch["encoder_input_tokens"],
                          batch["decoder_input_tokens"],
                          batch["decoder_target_tokens"],
                          method=Transformer.decode, **kwargs)
  return logits.astype(jnp.float32)


def _encode(config: T5Config, params, batch) -> Array:
  """[B, S, emb] the (teacher's) encoder output, no dropout."""
  return Transformer(config).apply(params, batch["encoder_input_tokens"],
                                   method=Transformer.encode)


def _kl(t_logits: Array, logits: Array, log_q: Array,
        temperature: float) -> Array:
  """[B, T] KL(p_teacher^T || q_student^T) from logits [B, T, V]."""
  log_p = jax.nn.log_softmax(t_logits / temperature, axis=-1)
  log_q_t = (log_q if temperature == 1.0 else jax.nn.log_softmax(
      logits / temperature, axis=-1))
  return (jnp.exp(log_p) * (log_p - log_q_t)).sum(-1)


def compute_losses(
    params, batch, dropout_rng, *, config: T5Config, settings: LossSettings,
    teacher_config: Optional[T5Config] = None,
    teacher_params: Any = None) -> Tuple[Array, Dict[str, Array]]:
  """Per-batch loss and metrics (all means over non-pad target tokens).

  Args:
    params: {'params': ...} of the student.
    batch: `ParallelData.make_batch` arrays.
    dropout_rng: PRNG key, used iff ``config.dropout_rate > 0``.
    config, settings: the student and the loss.
    teacher_config, teacher_params: the teacher, when ``settings.distill``.

  Returns:
    (loss [], metrics: ce, num_tokens, accuracy, z, loss, and kl when
    distilling).
  """
  encoded = None
  if not config.has_encoder:  # A shared-encoder student: the teacher's.
    if not settings.distill:
      raise ValueError("A student without an encoder (num_encoder_layers=0) "
                       "reads its teacher's encoder: set distill_from.")
    encoded = jax.lax.stop_gradient(
        _encode(teacher_config, teacher_params, batch))
  logits = _logits(
      config, params, batch,
      dropout_rng=(dropout_rng if config.dropout_rate > 0 else None),
      encoded=encoded)
  targets = batch["decoder_target_tokens"]
  mask = (targets > 0).astype(jnp.float32)
  num_tokens = jnp.maximum(mask.sum(), 1.0)

  def mean(x):
    return (x * mask).sum() / num_tokens

  log_z = jax.nn.logsumexp(logits, axis=-1)
  log_q = logits - log_z[..., None]
  nll = -jnp.take_along_axis(log_q, targets[..., None], axis=-1)[..., 0]
  ce = mean(nll)
  loss = ce
  if settings.label_smoothing:
    smooth = -log_q.mean(-1)
    loss = mean((1.0 - settings.label_smoothing) * nll +
                settings.label_smoothing * smooth)
  metrics = {
      "ce": ce,
      "num_tokens": num_tokens,
      "accuracy": mean((log_q.argmax(-1) == targets).astype(jnp.float32))
  }
  if settings.distill:
    t_logits = jax.lax.stop_gradient(
        _logits(teacher_config, teacher_params, batch, encoded=encoded))
    temp = settings.distill_temperature
    metrics["kl"] = mean(_kl(t_logits, logits, log_q, temp))
    w = settings.distill_weight
    loss = w * temp * temp * metrics["kl"] + (1.0 - w) * loss
  metrics["z"] = mean(jnp.square(log_z))
  if settings.z_loss:
    loss = loss + settings.z_loss * metrics["z"]
  metrics["loss"] = loss
  return loss, metrics
