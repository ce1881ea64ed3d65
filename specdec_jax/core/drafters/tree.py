"""Token-tree drafts: k branches of γ guesses per row from one draft model.

`TreeModelDrafter` is a `ModelDrafter` that can also propose a tree
(`propose_tree`) for tree verification (`decoding.tree_speculative_sample`):
per row, `width` = k branches x_{j,1..γ} that all continue the row's known
sequence. The draft model runs the k branches as one batch of B·k rows: it
catches up once on the B rows, its state is then repeated k times, and the
γ - 1 further steps feed B·k rows each.

How branches are drawn is what the acceptance rule (`decoding.tree_acceptance`)
needs:
* sampling (T > 0): k independent draws from the draft, x_{j,1} ~ q_1 i.i.d.
  and each branch continued with its own draws from q(· | its prefix). At
  any depth, the branches that still share the accepted prefix have next
  tokens i.i.d. from q given it: what the multi-draft rule's proof uses.
  With `first_without_replacement`, the k first tokens are distinct, drawn
  without replacement from q_1 (then each branch goes on as above).
* greedy (T = 0): the draft's k most likely first tokens, each continued
  greedily (draft_probs None).

After the target's verdict, `rollback_tree` keeps the accepted branch's rows
as the draft's state and rolls them back as `ModelDrafter.rollback` does, so
the state invariant of `ModelDrafter` (holds the true prefix up to length or
length - 1) is kept and the next `propose`/`propose_tree` catches up as
usual. The model state's leaves must all have the batch axis first (T5's
`DecodeCache` and the decoder-only example's state do).
"""
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.drafters.branches import branch_buffers
from specdec_jax.core.drafters.branches import first_guesses
from specdec_jax.core.drafters.branches import put_guess
from specdec_jax.core.drafters.branches import repeat_rows
from specdec_jax.core.drafters.feature import FeatureDrafter
from specdec_jax.core.drafters.feature_tree import FeatureTreeDrafter
from specdec_jax.core.drafters.model import ModelDrafter
from specdec_jax.core.drafters.model import ModelDrafterState

Array = jax.Array


@structs.dataclass
class TreeDraftState:
  """The draft's state between `propose_tree` and `rollback_tree`.

  Attributes:
    model_state: the draft model's state for B·k rows; row b·k + j is branch
      j of row b: buffer[b, :ℓ+1] then x_{j,1..γ-1} fed.
    length: [B] int32 buffer positions fed per row (ℓ + γ).
    width: k (static).
  """
  model_state: Any
  length: Array
  width: int = structs.field(pytree_node=False)


@structs.dataclass
class TreeModelDrafter(ModelDrafter):
  """A `ModelDrafter` that also proposes k branches per row (module doc).

  Adaptive γ (`confidence_threshold`) is not supported for trees.

  Attributes:
    first_without_replacement: at T > 0, draw the k first guesses without
      replacement from q_1 (Gumbel top-k: distinct tokens, in the order
      drawn; fewer than k tokens of positive q leave the rest with q = 0,
      never kept) instead of i.i.d.; the acceptance rule must be told
      (`TreeAcceptance.first_without_replacement`). Static.
  """
  first_without_replacement: bool = structs.field(pytree_node=False,
                                                  default=False)

  def propose_tree(
      self, state: ModelDrafterState, buffer: Array, length: Array, rng: Array,
      *, gamma: int, width: int, method: sampling.SamplingMethod
  ) -> Tuple[TreeDraftState, Array, Optional[Array]]:
    """k = width branches of γ guesses after buffer[b, :length[b]+1].

    Args: as `Drafter.propose`, plus width k (static).

    Returns:
      (state, draft_tokens [B, k, γ] int32, draft_probs [B, k, γ, V] float32
      q of each guess given its branch's prefix, or None when greedy).
    """
    batch = buffer.shape[0]
    logits, model_state = self.catch_up(state, buffer, length)
    rngs = jax.random.split(rng, gamma)
    first, first_q = first_guesses(rngs[0], logits, width, method,
                                   self.first_without_replacement)
    tokens, probs = branch_buffers(first, first_q, gamma)

    # Steps 2..γ on B·k rows: feed x_{j,i-1}, guess x_{j,i}.
    def step(i, carry):
      model_state, tokens, probs = carry
      step_logits, model_state = self.model.decode_chunk(
          tokens[:, :, i - 1].reshape(batch * width, 1), model_state)
      token, q = method.draw(rngs[i], step_logits.reshape(batch, width, -1))
      return (model_state,) + put_guess(tokens, probs, i, token, q)

    model_state, tokens, probs = lax.fori_loop(
        1, gamma, step, (repeat_rows(model_state, width), tokens, probs))
    return TreeDraftState(model_state, length + gamma, width), tokens, probs

  def rollback_tree(self, state: TreeDraftState, length: Array,
                    branch: Array) -> ModelDrafterState:
    """Keeps branch [B] int32 of each row, rolled back to length [B]."""
    batch = length.shape[0]
    rows = jnp.arange(batch) * state.width + branch
    model_state = jax.tree_util.tree_map(lambda x: x[rows], state.model_state)
    return self.rollback(ModelDrafterState(model_state, state.length), length)


def as_tree_drafter(drafter: Any,
                    first_without_replacement: bool = False) -> Any:
  """A `TreeModelDrafter` (with `first_without_replacement`) for a
  `ModelDrafter` (without adaptive γ) or a model with the `Target`
  interface, a `FeatureTreeDrafter` for a `FeatureDrafter`; ValueError for
  anything else."""
  if isinstance(drafter, FeatureDrafter):  # its top-k branches
    return FeatureTreeDrafter(
        drafter.model, first_without_replacement=first_without_replacement)
  if isinstance(drafter, ModelDrafter):
    model, threshold = drafter.model, drafter.confidence_threshold
  elif callable(getattr(drafter, "decode_chunk", None)):
    model, threshold = drafter, None
  else:
    raise ValueError(
        "tree verification drafts with a model: drafter must be a "
        "drafters.ModelDrafter or a model with the Target interface (e.g. a "
        f"small T5Model), got {type(drafter).__name__}.")
  if threshold is not None:
    raise ValueError(
        "tree verification does not support adaptive γ: the drafter's "
        f"confidence_threshold must be None, got {threshold!r}.")
  return TreeModelDrafter(model,
                          first_without_replacement=first_without_replacement)
