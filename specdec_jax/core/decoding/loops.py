"""Decode loops: the target alone, and speculative decoding (Algorithm 1).

Both are single jitted programs with no host round trip per token, and know
no concrete model: they call a `Target` (start / decode_chunk / truncate), a
`Drafter` (init / propose / rollback), a sampling method and an acceptance
rule (pytrees: their values are traced).

* `temperature_sample`: the walltime baseline, one target call per token in a
  `lax.while_loop` (the counterpart of T5X's `decoding.temperature_sample`).
* `speculative_sample`: an outer `lax.while_loop` over iterations; each runs
  the drafter (a draft model runs γ steps in a `lax.fori_loop`), one target
  call over the γ+1 positions, the acceptance rule, and a rollback of both
  states to the rows' new lengths. With a greedy method everything works on
  argmax tokens: no [B, γ, V] probabilities are built.

Sequence bookkeeping, per row: `buffer[:, 0]` is the decoder start token (0)
and `buffer[:, t]` the t-th generated token. `length` ℓ is the number of
generated tokens (not the paper's n, which counts accepted guesses); the
target's state always holds positions 0..ℓ-1, so the next target input is
`buffer[ℓ]`. Rows finish on EOS or at `max_decode_length` and are then
frozen while the others go on.

The entry points run the host-side argument checks of `decoding.checks`
(`check_speculative_args`, `check_encoder_inputs`, `check_rng`, ...) before
anything is traced or compiled, and return `decoding.outputs`' classes. Their
public names are importable from here too.
"""
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import carried_while
from specdec_jax.core import kernels
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.acceptance import ExactAcceptance
from specdec_jax.core.decoding.checks import as_drafter
from specdec_jax.core.decoding.checks import check_encoder_inputs
from specdec_jax.core.decoding.checks import check_eos_id
from specdec_jax.core.decoding.checks import check_rng
from specdec_jax.core.decoding.checks import check_settings
from specdec_jax.core.decoding.checks import check_speculative_args
from specdec_jax.core.decoding.checks import check_target
from specdec_jax.core.decoding.checks import resolve_method
from specdec_jax.core.decoding.outputs import DecodeOutput
from specdec_jax.core.decoding.outputs import SpeculativeOutput
from specdec_jax.core.decoding.programs import LoopProgram
from specdec_jax.core.decoding.statistics import StatisticsRecord
from specdec_jax.core.decoding.statistics import guess_beta
from specdec_jax.core.drafters import guesses
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.protocols import Drafter
from specdec_jax.core.protocols import Target
from specdec_jax.core.protocols import target_encoder_output
from specdec_jax.core.protocols import target_features

Array = jax.Array

EOS_ID = 1


# ---------------------------------------------------------------------------
# Shared bookkeeping.
# ---------------------------------------------------------------------------
def _finish(buffer: Array, lengths: Array, max_decode_length: int) -> Array:
  """Generated tokens [B, max_decode_length], zero past each row's length."""
  tokens = buffer[:, 1:max_decode_length + 1]
  positions = jnp.arange(1, max_decode_length + 1)
  return jnp.where(positions[None, :] <= lengths[:, None], tokens, 0)


def _running(s: Any) -> Array:
  """[] bool: some row of the loop state `s` is not done."""
  return jnp.logical_not(jnp.all(s.done))


def _truncate_at_eos(columns: Sequence[Array], num_new: Array,
                     eos_id: Array) -> Tuple[Array, Array]:
  """Cuts a row's new tokens after its first EOS.

  Args:
    columns: the W tokens just emitted, each [B] (the first num_new of
      each row valid).
    num_new: [B] number of valid tokens.
    eos_id: [] int32.

  Returns:
    (num_kept [B], hit_eos [B] bool).
  """
  width = len(columns)
  # The first EOS by selects, not a reduction over a stacked window: XLA
  # fuses selects into the ops that read them, where a reduction (an
  # argmax most of all) is a kernel of its own on a GPU.
  first = jnp.full(num_new.shape, width, jnp.int32)
  for j in reversed(range(width)):
    first = jnp.where((columns[j] == eos_id) & (j < num_new), j, first)
  hit_eos = first < width
  return jnp.where(hit_eos, first + 1, num_new), hit_eos


