"""Exact multi-draft (tree) verification: SpecInfer's multi-step rule.

The draft proposes k branches of γ guesses per row (`drafters.tree`); the
target scores them all in one call (`protocols.TreeTarget.decode_tree`) over
the chain tree of `chain_parents`: node 0 is the last known token (the
root), node 1 + j·γ + (d-1) is branch j's guess at depth d. The rule walks
the tree depth by depth. At depth d the candidates are the branches that
still carry the accepted prefix (all k at depth 1); with r := p_d (the
target's distribution after the prefix), each candidate j in turn has its
token x_j kept when u_j·q_j(x_j) < r(x_j) (u_j ~ U[0, 1)), and after a
rejection r := norm(max(0, r - q_j)). The first kept token extends the
prefix and the branches carrying it are the next depth's candidates; if none
is kept the row stops and the next token is drawn from the last r. After γ
kept tokens the next token is drawn from p_{γ+1} at the accepted leaf.

Exactness (SpecInfer, Miao et al. 2024, Thm. 4.2; proof sketch in
docs/design/beyond_the_paper.md): given the prefix, the candidates' tokens
are m i.i.d. draws from q(· | prefix) (each branch is drawn independently,
and which branches survive depends only on earlier depths), and for any
m >= 0 the kept-or-residual token above is distributed exactly as p. By
induction over depths every emitted token follows the target given its
prefix. With k = 1 this is Algorithm 1, draw for draw (`TreeAcceptance`
on [B, γ] guesses returns `ExactAcceptance`'s verdict).

Drawing the k first guesses without replacement (distinct tokens, in the
order drawn; Jeon et al. 2024, recursive rejection sampling) keeps the rule
exact when candidate j is tested against q_j, q_1 without the earlier
candidates' tokens renormalized, and the residual is norm(max(0, r - q_j)):
the same induction holds for any q_j a candidate is drawn from. After
depth 1 a single branch carries the prefix, so the deeper depths are
Algorithm 1. No duplicate first tokens: more distinct paths per call.

Greedy (p one-hot at the argmax a): a candidate is kept iff its token is a,
and the residual stays one-hot at a; the rule keeps the longest branch prefix
that matches the target's argmaxes and emits the next argmax (no [.., V]
probabilities are built).
"""
from typing import NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.protocols import Verdict

Array = jax.Array


def chain_parents(width: int, gamma: int) -> np.ndarray:
  """[1 + k·γ] int32 parents of the chain tree: a root and k branches of γ."""
  parents = [-1]
  for _ in range(width):
    parents += [0] + list(range(len(parents), len(parents) + gamma - 1))
  return np.asarray(parents, np.int32)


def path_nodes(width: int, gamma: int) -> np.ndarray:
  """[k, γ+1] int32: node of branch j at depth d (depth 0 is the root)."""
  depth = np.arange(gamma + 1)[None, :]
  branch = np.arange(width)[:, None]
  return np.where(depth == 0, 0,
                  1 + branch * gamma + depth - 1).astype(np.int32)


class TreeVerdict(NamedTuple):
  """What tree verification decided (B rows).

  Attributes:
    num_accepted: [B] int32 n in [0, γ]: guesses kept along the path.
    next_token: [B] int32 the token emitted after them.
    branch: [B] int32 a branch whose first n guesses are the kept ones (its
      nodes 0..n are the path the target keeps: `path_nodes`).
  """
  num_accepted: Array
  next_token: Array
  branch: Array


def first_round(draft_tokens: Array, verdict: TreeVerdict) -> Array:
  """[B] int32: the branch whose guess the first depth accepted, in the
  order the rule tests them, or k where no guess was kept.

  It is the first branch carrying the kept path's first guess: a guess the
  rule rejects has no residual mass left, so a later copy of it is never
  kept. The rule tests branch j only after branches 0..j-1, each drawn as
  in a tree of j + 1 branches, so a row kept a guess with k' < k branches
  exactly when this is below k' (`auto` prices every narrower tree from
  one pilot with k branches).

  Args:
    draft_tokens: [B, k, γ] the branches' guesses.
    verdict: the rule's `TreeVerdict` for them.
  """
  batch, width = draft_tokens.shape[:2]
  kept_first = draft_tokens[jnp.arange(batch), verdict.branch, 0]
  first = jnp.argmax(draft_tokens[:, :, 0] == kept_first[:, None], axis=1)
  return jnp.where(verdict.num_accepted > 0, first, width).astype(jnp.int32)


