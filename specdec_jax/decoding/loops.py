"""Decode loops: the target alone, and speculative decoding (Algorithm 1).

Both are single jitted programs with no host round trip per token, and know
no concrete model: they call a `Target` (start / decode_chunk / truncate), a
`Drafter` (init / propose / rollback), a sampling method (static) and an
acceptance rule.

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

Argument checks (`check_speculative_args`, `check_encoder_inputs`,
`check_rng`, ...) run on the host before anything is traced or compiled.
"""
import functools
import numbers
from typing import Any, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax import kernels
from specdec_jax import sampling
from specdec_jax.protocols import AcceptanceRule
from specdec_jax.acceptance import ExactAcceptance
from specdec_jax.protocols import Target
from specdec_jax.protocols import check_pytree
from specdec_jax.protocols import target_encoder_output
from specdec_jax.decoding.statistics import SpeculativeStatistics
from specdec_jax.decoding.statistics import guess_beta
from specdec_jax.drafters import guesses
from specdec_jax.protocols import Drafter
from specdec_jax.drafters.model import ModelDrafter

Array = jax.Array

EOS_ID = 1


# ---------------------------------------------------------------------------
# Outputs.
# ---------------------------------------------------------------------------
@flax.struct.dataclass
class DecodeOutput:
  """Result of `temperature_sample`.

  Attributes:
    tokens: [B, max_decode_length] int32 generated tokens, EOS included, 0
      after EOS (T5X's convention).
    lengths: [B] int32 number of generated tokens (EOS included).
    target_calls: [B] int32 target decoder calls while the row was active
      (one per generated token).
  """
  tokens: Array
  lengths: Array
  target_calls: Array


@flax.struct.dataclass
class SpeculativeOutput:
  """Result of `speculative_sample`, with Algorithm 1's statistics.

  Attributes:
    tokens: [B, max_decode_length] int32, as in `DecodeOutput`.
    lengths: [B] int32 number of generated tokens.
    stats: `SpeculativeStatistics` (per-row target calls, histogram of kept
      guesses, β, traces), or None when decoded with statistics=False. Its
      fields are also readable here (`out.target_calls`,
      `out.accepted_histogram`, ...).
  """
  tokens: Array
  lengths: Array
  stats: Optional[SpeculativeStatistics] = None

  def _stats(self) -> SpeculativeStatistics:
    if self.stats is None:
      raise ValueError(
          "This output was decoded with statistics=False: it has tokens and "
          "lengths only. Pass statistics=True for target calls, α and traces.")
    return self.stats

  # Fields of `SpeculativeStatistics`, for convenience.
  target_calls = property(lambda self: self._stats().target_calls)
  accepted_histogram = property(
      lambda self: self._stats().accepted_histogram)
  beta_sum = property(lambda self: self._stats().beta_sum)
  beta_count = property(lambda self: self._stats().beta_count)
  trace_draft_tokens = property(
      lambda self: self._stats().trace_draft_tokens)
  trace_num_accepted = property(
      lambda self: self._stats().trace_num_accepted)
  trace_next_token = property(lambda self: self._stats().trace_next_token)

  @property
  def gamma(self) -> int:
    return self.accepted_histogram.shape[-1] - 1

  @property
  def tokens_per_target_call(self) -> Array:
    """Mean generated tokens per target call over the batch (scalar)."""
    return jnp.sum(self.lengths) / jnp.maximum(jnp.sum(self.target_calls), 1)

  @property
  def alpha_hat(self) -> Array:
    """α̂ from acceptance counts: kept guesses / acceptance trials (scalar).

    An iteration whose n guesses were kept and followed by the target's
    token ran min(n + 1, γ) trials (it stops at the first rejection), n of
    them successes; one whose output ended inside its guesses (EOS or
    max_decode_length) counts only the trials and guesses that reached the
    output. The trials are `beta_count`.
    """
    hist = jnp.sum(self.accepted_histogram, axis=0)
    successes = jnp.sum(jnp.arange(hist.shape[0]) * hist)
    return successes / jnp.maximum(jnp.sum(self.beta_count), 1)

  @property
  def alpha_beta(self) -> Array:
    """α̂ as the mean β over visited positions (Corollary 3.6; scalar)."""
    return jnp.sum(self.beta_sum) / jnp.maximum(jnp.sum(self.beta_count), 1)

  def statistics(self) -> dict:
    """Host-side summary (Python numbers) for logs and metrics files."""
    return {
        "gamma": self.gamma,
        "tokens_generated": int(jnp.sum(self.lengths)),
        "target_calls": int(jnp.sum(self.target_calls)),
        "tokens_per_target_call": float(self.tokens_per_target_call),
        "alpha_hat": float(self.alpha_hat),
        "alpha_beta": float(self.alpha_beta),
        "acceptance_trials": int(jnp.sum(self.beta_count)),
        "accepted_histogram": [
            int(x) for x in jnp.sum(self.accepted_histogram, axis=0)],
    }