def _write_window(buffer: Array, columns: Sequence[Array],
                  start: Array) -> Array:
  """buffer [B, T] with each row's W tokens (`columns`, each [B]) written
  from start [B] on, as `lax.dynamic_update_slice` writes a window
  (start clamped to [0, T-W]).

  One select over the buffer: a vmapped dynamic_update_slice is a
  scatter, which XLA:GPU runs as a bounds check, the window's select
  against the old tokens and the write."""
  width = len(columns)
  start = jnp.clip(start, 0, buffer.shape[1] - width)
  offset = jnp.arange(buffer.shape[1])[None, :] - start[:, None]  # [B, T]
  out = buffer
  for j, column in enumerate(columns):
    out = jnp.where(offset == j, column[:, None].astype(out.dtype), out)
  return out


def emit_verdict(
    buffer: Array, length: Array, done: Array, guessed: Array,
    num_accepted: Array, next_token: Array, eos_id: Array,
    max_decode_length: int, written: Optional[Callable[[Array], Array]] = None
) -> Tuple[Array, Array, Array]:
  """Emits a verdict: x_1..x_n, then the extra token, cut at EOS and at
  max_decode_length; frozen rows keep their length.

  Args:
    buffer: [B, T] int32 the loop buffer; length: [B] int32 ℓ; done: [B].
    guessed: [B, γ] int32 the guesses of the verified path.
    num_accepted: [B] int32 n, leading guesses kept.
    next_token: [B] int32 the token sampled after them.
    eos_id: [] int32.
    max_decode_length: static.
    written: maps emitted tokens to what goes to the buffer, elementwise
      (partial guesses: `guesses.feedable`); None: the emitted ones.

  Returns:
    (buffer, new length [B], done [B]). Stale guesses past
    the extra token get overwritten later or masked at the end; finished
    rows write past their final length too (masked).
  """
  # The emitted tokens x_1..x_n, the extra token, then stale guesses, as
  # γ+1 columns [B], never stacked: XLA fuses their selects into each op
  # that reads them, where a stacked window is a kernel of its own on a GPU.
  emitted = [
      jnp.where(num_accepted == j, next_token, guessed[:, j])
      for j in range(guessed.shape[1])
  ] + [next_token]
  active = jnp.logical_not(done)
  num_new, hit_eos = _truncate_at_eos(emitted, num_accepted + 1, eos_id)
  new_length = jnp.where(active, jnp.minimum(length + num_new,
                                             max_decode_length), length)
  buffer = _write_window(
      buffer, emitted if written is None else [written(c) for c in emitted],
      length + 1)
  done = done | (active & (hit_eos | (new_length >= max_decode_length)))
  return buffer, new_length, done


def _start_buffer(target: Target, inputs: Array, size: int) -> Array:
  """[B, size] int32 token buffer: the target's start token at position 0
  (T5's 0; a decoder-only model's last prompt token), zeros after it."""
  first = jnp.asarray(target.start_token(inputs), jnp.int32)
  return jnp.zeros((inputs.shape[0], size), jnp.int32).at[:, 0].set(first)


# ---------------------------------------------------------------------------
# Baseline: the target alone.
# ---------------------------------------------------------------------------
@structs.dataclass
class _BaselineState:
  """Loop state of `temperature_sample` (B rows, T = max_decode_length + 1)."""
  step: Array  # [] int32 loop counter (folded into the rng).
  target_state: Any  # holds positions 0..ℓ-1.
  buffer: Array  # [B, T] int32 tokens, start token at 0.
  length: Array  # [B] int32 ℓ, tokens generated.
  done: Array  # [B] bool.
  # [B] int32 the token fed next: buffer[:, ℓ] in a row not done (any
  # token in one done: what it computes is never kept), carried as drawn,
  # not read back from the buffer (a gather: on a GPU a kernel of its own).
  last: Array


