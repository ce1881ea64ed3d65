"""What a run's calls cost: the target's k-token calls and one guess of
the drafter as the loop makes it, timed the one way `timing` defines. c of
Definition 3.7 and the verification call's cost in target steps come from
here.
"""
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import multihost
from specdec_jax.core import decoding
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.core.drafters import tree as tree_drafters
from specdec_jax.core.protocols import Drafter
from specdec_jax.core.protocols import target_encoder_output
from specdec_jax.metrics import timing

# Calls per timed program and interleaved rounds: ~1/4 of `timing`'s
# defaults, so that pricing c costs a run seconds, not tens of seconds; the
# ratios are medians of per-round ratios all the same.
STEPS, REPEATS = 32, 5


@dataclasses.dataclass(frozen=True)
class Pricing:
  """How a run prices its calls: the clock and its sizes (a run takes it
  from `plan.Providers.pricing`; tests hand in stand-in seconds).

  Attributes:
    call_seconds: (calls, encoder_input_tokens, *, fill, cache_len, steps,
      repeats) -> {name: seconds of one call} (`timing.call_seconds`).
    steps, repeats: calls per timed program, timed rounds.
  """
  call_seconds: Callable[..., Dict[Any, float]] = timing.call_seconds
  steps: int = STEPS
  repeats: int = REPEATS

  def __call__(self, calls: Mapping[Any, Tuple[Any, int]], inputs: Any, *,
               fill: int, cache_len: int) -> Dict[Any, float]:
    """`call_seconds` of `calls` at this pricing's steps and repeats."""
    return self.call_seconds(calls, inputs, fill=fill, cache_len=cache_len,
                             steps=self.steps, repeats=self.repeats)


PRICING = Pricing()


def price_calls(
    args: Any, drafter, target, batch: jax.Array, target_ks: Tuple[int, ...],
    fill: int, context: jax.Array, pricing: Pricing = PRICING,
    draft_gamma: Optional[int] = None) -> Tuple[Dict[int, float], float]:
  """The target's k-token calls and one guess of the drafter, in seconds.

  Timed the one way `timing.call_seconds` defines, in interleaved rounds,
  on `batch`, with a cache of max_decode_length + max(target_ks) slots (the
  speculative loop's when max(target_ks) = γ+1) filled to `fill`. Every
  drafter, a draft model included, is priced as the loop runs it: one
  `propose` of γ = max(target_ks) - 1 guesses on a real context (rolled
  back each call, sampling and bookkeeping included), divided by γ — not a
  bare one-token draft call, which leaves out what a guess costs around it.

  Args:
    args: the run's arguments.
    drafter: the run's drafter.
    target: the target model (plain: the baseline's step; a drafter that
      reads the target's hidden states gets the verification calls timed
      on `target.with_features()`, as the loop runs them, and is given
      the target's features over `context`: `FeaturesGiven`).
    batch: [B, S] the encoder inputs.
    target_ks: the target's k values to time (1, a step, is always
      timed; γ+1: the call).
    fill: the mean output length (clipped to the cache).
    context: [B, T] the target's own output for `batch` (what the drafter
      reads: e.g. `plan.baseline(batch, rng).tokens`).
    pricing: the clock and its sizes (`Pricing`).
    draft_gamma: the γ of the timed `propose` (None: max(target_ks) - 1;
      given when the target's calls are known and only a step is timed
      beside the drafter: target_ks = (1,)).

  Returns:
    ({k: seconds of the target's k-token call}, seconds of one guess: c's
    numerator).
  """
  gamma = max(target_ks) - 1 if draft_gamma is None else int(draft_gamma)
  if gamma < 1 or max(target_ks) > gamma + 1:
    raise ValueError(f"draft_gamma={draft_gamma} with target_ks={target_ks}: "
                     "allowed: γ >= 1 guesses and K <= γ + 1.")
  cache_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), cache_len - gamma - 1)
  inputs = jnp.asarray(multihost.to_host(batch), jnp.int32)
  drafter = decoding.as_drafter(drafter)
  # Jitted: op by op, a draft model's encoder takes seconds to start.
  state = jax.jit(lambda d, x, e: d.init(x, cache_len, e))(
      drafter, inputs,
      target_encoder_output(target,
                            timing.start(target, inputs, max_len=cache_len)))
  buffer = _context_buffer(context, gamma)
  # The verification calls as the loop makes them: with the target's
  # features kept when the drafter reads them; a step (k = 1) is the
  # baseline's, the plain target's.
  verifier = decoding.speculative_target(target, drafter)
  drafter = _given_features(drafter, verifier, inputs, buffer[:, :fill + 2],
                            cache_len)
  proposer = timing.Proposer(drafter, state, buffer, args.method())
  # k = 1 first: the reference the others' ratios are taken to.
  calls: Dict[Any, Any] = {
      k: (target if k == 1 else verifier, k)
      for k in sorted(set(target_ks) | {1})
  }
  calls["draft"] = (proposer, gamma)
  seconds = dict(
      pricing(calls, np.asarray(inputs), fill=fill, cache_len=cache_len))
  return seconds, seconds.pop("draft") / gamma