# ---------------------------------------------------------------------------
# Argument checks (on the host, before any tracing or compilation).
# ---------------------------------------------------------------------------
def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (
      value < 1):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def _concrete_values(x: Any) -> Optional[np.ndarray]:
  """x as a host array, or None when it is traced (or not addressable)."""
  if isinstance(x, jax.core.Tracer):
    return None
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return None
  return np.asarray(x)


def check_encoder_inputs(encoder_input_tokens: Any,
                         vocab_size: Optional[int] = None) -> None:
  """Encoder inputs must be [B, S] integer token ids in [0, vocab_size).

  The dtype and shape are checked always. The ids are checked on the host
  when the array is concrete (a NumPy array, or a jax.Array outside jit);
  inside a caller's own `jax.jit` they are traced and cannot be: there an
  id >= vocab_size embeds as NaN (`jnp.take`'s fill mode) and a negative id
  wraps around, so the output is garbage without an error.

  Raises:
    ValueError naming `encoder_input_tokens`, what it got and what is
    allowed.
  """
  shape = getattr(encoder_input_tokens, "shape", None)
  dtype = getattr(encoder_input_tokens, "dtype", None)
  if shape is None or len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
    raise ValueError(
        "encoder_input_tokens must be a non-empty [batch, length] integer "
        f"array, got shape {shape}.")
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(
        "encoder_input_tokens must have an integer dtype (token ids), got "
        f"{dtype}: floats would be silently truncated to ids.")
  if vocab_size is None:
    return
  values = _concrete_values(encoder_input_tokens)
  if values is None or values.size == 0:
    return
  bad = (values < 0) | (values >= vocab_size)
  if np.any(bad):
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f"encoder_input_tokens must hold token ids in [0, {vocab_size}) (the "
        f"model's vocab_size; 0 is padding), got {int(values[where])} at "
        f"{list(where)} ({int(bad.sum())} ids out of range).")


def check_rng(rng: Any) -> None:
  """rng must be one JAX PRNG key: `jax.random.key(seed)` (a typed key of
  shape []) or `jax.random.PRNGKey(seed)` (raw uint32 [2], or [4] for the
  'rbg' implementations)."""
  dtype = getattr(rng, "dtype", None)
  shape = getattr(rng, "shape", None)
  if dtype is not None and not isinstance(rng, (str, bytes)):
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
      if shape == ():
        return
    elif dtype == np.uint32 and shape in ((2,), (4,)):
      return
  what = (f"an array of dtype {dtype} and shape {shape}" if dtype is not None
          else repr(rng))
  raise ValueError(
      "rng must be a single JAX PRNG key, e.g. jax.random.key(0) or "
      f"jax.random.PRNGKey(0), got {what}.")


def _check_eos_id(eos_id: Any) -> None:
  if isinstance(eos_id, bool) or not isinstance(eos_id, numbers.Integral):
    raise ValueError(
        f"eos_id must be an integer token id (-1: never stop early), got "
        f"{eos_id!r}.")


