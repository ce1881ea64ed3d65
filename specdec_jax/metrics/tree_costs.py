"""What an ACCEPTANCE='tree' run's calls cost: the target's tree call over
1 + k·γ nodes and one depth of the k-branch draft, timed as `step_costs`
times a token-verification run's calls (`timing.call_seconds`).

`timing` times anything with `start` and `decode_chunk` (a target call) or
`propose` and `rollback` (a drafter); `TreeCall` and `TreeProposer` give the
tree loop's two calls those shapes, so that they are timed the one way the
project defines, interleaved with the one-token target step.
"""
from typing import Any, Dict, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import multihost
from specdec_jax.core import decoding
from specdec_jax.metrics import timing
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.core.drafters import tree as tree_drafters
from specdec_jax.core.protocols import target_encoder_output
from specdec_jax.metrics import step_costs


@flax.struct.dataclass
class TreeCall:
  """The tree loop's target call as a k-token call (`timing.call_loop`):
  `decode_chunk(tokens [B, 1 + k·γ], cache)` scores them as the loop's
  chain tree (`tree_acceptance.chain_parents`).

  Attributes:
    target: a `protocols.TreeTarget`.
    parents: the tree's 1 + k·γ parent indices (static).
  """
  target: Any
  parents: Tuple[int, ...] = flax.struct.field(pytree_node=False)

  def start(self, encoder_input_tokens, max_len):
    return self.target.start(encoder_input_tokens, max_len)

  def decode_chunk(self, tokens, cache):
    return self.target.decode_tree(tokens, jnp.asarray(self.parents, jnp.int32),
                                   cache)


@flax.struct.dataclass
class TreeProposer:
  """The tree loop's drafting as a `propose` of γ guesses
  (`timing.propose_loop`): one `propose_tree` of k branches, then the
  `rollback_tree` to one branch the loop makes after each call.

  Attributes:
    drafter: a tree drafter (`drafters.as_tree_drafter`), or one given
      the target's features (`step_costs.FeaturesGiven`).
    width: k (static).
  """
  drafter: Any
  width: int = flax.struct.field(pytree_node=False)

  def init(self, encoder_input_tokens, max_len, encoder_output=None):
    return self.drafter.init(encoder_input_tokens, max_len, encoder_output)

  def rollback(self, state, length):
    return self.drafter.rollback(state, length)

  def propose(self, state, buffer, length, rng, *, gamma, method):
    """(state, tokens [B, k·γ], probs [B, k·γ, V] or None)."""
    tree_state, tokens, probs = self.drafter.propose_tree(
        state, buffer, length, rng, gamma=gamma, width=self.width,
        method=method)
    batch = tokens.shape[0]
    state = self.drafter.rollback_tree(tree_state, length + gamma,
                                       jnp.zeros((batch,), jnp.int32))
    if probs is not None:
      probs = probs.reshape(batch, -1, probs.shape[-1])
    return state, tokens.reshape(batch, -1), probs