def _context_buffer(context: jax.Array, gamma: int) -> jax.Array:
  """[B, 1 + T + γ + 2] int32: a start slot (0), `context` [B, T] (the
  target's own output), then room for the γ + 2 tokens a call writes."""
  return jnp.asarray(
      np.pad(np.asarray(multihost.to_host(context)), ((0, 0), (1, gamma + 2))),
      jnp.int32)


def _given_features(proposing: Any, verifier: Any, inputs: jax.Array,
                    tokens: jax.Array, cache_len: int) -> Any:
  """`proposing` (a drafter or tree drafter) as it is, or, when it reads the
  target's hidden states, given the verifier's over `tokens` [B, n]
  (`FeaturesGiven`), as the loop gives them from the target's state."""
  if not proposing.reads_target_features:
    return proposing
  return FeaturesGiven(proposing,
                       context_features(verifier, inputs, tokens, cache_len))


def context_features(target: Any, inputs: jax.Array, tokens: jax.Array,
                     cache_len: int) -> jax.Array:
  """[B, cache_len, F] the target's hidden states after it is fed `tokens`.

  Args:
    target: a target that keeps its features (`with_features()`).
    inputs: [B, S] the encoder inputs.
    tokens: [B, n] int32 the context, start token first (n <= cache_len):
      entries [:, :n] of the result are the target's own.
    cache_len: the cache's slots.
  """

  @jax.jit
  def fed(target, inputs, tokens):
    state = target.start(inputs, cache_len)
    return target.features(target.decode_chunk(tokens, state)[1])

  return fed(target, inputs, tokens)


@flax.struct.dataclass
class FeaturesGiven(Drafter):
  """A drafter that reads the target's hidden states, with them fixed.

  For pricing only (`timing.Proposer` calls `propose` as the loop calls
  every drafter): `propose` hands `features` [B, max_len, F], the target's
  hidden states over a real context (`context_features`), to the drafter
  as `target_features`, as the loop does from the target's state. The
  drafter's work is the same; the loop's read of the features is not
  timed (a slice of an array the target call already wrote).
  """
  drafter: Any
  features: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.drafter.vocab_size

  @property
  def may_stop_early(self) -> bool:
    return self.drafter.may_stop_early

  def init(self, encoder_input_tokens, max_len, encoder_output=None):
    return self.drafter.init(encoder_input_tokens, max_len, encoder_output)

  def propose(self, state, buffer, length, rng, *, gamma, method):
    return self.drafter.propose(state, buffer, length, rng, gamma=gamma,
                                method=method, target_features=self.features)

  def rollback(self, state, length):
    return self.drafter.rollback(state, length)

  def propose_tree(self, state, buffer, length, rng, *, gamma, width, method):
    """The tree drafter's `propose_tree`, given the features as well."""
    return self.drafter.propose_tree(state, buffer, length, rng, gamma=gamma,
                                     width=width, method=method,
                                     target_features=self.features)

  def rollback_tree(self, state, length, branch):
    return self.drafter.rollback_tree(state, length, branch)


