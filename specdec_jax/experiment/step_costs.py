"""What a run's calls cost: the target's k-token calls and one guess of
the drafter as the loop makes it, timed the one way `timing` defines. c of
Definition 3.7 and the verification call's cost in target steps come from
here.
"""
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax import multihost
from specdec_jax import timing
from specdec_jax.experiment import arguments
from specdec_jax.core.protocols import target_encoder_output

# Calls per timed program and interleaved rounds: ~1/4 of `timing`'s
# defaults, so that pricing c costs a run seconds, not tens of seconds; the
# ratios are medians of per-round ratios all the same.
STEPS, REPEATS = 32, 5


def price_calls(args: arguments.RunArguments, drafter, target, batch: jax.Array,
                target_ks: Tuple[int, ...], fill: int,
                context: jax.Array) -> Tuple[Dict[int, float], float]:
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
    target: the target model.
    batch: [B, S] the encoder inputs.
    target_ks: the target's k values to time (1, a step, is always
      timed; γ+1: the call).
    fill: the mean output length (clipped to the cache).
    context: [B, T] the target's own output for `batch` (what the drafter
      reads: e.g. `plan.baseline(batch, rng).tokens`).

  Returns:
    ({k: seconds of the target's k-token call}, seconds of one guess: c's
    numerator).
  """
  gamma = max(target_ks) - 1
  cache_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), cache_len - gamma - 1)
  inputs = jnp.asarray(multihost.to_host(batch), jnp.int32)
  drafter = decoding.as_drafter(drafter)
  # Jitted: op by op, a draft model's encoder takes seconds to start.
  state = jax.jit(lambda d, x, e: d.init(x, cache_len, e))(
      drafter, inputs,
      target_encoder_output(target,
                            timing.start(target, inputs, max_len=cache_len)))
  buffer = np.pad(np.asarray(multihost.to_host(context)),
                  ((0, 0), (1, gamma + 2)))
  proposer = timing.Proposer(drafter, state, jnp.asarray(buffer, jnp.int32),
                             args.method())
  # k = 1 first: the reference the others' ratios are taken to.
  calls: Dict[Any, Any] = {k: (target, k) for k in sorted(set(target_ks) | {1})}
  calls["draft"] = (proposer, gamma)
  seconds = timing.call_seconds(calls, np.asarray(inputs), fill=fill,
                                cache_len=cache_len, steps=STEPS,
                                repeats=REPEATS)
  return seconds, seconds.pop("draft") / gamma