def price_tree_calls(
    args: Any, drafter, target, batch: jax.Array, fill: int, context: jax.Array,
    pricing: step_costs.Pricing = step_costs.PRICING
) -> Tuple[float, float, float]:
  """(one-token target step, one depth of the k-branch draft, the tree call
  over 1 + k·γ nodes), in seconds, interleaved (`timing.call_seconds`).

  As `step_costs.price_calls`, with the tree loop's caches (the target's
  max_decode_length + 1 + k·γ slots, the draft's max_decode_length + γ + 1)
  filled to `fill`; the draft's seconds are one `propose_tree` of k
  branches of γ guesses (and its rollback to one branch), divided by γ.

  Args:
    args: the run's arguments (ACCEPTANCE='tree': γ, TREE_WIDTH, ...).
    drafter: the run's drafter (a draft model or `ModelDrafter`).
    target: the target model (a `protocols.TreeTarget`).
    batch: [B, S] the encoder inputs.
    fill: the mean output length (clipped to the caches).
    context: [B, T] the target's own output for `batch`.
    pricing: the clock and its sizes (`step_costs.Pricing`).
  """
  gamma, width = int(args.gamma), int(args.tree_width)
  nodes = 1 + width * gamma
  cache_len = args.max_decode_length + nodes
  draft_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), args.max_decode_length - 1)
  inputs = jnp.asarray(multihost.to_host(batch), jnp.int32)
  tree_drafter = tree_drafters.as_tree_drafter(drafter,
                                               args.tree_without_replacement)
  buffer = jnp.asarray(
      np.pad(np.asarray(multihost.to_host(context)), ((0, 0), (1, gamma + 2))),
      jnp.int32)
  # A feature-level draft: the tree call on the target keeping its hidden
  # states, the draft given them over the context (`step_costs`).
  verifier = decoding.speculative_target(target, drafter)
  if tree_drafter.reads_target_features:
    tree_drafter = step_costs.FeaturesGiven(
        tree_drafter,
        step_costs.context_features(verifier, inputs, buffer[:, :fill + 2],
                                    cache_len))
  proposer = TreeProposer(tree_drafter, width)
  state = jax.jit(lambda d, x, e: d.init(x, draft_len, e))(
      proposer, inputs,
      target_encoder_output(target,
                            timing.start(target, inputs, max_len=cache_len)))
  parents = tuple(int(p) for p in tree_acceptance.chain_parents(width, gamma))
  seconds = pricing(
      {
          "step": (target, 1),
          "tree": (TreeCall(verifier, parents), nodes),
          "draft":
              (timing.Proposer(proposer, state, buffer, args.method()), gamma),
      }, np.asarray(inputs), fill=fill, cache_len=cache_len)
  return seconds["step"], seconds["draft"] / gamma, seconds["tree"]


def price_tree_shapes(
    args: Any, drafter, target, batch: jax.Array, fill: int, context: jax.Array,
    *, gamma: int, widths: Sequence[int], nodes: Sequence[int],
    pricing: step_costs.Pricing = step_costs.PRICING) -> Dict[str, Any]:
  """What GAMMA='auto' / TREE_WIDTH='auto' price (`auto_tree`): one target
  step, the tree call over each N in `nodes` and one depth of the k-branch
  draft for each k in `widths`, in seconds, interleaved
  (`timing.call_seconds`, the one-token step the reference).

  The tree call's cost depends on its N nodes, not on its shape (every
  node is a decoder position); each N is timed as one chain of N - 1
  guesses. Caches as `price_tree_calls`: the target's max_decode_length +
  max(nodes) slots, the draft's max_decode_length + γ + 1, filled to `fill`.

  Args:
    args: the run's arguments (its sampling method; TREE_WITHOUT_REPLACEMENT).
    drafter, target, batch, fill, context: as `price_tree_calls`.
    gamma: the guesses per branch the draft is priced at.
    widths: the k to price the draft at.
    nodes: the N to price the tree call at (1: the step itself).
    pricing: the clock and its sizes (`step_costs.Pricing`).

  Returns:
    {'step': seconds, 'tree': {N: seconds}, 'draft_depth': {k: seconds of
    one depth of k branches}}.
  """
  cache_len = args.max_decode_length + max(nodes)
  draft_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), args.max_decode_length - 1)
  inputs = jnp.asarray(multihost.to_host(batch), jnp.int32)
  encoder_output = target_encoder_output(
      target, timing.start(target, inputs, max_len=cache_len))
  buffer = jnp.asarray(
      np.pad(np.asarray(multihost.to_host(context)), ((0, 0), (1, gamma + 2))),
      jnp.int32)
  calls: Dict[str, Any] = {"step": (target, 1)}
  for n in sorted(set(nodes) - {1}):
    parents = tuple(int(p) for p in tree_acceptance.chain_parents(1, n - 1))
    calls[f"tree_{n}"] = (TreeCall(target, parents), n)
  for k in widths:
    proposer = TreeProposer(
        tree_drafters.as_tree_drafter(drafter, args.tree_without_replacement),
        int(k))
    state = jax.jit(lambda d, x, e: d.init(x, draft_len, e))(proposer, inputs,
                                                             encoder_output)
    calls[f"draft_{k}"] = (timing.Proposer(proposer, state, buffer,
                                           args.method()), gamma)
  seconds = pricing(calls, np.asarray(inputs), fill=fill, cache_len=cache_len)
  tree = {n: seconds.get(f"tree_{n}", seconds["step"]) for n in nodes}
  return {
      "step": seconds["step"],
      "tree": tree,
      "draft_depth": {
          k: seconds[f"draft_{k}"] / gamma for k in widths
      },
  }
