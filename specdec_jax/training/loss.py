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
from specdec_jax.core.models.feature_drafter import FeatureDecoder
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig
from specdec_jax.core.models.feature_drafter import shifted_features
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


# -- feature loss --------------------------------------------------------------
# The loss of a feature-level draft (`models.feature_drafter`), distilled.
#
# The frozen target (the teacher) encodes each batch once and decodes it by
# teacher forcing, giving its top hidden states f_t [B, T, F] and its
# distributions p_t [B, T, V]. The draft reads (f_{t-1}, x_t) at each
# position (pass 1: the target's features, as at the first guess of an
# iteration) and, in an unrolled pass 2, (f̂_{t-1}, x_t) with its own
# predictions f̂ from pass 1 in place of the target's (as at its later
# guesses, where it feeds back its own predicted state: EAGLE-3's training-time
# test, one step deep). Per pass and non-pad position:
#
#   head loss     -sum_{k in head} p_t(k) log q_t(k): the KL from the teacher's
#                 distribution restricted to the head to q (q is 0 off the head,
#                 so the full KL would be infinite; the mass off the head is a
#                 constant of the draft and reported as `off_head`);
#   feature loss  |f̂_t - f_t|^2 / mean |f_t|^2: EAGLE's regression of the
#                 next feature, scaled so that 1 means "predicts zeros".
#
# loss = head_1 + w_u head_2 + w_f (feature_1 + w_u feature_2). Metrics also
# give the acceptance rates the draft would have on its first and later
# guesses: `alpha0_*` (argmax q = argmax p, temperature 0) and `alpha1_*`
# (sum_v min(p, q), temperature 1, the paper's β).
@dataclasses.dataclass(frozen=True)
class FeatureLossSettings:
  """Weights of the feature draft's loss (hashable: a compiled step's key).

  Attributes:
    feature_weight: w_f, the feature regression's weight (>= 0).
    unroll_weight: w_u, pass 2's weight (>= 0; 0 skips pass 2).
    z_loss: T5X's log(Z)^2 weight on the head's logits.
  """
  feature_weight: float = 1.0
  unroll_weight: float = 1.0
  z_loss: float = 1e-4

  def __post_init__(self):
    for name in ("feature_weight", "unroll_weight", "z_loss"):
      value = getattr(self, name)
      if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}.")


def teacher_outputs(teacher: T5Config, teacher_params, batch) -> Dict[str, Any]:
  """The frozen teacher's encoder output, features, probabilities, embedding.

  Returns:
    encoded [B, S, F], features [B, T, F], probs [B, T, V] float32 (T = 1),
    embedded [B, T, F] (its embedding of the decoder inputs); no gradient.
  """
  module = Transformer(teacher)
  tokens = batch["encoder_input_tokens"]
  encoded = module.apply(teacher_params, tokens, method=Transformer.encode)
  features, logits = module.apply(teacher_params, encoded, tokens,
                                  batch["decoder_input_tokens"],
                                  batch["decoder_target_tokens"],
                                  method=Transformer.decode_hidden)
  table = teacher_params["params"]["token_embedder"]["embedding"]
  out = {
      "encoded": encoded,
      "features": features,
      "probs": jax.nn.softmax(logits.astype(jnp.float32), axis=-1),
      "embedded": jnp.take(table, batch["decoder_input_tokens"], axis=0),
  }
  return jax.lax.stop_gradient(out)


def _pass_terms(pred: Array, head_logits: Array, teacher: Dict[str, Any],
                head_tokens: Array, mask: Array) -> Dict[str, Array]:
  """Mean head loss, feature loss, z and acceptance metrics of one pass."""
  num = jnp.maximum(mask.sum(), 1.0)

  def mean(x):
    return (x * mask).sum() / num

  log_z = jax.nn.logsumexp(head_logits, axis=-1)
  log_q = head_logits - log_z[..., None]  # [B, T, K]
  p_head = jnp.take(teacher["probs"], head_tokens, axis=-1)  # [B, T, K]
  target = teacher["features"]
  scale = jnp.maximum(mean(jnp.mean(jnp.square(target), -1)), 1e-6)
  q = jnp.exp(log_q)
  p_argmax = teacher["probs"].argmax(-1)
  q_argmax = jnp.take(head_tokens, log_q.argmax(-1))
  return {
      "head": mean(-(p_head * log_q).sum(-1)),
      "feature": mean(jnp.mean(jnp.square(pred - target), -1)) / scale,
      "z": mean(jnp.square(log_z)),
      "alpha0": mean((q_argmax == p_argmax).astype(jnp.float32)),
      "alpha1": mean(jnp.minimum(p_head, q).sum(-1)),
      "off_head": mean(1.0 - p_head.sum(-1)),
  }


def feature_losses(params, batch, head_tokens: Array, teacher_params, *,
                   config: FeatureDrafterConfig, teacher: T5Config,
                   settings: FeatureLossSettings) -> Tuple[Array, Dict]:
  """(loss [], metrics) of one batch; see the module docstring.

  Args:
    params: the draft's {'params': ...}.
    batch: `ParallelData.make_batch` arrays.
    head_tokens: [K] int32 the head's tokens.
    teacher_params: the frozen target's {'params': ...}.
    config, teacher, settings: the draft, the target and the loss weights.
  """
  t_out = teacher_outputs(teacher, teacher_params, batch)
  targets = batch["decoder_target_tokens"]
  mask = (targets > 0).astype(jnp.float32)
  module = FeatureDecoder(config)
  enc_valid = batch["encoder_input_tokens"] > 0

  def run(features):
    return module.apply(params, shifted_features(features), t_out["embedded"],
                        t_out["encoded"], enc_valid, targets > 0)

  pred, logits = run(t_out["features"])
  first = _pass_terms(pred, logits, t_out, head_tokens, mask)
  metrics = {f"{k}_1": v for k, v in first.items()}
  w_f, w_u = settings.feature_weight, settings.unroll_weight
  loss = first["head"] + w_f * first["feature"] + settings.z_loss * first["z"]
  if w_u > 0:
    pred2, logits2 = run(pred)
    second = _pass_terms(pred2, logits2, t_out, head_tokens, mask)
    metrics.update({f"{k}_2": v for k, v in second.items()})
    loss = loss + w_u * (second["head"] + w_f * second["feature"])
  metrics["loss"] = loss
  metrics["num_tokens"] = mask.sum()
  return loss, metrics
