"""A draft model M_q with its own decode state (the paper's drafter)."""
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import carried_while
from specdec_jax.core import protocols
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.drafters import guesses
from specdec_jax.core.protocols import NO_GUESS
from specdec_jax.core.protocols import Drafter

Array = jax.Array


def start_model(model: Any, encoder_input_tokens: Array, max_len: int,
                encoder_output: Any = None) -> Any:
  """A draft model's state: from the target's encoder output when the model
  reads one (`reads_target_encoder`: a decoder without an encoder of its
  own, e.g. `models.SharedEncoderModel`) and the target gave it; else
  `model.start`, which encodes the inputs with the model's own encoder."""
  if encoder_output is not None and getattr(model, "reads_target_encoder",
                                            False):
    return model.start_from_encoder_output(encoder_output, max_len)
  return model.start(encoder_input_tokens, max_len)


@structs.dataclass
class ModelDrafterState:
  """State of `ModelDrafter`.

  Attributes:
    model_state: the draft model's decode state (for T5, a `DecodeCache`).
    length: [B] int32 buffer positions the model state holds: it has been
      fed buffer[b, :length[b]].
  """
  model_state: Any
  length: Array


@structs.dataclass
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

  Adaptive γ (`confidence_threshold` t in (0, 1), paper §3.5): a row stops
  after a guess whose confidence (`guesses.confidence`: q(x) of the drawn
  token, or the top softmax probability at temperature 0) is below t, and
  fills its other slots with NO_GUESS; the draft steps run in a while
  loop (`carried_while`) that ends when every row has stopped (at most γ
  steps).
  The stop depends only on the draft's own draws, so Algorithm 1 stays exact.

  A shared-encoder draft (`models.SharedEncoderModel`: a decoder reading the
  target's encoder) starts from the target's encoder output that the loop
  passes to `init` (`start_model`), so drafting encodes nothing.
  """
  model: Any
  confidence_threshold: Optional[float] = structs.field(pytree_node=False,
                                                        default=None)

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def may_stop_early(self) -> bool:
    return self.confidence_threshold is not None

  def init(self, encoder_input_tokens: Array, max_len: int,
           encoder_output: Any = None) -> ModelDrafterState:
    batch = encoder_input_tokens.shape[0]
    return ModelDrafterState(
        model_state=start_model(self.model, encoder_input_tokens, max_len,
                                encoder_output), length=jnp.zeros((batch,),
                                                                  jnp.int32))

  def propose(
      self, state: ModelDrafterState, buffer: Array, length: Array, rng: Array,
      *, gamma: int, method: sampling.SamplingMethod
  ) -> Tuple[ModelDrafterState, Array, Optional[Array]]:
    batch = buffer.shape[0]
    # Step 1: catch up and guess x_1.
    logits, model_state = self.catch_up(state, buffer, length)
    rngs = jax.random.split(rng, gamma)
    token, q = method.draw(rngs[0], logits)
    draft_tokens = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(token)
    draft_probs = None if q is None else jnp.zeros(
        (batch, gamma, q.shape[-1]), jnp.float32).at[:, 0].set(q)

    if self.confidence_threshold is not None:
      return self._propose_adaptive(model_state, length, rngs, logits,
                                    draft_tokens, draft_probs, q, method)

    if method.is_greedy and protocols.argmax_in_call(self.model):
      return self._propose_argmax_in_calls(model_state, length, logits, gamma)
    if protocols.unroll_draft_steps(self.model):
      return self._propose_unrolled(model_state, length, rngs, token, q, method)

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
    return (ModelDrafterState(model_state,
                              length + gamma), draft_tokens, draft_probs)

  def _propose_unrolled(self, model_state, length, rngs, token, q, method):
    """Steps 2..γ of `propose` unrolled (a GPU's paths:
    `protocols.unroll_draft_steps`), from step 1's model state, token x_1
    [B] and q_1 [B, V] or None. Each step feeds the token as drawn and the
    guesses are stacked once at the end: no loop counter, slice or scatter
    for XLA to run as kernels of their own between the model's."""
    tokens, probs = [token], [q]
    for i in range(1, rngs.shape[0]):
      logits, model_state = self.model.decode_chunk(tokens[-1][:, None],
                                                    model_state)
      token, q = method.draw(rngs[i], logits[:, 0])
      tokens.append(token)
      probs.append(q)
    draft_probs = None if q is None else jnp.stack(probs, axis=1)
    return (ModelDrafterState(model_state, length + len(tokens)),
            jnp.stack(tokens, axis=1), draft_probs)

  def _propose_argmax_in_calls(self, model_state, length, logits, gamma):
    """Greedy steps 2..γ of `propose` on a model that takes a step's argmax
    in its next call's first kernel (`protocols.argmax_in_call`), from
    step 1's model state and logits [B, V]: each step is fed the last
    one's logits, and the γ guesses are their argmax, taken once at the
    end (one XLA kernel, not one a step)."""
    fed = [logits[:, None]]
    for _ in range(1, gamma):
      step_logits, model_state = self.model.decode_argmax(fed[-1], model_state)
      fed.append(step_logits)
    guesses = jnp.argmax(jnp.concatenate(fed, axis=1), axis=-1)
    return (ModelDrafterState(model_state,
                              length + gamma), guesses.astype(jnp.int32), None)

  def catch_up(self, state: ModelDrafterState, buffer: Array,
               length: Array) -> Tuple[Array, Any]:
    """Feeds the model up to buffer[:, length] (1 or 2 new tokens per row).

    Returns (logits [B, V] of the token after buffer[b, length[b]], the
    model state holding buffer[b, :length[b] + 1]). The 2-token chunk is
    only paid when some row lags: a K=2 call costs up to 2x a K=1 call on
    compute-bound backends such as CPU. A model whose K-token calls cost
    about one (`protocols.flat_chunk_cost`: a GPU's decode path) always
    feeds two: no branch, whose index a GPU would read back to the host
    every iteration (a row that does not lag reads the first logits and
    drops the second token, as it does in a batch where another lags).
    """
    rows = jnp.arange(buffer.shape[0])
    fed = state.length  # [B]: length or length - 1.

    def feed_two(model_state):
      chunk = jnp.stack([buffer[rows, fed], buffer[rows, fed + 1]], axis=1)
      logits, model_state = self.model.decode_chunk(chunk, model_state)
      return logits[rows, jnp.clip(length - fed, 0, 1)], model_state

    def feed_one(model_state):
      logits, model_state = self.model.decode_chunk(buffer[rows, fed][:, None],
                                                    model_state)
      return logits[:, 0], model_state

    if protocols.flat_chunk_cost(self.model):
      logits, model_state = feed_two(state.model_state)
    else:
      logits, model_state = lax.cond(jnp.any(fed < length), feed_two, feed_one,
                                     state.model_state)
    return logits, self.model.truncate(model_state, length + 1)

  def _propose_adaptive(self, model_state, length, rngs, logits, draft_tokens,
                        draft_probs, q, method):
    """Steps 2..γ of `propose` with per-row stops (adaptive γ).

    Args: the state after step 1: the model state (fed up to buffer[length]),
    length [B], the γ step keys, step 1's logits [B, V], draft_tokens
    [B, γ] / draft_probs [B, γ, V] or None holding x_1 / q_1, and q_1.
    """
    gamma = draft_tokens.shape[1]
    threshold = self.confidence_threshold
    stopped = guesses.confidence(method, logits, draft_tokens[:, 0],
                                 q) < threshold
    empty = jnp.full_like(draft_tokens, NO_GUESS)
    draft_tokens = jnp.where(
        jnp.arange(gamma)[None, :] == 0, draft_tokens, empty)

    def cond(carry):
      i, _, _, _, stopped = carry
      return (i < gamma) & jnp.logical_not(jnp.all(stopped))

    def body(carry):
      i, model_state, draft_tokens, draft_probs, stopped = carry
      # Stopped rows feed a placeholder; `rollback` drops what it wrote.
      logits, model_state = self.model.decode_chunk(
          guesses.feedable(draft_tokens[:, i - 1, None]), model_state)
      token, q = method.draw(rngs[i], logits[:, 0])
      draft_tokens = draft_tokens.at[:,
                                     i].set(jnp.where(stopped, NO_GUESS, token))
      if draft_probs is not None:
        # q of a NO_GUESS slot is zeros (the acceptance rules' contract).
        draft_probs = draft_probs.at[:,
                                     i].set(jnp.where(stopped[:, None], 0.0, q))
      stopped = stopped | (guesses.confidence(method, logits[:, 0], token, q)
                           < threshold)
      return i + 1, model_state, draft_tokens, draft_probs, stopped

    _, model_state, draft_tokens, draft_probs, _ = carried_while.while_loop(
        cond, body,
        (jnp.int32(1), model_state, draft_tokens, draft_probs, stopped))
    # Fed: the prefix up to buffer[length], then x_1..x_{g-1} (g guesses);
    # anything a row fed after its stop lies past length + g.
    fed = length + guesses.num_guesses(draft_tokens)
    return ModelDrafterState(model_state, fed), draft_tokens, draft_probs

  def rollback(self, state: ModelDrafterState,
               length: Array) -> ModelDrafterState:
    kept = jnp.minimum(state.length, length)
    return ModelDrafterState(self.model.truncate(state.model_state, kept), kept)
