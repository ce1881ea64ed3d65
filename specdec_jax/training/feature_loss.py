"""The loss of a feature-level draft (`models.feature_drafter`), distilled.

The frozen target (the teacher) encodes each batch once and decodes it by
teacher forcing, giving its top hidden states f_t [B, T, F] and its
distributions p_t [B, T, V]. The draft reads (f_{t-1}, x_t) at each
position (pass 1: the target's features, as at the first guess of an
iteration) and, in an unrolled pass 2, (f̂_{t-1}, x_t) with its own
predictions f̂ from pass 1 in place of the target's (as at its later
guesses, where it feeds back its own predicted state: EAGLE-3's training-time
test, one step deep). Per pass and non-pad position:

  head loss     -sum_{k in head} p_t(k) log q_t(k): the KL from the teacher's
                distribution restricted to the head to q (q is 0 off the head,
                so the full KL would be infinite; the mass off the head is a
                constant of the draft and reported as `off_head`);
  feature loss  |f̂_t - f_t|^2 / mean |f_t|^2: EAGLE's regression of the
                next feature, scaled so that 1 means "predicts zeros".

loss = head_1 + w_u head_2 + w_f (feature_1 + w_u feature_2). Metrics also
give the acceptance rates the draft would have on its first and later
guesses: `alpha0_*` (argmax q = argmax p, temperature 0) and `alpha1_*`
(sum_v min(p, q), temperature 1, the paper's β).
"""
import dataclasses
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp

from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.feature_drafter import FeatureDecoder
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig
from specdec_jax.core.models.feature_drafter import shifted_features
from specdec_jax.core.models.t5 import Transformer

Array = jax.Array


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