def temperature_loop(target: Target, encoder_input_tokens: Array, rng: Array,
                     eos_id: Array, *, max_decode_length: int,
                     method: sampling.SamplingMethod) -> DecodeOutput:
  """The traceable baseline loop (no argument checks; see
  `temperature_sample`)."""
  batch = encoder_input_tokens.shape[0]
  with jax.named_scope("start"):  # once a decode: the encoder, the cache
    buffer = _start_buffer(target, encoder_input_tokens, max_decode_length + 1)
    state = _BaselineState(
        step=jnp.array(0, jnp.int32),
        target_state=target.start(encoder_input_tokens, max_decode_length + 1),
        buffer=buffer, length=jnp.zeros((batch,), jnp.int32), done=jnp.zeros(
            (batch,), bool), last=buffer[:, 0])

  def body(s):
    with jax.named_scope("verify"):  # the target step
      logits, target_state = target.decode_chunk(s.last[:, None],
                                                 s.target_state)
    with jax.named_scope("acceptance"):  # here: sampling the token
      token = method.sample(jax.random.fold_in(rng, s.step), logits[:, 0])
    active = jnp.logical_not(s.done)
    # A select over the buffer, not a scatter (`_write_window`); a done
    # row, whose length + 1 may lie past the buffer, writes nothing.
    buffer = jnp.where(
        active[:, None] &
        (jnp.arange(s.buffer.shape[1])[None, :] == (s.length + 1)[:, None]),
        token[:, None].astype(s.buffer.dtype), s.buffer)
    length = jnp.where(active, s.length + 1, s.length)
    done = s.done | (token == eos_id) | (length >= max_decode_length)
    return _BaselineState(step=s.step + 1,
                          target_state=target.truncate(target_state, length),
                          buffer=buffer, length=length, done=done,
                          last=token.astype(jnp.int32))

  state = carried_while.while_loop(_running, body, state)
  return DecodeOutput(
      tokens=_finish(state.buffer, state.length, max_decode_length),
      lengths=state.length, target_calls=state.length)


BASELINE_PROGRAM = LoopProgram(temperature_loop, ("max_decode_length",),
                               kernels.CPU_BASELINE_COMPILER_OPTIONS)


def temperature_sample(target: Target, encoder_input_tokens: Array, rng: Array,
                       *, max_decode_length: int,
                       temperature: Optional[float] = None,
                       top_k: Optional[int] = None,
                       top_p: Optional[float] = None,
                       method: Optional[sampling.SamplingMethod] = None,
                       eos_id: int = EOS_ID) -> DecodeOutput:
  """Samples from the target alone, one target call per token.

  Args:
    target: the target model (`Target`, e.g. `models.T5Model`).
    encoder_input_tokens: [B, S] integer token ids in [0, vocab_size),
      0-padded (checked on the host when concrete: `check_encoder_inputs`).
    rng: a JAX PRNG key (unused by a greedy method, still checked).
    max_decode_length: maximum generated tokens per row (>= 1).
    temperature, top_k, top_p: the sampling settings (`sampling.make_method`;
      default greedy); or
    method: a `sampling.SamplingMethod` instead of them.
    eos_id: a row stops after emitting it (traced: changing it does not
      recompile; -1 never stops early).

  Returns:
    `DecodeOutput`.

  Raises:
    ValueError naming the bad argument, before anything is compiled.
  """
  check_settings(max_decode_length=max_decode_length)
  method = resolve_method(method, temperature, top_k, top_p)
  check_target(target)
  check_encoder_inputs(encoder_input_tokens, target.vocab_size)
  check_rng(rng)
  check_eos_id(eos_id)
  return BASELINE_PROGRAM(target, jnp.asarray(encoder_input_tokens,
                                              jnp.int32), rng, np.int32(eos_id),
                          max_decode_length=int(max_decode_length),
                          method=method)


# ---------------------------------------------------------------------------
# Speculative decoding.
# ---------------------------------------------------------------------------
@structs.dataclass
class SpeculativeState:
  """Loop state of the speculative decoder: Algorithm 1's state only.

  B rows, T = max_decode_length + γ + 2 buffer positions.

  Attributes:
    iteration: [] int32 iterations so far (folded into the rng).
    target_state: the target's state; holds positions 0..ℓ-1.
    draft_state: the drafter's state.
    buffer: [B, T] int32 tokens, start token at 0.
    length: [B] int32 ℓ, tokens generated per row.
    done: [B] bool rows finished (EOS or max_decode_length).
    stats: `StatisticsRecord` (`SpeculativeStatistics` once finished), or
      None when not collected.
  """
  iteration: Array
  target_state: Any
  draft_state: Any
  buffer: Array
  length: Array
  done: Array
  stats: Optional[StatisticsRecord] = None