def resolve_method(method: Optional[sampling.SamplingMethod] = None,
                   temperature: Optional[float] = None,
                   top_k: Optional[int] = None,
                   top_p: Optional[float] = None) -> sampling.SamplingMethod:
  """The sampling method from either `method` or the loose scalars.

  Loose scalars default to greedy (temperature 0, top_k 0, top_p 1) and are
  validated by `sampling.make_method`; giving both forms is an error.
  """
  loose = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
  if method is not None:
    given = [k for k, v in loose.items() if v is not None]
    if given:
      raise ValueError(
          f"Pass either method or {'/'.join(given)}, not both: method "
          f"({method!r}) already fixes them.")
    if not isinstance(method, sampling.SamplingMethod):
      raise ValueError(
          "method must be a sampling.SamplingMethod (e.g. sampling.Greedy() "
          f"or sampling.Sampling(temperature=0.7, top_p=0.9)), got "
          f"{type(method).__name__}.")
    return method
  return sampling.make_method(0.0 if temperature is None else temperature,
                              0 if top_k is None else top_k,
                              1.0 if top_p is None else top_p)


def check_settings(*, max_decode_length: Any, gamma: Any = None) -> None:
  """Checks γ (when given) and max_decode_length; raises ValueError."""
  if gamma is not None:
    _check_positive_int("gamma", gamma)
  _check_positive_int("max_decode_length", max_decode_length)


def check_vocab_sizes(target_vocab_size: int, draft_vocab_size: int) -> None:
  if draft_vocab_size != target_vocab_size:
    raise ValueError(
        f"draft vocab_size ({draft_vocab_size}) must equal the target's "
        f"vocab_size ({target_vocab_size}): speculative decoding compares "
        "their distributions token by token.")


# What `Target` asks for (protocols.Target).
_TARGET_MEMBERS = ("vocab_size", "start_token", "start", "length",
                   "decode_chunk", "truncate")


@functools.lru_cache(maxsize=None)
def _implements_target(cls: type) -> bool:
  """Whether instances of cls have Target's members (a Protocol isinstance
  costs ~0.1 ms: too much per decode call, so it is cached per class)."""
  return all(hasattr(cls, m) for m in _TARGET_MEMBERS)


def check_target(target: Any) -> None:
  """The target implements `Target` and is a pytree; raises ValueError."""
  # A class is hashable; mypy's Hashable protocol does not see type.__hash__.
  if (not _implements_target(type(target))  # type: ignore[arg-type]
      and not isinstance(target, Target)):
    missing = [m for m in _TARGET_MEMBERS if not hasattr(target, m)]
    raise ValueError(
        "target must implement specdec_jax.protocols.Target ("
        f"{', '.join(_TARGET_MEMBERS)}), e.g. a models.T5Model; got "
        f"{type(target).__name__}, missing {missing}.")
  check_pytree("target", target)


def as_drafter(drafter: Any) -> Drafter:
  """A `Drafter` as is; a model with the `Target` interface (e.g. a small
  `T5Model`) wrapped in `drafters.ModelDrafter`."""
  if not isinstance(drafter, Drafter) and isinstance(drafter, Target):
    return ModelDrafter(drafter)
  return drafter


