"""A draft of a draft (paper §5): the draft model, itself sped up.

`HierarchicalDrafter` drafts with a model M_q (e.g. a small T5) whose own
decoding is speculative: a negligible-cost inner drafter (prompt lookup or
an n-gram table) guesses `inner_gamma` tokens, M_q scores them in one call
and Algorithm 1 keeps a prefix plus one token, until every row has γ
tokens. The inner Algorithm 1 is exact, so the γ tokens are exact samples
of M_q's own (standardized) distribution q, and the same M_q call gives
q_i at each of them: the outer Algorithm 1, which needs x_i ~ q_i and q_i,
stays exact too. At temperature 0 both levels work on argmax tokens.

Cost: one M_q call of inner_gamma+1 tokens per inner iteration instead of
one M_q step per guess (a one-token call when no row has an inner guess).
A row that overshoots γ drops its extra tokens.

State between outer iterations: M_q's state holds the buffer positions
0..d-1 with d = `length`; after a rollback to ℓ (the outer loop's new
length), d is ℓ or ℓ-1 (all γ guesses kept and M_q never fed x_γ); a
lagging row is caught up by one one-token call before the inner loop.
"""
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import carried_while
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.acceptance import ExactAcceptance
from specdec_jax.core.drafters import guesses
from specdec_jax.core.drafters import model as model_lib
from specdec_jax.core.protocols import Drafter
from specdec_jax.core.drafters.ngram import NGramDrafter
from specdec_jax.core.drafters.prompt_lookup import PromptLookupDrafter

Array = jax.Array


@structs.dataclass
class HierarchicalState:
  """State of `HierarchicalDrafter`.

  Attributes:
    model_state: M_q's decode state, holding buffer positions 0..length-1.
    length: [B] int32 positions M_q's state holds.
    inner_state: the inner drafter's state.
  """
  model_state: Any
  length: Array
  inner_state: Any


@structs.dataclass
class HierarchicalDrafter(Drafter):
  """M_q drafting with its own negligible-cost drafter (module docstring).

  Attributes:
    model: the draft model M_q (a `decoding.Target`, e.g. a `T5Model`).
    inner: the inner drafter: a `PromptLookupDrafter` or an `NGramDrafter`
      (stateless between positions, so the inner loop may rewind freely).
    inner_gamma: guesses per inner iteration (static, >= 1).
  """
  model: Any
  inner: Drafter
  inner_gamma: int = structs.field(pytree_node=False, default=4)

  def __post_init__(self):
    if not isinstance(self.inner, (PromptLookupDrafter, NGramDrafter)):
      raise ValueError(
          "HierarchicalDrafter: inner must be a PromptLookupDrafter or an "
          f"NGramDrafter, got {type(self.inner).__name__}.")
    if (isinstance(self.inner_gamma, bool) or
        not isinstance(self.inner_gamma, int) or self.inner_gamma < 1):
      raise ValueError("HierarchicalDrafter: inner_gamma must be an integer "
                       f">= 1, got {self.inner_gamma!r}.")

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def init(self, encoder_input_tokens: Array, max_len: int,
           encoder_output: Any = None) -> HierarchicalState:
    # Rows that already have γ tokens keep running the inner loop at up to
    # γ + inner_gamma positions past the outer length, inner_gamma + 1 wide.
    room = max_len + 2 * self.inner_gamma + 1
    return HierarchicalState(
        model_state=model_lib.start_model(self.model, encoder_input_tokens,
                                          room, encoder_output),
        length=jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32),
        inner_state=self.inner.init(encoder_input_tokens, room))

  def propose(
      self, state: HierarchicalState, buffer: Array, length: Array, rng: Array,
      *, gamma: int, method: sampling.SamplingMethod
  ) -> Tuple[HierarchicalState, Array, Optional[Array]]:
    batch = buffer.shape[0]
    rows = jnp.arange(batch)
    inner_gamma = self.inner_gamma

    # Feed buffer[d] to rows that lag (d = ℓ-1); the others' extra position
    # is dropped by the truncation. M_q then holds 0..ℓ-1 in every row.
    def catch_up(model_state):
      _, model_state = self.model.decode_chunk(
          buffer[rows, state.length][:, None], model_state)
      return model_state

    model_state = lax.cond(jnp.any(state.length < length), catch_up,
                           lambda s: s, state.model_state)
    model_state = self.model.truncate(model_state, length)

    # The inner loop writes past the outer buffer's end: give it room.
    work = jnp.pad(buffer, ((0, 0), (0, gamma + inner_gamma + 2)))
    slots = gamma + inner_gamma + 1  # A row may overshoot γ by inner_gamma.
    out_tokens = jnp.zeros((batch, slots), jnp.int32)
    out_probs = None if method.is_greedy else jnp.zeros(
        (batch, slots, self.vocab_size), jnp.float32)

    def cond(carry):
      return jnp.any(carry[3] < gamma)

    def body(carry):
      it, model_state, inner_state, produced, known, work, out_tokens, \
          out_probs = carry
      propose_rng, accept_rng = jax.random.split(jax.random.fold_in(rng, it))
      inner_state, inner_tokens, inner_probs = self.inner.propose(
          inner_state, work, known, propose_rng, gamma=inner_gamma,
          method=method)
      logits, model_state = guesses.verify_call(self.model, work[rows, known],
                                                inner_tokens, model_state)
      verdict = ExactAcceptance()(accept_rng, logits, inner_tokens, inner_probs,
                                  method)
      n = verdict.num_accepted
      emitted = jnp.concatenate([inner_tokens, verdict.next_token[:, None]],
                                axis=1)
      emitted = guesses.feedable(
          jnp.where(
              jnp.arange(inner_gamma + 1)[None, :] == n[:, None],
              verdict.next_token[:, None], emitted))
      active = produced < gamma
      put = jax.vmap(lambda row, new, at: lax.dynamic_update_slice(
          row, new, (at,) + (0,) * (row.ndim - 1)))

      def keep(new, old):
        mask = active.reshape((batch,) + (1,) * (old.ndim - 1))
        return jnp.where(mask, new, old)

      out_tokens = keep(put(out_tokens, emitted, produced), out_tokens)
      if out_probs is not None:
        # Emitted token j (j <= n) sits at chunk position j, whose logits
        # give its q: the standardized M_q distribution it was drawn from.
        out_probs = keep(put(out_probs, verdict.target_probs, produced),
                         out_probs)
      work = keep(put(work, emitted, known + 1), work)
      step = jnp.where(active, n + 1, 0)
      known, produced = known + step, produced + step
      model_state = self.model.truncate(model_state, known)
      inner_state = self.inner.rollback(inner_state, known)
      return (it + 1, model_state, inner_state, produced, known, work,
              out_tokens, out_probs)

    carry = (jnp.int32(0), model_state, state.inner_state,
             jnp.zeros((batch,),
                       jnp.int32), length, work, out_tokens, out_probs)
    _, model_state, inner_state, _, known, _, out_tokens, out_probs = (
        carried_while.while_loop(cond, body, carry))
    return (HierarchicalState(model_state, known,
                              inner_state), out_tokens[:, :gamma],
            None if out_probs is None else out_probs[:, :gamma])

  def rollback(self, state: HierarchicalState,
               length: Array) -> HierarchicalState:
    kept = jnp.minimum(state.length, length)
    return HierarchicalState(self.model.truncate(state.model_state, kept), kept,
                             self.inner.rollback(state.inner_state, length))