def init_speculative_state(target: Target, drafter: Drafter,
                           encoder_input_tokens: Array, *, gamma: int,
                           max_decode_length: int,
                           statistics: bool = True) -> SpeculativeState:
  """Prefills both models from inputs [B, S] and allocates the loop state."""
  batch = encoder_input_tokens.shape[0]
  # Chunks reach position ℓ + γ with ℓ <= max_decode_length (frozen rows
  # keep running at their final length): max_decode_length + γ + 1 slots.
  state_len = max_decode_length + gamma + 1
  target_state = target.start(encoder_input_tokens, state_len)
  # The target's encoding (None without one): a shared-encoder draft reads it.
  encoder_output = target_encoder_output(target, target_state)
  return SpeculativeState(
      iteration=jnp.array(0, jnp.int32), target_state=target_state,
      draft_state=drafter.init(encoder_input_tokens, state_len, encoder_output),
      buffer=_start_buffer(target, encoder_input_tokens, state_len + 1),
      length=jnp.zeros((batch,), jnp.int32), done=jnp.zeros(
          (batch,), bool), stats=(StatisticsRecord.zeros(
              batch, gamma, max_decode_length) if statistics else None))


def iteration_inputs(target: Target, drafter: Drafter, target_state: Any,
                     iteration: Array,
                     rng: Array) -> Tuple[Array, Array, Dict[str, Any]]:
  """What an iteration of a speculative loop (chain or tree) starts from.

  Args:
    target_state: the target's state; iteration: [] int32, folded into rng.

  Returns:
    (the draft's rng, the acceptance rule's rng, the drafter's extra keyword
    arguments: a feature-level drafter's `target_features`, else none).
  """
  draft_rng, accept_rng = jax.random.split(jax.random.fold_in(rng, iteration))
  features = ({
      "target_features": target_features(target, target_state)
  } if drafter.reads_target_features else {})
  return draft_rng, accept_rng, features


def speculative_iteration(target: Target, drafter: Drafter,
                          acceptance: AcceptanceRule, s: SpeculativeState,
                          rng: Array, eos_id: Array, *, gamma: int,
                          max_decode_length: int,
                          method: sampling.SamplingMethod) -> SpeculativeState:
  """One iteration of Algorithm 1 for every row of the batch.

  Args:
    target, drafter, acceptance: the plug points.
    s: the loop state.
    rng: the decode's PRNG key (the iteration number is folded in).
    eos_id: [] int32.
    gamma, max_decode_length: static; method: the sampling method.

  Returns:
    The next state: each active row gained 1..γ+1 tokens; both models'
    states are rolled back to the new lengths.
  """
  batch = s.buffer.shape[0]
  rows = jnp.arange(batch)
  draft_rng, accept_rng, features = iteration_inputs(target, drafter,
                                                     s.target_state,
                                                     s.iteration, rng)
  # The named scopes label each part's ops in the compiled program
  # (profiles, `tools.benchmarks.iteration_hlo`); they change no computation.
  with jax.named_scope("propose"):
    draft_state, draft_tokens, draft_probs = drafter.propose(
        s.draft_state, s.buffer, s.length, draft_rng, gamma=gamma,
        method=method, **features)

  # One target call over the γ+1 positions ℓ..ℓ+γ.
  partial = drafter.may_stop_early  # Static: NO_GUESS slots may come back.
  with jax.named_scope("verify"):
    if partial:
      logits, target_state = guesses.verify_call(target, s.buffer[rows,
                                                                  s.length],
                                                 draft_tokens, s.target_state)
    else:
      chunk = jnp.concatenate([s.buffer[rows, s.length][:, None], draft_tokens],
                              axis=1)
      logits, target_state = target.decode_chunk(chunk, s.target_state)
  with jax.named_scope("acceptance"):
    verdict = acceptance(accept_rng, logits, draft_tokens, draft_probs, method)
  num_accepted, next_token = verdict.num_accepted, verdict.next_token

  active = jnp.logical_not(s.done)
  with jax.named_scope("emit"):
    buffer, new_length, done = emit_verdict(
        s.buffer, s.length, s.done, draft_tokens, num_accepted, next_token,
        eos_id, max_decode_length, guesses.feedable if partial else None)

  stats = s.stats
  if stats is not None:
    with jax.named_scope("statistics"):
      stats = stats.update(
          iteration=s.iteration, active=active, draft_tokens=draft_tokens,
          verdict=verdict, beta=guess_beta(verdict, draft_tokens, draft_probs),
          num_kept=new_length - s.length,
          num_guesses=guesses.num_guesses(draft_tokens) if partial else None)

  return SpeculativeState(
      iteration=s.iteration + 1,
      # Rollback by index: both states keep only the accepted prefix.
      target_state=target.truncate(target_state, new_length),
      draft_state=drafter.rollback(draft_state, new_length),
      buffer=buffer,
      length=new_length,
      done=done,
      stats=stats)


