"""How a decoder call is timed, the one definition behind c and the
K-curve (docs/design/performance.md): `call_seconds` runs calls as the loop
does, on its cache filled to `fill`, many in one compiled loop, compilation
excluded, kinds interleaved; the decode benchmark times an iteration's
parts the same way (`propose_loop`, `iteration_loop`).
"""
import functools
import time
from typing import (Any, Callable, Dict, List, Mapping, NamedTuple, Optional,
                    Sequence, Tuple)

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.core.decoding.programs import LoopProgram


@functools.partial(jax.jit, static_argnames=("max_len",))
def start(model, encoder_input_tokens, *, max_len):
  """`model.start` jitted (max_len static): the cache a timed call runs on."""
  return model.start(encoder_input_tokens, max_len)


# The loop's parts update caches in place as the loop does on XLA:CPU
# (`LoopProgram`); `call_loop` keeps XLA's defaults.
_IN_PLACE = kernels.CPU_IN_PLACE_COMPILER_OPTIONS


@functools.partial(jax.jit, static_argnames=("k", "steps"))
def call_loop(model, cache, fill, *, k: int, steps: int):
  """`steps` calls of `model.decode_chunk(tokens [B, k], cache)` from the
  [B] int32 cache lengths `fill`; a checksum. Every per-call time runs it."""
  batch = fill.shape[0]

  def body(i, carry):
    cache, acc = carry
    # Token ids vary with i so no call can be hoisted out of the loop.
    tokens = jnp.full((batch, k), 3, jnp.int32) + (i % 2)
    logits, cache = model.decode_chunk(tokens, cache.replace(length=fill))
    return cache, acc + logits[:, -1, 0]

  _, acc = jax.lax.fori_loop(0, steps, body,
                             (cache, jnp.zeros((batch,), jnp.float32)))
  return acc


