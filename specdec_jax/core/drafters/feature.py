"""A feature-level (EAGLE-style) drafter: drafts from the target's state."""
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.models.feature_drafter import FeatureDraftModel
from specdec_jax.core.models.network import DecodeCache
from specdec_jax.core.protocols import Drafter

Array = jax.Array


@structs.dataclass
class FeatureDrafterState:
  """State of `FeatureDrafter`.

  Attributes:
    cache: the draft model's `DecodeCache`.
    length: [B] int32: the cache holds buffer positions 0..length-1 fed
      with the target's own features (positions after them, fed with the
      draft's predictions, are forgotten at `rollback`).
  """
  cache: DecodeCache
  length: Array


@structs.dataclass
class FeatureDrafter(Drafter):
  """Guesses with a `FeatureDraftModel` reading the target's hidden states.

  Each call, with ℓ = length and the target's state holding positions
  0..ℓ-1 (its features f_0..f_{ℓ-1}):

  1. Catch up: one chunk of γ+1 positions from the first position d not yet
     fed with true features (d >= ℓ - γ): inputs (f_{p-1}, x_p) for
     p = d..d+γ (f_{-1} = 0); positions past ℓ are placeholders, dropped by
     `truncate` before they are read. Position ℓ's output gives q_1 and the
     predicted feature f̂_ℓ. The draft's positions fed with its own
     predictions in the last call are recomputed here with the target's
     features, as EAGLE does.
  2. Steps 2..γ: one position each, input (f̂_{ℓ+i-2}, x_{i-1}): the draft
     feeds back its own predicted state.

  So a call costs one (γ+1)-position chunk plus γ-1 single steps of the
  draft. q is exactly 0 off the head's tokens; Algorithm 1 is exact
  whatever q is. Needs the target's encoder output at `init` and its
  features at `propose` (`reads_target_features`).
  """
  model: FeatureDraftModel

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def reads_target_features(self) -> bool:
    return True

  def init(self, encoder_input_tokens: Array, max_len: int,
           encoder_output=None) -> FeatureDrafterState:
    if encoder_output is None:
      raise ValueError(
          "FeatureDrafter.init: the draft cross-attends to the target's "
          "encoder output, but none was given (the target has no "
          "`encoder_output`, or the drafter runs without a target).")
    batch = encoder_input_tokens.shape[0]
    return FeatureDrafterState(
        cache=self.model.start_from_encoder_output(encoder_output, max_len),
        length=jnp.zeros((batch,), jnp.int32))

  def propose(
      self, state: FeatureDrafterState, buffer: Array, length: Array,
      rng: Array, *, gamma: int, method: sampling.SamplingMethod,
      target_features: Optional[Array] = None
  ) -> Tuple[FeatureDrafterState, Array, Optional[Array]]:
    batch = buffer.shape[0]
    logits, feature, cache = self.catch_up(state, buffer, length, gamma,
                                           target_features)
    rngs = jax.random.split(rng, gamma)
    token, q = method.draw(rngs[0], logits)
    draft_tokens = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(token)
    draft_probs = None if q is None else jnp.zeros(
        (batch, gamma, q.shape[-1]), jnp.float32).at[:, 0].set(q)

    def step(i, carry):
      cache, feature, draft_tokens, draft_probs = carry
      features, logits, cache = self.model.decode_chunk(
          feature[:, None], draft_tokens[:, i - 1, None], cache)
      token, q = method.draw(rngs[i], logits[:, 0])
      if draft_probs is not None:
        draft_probs = draft_probs.at[:, i].set(q)
      return (cache, features[:, 0], draft_tokens.at[:,
                                                     i].set(token), draft_probs)

    cache, _, draft_tokens, draft_probs = lax.fori_loop(
        1, gamma, step, (cache, feature, draft_tokens, draft_probs))
    return FeatureDrafterState(cache, length + 1), draft_tokens, draft_probs

  def catch_up(
      self, state: FeatureDrafterState, buffer: Array, length: Array,
      gamma: int,
      target_features: Optional[Array]) -> Tuple[Array, Array, DecodeCache]:
    """Step 1 of `propose`: the (γ+1)-position chunk fed with the target's
    features, from the first position not yet fed with them.

    Returns:
      (logits [B, V] of q_1 at position ℓ = length, the predicted feature
      f̂_ℓ [B, F], the cache holding positions 0..ℓ, all fed with the
      target's features).
    """
    if target_features is None:
      raise ValueError("FeatureDrafter.propose needs target_features "
                       "([B, max_len, F], `Target.features`).")
    rows = jnp.arange(buffer.shape[0])
    fed = state.length
    pos = fed[:, None] + jnp.arange(gamma + 1)[None, :]  # [B, γ+1]
    tokens = jnp.take_along_axis(buffer, jnp.minimum(pos, buffer.shape[1] - 1),
                                 axis=1)
    prev = pos - 1
    feats = jnp.take_along_axis(
        target_features,
        jnp.clip(prev, 0, target_features.shape[1] - 1)[..., None], axis=1)
    feats = jnp.where((prev >= 0)[..., None], feats, 0)
    features, logits, cache = self.model.decode_chunk(feats, tokens,
                                                      state.cache)
    at = jnp.clip(length - fed, 0, gamma)  # Position ℓ within the chunk.
    return (logits[rows,
                   at], features[rows,
                                 at], self.model.truncate(cache, length + 1))

  def rollback(self, state: FeatureDrafterState,
               length: Array) -> FeatureDrafterState:
    kept = jnp.minimum(state.length, length)
    return FeatureDrafterState(self.model.truncate(state.cache, kept), kept)