def speculative_loop(target: Target, drafter: Drafter,
                     encoder_input_tokens: Array, rng: Array, eos_id: Array, *,
                     gamma: int, max_decode_length: int,
                     method: sampling.SamplingMethod,
                     acceptance: AcceptanceRule = ExactAcceptance(),
                     statistics: bool = True) -> SpeculativeOutput:
  """The traceable speculative loop: no argument checks, not jitted.

  For callers that compose it inside their own `jax.jit` (the benchmark,
  `jax.experimental.checkify.checkify` for cache-overflow checks);
  `speculative_sample` is the checked, jitted entry point.
  """
  with jax.named_scope("start"):  # once a decode: encoders, caches
    state = init_speculative_state(target, drafter, encoder_input_tokens,
                                   gamma=gamma,
                                   max_decode_length=max_decode_length,
                                   statistics=statistics)

  def body(s):
    return speculative_iteration(target, drafter, acceptance, s, rng, eos_id,
                                 gamma=gamma,
                                 max_decode_length=max_decode_length,
                                 method=method)

  state = carried_while.while_loop(_running, body, state)
  return SpeculativeOutput(
      tokens=_finish(state.buffer, state.length,
                     max_decode_length), lengths=state.length,
      stats=None if state.stats is None else state.stats.finish())


# XLA:CPU: per-program compiler options (`kernels.CPU_SPECULATIVE_COMPILER_
# OPTIONS` says why the speculative loop differs from the baseline's).
SPECULATIVE_PROGRAM = LoopProgram(speculative_loop,
                                  ("gamma", "max_decode_length", "statistics"),
                                  kernels.CPU_SPECULATIVE_COMPILER_OPTIONS)


def speculative_sample(target: Target, drafter: Any,
                       encoder_input_tokens: Array, rng: Array, *, gamma: int,
                       max_decode_length: int,
                       temperature: Optional[float] = None,
                       top_k: Optional[int] = None,
                       top_p: Optional[float] = None,
                       method: Optional[sampling.SamplingMethod] = None,
                       acceptance: Optional[AcceptanceRule] = None,
                       eos_id: int = EOS_ID,
                       statistics: bool = True) -> SpeculativeOutput:
  """Speculative decoding: exactly the target's output distribution.

  Args:
    target: the target model (`Target`, e.g. `models.T5Model`).
    drafter: a `drafters.Drafter`, or a small model with the `Target`
      interface (wrapped in `drafters.ModelDrafter`).
    encoder_input_tokens: [B, S] integer token ids in [0, vocab_size),
      0-padded (checked on the host when concrete: `check_encoder_inputs`).
    rng: a JAX PRNG key.
    gamma: number of draft guesses γ per target call (static, >= 1).
    max_decode_length: maximum generated tokens per row (>= 1).
    temperature, top_k, top_p: the sampling settings, applied identically
      to target and draft (`sampling.make_method`; default greedy, whose
      output is token-identical to `temperature_sample`'s); or
    method: a `sampling.SamplingMethod` instead of them.
    acceptance: the acceptance rule; default `ExactAcceptance()`
      (Algorithm 1, the only exact one).
    eos_id: a row stops after emitting it (-1: never).
    statistics: also collect per-row target calls, the histogram of kept
      guesses, β and traces (`SpeculativeStatistics`); False carries
      Algorithm 1's state only.

  Returns:
    `SpeculativeOutput`.

  Raises:
    ValueError naming the bad argument, before anything is compiled.
  """
  drafter = as_drafter(drafter)
  method = check_speculative_args(target, drafter, gamma=gamma,
                                  max_decode_length=max_decode_length,
                                  method=method, temperature=temperature,
                                  top_k=top_k, top_p=top_p,
                                  acceptance=acceptance)
  check_encoder_inputs(encoder_input_tokens, target.vocab_size)
  check_rng(rng)
  check_eos_id(eos_id)
  if not isinstance(statistics, bool):
    raise ValueError(f"statistics must be True or False, got {statistics!r}.")
  return SPECULATIVE_PROGRAM(
      target, drafter, jnp.asarray(encoder_input_tokens, jnp.int32), rng,
      np.int32(eos_id), gamma=int(gamma),
      max_decode_length=int(max_decode_length), method=method,
      acceptance=ExactAcceptance() if acceptance is None else acceptance,
      statistics=statistics)