def _residual(r: Array, q: Union[Array, float]) -> Array:
  """norm(max(0, r - q)) over [B, V]; r itself where no mass is left (the
  rejection then had probability 0: rounding only)."""
  res = jnp.maximum(r - q, 0.0)
  mass = jnp.sum(res, axis=-1, keepdims=True)
  return jnp.where(mass > 0, res / jnp.where(mass > 0, mass, 1.0), r)


def _depth(u, r, tokens, probs, alive, without_replacement=False):
  """One depth of the multi-step rule for every row.

  Args:
    u: [B, k] uniforms; r: [B, V] p after the prefix; tokens: [B, k] the
    branches' guesses; probs: [B, k, V] their q; alive: [B, k] candidates;
    without_replacement: the tokens were drawn without replacement from q
    (static): candidate j's q is then q without the earlier candidates'
    tokens, renormalized, and a token of q-mass 0 is no candidate.

  Returns:
    (found [B] bool, token [B] the kept one (-1 if none), r [B, V]: the
    residual after the rejections).
  """
  rows = jnp.arange(r.shape[0])
  found = jnp.zeros(r.shape[:1], bool)
  token = jnp.full(r.shape[:1], -1, jnp.int32)
  for j in range(tokens.shape[1]):  # k is small and static.
    # A NO_GUESS slot (negative; single-path use) is never a candidate.
    x, q = jnp.maximum(tokens[:, j], 0), probs[:, j]
    candidate = alive[:, j] & ~found & (tokens[:, j] >= 0)
    if without_replacement:
      q = _without(q, tokens[:, :j])
      candidate = candidate & (q[rows, x] > 0)
    # u·q(x) < r(x) without dividing: p >= q always keeps, q = 0 never NaN.
    kept = candidate & (u[:, j] * q[rows, x] < r[rows, x])
    token = jnp.where(kept, x, token)
    found = found | kept
    r = jnp.where((candidate & ~kept)[:, None], _residual(r, q), r)
  return found, token, r


def _without(q: Array, drawn: Array) -> Array:
  """q [B, V] with the tokens drawn [B, m] removed, renormalized (zeros
  when nothing is left)."""
  rest = jnp.where(
      jnp.any(
          jnp.arange(q.shape[-1])[None, None, :] == drawn[..., None], axis=1),
      0.0, q)
  mass = jnp.sum(rest, axis=-1, keepdims=True)
  return jnp.where(mass > 0, rest / jnp.where(mass > 0, mass, 1.0), 0.0)


def tree_accept(
    rng: Array, target_probs: Array, draft_probs: Array, draft_tokens: Array,
    first_without_replacement: bool = False) -> Tuple[Array, Array, Array]:
  """The multi-step rule over the chain tree (module doc).

  Args:
    rng: PRNG key.
    target_probs: [B, 1 + k·γ, V] p after each node (`chain_parents` order).
    draft_probs: [B, k, γ, V] q of each guess given its branch's prefix.
    draft_tokens: [B, k, γ] int32 guesses.
    first_without_replacement: the k first guesses were drawn without
      replacement from q_1 (static; module doc).

  Returns:
    (num_accepted [B], next_token [B], branch [B]) as in `TreeVerdict`.
  """
  batch, width, gamma = draft_tokens.shape
  rows = jnp.arange(batch)
  path_probs = target_probs[:, path_nodes(width, gamma)]  # [B, k, γ+1, V]
  accept_rng, residual_rng = jax.random.split(rng)
  # [B, γ, k]: with k = 1 the same numbers as Algorithm 1's [B, γ].
  u = jax.random.uniform(accept_rng, (batch, gamma, width))
  alive = jnp.ones((batch, width), bool)
  going = jnp.ones((batch,), bool)
  num_accepted = jnp.zeros((batch,), jnp.int32)
  final = jnp.zeros_like(target_probs[:, 0])
  for d in range(gamma):
    r = path_probs[rows, jnp.argmax(alive, axis=1), d]
    found, token, r = _depth(u[:, d], r, draft_tokens[:, :,
                                                      d], draft_probs[:, :, d],
                             alive, first_without_replacement and d == 0)
    final = jnp.where((going & ~found)[:, None], r, final)
    extend = going & found
    num_accepted = num_accepted + extend.astype(jnp.int32)
    alive = jnp.where(extend[:, None],
                      alive & (draft_tokens[:, :, d] == token[:, None]), alive)
    going = extend
  branch = jnp.argmax(alive, axis=1).astype(jnp.int32)
  # All γ kept: the bonus token from p_{γ+1} (q := 0, as Algorithm 1).
  leaf = _residual(path_probs[rows, branch, gamma], 0.0)
  final = jnp.where(going[:, None], leaf, final)
  return num_accepted, sampling.sample_from(residual_rng, final), branch


