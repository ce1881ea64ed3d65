"""The draft's side of speculative beam search: its beam tree and the rows.

`run_draft` runs the draft model's beam search of width u for γ steps from
the target's live beams and keeps every beam of every depth (`DraftTree`);
`candidate_rows` picks the R sequences the target scores in one call (each
a live beam followed by a tree node's draft tokens). What is proposed
decides only how many target steps a call covers, never the beams
(`speculative_beam` says why).
"""
from typing import Any, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import structs
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding.beam_search import Beams
from specdec_jax.core.decoding.beam_search import beam_rows
from specdec_jax.core.decoding.beam_search import gather_rows
from specdec_jax.core.protocols import Target

Array = jax.Array


@structs.dataclass
class DraftTree:
  """Every beam of the draft's beam search (width u, γ depths): N = γ·u nodes.

  Node n = d·u + r is beam r (best first) after d+1 draft steps.

  Attributes:
    tokens: [B, N, γ] int32 the node's draft tokens after its root (zeros
      past its depth).
    roots: [B, N] int32 the live target beam (in [0, k)) it descends from.
    depth: [B, N] int32 its number of draft tokens, d+1.
    priority: [B, N] int32 for leaves (nodes no deeper node extends), the
      deeper and better the higher; -1 for the other nodes (their sequences
      are prefixes of a leaf's).
  """
  tokens: Array
  roots: Array
  depth: Array
  priority: Array


def _draft_select(log_probs: Array, scores: Array,
                  eos_id: Array) -> Tuple[Array, Array, Array]:
  """One draft beam step: top u of u×V, never an EOS.

  Args:
    log_probs: [B, u, V] the draft's next-token log-probabilities.
    scores: [B, u] the beams' log-probabilities.
    eos_id: [] int32.

  Returns:
    (scores [B, u] sorted best first, parents [B, u], tokens [B, u]).
  """
  batch, u, vocab = log_probs.shape
  not_eos = jnp.arange(vocab) != eos_id
  candidates = jnp.where(not_eos, log_probs, -jnp.inf) + scores[:, :, None]
  top, flat = lax.top_k(candidates.reshape(batch, u * vocab), u)
  return top, flat // vocab, flat % vocab


def per_beam(values: Array, k: int) -> Array:
  """[B] per batch element -> [B*k] per beam row."""
  return jnp.repeat(values.astype(jnp.int32), k)


def _draft_roots(draft: Target, draft_state: Any, known: Array, beams: Beams,
                 gamma: int) -> Tuple[Array, Any]:
  """The draft's next-token log-probabilities after each live beam.

  The draft state holds positions < `known` [B] of every live beam (the
  positions its root shared last iteration); one chunk of γ+1 positions
  from there covers the (up to γ+1) positions since.

  Returns:
    (log_probs [B, k, V] float32, the live beams' draft state, B*k rows
    holding positions 0..step).
  """
  batch, k, _ = beams.live_seqs.shape
  t = beams.step
  seqs = jnp.pad(beams.live_seqs, ((0, 0), (0, 0), (0, gamma + 1)))
  positions = known[:, None, None] + jnp.arange(gamma + 1)
  chunk = jnp.take_along_axis(
      seqs, jnp.broadcast_to(positions, (batch, k, gamma + 1)), axis=2)
  draft_state = draft.truncate(draft_state, per_beam(known, k))
  logits, state = draft.decode_chunk(chunk.reshape(batch * k, gamma + 1),
                                     draft_state)
  logits = logits.reshape(batch, k, gamma + 1, -1)
  logits = jnp.take_along_axis(logits, (t - known)[:, None, None, None],
                               axis=2)[:, :, 0]
  state = draft.truncate(state, per_beam(t + 1, k))
  return jax.nn.log_softmax(logits.astype(jnp.float32)), state