# -- tree costs ----------------------------------------------------------------
# What an ACCEPTANCE='tree' run's calls cost: the target's tree call over
# 1 + k·γ nodes and one depth of the k-branch draft, timed as `price_calls`
# times a token-verification run's calls (`timing.call_seconds`).
#
# `timing` times anything with `start` and `decode_chunk` (a target call) or
# `propose` and `rollback` (a drafter); `TreeCall` and `TreeProposer` give the
# tree loop's two calls those shapes, so that they are timed the one way the
# project defines, interleaved with the one-token target step.
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
      the target's features (`FeaturesGiven`).
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


def price_tree_calls(args: Any, drafter, target, batch: jax.Array, fill: int,
                     context: jax.Array,
                     pricing: Pricing = PRICING) -> Tuple[float, float, float]:
  """(one-token target step, one depth of the k-branch draft, the tree call
  over 1 + k·γ nodes), in seconds, interleaved (`timing.call_seconds`).

  As `price_calls`, with the tree loop's caches (the target's
  max_decode_length + 1 + k·γ slots, the draft's max_decode_length + γ + 1)
  filled to `fill`; the draft's seconds are one `propose_tree` of k
  branches of γ guesses (and its rollback to one branch), divided by γ.

  Args:
    args: the run's arguments (γ, and its decode mode a tree's:
      `decode_modes.TreeMode`, its width and draws).
    drafter: the run's drafter (a draft model or `ModelDrafter`).
    target: the target model (a `protocols.TreeTarget`).
    batch: [B, S] the encoder inputs.
    fill: the mean output length (clipped to the caches).
    context: [B, T] the target's own output for `batch`.
    pricing: the clock and its sizes (`Pricing`).
  """
  tree = args.decode_mode
  gamma, width = int(args.gamma), int(tree.width)
  nodes = 1 + width * gamma
  cache_len = args.max_decode_length + nodes
  draft_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), args.max_decode_length - 1)
  inputs = jnp.asarray(multihost.to_host(batch), jnp.int32)
  tree_drafter = tree_drafters.as_tree_drafter(drafter,
                                               tree.without_replacement)
  buffer = _context_buffer(context, gamma)
  # A feature-level draft: the tree call on the target keeping its hidden
  # states, the draft given them over the context (`step_costs`).
  verifier = decoding.speculative_target(target, drafter)
  tree_drafter = _given_features(tree_drafter, verifier, inputs,
                                 buffer[:, :fill + 2], cache_len)
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


def price_tree_shapes(args: Any, drafter, target, batch: jax.Array, fill: int,
                      context: jax.Array, *, gamma: int, widths: Sequence[int],
                      nodes: Sequence[int], without_replacement: bool,
                      pricing: Pricing = PRICING) -> Dict[str, Any]:
  """What the 'auto' choices price for trees (`price_cache`): one target
  step, the tree call over each N in `nodes` and one depth of the k-branch
  draft for each k in `widths`, in seconds, interleaved
  (`timing.call_seconds`, the one-token step the reference).

  The tree call's cost depends on its N nodes, not on its shape (every
  node is a decoder position); each N is timed as one chain of N - 1
  guesses. Caches as `price_tree_calls`: the target's max_decode_length +
  max(nodes) slots, the draft's max_decode_length + γ + 1, filled to `fill`.

  Args:
    args: the run's arguments (its sampling method).
    drafter, target, batch, fill, context: as `price_tree_calls`.
    gamma: the guesses per branch the draft is priced at.
    widths: the k to price the draft at.
    nodes: the N to price the tree call at (1: the step itself).
    without_replacement: how the trees draw their first guesses
      (TREE_WITHOUT_REPLACEMENT).
    pricing: the clock and its sizes (`Pricing`).

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
  buffer = _context_buffer(context, gamma)
  calls: Dict[str, Any] = {"step": (target, 1)}
  for n in sorted(set(nodes) - {1}):
    parents = tuple(int(p) for p in tree_acceptance.chain_parents(1, n - 1))
    calls[f"tree_{n}"] = (TreeCall(target, parents), n)
  for k in widths:
    proposer = TreeProposer(
        tree_drafters.as_tree_drafter(drafter, without_replacement), int(k))
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
