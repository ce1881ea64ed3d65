"""How a tree drafter starts its k branches (`tree`, `feature_tree`).

Both tree drafters catch up once on the B rows, draw the k first guesses of
each row from the same q_1 (`first_guesses`), then run the k branches as
B·k rows (`repeat_rows`). How the first guesses are drawn is what the tree
acceptance rule (`decoding.tree_acceptance`) must be told.
"""
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import sampling

Array = jax.Array


def repeat_rows(tree: Any, width: int) -> Any:
  """Every leaf [B, ...] -> [B·k, ...], row b·k + j a copy of row b."""
  return jax.tree_util.tree_map(lambda x: jnp.repeat(x, width, axis=0), tree)


def first_guesses(rng: Array, logits: Array, width: int,
                  method: sampling.SamplingMethod,
                  without_replacement: bool) -> Tuple[Array, Optional[Array]]:
  """The k first guesses of each row, all from q_1 = logits [B, V].

  * greedy: the k most likely tokens (q None: deterministic);
  * `without_replacement`: k distinct tokens drawn without replacement
    (Gumbel top-k, in the order drawn; past q_1's support the rest have
    q = 0 and are never kept);
  * otherwise: k i.i.d. draws from q_1.

  Returns:
    (tokens [B, k] int32, q [B, k, V] float32 each branch's q_1, or None
    when greedy).
  """
  batch = logits.shape[0]
  if method.is_greedy:
    return lax.top_k(logits, width)[1].astype(jnp.int32), None
  branched = jnp.broadcast_to(logits[:, None],
                              (batch, width) + logits.shape[-1:])
  if without_replacement:
    q = method.standardize(branched)
    gumbel = jax.random.gumbel(rng, logits.shape)
    return lax.top_k(jnp.log(q[:, 0]) + gumbel, width)[1].astype(jnp.int32), q
  return method.draw(rng, branched)


def branch_buffers(first: Array, first_q: Optional[Array],
                   gamma: int) -> Tuple[Array, Optional[Array]]:
  """The k branches' guess buffers, the first guesses in place.

  Args:
    first: [B, k] int32 and first_q: [B, k, V] float32 or None, as
      `first_guesses` returns them.

  Returns:
    (tokens [B, k, γ] int32, probs [B, k, γ, V] float32 or None), zeros past
    the first guess.
  """
  batch, width = first.shape
  tokens = jnp.zeros((batch, width, gamma), jnp.int32).at[:, :, 0].set(first)
  probs = None if first_q is None else jnp.zeros(
      (batch, width, gamma, first_q.shape[-1]), jnp.float32).at[:, :,
                                                                0].set(first_q)
  return tokens, probs


def put_guess(tokens: Array, probs: Optional[Array], i: Array, token: Array,
              q: Optional[Array]) -> Tuple[Array, Optional[Array]]:
  """Guess i of every branch, token [B, k] (and q [B, k, V]), written into
  the `branch_buffers`."""
  if probs is not None:
    probs = probs.at[:, :, i].set(q)
  return tokens.at[:, :, i].set(token), probs
