"""Decode loops: the target alone, and speculative decoding (Algorithm 1).

Both are single jitted programs with no host round trip per token:

* `temperature_sample`: the walltime baseline, one target call per token in a
  `lax.while_loop` (the counterpart of T5X's `decoding.temperature_sample`).
* `speculative_sample`: an outer `lax.while_loop` over iterations; each runs
  the drafter (a T5 draft model runs γ steps in a `lax.fori_loop`), one target
  call over the γ+1 positions, Algorithm 1's accept step (`sampling`), and a
  rollback of both caches by setting their per-row lengths. At temperature 0
  everything works on argmax tokens: no [B, γ, V] probabilities are built.

Sequence bookkeeping, per row: `buffer[:, 0]` is the decoder start token (0)
and `buffer[:, t]` the t-th generated token. `length` n is the number of
generated tokens; the target's cache always holds positions 0..n-1, so the
next target input is `buffer[n]`. Rows finish on EOS or at
`max_decode_length` and are then frozen while the others go on.
"""
import abc
import functools
from typing import Any, Callable, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax import sampling
from specdec_jax.models.t5 import DecodeCache
from specdec_jax.models.t5 import T5Model

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
    target_calls: [B] int32 target decoder calls while the row was active.
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
    target_calls: [B] int32 target calls (= iterations) per row.
    accepted_histogram: [B, γ+1] int32; entry k counts the iterations of a
      row in which exactly k draft tokens were accepted.
    beta_sum, beta_count: [B] float32 / int32: Σ and count of
      β = Σ_x min(p(x), q(x)) over the draft positions whose context is a
      prefix of the output (Corollary 3.6's α estimate is their ratio).
    trace_draft_tokens: [B, max_decode_length, γ] int32 draft guesses of
      iteration i (row i of the trace; iterations past target_calls are 0).
    trace_num_accepted: [B, max_decode_length] int32 n of each iteration.
    trace_next_token: [B, max_decode_length] int32 the target-sampled token.
  """
  tokens: Array
  lengths: Array
  target_calls: Array
  accepted_histogram: Array
  beta_sum: Array
  beta_count: Array
  trace_draft_tokens: Array
  trace_num_accepted: Array
  trace_next_token: Array

  @property
  def gamma(self) -> int:
    return self.accepted_histogram.shape[-1] - 1

  @property
  def tokens_per_target_call(self) -> Array:
    """Mean generated tokens per target call over the batch (scalar)."""
    return jnp.sum(self.lengths) / jnp.maximum(jnp.sum(self.target_calls), 1)

  @property
  def alpha_hat(self) -> Array:
    """α̂ from acceptance counts: accepted / Bernoulli trials (scalar).

    An iteration with n accepted tokens ran min(n + 1, γ) acceptance trials
    (it stops at the first rejection), n of them successes.
    """
    hist = jnp.sum(self.accepted_histogram, axis=0)
    k = jnp.arange(hist.shape[0])
    successes = jnp.sum(k * hist)
    trials = jnp.sum(jnp.minimum(k + 1, self.gamma) * hist)
    return successes / jnp.maximum(trials, 1)

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
        "accepted_histogram": [
            int(x) for x in jnp.sum(self.accepted_histogram, axis=0)],
    }


# ---------------------------------------------------------------------------
# Argument checks (before any tracing or compilation).
# ---------------------------------------------------------------------------
def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def _check_encoder_inputs(encoder_input_tokens) -> None:
  shape = getattr(encoder_input_tokens, "shape", None)
  if shape is None or len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
    raise ValueError(
        "encoder_input_tokens must be a non-empty [batch, length] integer "
        f"array, got shape {shape}.")


# ---------------------------------------------------------------------------
# Drafters.
# ---------------------------------------------------------------------------
class Drafter(abc.ABC):
  """What the speculative loop needs from a draft: guesses and their q.

  Implementations are pytrees (`flax.struct.dataclass`) so they pass through
  `jax.jit`; their `state` is any pytree (a KV cache, an n-gram table, ...).
  A deterministic drafter returns one-hot `draft_probs`.
  """

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """The draft's vocabulary size (must equal the target's)."""

  @abc.abstractmethod
  def init(self, encoder_input_tokens: Array, max_len: int) -> Any:
    """State for a batch of inputs [B, S]; positions up to max_len - 1."""

  @abc.abstractmethod
  def propose(self, state: Any, buffer: Array, length: Array, rng: Array, *,
              gamma: int, temperature: float, top_k: int, top_p: float
              ) -> Tuple[Any, Array, Array]:
    """Guesses the γ tokens after buffer[:, :length+1].

    Args:
      state: the drafter's state.
      buffer: [B, T] int32 decoder tokens (start token at 0); the known
        sequence of row b is buffer[b, :length[b] + 1].
      length: [B] int32 number of generated tokens n.
      rng: PRNG key.
      gamma, temperature, top_k, top_p: static.

    Returns:
      (state, draft_tokens [B, γ] int32, draft_probs [B, γ, V] float32): the
      guesses and the standardized distributions q_1..q_γ they came from.
      At temperature 0 draft_probs may be None: the target is then one-hot
      and Algorithm 1 does not depend on q (`sampling.greedy_accept`).
    """

  @abc.abstractmethod
  def rollback(self, state: Any, length: Array) -> Any:
    """Forgets everything past n = length [B] generated tokens."""


@flax.struct.dataclass
class T5Drafter(Drafter):
  """A T5 draft model with its own encoder and KV cache.

  Cache invariant between iterations: positions 0..cache.length-1 hold the
  row's true prefix, and cache.length is n (after a rejection) or n - 1
  (after all γ were accepted: x_γ was guessed but never fed). When some row
  lags, the first draft step feeds a chunk of 2 tokens, buffer[d],
  buffer[d+1] at d = cache.length, and reads the logits of the last true
  one (for rows that did not lag the second slot is a placeholder that the
  next step, or the length mask, makes harmless); otherwise it feeds one.
  The remaining γ-1 steps feed one token each.
  """
  model: T5Model

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def init(self, encoder_input_tokens, max_len):
    return self.model.start(encoder_input_tokens, max_len)

  def propose(self, state: DecodeCache, buffer, length, rng, *, gamma,
              temperature, top_k, top_p):
    batch = buffer.shape[0]
    rows = jnp.arange(batch)
    # Step 1: catch up (1 or 2 new tokens) and guess x_1. The 2-token chunk
    # is only paid when some row lags: a K=2 call costs up to 2x a K=1 call
    # on compute-bound backends such as CPU.
    start = state.length

    def feed_two(state):
      chunk = jnp.stack([buffer[rows, start], buffer[rows, start + 1]],
                        axis=1)
      logits, state = self.model.decode_chunk(chunk, state)
      return logits[rows, jnp.clip(length - start, 0, 1)], state

    def feed_one(state):
      logits, state = self.model.decode_chunk(buffer[rows, start][:, None],
                                              state)
      return logits[:, 0], state

    logits, state = lax.cond(jnp.any(start < length), feed_two, feed_one,
                             state)
    state = state.replace(length=length + 1)
    rngs = jax.random.split(rng, gamma)
    greedy = temperature == 0.0

    def guess(logits, rng):
      """(x_i [B], q_i [B, V] or None) from the draft's logits [B, V]."""
      if greedy:  # q is one-hot and never needed (see `propose`).
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
      q = sampling.standardize(logits, temperature, top_k, top_p)
      return sampling.sample_from(rng, q), q

    token, q = guess(logits, rngs[0])
    draft_tokens = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(token)
    draft_probs = None if greedy else jnp.zeros(
        (batch, gamma, q.shape[-1]), jnp.float32).at[:, 0].set(q)

    # Steps 2..γ: feed x_{i-1}, guess x_i.
    def step(i, carry):
      state, draft_tokens, draft_probs = carry
      logits, state = self.model.decode_chunk(draft_tokens[:, i - 1, None],
                                              state)
      token, q = guess(logits[:, 0], rngs[i])
      if not greedy:
        draft_probs = draft_probs.at[:, i].set(q)
      return state, draft_tokens.at[:, i].set(token), draft_probs

    state, draft_tokens, draft_probs = lax.fori_loop(
        1, gamma, step, (state, draft_tokens, draft_probs))
    return state, draft_tokens, draft_probs

  def rollback(self, state: DecodeCache, length):
    return state.replace(length=jnp.minimum(state.length, length))