def timed(fn, *args) -> Any:
  """(fn(*args) ready, seconds): wall time including `block_until_ready`."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - start


class Proposer(NamedTuple):
  """A drafter priced as the loop runs it: its `init` state, `buffer` [B, T]
  int32 a real context (start token first) and the method (static)."""
  drafter: Any
  state: Any
  buffer: jax.Array
  method: Any


# A timed program of `steps` calls over at most this many rows (batch x
# tokens) keeps all its calls; a wider call gets fewer (`steps_for_rows`).
FULL_STEP_ROWS = 16
MIN_STEPS = 16


def steps_for_rows(steps: int, rows: int) -> int:
  """Calls per timed program over `rows` rows (batch x tokens): `steps` up
  to `FULL_STEP_ROWS`, fewer in proportion beyond, at least `MIN_STEPS`:
  on XLA:CPU a wide call costs several steps, and shorter programs pay
  their fixed cost (docs/results/2026-11-27-auto-first-run-cost.md)."""
  return max(min(steps, MIN_STEPS),
             min(steps, round(steps * FULL_STEP_ROWS / max(rows, 1))))


# (fn, round) -> (fn(round) ready, seconds), as `timed`.
Clock = Callable[..., Tuple[Any, float]]


def call_seconds(calls: Mapping[str, Tuple[Any, int]],
                 encoder_input_tokens: np.ndarray, *, fill: int, cache_len: int,
                 steps: int = 64, repeats: int = 9, clock: Clock = timed,
                 programs: Optional["CallPrograms"] = None) -> Dict[str, float]:
  """{name: median seconds of one call}, timed in interleaved rounds: the
  median per-round ratio to the first kind, times its median (so c and the
  call cost are medians of ratios taken in one round).

  Args:
    calls: name -> (model with `start` and `decode_chunk`, k tokens per row
      per call), or (`Proposer`, γ): one `propose` of γ guesses rolled back
      to `fill` each call. The first entry is the reference.
    encoder_input_tokens: [B, S] int32 inputs the caches are built from.
    fill, cache_len: positions written before each call; cache slots.
    steps, repeats: calls per timed program (`steps_for_rows`), rounds.
    clock: the clock (`timed`).
    programs: the programs timed (`CallPrograms`).
  """
  programs = programs or CallPrograms()
  for name, (caller, k) in calls.items():
    if isinstance(caller, Proposer):
      continue  # its state was built for its buffer
    if not 0 <= fill <= cache_len - k:
      raise ValueError(f"{name}: fill={fill} and k={k} must fit in "
                       f"cache_len={cache_len} slots (0 <= fill <= "
                       "cache_len - k).")
  inputs = jnp.asarray(encoder_input_tokens, jnp.int32)
  fill_rows = jnp.full((inputs.shape[0],), fill, jnp.int32)

  # One cache per model: every call rewinds it to `fill` (nothing donated).
  caches = {
      id(model): programs.start(model, inputs, max_len=cache_len)
      for model, _ in calls.values()
      if not isinstance(model, Proposer)
  }

  # A wide call costs about a step on an accelerator, several on the CPU.
  cpu = jax.default_backend() == "cpu"
  steps_of = {
      name: steps_for_rows(steps, inputs.shape[0] *
                           k) if cpu and not isinstance(model, Proposer) else
            steps for name, (model, k) in calls.items()
  }

  def program(name, model, k):
    if isinstance(model, Proposer):  # one propose of γ = k guesses
      return lambda _: programs.propose_loop(
          model.drafter, model.state, model.buffer, fill_rows,
          jax.random.PRNGKey(0), gamma=k, method=model.method, steps=steps)
    cache = caches[id(model)]
    return lambda _: programs.call_loop(model, cache, fill_rows, k=k, steps=
                                        steps_of[name])

  times, _ = InterleavedTimer(repeats, log=lambda _: None, clock=clock)({
      name: program(name, model, k) for name, (model, k) in calls.items()
  })
  # Seconds of one call in each round.
  per_call = {name: t / steps_of[name] for name, t in times.items()}
  reference = per_call[next(iter(calls))]
  return {
      name: float(np.median(reference)) * float(np.median(t / reference))
      for name, t in per_call.items()
  }


# -- The parts of a speculative iteration (the decode benchmark) ---------------
@jax.jit
def prefill(model, cache, tokens):
  """`cache` after one `decode_chunk` of tokens [B, n] (n positions written)."""
  _, cache = model.decode_chunk(tokens, cache)
  return cache


@functools.partial(jax.jit,
                   static_argnames=("gamma", "max_decode_length", "fill"))
def speculative_state_at(target, drafter, encoder_input_tokens, target_cache,
                         draft_cache, prefix, *, gamma, max_decode_length,
                         fill):
  """A speculative loop state around the target's and the draft model's
  caches, both prefilled with `prefix[:, :fill]` (prefix: [B, >= fill + 1]
  int32, start token first)."""
  s = decoding.init_speculative_state(target, drafter, encoder_input_tokens,
                                      gamma=gamma,
                                      max_decode_length=max_decode_length)
  length = jnp.full_like(s.length, fill)
  return s.replace(
      buffer=s.buffer.at[:, :prefix.shape[1]].set(prefix),
      target_state=target_cache,
      draft_state=s.draft_state.replace(model_state=draft_cache,
                                        length=length), length=length)


def _propose_loop(drafter, draft_state, buffer, fill, rng, *, gamma, method,
                  steps):
  """`steps` drafter.propose calls of γ guesses, call i rolled back to
  fill + i % 2 ([B] int32); (draft state, checksum)."""

  def body(i, carry):
    state, acc = carry
    n = fill + i % 2
    # Each call grows the state past n: rolling back resets it to n.
    state, tokens, probs = drafter.propose(drafter.rollback(state,
                                                            n), buffer, n,
                                           jax.random.fold_in(rng, i),
                                           gamma=gamma, method=method)
    # Depend on the outputs so nothing is optimized away (no q at T=0).
    acc = acc + jnp.sum(tokens).astype(jnp.float32)
    return state, acc if probs is None else acc + probs[0, -1, 0]

  return jax.lax.fori_loop(0, steps, body, (draft_state, jnp.float32(0.0)))


def _iteration_loop(target, drafter, acceptance, state, fill, rng, eos_id, *,
                    gamma, max_decode_length, method, steps):
  """`steps` speculative iterations from fill + i % 2; `acceptance`'s
  leaves (a synthetic α) are traced: one compilation serves every value."""

  def body(i, s):
    n = fill + i % 2
    # Each iteration grows the states past n: rolling back resets them.
    s = s.replace(length=n, done=jnp.zeros_like(s.done),
                  target_state=target.truncate(s.target_state, n),
                  draft_state=drafter.rollback(s.draft_state, n))
    return decoding.speculative_iteration(target, drafter, acceptance, s, rng,
                                          eos_id, gamma=gamma,
                                          max_decode_length=max_decode_length,
                                          method=method)

  return jax.lax.fori_loop(0, steps, body, state)


propose_loop = LoopProgram(_propose_loop, ("gamma", "steps"), _IN_PLACE)
iteration_loop = LoopProgram(_iteration_loop,
                             ("gamma", "max_decode_length", "steps"), _IN_PLACE)


class CallPrograms(NamedTuple):
  """The programs `call_seconds` times (tests hand in stand-ins)."""
  start: Callable[..., Any] = start
  call_loop: Callable[..., Any] = call_loop
  propose_loop: Callable[..., Any] = propose_loop


class InterleavedTimer:
  """Runs each program once a round after a warm-up (`rotate`: round r
  starts from program r mod n); keeps the warm-ups' seconds
  (`first_call_s`) and excess over the median (`compile_time_s`)."""

  def __init__(self, repeats: int, log: Callable[[str], None],
               rotate: bool = False, clock: Clock = timed):
    self.clock = clock
    self.repeats = repeats
    self.compile_time_s: Dict[str, float] = {}
    self.first_call_s: Dict[str, float] = {}
    self.log = log
    self.rotate = rotate

  def __call__(
      self, fns: Dict[str, Callable[[int], Any]], keep: Sequence[str] = (),
      allows: Optional[Callable[[float], bool]] = None
  ) -> Tuple[Dict[str, np.ndarray], Dict[str, List[Any]]]:
    """({name: [rounds] seconds}, {name in `keep`: outputs}) of `fns`,
    name -> fn(round) (round -1: the warm-up). With `allows` (a deadline's:
    whether a step of so many seconds still fits), a round after the first
    runs only if 1.25x the mean round so far does: fewer than `repeats`
    rounds rather than a time cap overrun."""
    first = {name: self.clock(fn, -1)[1] for name, fn in fns.items()}
    times = {name: [] for name in fns}
    outs = {name: [] for name in keep}
    for r in range(self.repeats):
      if r and allows is not None and not allows(
          1.25 * sum(map(sum, times.values())) / r):
        break
      k = r % len(fns) if self.rotate else 0
      for name in list(fns)[k:] + list(fns)[:k]:
        out, seconds = self.clock(fns[name], r)
        times[name].append(seconds)
        if name in outs:
          outs[name].append(out)
    result = {}
    for name in fns:
      t = np.asarray(times[name])
      median = float(np.median(t))
      self.first_call_s[name] = first[name]
      self.compile_time_s[name] = max(self.compile_time_s.get(name, 0.0),
                                      first[name] - median, 0.0)
      self.log(f"  {name}: {median * 1e3:.3f} ms (median of {len(t)}; "
               f"warm-up {first[name]:.2f} s)")
      result[name] = t
    return result, outs
