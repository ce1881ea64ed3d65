"""How a decoder call is timed: the one definition behind c and the K-curve.

Theorem 3.8 prices an iteration of Algorithm 1 as γ draft steps plus one
target call, in units of one target step. `call_seconds` times any of
these the same way, several kinds in interleaved rounds, in the conditions
of the decoding loop:

* the model is called on a cache of `cache_len` slots (the loop's: attention
  reads every slot, so a short cache would flatter a step), filled to
  `fill` positions, with chunks of `k` tokens per row;
* `steps` calls run inside one compiled `lax.fori_loop`, each rewinding the
  cache to `fill` (a rollback by index, as the loop does), so per-call
  dispatch is the loop's, not Python's;
* compilation is excluded (one untimed call first); the result is the median
  over `repeats` rounds of wall time / steps, each ending with
  `block_until_ready`.

The cost coefficient c = draft step / target step (both k = 1), and the
verification ratio = target call at k = γ+1 / target step: Theorem 3.8
assumes 1; on a CPU it is measured (`analysis.speedup_with_call_cost`).

The decode benchmark times the parts of an iteration the same way
(`propose_loop`: the drafter's γ steps; `iteration_loop`: a whole
iteration), on caches prefilled to `fill` (`prefill`, `speculative_state_at`),
and interleaves the programs it compares (`InterleavedTimer`).
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


# The speculative loop's parts update caches in place as it does on XLA:CPU
# (its option, given on the CPU only: `LoopProgram`); `call_loop` prices
# steps and verification calls with XLA's defaults, as before.
_IN_PLACE = kernels.CPU_IN_PLACE_COMPILER_OPTIONS


@functools.partial(jax.jit, static_argnames=("k", "steps"))
def call_loop(model, cache, fill, *, k: int, steps: int):
  """`steps` k-token calls at positions fill..fill+k-1; returns a checksum.

  The program every per-call time in the project runs (`run`'s c and
  verification cost, the decode benchmark's K-curve and c).

  Args:
    model: has `decode_chunk(tokens [B, k], cache)`.
    cache: a cache from `model.start`, at least fill + k slots.
    fill: [B] int32 cache length each call starts from.
  """
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
  """A drafter priced as the speculative loop runs it (`call_seconds`).

  Attributes:
    drafter: any `Drafter`; state: its state from `init` on the batch.
    buffer: [B, T] int32 a real context (the target's own output, start
      token first): what `propose` reads.
    method: the sampling method (static).
  """
  drafter: Any
  state: Any
  buffer: jax.Array
  method: Any


# A timed program of `steps` calls over at most this many rows (batch x
# tokens) keeps all its calls; a wider call gets fewer (`steps_for_rows`).
FULL_STEP_ROWS = 16
MIN_STEPS = 16


def steps_for_rows(steps: int, rows: int) -> int:
  """Calls per timed program for a call over `rows` rows (batch x tokens):
  `steps` up to `FULL_STEP_ROWS` rows, fewer in proportion beyond (at least
  `MIN_STEPS`).

  On XLA:CPU a call over many rows costs several steps (at batch 8 on
  host A: 5.7 for 13 tokens, 9.5 for a 25-node tree), so 32 of them took
  2-3 s per round, and timing was most of the 92 s that pricing a batch-8
  run's candidates took. With calls in proportion to 16 / rows, each
  program lasts about as long as the reference step's. Not below 16: a
  program also pays a fixed cost (~4 steps for a 13-token call at batch 8),
  which programs of 10 calls priced 3.5-7% above programs of 32, 5 calls
  11-15% (interleaved in one process, host A:
  benchmarks/auto_first_run/call_steps_bias.json)."""
  return max(min(steps, MIN_STEPS),
             min(steps, round(steps * FULL_STEP_ROWS / max(rows, 1))))


def _steps_by_call(calls: Mapping[str, Tuple[Any, int]], steps: int,
                   batch: int) -> Dict[str, int]:
  """`call_seconds`' calls per timed program, by name: `steps_for_rows` of
  each call's batch x k rows on the CPU; on an accelerator, where a wide
  call costs about a step, and for a propose, `steps`."""
  cpu = jax.default_backend() == "cpu"
  return {
      name: steps_for_rows(steps, batch *
                           k) if cpu and not isinstance(model, Proposer) else
            steps for name, (model, k) in calls.items()
  }


def call_seconds(calls: Mapping[str,
                                Tuple[Any,
                                      int]], encoder_input_tokens: np.ndarray,
                 *, fill: int, cache_len: int, steps: int = 64,
                 repeats: int = 9, clock: Callable[..., Tuple[Any,
                                                              float]] = timed,
                 programs: Optional["CallPrograms"] = None) -> Dict[str, float]:
  """Median seconds of one decoder call of each kind (compilation excluded).

  The kinds are timed in interleaved rounds (`InterleavedTimer`), so a load
  change on a shared machine hits them alike. The first kind is the
  reference: every other kind's seconds are the median over rounds of its
  ratio to the reference, times the reference's median, so the ratios of
  the results (c, the verification cost) are medians of ratios measured in
  the same round. Under a bursty load on a 2-core CPU that kept the
  K = 4 / K = 1 ratio within 1.20–2.15 over 15 repeats, where back-to-back
  timings (16 calls, 5 repeats each) ranged over 0.56–3.53
  (`python -m tools.benchmarks.timing_noise`).

  Args:
    calls: name -> (model, k): a `T5Model` (or anything with `start` and
      `decode_chunk`) and its tokens per row per call (1 = a decode step;
      γ+1 = a verification); or (a `Proposer`, γ): one `propose` of γ
      guesses as the speculative loop runs it (its state rolled back to
      `fill` each call: `propose_loop`). The first entry is the reference.
    encoder_input_tokens: [B, S] int32 inputs the caches are built from.
    fill: cache positions already written before each call.
    cache_len: cache slots, as in the decoding loop being priced.
    steps, repeats: calls per timed program (on the CPU a call over more
      than `FULL_STEP_ROWS` rows: fewer, `steps_for_rows`; a propose: all),
      timed rounds.
    clock: (fn, round) -> (fn(round) ready, seconds) (`timed`).
    programs: the programs timed (`CallPrograms`: `start`, `call_loop`,
      `propose_loop`).

  Returns:
    name -> seconds of one call.
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

  steps_of = _steps_by_call(calls, steps, inputs.shape[0])

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


# ---------------------------------------------------------------------------
# The parts of a speculative iteration (the decode benchmark).
# ---------------------------------------------------------------------------
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
  """A speculative loop state around caches that hold `fill` positions.

  Args:
    target_cache, draft_cache: the model drafter's and the target's caches,
      both prefilled with `prefix[:, :fill]`.
    prefix: [B, >= fill + 1] int32 known tokens, start token first.
  """
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
  """`steps` drafter.propose calls (γ draft steps each) at length fill(+1).

  Args:
    fill: [B] int32; call i starts from fill + i % 2 (rolled back to it).

  Returns:
    (draft state, checksum) so that nothing is optimized away.
  """

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
  """`steps` full speculative iterations, each from length fill(+1).

  Args:
    acceptance: the acceptance rule (a pytree: its leaves, e.g. a synthetic
      α, are traced, so one compilation serves all their values).
    state: from `speculative_state_at`.
    fill: [B] int32; iteration i starts from fill + i % 2.
  """

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
  """The programs `call_seconds` times (tests hand in stand-ins): the
  cache (`start`), k-token calls (`call_loop`), a drafter's proposes
  (`propose_loop`)."""
  start: Callable[..., Any] = start
  call_loop: Callable[..., Any] = call_loop
  propose_loop: Callable[..., Any] = propose_loop


class InterleavedTimer:
  """Interleaved timing: warm-up each program, then `repeats` rounds.

  Each round runs every program of a group once, in order, so that load
  changes on a shared machine hit them alike; ratios and differences are
  taken within a round, then the median over rounds. With `rotate`, round r
  starts from the (r mod n)-th of the n programs, so that none always runs
  first. The warm-up's seconds are recorded (`first_call_s`, compilation
  included), and its excess over the median run as compile time
  (`compile_time_s`).
  """

  def __init__(self, repeats: int, log: Callable[[str],
                                                 None], rotate: bool = False,
               clock: Callable[..., Tuple[Any, float]] = timed):
    self.clock = clock  # (fn, round) -> (its output, ready; seconds)
    self.repeats = repeats
    self.compile_time_s: Dict[str, float] = {}
    self.first_call_s: Dict[str, float] = {}
    self.log = log
    self.rotate = rotate

  def _order(self, names: List[str], r: int) -> List[str]:
    k = r % len(names) if self.rotate else 0
    return names[k:] + names[:k]

  def __call__(
      self, fns: Dict[str, Callable[[int], Any]], keep: Sequence[str] = ()
  ) -> Tuple[Dict[str, np.ndarray], Dict[str, List[Any]]]:
    """fns: name -> fn(round) (round -1 is the warm-up).

    Returns:
      (seconds per round [repeats] by name, outputs per round for `keep`).
    """
    first = {name: self.clock(fn, -1)[1] for name, fn in fns.items()}
    times = {name: [] for name in fns}
    outs = {name: [] for name in keep}
    for r in range(self.repeats):
      for name in self._order(list(fns), r):
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
      self.log(f"  {name}: {median * 1e3:.3f} ms (median of {self.repeats}; "
               f"warm-up {first[name]:.2f} s)")
      result[name] = t
    return result, outs
