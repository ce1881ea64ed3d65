"""What a run's calls cost: the target's k-token calls and one guess of
the drafter as the loop makes it, timed the one way `timing` defines. c of
Definition 3.7 and the verification call's cost in target steps come from
here.
"""
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax import multihost
from specdec_jax.metrics import timing
from specdec_jax.core.protocols import Drafter
from specdec_jax.core.protocols import target_encoder_output

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
  buffer = jnp.asarray(
      np.pad(np.asarray(multihost.to_host(context)), ((0, 0), (1, gamma + 2))),
      jnp.int32)
  # The verification calls as the loop makes them: with the target's
  # features kept when the drafter reads them; a step (k = 1) is the
  # baseline's, the plain target's.
  verifier = decoding.speculative_target(target, drafter)
  if drafter.reads_target_features:
    drafter = FeaturesGiven(
        drafter,
        context_features(verifier, inputs, buffer[:, :fill + 2], cache_len))
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