def check_speculative_args(target: Any, drafter: Any, *, gamma: Any,
                           max_decode_length: Any,
                           method: Optional[sampling.SamplingMethod] = None,
                           temperature: Optional[float] = None,
                           top_k: Optional[int] = None,
                           top_p: Optional[float] = None,
                           acceptance: Optional[AcceptanceRule] = None
                           ) -> sampling.SamplingMethod:
  """All model-level checks of `speculative_sample`; raises ValueError.

  Returns:
    The sampling method (`resolve_method`).
  """
  check_settings(gamma=gamma, max_decode_length=max_decode_length)
  method = resolve_method(method, temperature, top_k, top_p)
  check_target(target)
  if not isinstance(drafter, Drafter):
    raise ValueError(
        "drafter must be a specdec_jax.drafters.Drafter (e.g. "
        "ModelDrafter(small_model)) or a model with the Target interface, "
        f"got {type(drafter).__name__}.")
  check_pytree("drafter", drafter)
  check_vocab_sizes(target.vocab_size, drafter.vocab_size)
  if acceptance is not None:
    if not isinstance(acceptance, AcceptanceRule):
      raise ValueError(
          "acceptance must be a decoding.AcceptanceRule (e.g. "
          f"ExactAcceptance()), got {type(acceptance).__name__}.")
    check_pytree("acceptance", acceptance)
  return method


# ---------------------------------------------------------------------------
# Shared bookkeeping.
# ---------------------------------------------------------------------------
def _finish(buffer: Array, lengths: Array, max_decode_length: int) -> Array:
  """Generated tokens [B, max_decode_length], zero past each row's length."""
  tokens = buffer[:, 1:max_decode_length + 1]
  positions = jnp.arange(1, max_decode_length + 1)
  return jnp.where(positions[None, :] <= lengths[:, None], tokens, 0)


def _truncate_at_eos(window: Array, num_new: Array, eos_id: Array
                     ) -> Tuple[Array, Array]:
  """Cuts a row's new tokens after its first EOS.

  Args:
    window: [B, W] the tokens just emitted (first num_new of each row valid).
    num_new: [B] number of valid tokens in the window.
    eos_id: [] int32.

  Returns:
    (num_kept [B], hit_eos [B] bool).
  """
  valid = jnp.arange(window.shape[1])[None, :] < num_new[:, None]
  is_eos = (window == eos_id) & valid
  hit_eos = jnp.any(is_eos, axis=1)
  first = jnp.argmax(is_eos, axis=1)
  return jnp.where(hit_eos, first + 1, num_new), hit_eos


def _start_buffer(target: Target, inputs: Array, size: int) -> Array:
  """[B, size] int32 token buffer: the target's start token at position 0
  (T5's 0; a decoder-only model's last prompt token), zeros after it."""
  first = jnp.asarray(target.start_token(inputs), jnp.int32)
  return jnp.zeros((inputs.shape[0], size), jnp.int32).at[:, 0].set(first)


# ---------------------------------------------------------------------------
# Baseline: the target alone.
# ---------------------------------------------------------------------------
@flax.struct.dataclass
class _BaselineState:
  """Loop state of `temperature_sample` (B rows, T = max_decode_length + 1)."""
  step: Array          # [] int32 loop counter (folded into the rng).
  target_state: Any    # holds positions 0..ℓ-1.
  buffer: Array        # [B, T] int32 tokens, start token at 0.
  length: Array        # [B] int32 ℓ, tokens generated.
  done: Array          # [B] bool.


def temperature_loop(target: Target, encoder_input_tokens: Array, rng: Array,
                     eos_id: Array, *, max_decode_length: int,
                     method: sampling.SamplingMethod) -> DecodeOutput:
  """The traceable baseline loop (no argument checks; see
  `temperature_sample`)."""
  batch = encoder_input_tokens.shape[0]
  rows = jnp.arange(batch)
  state = _BaselineState(
      step=jnp.array(0, jnp.int32),
      target_state=target.start(encoder_input_tokens, max_decode_length + 1),
      buffer=_start_buffer(target, encoder_input_tokens,
                           max_decode_length + 1),
      length=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), bool))

  def cond(s):
    return jnp.logical_not(jnp.all(s.done))

  def body(s):
    logits, target_state = target.decode_chunk(
        s.buffer[rows, s.length][:, None], s.target_state)
    token = method.sample(jax.random.fold_in(rng, s.step), logits[:, 0])
    active = jnp.logical_not(s.done)
    buffer = s.buffer.at[rows, s.length + 1].set(
        jnp.where(active, token, s.buffer[rows, s.length + 1]))
    length = jnp.where(active, s.length + 1, s.length)
    done = s.done | (token == eos_id) | (length >= max_decode_length)
    return _BaselineState(
        step=s.step + 1, target_state=target.truncate(target_state, length),
        buffer=buffer, length=length, done=done)

  state = lax.while_loop(cond, body, state)
  return DecodeOutput(
      tokens=_finish(state.buffer, state.length, max_decode_length),
      lengths=state.length, target_calls=state.length)


