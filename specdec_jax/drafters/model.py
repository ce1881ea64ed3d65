"""A draft model M_q with its own decode state (the paper's drafter)."""
from typing import Any, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax import sampling
from specdec_jax.drafters.base import Drafter

Array = jax.Array


@flax.struct.dataclass
class ModelDrafterState:
  """State of `ModelDrafter`.

  Attributes:
    model_state: the draft model's decode state (for T5, a `DecodeCache`).
    length: [B] int32 buffer positions the model state holds: it has been
      fed buffer[b, :length[b]].
  """
  model_state: Any
  length: Array


@flax.struct.dataclass
class ModelDrafter(Drafter):
  """Drafts with a smaller model that has the target's interface.

  `model` is anything implementing `decoding.Target` (`start`,
  `decode_chunk`, `truncate`, `vocab_size`), e.g. a `T5Model`; each draft
  step is one single-token `decode_chunk` and x_i is drawn from its logits
  with the loop's sampling method.

  State invariant between iterations: the model state holds the row's true
  prefix buffer[:, :d], with d = length (after a rejection) or length - 1
  (after all γ guesses were accepted: x_γ was guessed but never fed). When
  some row lags, the first step feeds a 2-token chunk buffer[d], buffer[d+1]
  and reads the logits of the last true one (for rows that did not lag the
  second slot is a placeholder, dropped by `truncate`); otherwise it feeds
  one token. The other γ-1 steps feed one token each, so a call costs γ
  model steps (plus the rare 2-token catch-up).
  """
  model: Any

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def init(self, encoder_input_tokens: Array, max_len: int
           ) -> ModelDrafterState:
    batch = encoder_input_tokens.shape[0]
    return ModelDrafterState(
        model_state=self.model.start(encoder_input_tokens, max_len),
        length=jnp.zeros((batch,), jnp.int32))

  def propose(self, state: ModelDrafterState, buffer: Array, length: Array,
              rng: Array, *, gamma: int, method: sampling.SamplingMethod
              ) -> Tuple[ModelDrafterState, Array, Optional[Array]]:
    batch = buffer.shape[0]
    rows = jnp.arange(batch)
    fed = state.length  # [B]: length or length - 1.

    # Step 1: catch up (1 or 2 new tokens) and guess x_1. The 2-token chunk
    # is only paid when some row lags: a K=2 call costs up to 2x a K=1 call
    # on compute-bound backends such as CPU.
    def feed_two(model_state):
      chunk = jnp.stack([buffer[rows, fed], buffer[rows, fed + 1]], axis=1)
      logits, model_state = self.model.decode_chunk(chunk, model_state)
      return logits[rows, jnp.clip(length - fed, 0, 1)], model_state

    def feed_one(model_state):
      logits, model_state = self.model.decode_chunk(
          buffer[rows, fed][:, None], model_state)
      return logits[:, 0], model_state

    logits, model_state = lax.cond(jnp.any(fed < length), feed_two, feed_one,
                                   state.model_state)
    model_state = self.model.truncate(model_state, length + 1)
    rngs = jax.random.split(rng, gamma)
    token, q = method.draw(rngs[0], logits)
    draft_tokens = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(token)
    draft_probs = None if q is None else jnp.zeros(
        (batch, gamma, q.shape[-1]), jnp.float32).at[:, 0].set(q)

    # Steps 2..γ: feed x_{i-1}, guess x_i.
    def step(i, carry):
      model_state, draft_tokens, draft_probs = carry
      logits, model_state = self.model.decode_chunk(
          draft_tokens[:, i - 1, None], model_state)
      token, q = method.draw(rngs[i], logits[:, 0])
      if draft_probs is not None:
        draft_probs = draft_probs.at[:, i].set(q)
      return model_state, draft_tokens.at[:, i].set(token), draft_probs

    model_state, draft_tokens, draft_probs = lax.fori_loop(
        1, gamma, step, (model_state, draft_tokens, draft_probs))
    # Fed: the prefix up to buffer[length], then x_1..x_{γ-1}.
    return (ModelDrafterState(model_state, length + gamma), draft_tokens,
            draft_probs)

  def rollback(self, state: ModelDrafterState, length: Array
               ) -> ModelDrafterState:
    kept = jnp.minimum(state.length, length)
    return ModelDrafterState(self.model.truncate(state.model_state, kept),
                             kept)


# The paper's setting: a small T5 drafting for a large one (any model with
# the target's interface works; the name is kept for existing callers).
T5Drafter = ModelDrafter