# ---------------------------------------------------------------------------
# Shared bookkeeping.
# ---------------------------------------------------------------------------
def _finish(buffer: Array, lengths: Array, max_decode_length: int) -> Array:
  """Generated tokens [B, max_decode_length], zero past each row's length."""
  tokens = buffer[:, 1:max_decode_length + 1]
  positions = jnp.arange(1, max_decode_length + 1)
  return jnp.where(positions[None, :] <= lengths[:, None], tokens, 0)


def _truncate_at_eos(window: Array, num_new: Array, eos_id: int
                     ) -> Tuple[Array, Array]:
  """Cuts a row's new tokens after its first EOS.

  Args:
    window: [B, W] the tokens just emitted (first num_new of each row valid).
    num_new: [B] number of valid tokens in the window.

  Returns:
    (num_kept [B], hit_eos [B] bool).
  """
  valid = jnp.arange(window.shape[1])[None, :] < num_new[:, None]
  is_eos = (window == eos_id) & valid
  hit_eos = jnp.any(is_eos, axis=1)
  first = jnp.argmax(is_eos, axis=1)
  return jnp.where(hit_eos, first + 1, num_new), hit_eos


# ---------------------------------------------------------------------------
# Baseline: the target alone.
# ---------------------------------------------------------------------------
@flax.struct.dataclass
class _BaselineState:
  """Loop state of `temperature_sample` (B rows, T = max_decode_length + 1)."""
  step: Array          # [] int32 loop counter.
  cache: DecodeCache   # target cache, length == n (frozen when done).
  buffer: Array        # [B, T] int32.
  length: Array        # [B] int32 n.
  done: Array          # [B] bool.
  target_calls: Array  # [B] int32.