def _ancestors(parents: Array) -> Array:
  """[B, γ, u] parents (depth d's beams index depth d-1's) -> [B, N, γ]:
  node n's ancestor (its beam index) at each depth, -1 below its depth."""
  batch, gamma, width = parents.shape
  per_depth = []
  for depth in range(gamma):
    current = jnp.broadcast_to(jnp.arange(width), (batch, width))
    chain = [current]
    for above in range(depth, 0, -1):
      current = jnp.take_along_axis(parents[:, above], current, axis=1)
      chain.append(current)
    chain = chain[::-1] + [jnp.full_like(current, -1)] * (gamma - depth - 1)
    per_depth.append(jnp.stack(chain, axis=2))
  return jnp.concatenate(per_depth, axis=1)


def _leaf_priority(parents: Array) -> Array:
  """[B, γ, u] parents -> [B, N] int32 priority of each node as a row.

  A step of the target is replayed only when all its live beams were
  scored, i.e. (for a good draft) all draft beams of that depth. So rows
  cover whole depths in order: each node is represented by its deepest,
  best leaf, and a leaf ranks by the shallowest depth it represents, then
  by its own depth and rank. Inner nodes (prefixes of some leaf) get -1.
  """
  batch, gamma, width = parents.shape
  beam = jnp.arange(width)
  extended = jnp.any(parents[:, 1:, None, :] == beam[None, None, :, None],
                     axis=3)  # [B, γ-1, u]: some deeper beam extends it.
  deepest = jnp.ones((batch, 1, width), bool)
  leaf = jnp.concatenate([~extended, deepest],
                         axis=1).reshape(batch, gamma * width)
  own = (jnp.arange(gamma)[:, None] + 1) * width + (width - 1 - beam)
  own = jnp.where(leaf, own.reshape(-1)[None], -1)
  ancestors = _ancestors(parents)
  level = jnp.full(own.shape, gamma + 1)
  for depth in range(gamma):
    below = ancestors[:, None, :, depth] == beam[None, :, None]  # [B, u, N]
    representative = jnp.argmax(jnp.where(below, own[:, None], -1), axis=2)
    hit = jnp.any(jax.nn.one_hot(representative, own.shape[1], dtype=bool),
                  axis=1)
    level = jnp.where(hit & (level > gamma), depth + 1, level)
  levels = (gamma + 1) * width
  return jnp.where(leaf, (gamma + 1 - level) * levels + own, -1)