_jit_temperature_loop = jax.jit(
    temperature_loop, static_argnames=("max_decode_length", "method"))


def temperature_sample(target: Target, encoder_input_tokens: Array,
                       rng: Array, *, max_decode_length: int,
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
  _check_eos_id(eos_id)
  return _jit_temperature_loop(
      target, jnp.asarray(encoder_input_tokens, jnp.int32), rng,
      np.int32(eos_id), max_decode_length=int(max_decode_length),
      method=method)


# ---------------------------------------------------------------------------
# Speculative decoding.
# ---------------------------------------------------------------------------
@flax.struct.dataclass
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
    stats: `SpeculativeStatistics`, or None when not collected.
  """
  iteration: Array
  target_state: Any
  draft_state: Any
  buffer: Array
  length: Array
  done: Array
  stats: Optional[SpeculativeStatistics] = None


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
      iteration=jnp.array(0, jnp.int32),
      target_state=target_state,
      draft_state=drafter.init(encoder_input_tokens, state_len,
                               encoder_output),
      buffer=_start_buffer(target, encoder_input_tokens, state_len + 1),
      length=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), bool),
      stats=(SpeculativeStatistics.zeros(batch, gamma, max_decode_length)
             if statistics else None))


def speculative_iteration(target: Target, drafter: Drafter,
                          acceptance: AcceptanceRule, s: SpeculativeState,
                          rng: Array, eos_id: Array, *, gamma: int,
                          max_decode_length: int,
                          method: sampling.SamplingMethod
                          ) -> SpeculativeState:
  """One iteration of Algorithm 1 for every row of the batch.

  Args:
    target, drafter, acceptance: the plug points.
    s: the loop state.
    rng: the decode's PRNG key (the iteration number is folded in).
    eos_id: [] int32.
    gamma, max_decode_length, method: static.

  Returns:
    The next state: each active row gained 1..γ+1 tokens; both models'
    states are rolled back to the new lengths.
  """
  batch = s.buffer.shape[0]
  rows = jnp.arange(batch)
  draft_rng, accept_rng = jax.random.split(
      jax.random.fold_in(rng, s.iteration))
  draft_state, draft_tokens, draft_probs = drafter.propose(
      s.draft_state, s.buffer, s.length, draft_rng, gamma=gamma,
      method=method)

  # One target call over the γ+1 positions ℓ..ℓ+γ.
  partial = drafter.may_stop_early  # Static: NO_GUESS slots may come back.
  if partial:
    logits, target_state = guesses.verify_call(
        target, s.buffer[rows, s.length], draft_tokens, s.target_state)
  else:
    chunk = jnp.concatenate([s.buffer[rows, s.length][:, None], draft_tokens],
                            axis=1)
    logits, target_state = target.decode_chunk(chunk, s.target_state)
  verdict = acceptance(accept_rng, logits, draft_tokens, draft_probs, method)
  num_accepted, next_token = verdict.num_accepted, verdict.next_token

  # Emit x_1..x_n then the extra token; stale guesses past it get overwritten
  # later or masked at the end.
  emitted = jnp.concatenate([draft_tokens, next_token[:, None]], axis=1)
  emitted = jnp.where(jnp.arange(gamma + 1)[None, :] == num_accepted[:, None],
                      next_token[:, None], emitted)
  active = jnp.logical_not(s.done)
  num_new, hit_eos = _truncate_at_eos(emitted, num_accepted + 1, eos_id)
  new_length = jnp.where(
      active, jnp.minimum(s.length + num_new, max_decode_length), s.length)
  # Finished rows write past their final length too: harmless, it is masked.
  buffer = jax.vmap(lambda row, new, start: lax.dynamic_update_slice(
      row, new, (start,)))(
          s.buffer, guesses.feedable(emitted) if partial else emitted,
          s.length + 1)
  done = s.done | (active & (hit_eos | (new_length >= max_decode_length)))

  stats = s.stats
  if stats is not None:
    stats = stats.update(
        active=active, draft_tokens=draft_tokens, verdict=verdict,
        beta=guess_beta(verdict, draft_tokens, draft_probs),
        num_kept=new_length - s.length,
        num_guesses=guesses.num_guesses(draft_tokens) if partial else None)

  return SpeculativeState(
      iteration=s.iteration + 1,
      # Rollback by index: both states keep only the accepted prefix.
      target_state=target.truncate(target_state, new_length),
      draft_state=drafter.rollback(draft_state, new_length),
      buffer=buffer, length=new_length, done=done, stats=stats)


def speculative_loop(target: Target, drafter: Drafter,
                     encoder_input_tokens: Array, rng: Array, eos_id: Array,
                     *, gamma: int, max_decode_length: int,
                     method: sampling.SamplingMethod,
                     acceptance: AcceptanceRule = ExactAcceptance(),
                     statistics: bool = True) -> SpeculativeOutput:
  """The traceable speculative loop: no argument checks, not jitted.

  For callers that compose it inside their own `jax.jit` (the benchmark,
  `jax.experimental.checkify.checkify` for cache-overflow checks);
  `speculative_sample` is the checked, jitted entry point.
  """
  state = init_speculative_state(target, drafter, encoder_input_tokens,
                                 gamma=gamma,
                                 max_decode_length=max_decode_length,
                                 statistics=statistics)

  def body(s):
    return speculative_iteration(
        target, drafter, acceptance, s, rng, eos_id, gamma=gamma,
        max_decode_length=max_decode_length, method=method)

  state = lax.while_loop(lambda s: jnp.logical_not(jnp.all(s.done)), body,
                         state)
  return SpeculativeOutput(
      tokens=_finish(state.buffer, state.length, max_decode_length),
      lengths=state.length, stats=state.stats)


_SPECULATIVE_STATIC = ("gamma", "max_decode_length", "method", "statistics")
_jit_speculative_loop = jax.jit(speculative_loop,
                                static_argnames=_SPECULATIVE_STATIC)
# XLA:CPU: per-program compiler options (`kernels.CPU_SPECULATIVE_COMPILER_
# OPTIONS` says why the speculative loop differs from the baseline's).
_jit_speculative_loop_cpu = jax.jit(
    speculative_loop, static_argnames=_SPECULATIVE_STATIC,
    compiler_options=kernels.CPU_SPECULATIVE_COMPILER_OPTIONS)


def _speculative_program():
  """The jitted speculative loop for the default backend."""
  return (_jit_speculative_loop_cpu if jax.default_backend() == "cpu"
          else _jit_speculative_loop)


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
  method = check_speculative_args(
      target, drafter, gamma=gamma, max_decode_length=max_decode_length,
      method=method, temperature=temperature, top_k=top_k, top_p=top_p,
      acceptance=acceptance)
  check_encoder_inputs(encoder_input_tokens, target.vocab_size)
  check_rng(rng)
  _check_eos_id(eos_id)
  if not isinstance(statistics, bool):
    raise ValueError(f"statistics must be True or False, got {statistics!r}.")
  return _speculative_program()(
      target, drafter, jnp.asarray(encoder_input_tokens, jnp.int32), rng,
      np.int32(eos_id), gamma=int(gamma),
      max_decode_length=int(max_decode_length), method=method,
      acceptance=ExactAcceptance() if acceptance is None else acceptance,
      statistics=statistics)