@functools.partial(jax.jit, static_argnames=(
    "max_decode_length", "temperature", "top_k", "top_p"))
def _temperature_sample(target, encoder_input_tokens, rng, *,
                        max_decode_length, temperature, top_k, top_p, eos_id):
  batch = encoder_input_tokens.shape[0]
  rows = jnp.arange(batch)
  state = _BaselineState(
      step=jnp.array(0, jnp.int32),
      cache=target.start(encoder_input_tokens, max_decode_length + 1),
      buffer=jnp.zeros((batch, max_decode_length + 1), jnp.int32),
      length=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), bool),
      target_calls=jnp.zeros((batch,), jnp.int32))

  def cond(s):
    return jnp.logical_not(jnp.all(s.done))

  def body(s):
    logits, cache = target.decode_chunk(s.buffer[rows, s.length][:, None],
                                        s.cache)
    if temperature == 0.0:  # Same token as sampling the one-hot; cheaper.
      token = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
    else:
      probs = sampling.standardize(logits[:, 0], temperature, top_k, top_p)
      token = sampling.sample_from(jax.random.fold_in(rng, s.step), probs)
    active = jnp.logical_not(s.done)
    buffer = s.buffer.at[rows, s.length + 1].set(
        jnp.where(active, token, s.buffer[rows, s.length + 1]))
    length = jnp.where(active, s.length + 1, s.length)
    done = s.done | (token == eos_id) | (length >= max_decode_length)
    return _BaselineState(
        step=s.step + 1, cache=cache.replace(length=length), buffer=buffer,
        length=length, done=done,
        target_calls=s.target_calls + active.astype(jnp.int32))

  state = lax.while_loop(cond, body, state)
  return DecodeOutput(
      tokens=_finish(state.buffer, state.length, max_decode_length),
      lengths=state.length, target_calls=state.target_calls)