def run_draft(draft: Target, draft_state: Any, known: Array, beams: Beams, *,
              width: int, gamma: int, eos_id: Array) -> Tuple[DraftTree, Any]:
  """The draft's beam search of width u for γ steps from the live beams.

  Returns:
    (the tree of its beams, the live beams' draft state: B*k rows holding
    positions 0..step).
  """
  batch, k, _ = beams.live_seqs.shape
  log_probs, root_state = _draft_roots(draft, draft_state, known, beams, gamma)
  # Width u: the k live beams, then fillers that no real candidate loses to.
  roots = jnp.broadcast_to(
      jnp.concatenate([jnp.arange(k),
                       jnp.zeros((width - k,), jnp.int32)]), (batch, width))
  scores = jnp.concatenate([
      beams.live_logprobs,
      jnp.full((batch, width - k), beam_search.NEG_INF, jnp.float32)
  ], axis=1)
  log_probs = jnp.take_along_axis(log_probs, roots[:, :, None], axis=1)
  tree_tokens = jnp.zeros((batch, gamma, width, gamma), jnp.int32)
  tree_roots = jnp.zeros((batch, gamma, width), jnp.int32)
  tree_parents = jnp.zeros((batch, gamma, width), jnp.int32)
  history = jnp.zeros((batch, width, gamma), jnp.int32)
  state = gather_rows(root_state, beam_rows(roots, k))
  carry = (scores, roots, history, state, tree_tokens, tree_roots, tree_parents)

  def step(depth, log_probs, carry):
    """Select depth's beams and record them in the tree."""
    scores, roots, history, state, tree_tokens, tree_roots, tree_parents = (
        carry)
    scores, parents, tokens = _draft_select(log_probs, scores, eos_id)
    roots = jnp.take_along_axis(roots, parents, axis=1)
    history = jnp.take_along_axis(history, parents[:, :, None], axis=1)
    history = lax.dynamic_update_slice_in_dim(history, tokens[:, :, None],
                                              depth, axis=2)
    state = gather_rows(state, beam_rows(parents, width))
    tree_tokens = tree_tokens.at[:, depth].set(history)
    tree_roots = tree_roots.at[:, depth].set(roots)
    tree_parents = tree_parents.at[:, depth].set(parents)
    return scores, roots, history, state, tree_tokens, tree_roots, tree_parents

  def body(depth, carry):
    """Feed each beam's last draft token, then select the next depth."""
    history, state = carry[2], carry[3]
    last = lax.dynamic_index_in_dim(history, depth - 1, axis=2, keepdims=False)
    logits, state = draft.decode_chunk(last.reshape(-1, 1), state)
    log_probs = jax.nn.log_softmax(
        logits.reshape(batch, width, -1).astype(jnp.float32))
    return step(depth, log_probs, carry[:3] + (state,) + carry[4:])

  carry = step(0, log_probs, carry)
  carry = lax.fori_loop(1, gamma, body, carry)
  tree_tokens, tree_roots, tree_parents = carry[4:]
  nodes = gamma * width
  depth = jnp.repeat(jnp.arange(1, gamma + 1), width)
  tree = DraftTree(tokens=tree_tokens.reshape(batch, nodes, gamma),
                   roots=tree_roots.reshape(batch, nodes),
                   depth=jnp.broadcast_to(depth, (batch, nodes)),
                   priority=_leaf_priority(tree_parents))
  return tree, root_state


def candidate_rows(tree: DraftTree, k: int,
                   num_rows: int) -> Tuple[Array, Array, Array]:
  """The rows the target scores: every live beam is the parent of one.

  The pool: the tree's N nodes, and the k live beams alone (no draft token,
  lowest priority). Rows 0..k-1: for live beam i, its best pool entry;
  rows k..R-1: the best entries left (`_leaf_priority`).

  Returns:
    (parent [B, R] int32 in [0, k), tokens [B, R, γ] int32, depth [B, R]
    int32: the deepest offset whose logits the row's tokens make valid).
  """
  batch, _, gamma = tree.tokens.shape
  roots = jnp.broadcast_to(jnp.arange(k), (batch, k))
  pool_roots = jnp.concatenate([tree.roots, roots], axis=1)
  pool_tokens = jnp.concatenate(
      [tree.tokens, jnp.zeros((batch, k, gamma), jnp.int32)], axis=1)
  pool_depth = jnp.concatenate([tree.depth, jnp.zeros_like(roots)], axis=1)
  priority = jnp.concatenate([tree.priority, jnp.full_like(roots, -2)], axis=1)
  order = jnp.argsort(-priority, axis=1, stable=True)
  sorted_roots = jnp.take_along_axis(pool_roots, order, axis=1)
  # Position in `order` of each live beam's best entry (one always exists).
  first = jnp.argmax(sorted_roots[:, None, :] == roots[:, :, None], axis=2)
  taken = jnp.any(jax.nn.one_hot(first, order.shape[1], dtype=bool), axis=1)
  rest = jnp.argsort(taken, axis=1, stable=True)[:, :num_rows - k]
  entry = jnp.take_along_axis(order, jnp.concatenate([first, rest], axis=1),
                              axis=1)
  return (jnp.take_along_axis(pool_roots, entry, axis=1),
          jnp.take_along_axis(pool_tokens, entry[:, :, None], axis=1),
          jnp.take_along_axis(pool_depth, entry, axis=1))
