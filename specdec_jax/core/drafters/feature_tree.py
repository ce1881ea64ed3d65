"""A feature-level draft's top-k branches, for tree verification.

`FeatureTreeDrafter` is a `FeatureDrafter` that can also propose a tree
(`propose_tree`, as `TreeModelDrafter` does for a draft model): it catches
up once on the B rows with the target's features (`FeatureDrafter.catch_up`:
q_1 and the predicted feature f̂_ℓ), draws the k first guesses from q_1
(`branches.first_guesses`: greedy top-k, or draws with or without
replacement), then runs the k branches as B·k rows for guesses 2..γ, each
branch fed its own previous guess and its own predicted feature. So at any
depth the branches that share a prefix draw their next guesses i.i.d. from
q given that prefix, which the tree acceptance rule's exactness needs.

Every position the branches add is fed with the draft's own predictions,
which `rollback` drops anyway: the tree state is the un-branched state
after the catch-up (positions 0..ℓ, all fed with the target's features),
and `rollback_tree` needs no branch.
"""
from typing import Optional, Tuple

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
from specdec_jax.core.drafters.feature import FeatureDrafterState

Array = jax.Array


@structs.dataclass
class FeatureTreeDrafter(FeatureDrafter):
  """A `FeatureDrafter` that also proposes k branches per row (module doc).

  Attributes:
    first_without_replacement: at T > 0, draw the k first guesses without
      replacement from q_1 (the acceptance rule must be told,
      `TreeAcceptance.first_without_replacement`). Static.
  """
  first_without_replacement: bool = structs.field(pytree_node=False,
                                                  default=False)

  def propose_tree(
      self, state: FeatureDrafterState, buffer: Array, length: Array,
      rng: Array, *, gamma: int, width: int, method: sampling.SamplingMethod,
      target_features: Optional[Array] = None
  ) -> Tuple[FeatureDrafterState, Array, Optional[Array]]:
    """k = width branches of γ guesses after buffer[b, :length[b]+1].

    Args: as `FeatureDrafter.propose`, plus width k (static).

    Returns:
      (state for `rollback_tree`, draft_tokens [B, k, γ] int32,
      draft_probs [B, k, γ, V] float32 q of each guess given its branch's
      prefix, or None when greedy).
    """
    batch = buffer.shape[0]
    logits, feature, cache = self.catch_up(state, buffer, length, gamma,
                                           target_features)
    rngs = jax.random.split(rng, gamma)
    first, first_q = first_guesses(rngs[0], logits, width, method,
                                   self.first_without_replacement)
    tokens, probs = branch_buffers(first, first_q, gamma)

    # Guesses 2..γ on B·k rows: feed (f̂ of the previous position, x_{j,i-1}).
    def step(i, carry):
      branch_cache, feature, tokens, probs = carry
      features, step_logits, branch_cache = self.model.decode_chunk(
          feature[:, None], tokens[:, :, i - 1].reshape(batch * width, 1),
          branch_cache)
      token, q = method.draw(rngs[i], step_logits.reshape(batch, width, -1))
      return (branch_cache, features[:, 0]) + put_guess(tokens, probs, i, token,
                                                        q)

    _, _, tokens, probs = lax.fori_loop(1, gamma, step, (repeat_rows(
        cache, width), jnp.repeat(feature, width, axis=0), tokens, probs))
    return FeatureDrafterState(cache, length + 1), tokens, probs

  def rollback_tree(self, state: FeatureDrafterState, length: Array,
                    branch: Array) -> FeatureDrafterState:
    """Rolls back to length [B]; every branch shares the kept positions."""
    del branch
    return self.rollback(state, length)
