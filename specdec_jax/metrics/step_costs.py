"""What a run's calls cost, timed the one way `timing` defines: the
target's k-token (or tree) calls and one guess of the drafter as the loop
makes it; c (Definition 3.7) and the call cost in target steps come from
here.
"""
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import multihost
from specdec_jax.core import decoding
from specdec_jax.core import structs
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.core.drafters import tree as tree_drafters
from specdec_jax.core.protocols import Drafter
from specdec_jax.core.protocols import target_encoder_output
from specdec_jax.metrics import timing

# Calls per timed program and rounds: ~1/4 of `timing`'s defaults, so that
# pricing costs a run seconds (the ratios are medians of per-round ratios).
STEPS, REPEATS = 32, 5


@dataclasses.dataclass(frozen=True)
class Pricing:
  """How a run prices its calls (`plan.Providers.pricing`; tests hand in
  stand-in seconds): `timing.call_seconds`' signature, steps and repeats."""
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
  """({k: seconds of the target's k-token call, k = 1 always}, seconds of
  one guess), timed on `batch` [B, S] with the loop's cache filled to
  `fill`; a guess as the loop makes it, one `propose` of γ (draft_gamma, or
  max(target_ks) - 1) guesses on `context` [B, T], rolled back, over γ (a
  drafter reading the target's hidden states is given them)."""
  gamma = max(target_ks) - 1 if draft_gamma is None else int(draft_gamma)
  if gamma < 1 or max(target_ks) > gamma + 1:
    raise ValueError(f"draft_gamma={draft_gamma} with target_ks={target_ks}: "
                     "allowed: γ >= 1 guesses and K <= γ + 1.")
  cache_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), cache_len - gamma - 1)
  inputs = jnp.asarray(multihost.to_host(batch), jnp.int32)
  drafter = decoding.as_drafter(drafter)
  state = _init(drafter, inputs, cache_len, _encoded(target, inputs, cache_len))
  buffer = _context_buffer(context, gamma)
  # A step (k = 1) is the baseline's, on the plain target.
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


def _encoded(target: Any, inputs: jax.Array, cache_len: int) -> Any:
  """The target's encoder output on `inputs`, for the drafter's init."""
  return target_encoder_output(target,
                               timing.start(target, inputs, max_len=cache_len))


def _init(drafter: Any, inputs: jax.Array, max_len: int,
          encoder_output: Any) -> Any:
  """`drafter.init`, jitted: op by op a draft model's encoder takes seconds
  to start."""
  return jax.jit(lambda d, x, e: d.init(x, max_len, e))(drafter, inputs,
                                                        encoder_output)


def _context_buffer(context: jax.Array, gamma: int) -> jax.Array:
  """[B, 1 + T + γ + 2] int32: a start slot (0), `context` [B, T] (the
  target's own output), then room for the γ + 2 tokens a call writes."""
  return jnp.asarray(
      np.pad(np.asarray(multihost.to_host(context)), ((0, 0), (1, gamma + 2))),
      jnp.int32)


def _given_features(proposing: Any, verifier: Any, inputs: jax.Array,
                    tokens: jax.Array, cache_len: int) -> Any:
  """`proposing` (a drafter or tree drafter), given the verifier's hidden
  states over `tokens` [B, n] when it reads them (`FeaturesGiven`)."""
  if not proposing.reads_target_features:
    return proposing
  return FeaturesGiven(proposing,
                       context_features(verifier, inputs, tokens, cache_len))


def context_features(target: Any, inputs: jax.Array, tokens: jax.Array,
                     cache_len: int) -> jax.Array:
  """[B, cache_len, F] hidden states of `target` (`with_features()`) after
  it is fed `tokens` [B, n] (start token first) on `inputs` [B, S]."""

  @jax.jit
  def fed(target, inputs, tokens):
    state = target.start(inputs, cache_len)
    return target.features(target.decode_chunk(tokens, state)[1])

  return fed(target, inputs, tokens)


@structs.dataclass
class FeaturesGiven(Drafter):
  """For pricing: a drafter reading the target's hidden states, given fixed
  `features` [B, max_len, F] as the loop gives them (that read untimed)."""
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
    return self.drafter.propose_tree(state, buffer, length, rng, gamma=gamma,
                                     width=width, method=method,
                                     target_features=self.features)

  def rollback_tree(self, state, length, branch):
    return self.drafter.rollback_tree(state, length, branch)


# -- Tree costs ----------------------------------------------------------------
# `TreeCall` and `TreeProposer` give the tree loop's two calls the shapes
# `timing` times (a k-token call, a `propose`).
@structs.dataclass
class TreeCall:
  """The tree loop's target call (a `protocols.TreeTarget`) as a k-token
  call: `decode_chunk` scores tokens [B, N] as the tree of `parents`."""
  target: Any
  parents: Tuple[int, ...] = structs.field(pytree_node=False)

  def start(self, encoder_input_tokens, max_len):
    return self.target.start(encoder_input_tokens, max_len)

  def decode_chunk(self, tokens, cache):
    return self.target.decode_tree(tokens, jnp.asarray(self.parents, jnp.int32),
                                   cache)


@structs.dataclass
class TreeProposer:
  """The tree loop's drafting as a `propose`: one `propose_tree` of `width`
  branches of a tree drafter, then its `rollback_tree` to one branch."""
  drafter: Any
  width: int = structs.field(pytree_node=False)

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
  """(target step, one depth of the k-branch draft, the tree call over
  1 + k·γ nodes) in seconds, as `price_calls` with the tree loop's caches;
  `args.decode_mode` is a `decode_modes.TreeMode`."""
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
  verifier = decoding.speculative_target(target, drafter)
  tree_drafter = _given_features(tree_drafter, verifier, inputs,
                                 buffer[:, :fill + 2], cache_len)
  proposer = TreeProposer(tree_drafter, width)
  state = _init(proposer, inputs, draft_len, _encoded(target, inputs,
                                                      cache_len))
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
  """What 'auto' prices for trees, as `price_tree_calls`: {'step', 'tree':
  {N in `nodes`: a call over N nodes, timed as a chain (a cost of N, not of
  the shape)}, 'draft_depth': {k in `widths`: one depth of k branches}}."""
  cache_len = args.max_decode_length + max(nodes)
  draft_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), args.max_decode_length - 1)
  inputs = jnp.asarray(multihost.to_host(batch), jnp.int32)
  encoder_output = _encoded(target, inputs, cache_len)
  buffer = _context_buffer(context, gamma)
  calls: Dict[str, Any] = {"step": (target, 1)}
  for n in sorted(set(nodes) - {1}):
    parents = tuple(int(p) for p in tree_acceptance.chain_parents(1, n - 1))
    calls[f"tree_{n}"] = (TreeCall(target, parents), n)
  for k in widths:
    proposer = TreeProposer(
        tree_drafters.as_tree_drafter(drafter, without_replacement), int(k))
    state = _init(proposer, inputs, draft_len, encoder_output)
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