def temperature_sample(target: T5Model, encoder_input_tokens: Array,
                       rng: Array, *, max_decode_length: int,
                       temperature: float = 0.0, top_k: int = 0,
                       top_p: float = 1.0, eos_id: int = EOS_ID
                       ) -> DecodeOutput:
  """Samples from the target alone, one target call per token.

  Args:
    target: the target model and its params.
    encoder_input_tokens: [B, S] int32 inputs, 0-padded.
    rng: PRNG key (unused at temperature 0).
    max_decode_length: maximum generated tokens per row (>= 1).
    temperature, top_k, top_p: see `sampling.standardize`.
    eos_id: a row stops after emitting it (traced: changing it does not
      recompile; -1 never stops early).

  Returns:
    `DecodeOutput`.
  """
  _check_positive_int("max_decode_length", max_decode_length)
  sampling.validate_sampling_args(temperature, top_k, top_p)
  _check_encoder_inputs(encoder_input_tokens)
  return _temperature_sample(
      target, jnp.asarray(encoder_input_tokens, jnp.int32), rng,
      max_decode_length=max_decode_length, temperature=float(temperature),
      top_k=int(top_k), top_p=float(top_p),
      eos_id=np.int32(eos_id))


# ---------------------------------------------------------------------------
# Speculative decoding.
# ---------------------------------------------------------------------------
@flax.struct.dataclass
class _SpeculativeState:
  """Loop state of the speculative decoder (T = max_decode_length + γ + 2)."""
  iteration: Array      # [] int32.
  target_cache: DecodeCache  # holds positions 0..n-1.
  draft_state: Any      # the drafter's state.
  buffer: Array         # [B, T] int32 tokens (start token at 0).
  length: Array         # [B] int32 n.
  done: Array           # [B] bool.
  target_calls: Array   # [B] int32.
  histogram: Array      # [B, γ+1] int32.
  beta_sum: Array       # [B] float32.
  beta_count: Array     # [B] int32.
  trace_draft: Array    # [B, max_decode_length, γ] int32.
  trace_accepted: Array  # [B, max_decode_length] int32.
  trace_next: Array     # [B, max_decode_length] int32.