def greedy_tree_accept(target_tokens: Array,
                       draft_tokens: Array) -> Tuple[Array, Array, Array]:
  """The rule with one-hot p: the longest branch prefix equal to the
  target's argmaxes, then the next argmax.

  Args:
    target_tokens: [B, 1 + k·γ] int32 argmax after each node.
    draft_tokens: [B, k, γ] int32 guesses.

  Returns:
    (num_accepted [B], next_token [B], branch [B]) as in `TreeVerdict`.
  """
  batch, width, gamma = draft_tokens.shape
  rows = jnp.arange(batch)
  path_tokens = target_tokens[:, path_nodes(width, gamma)]  # [B, k, γ+1]
  alive = jnp.ones((batch, width), bool)
  going = jnp.ones((batch,), bool)
  num_accepted = jnp.zeros((batch,), jnp.int32)
  for d in range(gamma):
    want = path_tokens[rows, jnp.argmax(alive, axis=1), d]
    match = alive & (draft_tokens[:, :, d] == want[:, None])
    extend = going & jnp.any(match, axis=1)
    num_accepted = num_accepted + extend.astype(jnp.int32)
    alive = jnp.where(extend[:, None], match, alive)
    going = extend
  branch = jnp.argmax(alive, axis=1).astype(jnp.int32)
  return num_accepted, path_tokens[rows, branch, num_accepted], branch


@structs.dataclass
class TreeAcceptance(AcceptanceRule):
  """Exact multi-draft verification (module doc).

  Called with a tree, draft_tokens [B, k, γ], draft_probs [B, k, γ, V] or
  None (one-hot q) and target_logits [B, 1 + k·γ, V] over
  `chain_parents(k, γ)`, it returns a `TreeVerdict`. Called as any
  `AcceptanceRule` (draft_tokens [B, γ], logits [B, γ+1, V]: the chain of
  one branch) it returns Algorithm 1's `Verdict`.

  Attributes:
    first_without_replacement: the drafter drew the k first guesses without
      replacement from q_1 (`TreeModelDrafter.first_without_replacement`,
      which must agree): they are then tested with recursive rejection
      sampling (module doc). Static.
  """
  first_without_replacement: bool = structs.field(pytree_node=False,
                                                  default=False)

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    if draft_tokens.ndim == 2:
      return self._single_path(rng, target_logits, draft_tokens, draft_probs,
                               method)
    if method.is_greedy:
      target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
      return TreeVerdict(*greedy_tree_accept(target_tokens, draft_tokens))
    target_probs = method.standardize(target_logits)
    if draft_probs is None:  # Deterministic guesses: one-hot q.
      draft_probs = jax.nn.one_hot(draft_tokens, target_probs.shape[-1],
                                   dtype=target_probs.dtype)
    return TreeVerdict(
        *tree_accept(rng, target_probs, draft_probs, draft_tokens,
                     self.first_without_replacement))

  def _single_path(self, rng, target_logits, draft_tokens,
                   draft_probs: Optional[Array], method) -> Verdict:
    """k = 1 through the tree rule, returned as Algorithm 1's `Verdict`."""
    verdict = self(rng, target_logits, draft_tokens[:, None],
                   None if draft_probs is None else draft_probs[:,
                                                                None], method)
    if method.is_greedy:
      tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
      return Verdict(verdict.num_accepted, verdict.next_token, None, tokens)
    return Verdict(verdict.num_accepted, verdict.next_token,
                   method.standardize(target_logits), None)