def speculative_iteration(target: T5Model, drafter: Drafter,
                          s: _SpeculativeState, rng: Array, *, gamma: int,
                          max_decode_length: int, temperature: float,
                          top_k: int, top_p: float, eos_id: int,
                          synthetic_acceptance: Optional[Callable] = None
                          ) -> _SpeculativeState:
  """One iteration of Algorithm 1 for every row of the batch.

  `synthetic_acceptance` is for timing only (`benchmarking`): a function
  (rng, shape [B, γ]) -> bool [B, γ] whose leading Trues replace the number
  of accepted guesses, so the loop runs at a chosen α. The output is then
  NOT the target's distribution.
  """
  batch = s.buffer.shape[0]
  rows = jnp.arange(batch)
  draft_rng, accept_rng = jax.random.split(jax.random.fold_in(rng,
                                                              s.iteration))
  n = s.length
  draft_state, draft_tokens, draft_probs = drafter.propose(
      s.draft_state, s.buffer, n, draft_rng, gamma=gamma,
      temperature=temperature, top_k=top_k, top_p=top_p)

  # One target call over the γ+1 positions n..n+γ.
  chunk = jnp.concatenate([s.buffer[rows, n][:, None], draft_tokens], axis=1)
  logits, target_cache = target.decode_chunk(chunk, s.target_cache)
  if temperature == 0.0:
    # One-hot p and q: argmax tokens only, no [B, γ+1, V] probabilities.
    target_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    num_accepted, next_token = sampling.greedy_accept(target_tokens,
                                                      draft_tokens)
    # Σ min(p, q) of two one-hots.
    beta = (target_tokens[:, :gamma] == draft_tokens).astype(jnp.float32)
  else:
    target_probs = sampling.standardize(logits, temperature, top_k, top_p)
    num_accepted, next_token = sampling.speculative_accept(
        accept_rng, target_probs, draft_probs, draft_tokens)
    beta = sampling.acceptance_beta(target_probs[:, :gamma], draft_probs)
  if synthetic_acceptance is not None:
    # Timing only: n at a chosen α. The extra token is still computed (its
    # cost is real), at the exact n; its value does not matter here.
    num_accepted = sampling.leading_accepted(
        synthetic_acceptance(accept_rng, draft_tokens.shape))

  # Emit x_1..x_n then the extra token; stale guesses past it get overwritten
  # later or masked at the end.
  emitted = jnp.concatenate([draft_tokens, next_token[:, None]], axis=1)
  emitted = jnp.where(jnp.arange(gamma + 1)[None, :] == num_accepted[:, None],
                      next_token[:, None], emitted)
  active = jnp.logical_not(s.done)
  num_new, hit_eos = _truncate_at_eos(emitted, num_accepted + 1, eos_id)
  new_length = jnp.minimum(n + num_new, max_decode_length)
  new_length = jnp.where(active, new_length, n)
  # Finished rows write past their final length too: harmless, it is masked.
  buffer = jax.vmap(lambda row, new, start: lax.dynamic_update_slice(
      row, new, (start,)))(s.buffer, emitted, n + 1)
  done = s.done | (active & (hit_eos | (new_length >= max_decode_length)))

  # Statistics over active rows.
  act = active.astype(jnp.int32)
  histogram = s.histogram.at[rows, num_accepted].add(act)
  visited = (jnp.arange(gamma)[None, :] <= num_accepted[:, None]) & active[
      :, None]  # positions 1..min(n+1, γ): their context is on the output.
  slot = jnp.minimum(s.target_calls, max_decode_length - 1)
  trace_draft = s.trace_draft.at[rows, slot].set(
      jnp.where(active[:, None], draft_tokens, s.trace_draft[rows, slot]))
  trace_accepted = s.trace_accepted.at[rows, slot].set(
      jnp.where(active, num_accepted, s.trace_accepted[rows, slot]))
  trace_next = s.trace_next.at[rows, slot].set(
      jnp.where(active, next_token, s.trace_next[rows, slot]))

  return _SpeculativeState(
      iteration=s.iteration + 1,
      # Rollback by index: both caches keep only the accepted prefix.
      target_cache=target_cache.replace(length=new_length),
      draft_state=drafter.rollback(draft_state, new_length),
      buffer=buffer, length=new_length, done=done,
      target_calls=s.target_calls + act, histogram=histogram,
      beta_sum=s.beta_sum + jnp.sum(jnp.where(visited, beta, 0.0), axis=1),
      beta_count=s.beta_count + jnp.sum(visited, axis=1, dtype=jnp.int32),
      trace_draft=trace_draft, trace_accepted=trace_accepted,
      trace_next=trace_next)


def init_speculative_state(target: T5Model, drafter: Drafter,
                           encoder_input_tokens: Array, *, gamma: int,
                           max_decode_length: int) -> _SpeculativeState:
  """Encodes the inputs with both models and allocates the loop state."""
  batch = encoder_input_tokens.shape[0]
  # Chunks reach position n + γ with n < max_decode_length; frozen rows may
  # go one further. One slack slot keeps writes inside the buffers.
  cache_len = max_decode_length + gamma + 1
  zeros = lambda *shape: jnp.zeros(shape, jnp.int32)  # pylint: disable=unnecessary-lambda-assignment
  return _SpeculativeState(
      iteration=jnp.array(0, jnp.int32),
      target_cache=target.start(encoder_input_tokens, cache_len),
      draft_state=drafter.init(encoder_input_tokens, cache_len),
      buffer=zeros(batch, cache_len + 1),
      length=zeros(batch), done=jnp.zeros((batch,), bool),
      target_calls=zeros(batch), histogram=zeros(batch, gamma + 1),
      beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=zeros(batch),
      trace_draft=zeros(batch, max_decode_length, gamma),
      trace_accepted=zeros(batch, max_decode_length),
      trace_next=zeros(batch, max_decode_length))


def _speculative_loop(target, drafter, encoder_input_tokens, rng, *, gamma,
                      max_decode_length, temperature, top_k, top_p, eos_id,
                      synthetic_acceptance=None):
  state = init_speculative_state(target, drafter, encoder_input_tokens,
                                 gamma=gamma,
                                 max_decode_length=max_decode_length)
  iteration = functools.partial(
      speculative_iteration, target, drafter, rng=rng, gamma=gamma,
      max_decode_length=max_decode_length, temperature=temperature,
      top_k=top_k, top_p=top_p, eos_id=eos_id,
      synthetic_acceptance=synthetic_acceptance)
  state = lax.while_loop(lambda s: jnp.logical_not(jnp.all(s.done)),
                         iteration, state)
  return SpeculativeOutput(
      tokens=_finish(state.buffer, state.length, max_decode_length),
      lengths=state.length, target_calls=state.target_calls,
      accepted_histogram=state.histogram, beta_sum=state.beta_sum,
      beta_count=state.beta_count, trace_draft_tokens=state.trace_draft,
      trace_num_accepted=state.trace_accepted,
      trace_next_token=state.trace_next)


_jit_speculative_loop = jax.jit(
    _speculative_loop,
    static_argnames=("gamma", "max_decode_length", "temperature", "top_k",
                     "top_p"))


def check_speculative_args(target, drafter, *, gamma, max_decode_length,
                           temperature, top_k, top_p) -> None:
  """All argument checks of `speculative_sample`; raises ValueError."""
  _check_positive_int("gamma", gamma)
  _check_positive_int("max_decode_length", max_decode_length)
  sampling.validate_sampling_args(temperature, top_k, top_p)
  if not isinstance(drafter, Drafter):
    raise ValueError(
        f"drafter must be a specdec_jax.decoding.Drafter (e.g. T5Drafter), "
        f"got {type(drafter).__name__}.")
  if drafter.vocab_size != target.vocab_size:
    raise ValueError(
        f"draft vocab_size ({drafter.vocab_size}) must equal the target's "
        f"vocab_size ({target.vocab_size}): speculative decoding compares "
        "their distributions token by token.")


def speculative_sample(target: T5Model, drafter: Drafter,
                       encoder_input_tokens: Array, rng: Array, *, gamma: int,
                       max_decode_length: int, temperature: float = 0.0,
                       top_k: int = 0, top_p: float = 1.0,
                       eos_id: int = EOS_ID) -> SpeculativeOutput:
  """Speculative decoding: exactly the target's output distribution.

  Args:
    target: the target model and its params (`T5Model`).
    drafter: a `Drafter` (e.g. `T5Drafter(T5Model(draft_config, params))`);
      a `T5Model` is wrapped in `T5Drafter` for convenience.
    encoder_input_tokens: [B, S] int32 inputs, 0-padded.
    rng: PRNG key.
    gamma: number of draft guesses per target call (static, >= 1).
    max_decode_length: maximum generated tokens per row (>= 1).
    temperature, top_k, top_p: applied identically to target and draft
      (`sampling.standardize`); temperature 0 is greedy and then the output is
      token-identical to `temperature_sample` with the same target.
    eos_id: a row stops after emitting it.

  Returns:
    `SpeculativeOutput` with tokens and Algorithm 1's statistics.
  """
  if isinstance(drafter, T5Model):
    drafter = T5Drafter(drafter)
  check_speculative_args(target, drafter, gamma=gamma,
                         max_decode_length=max_decode_length,
                         temperature=temperature, top_k=top_k, top_p=top_p)
  _check_encoder_inputs(encoder_input_tokens)
  return _jit_speculative_loop(
      target, drafter, jnp.asarray(encoder_input_tokens, jnp.int32), rng,
      gamma=gamma, max_decode_length=max_decode_length,
      temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
      eos_id=np.int32(eos_id))
