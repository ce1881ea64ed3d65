"""Speculative beam search: the target's own beam search, fewer target calls.

The paper's Appendix A.4, made exact. Each iteration (one target call):

1. **Draft.** The draft model runs a beam search of width u >= k for γ
   steps from the target's k live beams (their log-probabilities as initial
   scores): a plain top-u over u×V candidates that never keeps an EOS (an
   EOS candidate of the target is finished, never extended, and is scored
   from its parent's logits). Its beams at all γ depths form a tree of γ·u
   nodes (`beam_candidates.DraftTree`).
2. **Rows.** R candidate sequences (`num_rows`), each a live beam followed
   by a node's draft tokens: first, for every live beam, its best leaf (or
   the beam alone if no draft beam descends from it), so that every live
   beam is scored; then leaves covering whole depths first
   (`beam_candidates`), since a target step needs all of its live beams.
3. **Verify.** One target call over the R rows × γ+1 positions, each row
   with a copy of its live beam's target state: offset j of a row holds the
   target's next-token logits after the live beam and the row's first j
   draft tokens (a "scored" prefix).
4. **Replay.** The target's step (`beam_search.top_candidates` and
   `step_from_candidates`, what the baseline's `beam_step` runs) is applied
   step by step, per batch element. Step j needs the logits of the live
   beams: a beam is scored when its whole sequence equals a row's prefix of
   offset j; an unscored beam is allowed only below the step's 2k-th
   candidate (`_step_is_scored`). The element goes on while that holds and
   while its search goes on (`beam_search.elements_alive`). Step 0 is always
   scored, so each element still searching advances 1 to γ+1 steps.
5. **Reorder, roll back.** A new live beam's target state is the state of
   the row that scored its parent, truncated to the new length (rollback by
   index); its draft state is its root's (the live beam it descends from,
   which shares its positions up to the old step), and the draft re-reads
   the rest in one chunk next iteration (`beam_candidates.run_draft`).

**Why identical to the baseline.** The beams after a step depend only on
the beams before it and the live beams' next-token logits (the same pure
functions in both searches), and each element stops exactly where the
baseline's search of it ends. A replayed step is fed, for each live beam,
the logits the target computed for exactly that beam's token sequence (the
match compares the whole sequence, start token to last), from a state
holding exactly that sequence's keys and values, or leaves out a beam none
of whose candidates can be in the step's top 2k. So each replayed step is
the baseline's step on the same inputs, whatever the draft proposed; the
draft only decides how many steps one call covers. The only difference is
floating-point: the target's logits for a position come from a chunk of γ+1
positions instead of one, equal to float32 rounding (as for every
speculative decoder in this package, `docs/design/exactness.md`).

Batch elements advance independently (one step counter each), while T5X
steps all of them until all have stopped: the same beams, since an element
whose search ended can no longer change its finished beams (this needs
V >= 2k, so that live beams are never NEG_INF fillers after step 0;
`speculative_beam_search` checks it).
"""
import dataclasses
from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax.core import carried_while
from specdec_jax.core import kernels
from specdec_jax.core import structs
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding.beam_search import Beams
from specdec_jax.core.decoding.beam_search import beam_rows
from specdec_jax.core.decoding.beam_search import gather_rows
from specdec_jax.core.decoding.beam_candidates import candidate_rows
from specdec_jax.core.decoding.beam_candidates import per_beam
from specdec_jax.core.decoding.beam_candidates import run_draft
from specdec_jax.core.decoding.checks import check_encoder_inputs
from specdec_jax.core.decoding.checks import check_eos_id
from specdec_jax.core.decoding.checks import check_target
from specdec_jax.core.decoding.programs import LoopProgram
from specdec_jax.core.decoding.checks import check_vocab_sizes
from specdec_jax.core.drafters.model import start_model
from specdec_jax.core.protocols import Target
from specdec_jax.core.protocols import target_encoder_output

Array = jax.Array


@structs.dataclass
class SpeculativeBeamOutput:
  """Result of `speculative_beam_search`.

  Attributes:
    tokens, scores: as `beam_search.BeamOutput` (identical values).
    steps: [B] int32 steps taken by each batch element (the baseline's
      `steps` is their maximum: it steps all elements until all stop).
    calls: [] int32 target calls (iterations).
    steps_per_call: [γ + 2] int32 histogram over (call, element still
      searching): entry m counts those that advanced m steps (m >= 1).
    element_calls: [B] int32 target calls while each element was searching.
    trace_steps: [B, max_decode_len] int32; entry i is the steps the
      element's (i+1)-th call advanced it (1 to γ+1); -1 after its last
      call (`element_calls`).
  """
  tokens: Array
  scores: Array
  steps: Array
  calls: Array
  steps_per_call: Array
  element_calls: Array
  trace_steps: Array

  @property
  def best(self) -> Array:
    """[B, max_decode_len] int32 the best beam of each batch element."""
    return self.tokens[:, -1]

  @property
  def mean_steps_per_call(self) -> Array:
    """[] float32 steps per target call of a batch element searching."""
    counts = self.steps_per_call
    return (jnp.sum(counts * jnp.arange(counts.shape[0])) /
            jnp.maximum(jnp.sum(counts), 1))


@structs.dataclass
class _LoopState:
  """The speculative search between iterations (B elements, k beams).

  Attributes:
    beams: the target's beams after `beams.step` steps.
    target_state: B*k rows (row b*k + i: live beam i of element b), holding
      positions 0..step-1 of the beam.
    draft_state: B*k rows likewise, holding positions 0..draft_known-1.
    draft_known: [B] int32 positions the draft state holds (<= step).
    calls: [] int32 target calls so far.
    steps_per_call: [γ + 2] int32 histogram of steps per call.
    element_calls: [B] int32 calls while each element was searching.
    trace_steps: [B, L] int32 steps of each element's calls, -1 after.
  """
  beams: Beams
  target_state: Any
  draft_state: Any
  draft_known: Array
  calls: Array
  steps_per_call: Array
  element_calls: Array
  trace_steps: Array


def _row_sequences(beams: Beams, parent: Array, tokens: Array,
                   gamma: int) -> Array:
  """[B, u, T + γ] int32: each row's whole sequence (parent, then tokens).

  Args:
    beams: the live beams.
    parent: [B, u] the live beam of each row.
    tokens: [B, u, γ] the draft tokens after it.
  """
  seqs = jnp.take_along_axis(beams.live_seqs, parent[:, :, None], axis=1)
  seqs = jnp.pad(seqs, ((0, 0), (0, 0), (0, gamma)))
  # Draft token i goes to position step + 1 + i of its element.
  offset = jnp.arange(seqs.shape[2]) - (beams.step[:, None] + 1)  # [B, T']
  drafted = (offset >= 0) & (offset < gamma)
  placed = jnp.take_along_axis(
      tokens,
      jnp.broadcast_to(jnp.clip(offset, 0, gamma - 1)[:, None], seqs.shape),
      axis=2)
  return jnp.where(drafted[:, None, :], placed, seqs)


def _verify(target: Target, target_state: Any, beams: Beams, parent: Array,
            tokens: Array) -> Tuple[Array, Any]:
  """One target call over the candidate rows.

  Args:
    target_state: B*k rows, the live beams' states (positions < step).
    parent: [B, u] the live beam of each row.
    tokens: [B, u, γ] the draft tokens of each row.

  Returns:
    (logits [B, u, γ+1, V] float32: offset j holds the target's next-token
    logits after the row's parent and its first j draft tokens; the rows'
    target state, B*u rows holding positions < step + γ + 1).
  """
  batch, u, gamma = tokens.shape
  k = beams.live_seqs.shape[1]
  last = jnp.take_along_axis(beams.live_seqs, beams.step[:, None, None],
                             axis=2)[:, :, 0]
  last = jnp.take_along_axis(last, parent, axis=1)
  chunk = jnp.concatenate([last[:, :, None], tokens], axis=2)
  state = gather_rows(target_state, beam_rows(parent, k))
  logits, state = target.decode_chunk(chunk.reshape(batch * u, gamma + 1),
                                      state)
  return logits.reshape(batch, u, gamma + 1, -1).astype(jnp.float32), state


def _match(beams: Beams, row_seqs: Array, depth: Array,
           offset: Array) -> Tuple[Array, Array]:
  """Which row scored each live beam's whole sequence at `offset`.

  Args:
    beams: live beams after `offset` replayed steps (sequences at positions
      0..beams.step).
    row_seqs: [B, u, T + γ] the rows' sequences.
    depth: [B, u] int32 the deepest offset each row's logits are valid for.
    offset: [] int32 j.

  Returns:
    (found [B, k] bool, row [B, k] int32, meaningful where found).
  """
  gamma = row_seqs.shape[2] - beams.live_seqs.shape[2]
  live = jnp.pad(beams.live_seqs, ((0, 0), (0, 0), (0, gamma)))
  prefix = jnp.arange(row_seqs.shape[2]) <= beams.step[:, None]  # [B, T']
  same = (live[:, :, None, :] == row_seqs[:,
                                          None, :, :]) | ~prefix[:, None, None]
  equal = jnp.all(same, axis=3) & (offset <= depth)[:, None, :]
  return jnp.any(equal, axis=2), jnp.argmax(equal, axis=2)


def _step_is_scored(beams: Beams, found: Array, values: Array) -> Array:
  """[B] bool: whether a step computed from the scored beams is exact.

  Args:
    beams: the live beams before the step.
    found: [B, k] bool, the beams whose logits the target computed.
    values: [B, 2k] the step's top candidates over those beams.

  An unscored beam is harmless when its log-probability is below the 2k-th
  candidate: none of its own candidates (its log-probability plus a
  log-probability <= 0) could have been among the 2k, so the step's
  candidates, and hence its beams, are the full step's.
  """
  return jnp.all(found | (beams.live_logprobs < values[:, -1:]), axis=1)


def _select(ok: Array, new: Any, old: Any) -> Any:
  """Per batch element: `new` where ok [B], else `old` (leaves [B, ...])."""
  return jax.tree_util.tree_map(
      lambda n, o: jnp.where(ok.reshape((-1,) + (1,) * (n.ndim - 1)), n, o),
      new, old)


def _replay(beams: Beams, logits: Array, row_seqs: Array, depth: Array,
            alpha: Array, eos_id: Array,
            max_decode_len: int) -> Tuple[Beams, Array, Array]:
  """The target's beam steps over the scored rows, while they are scored.

  Each batch element goes on until a step of its own is not scored or its
  own search ends (`beam_search.elements_alive`).

  Returns:
    (beams after m steps, m [B] int32 >= 1 for each element that was alive,
    row [B, k] int32: the row that scored each new live beam's parent).
  """
  batch, k = beams.live_logprobs.shape
  gamma = logits.shape[2] - 1

  def cond(carry):
    _, offset, _, going, _ = carry
    return jnp.any(going) & (offset <= gamma)

  def body(carry):
    beams, offset, row, going, steps = carry
    found, match = _match(beams, row_seqs, depth, offset)
    scored = jnp.take_along_axis(logits, match[:, :, None, None], axis=1)
    scored = lax.dynamic_index_in_dim(scored, offset, axis=2, keepdims=False)
    values, indices = beam_search.top_candidates(beams, scored, found)
    ok = (going & beam_search.elements_alive(beams, alpha, max_decode_len) &
          _step_is_scored(beams, found, values))
    stepped, parents = beam_search.step_from_candidates(beams, values, indices,
                                                        logits.shape[3], alpha,
                                                        eos_id)
    beams = _select(ok, stepped, beams)
    row = _select(ok, jnp.take_along_axis(match, parents, axis=1), row)
    return beams, offset + 1, row, ok, steps + ok.astype(jnp.int32)

  zeros = jnp.zeros((batch,), jnp.int32)
  beams, _, row, _, steps = carried_while.while_loop(
      cond, body, (beams, jnp.zeros(
          (), jnp.int32), jnp.zeros(
              (batch, k), jnp.int32), jnp.ones((batch,), bool), zeros))
  return beams, steps, row


def _iteration(target: Target, draft: Target, state: _LoopState, alpha: Array,
               eos_id: Array, *, width: int, gamma: int, num_rows: int,
               max_decode_len: int) -> _LoopState:
  """One draft beam search, one target call, the replay and the reorder."""
  beams = state.beams
  k = beams.live_logprobs.shape[1]
  tree, root_state = run_draft(draft, state.draft_state, state.draft_known,
                               beams, width=width, gamma=gamma, eos_id=eos_id)
  parent, tokens, depth = candidate_rows(tree, k, num_rows)
  logits, rows_state = _verify(target, state.target_state, beams, parent,
                               tokens)
  row_seqs = _row_sequences(beams, parent, tokens, gamma)
  new_beams, steps, row = _replay(beams, logits, row_seqs, depth, alpha, eos_id,
                                  max_decode_len)
  # A new beam's target state: the row that scored its parent (positions
  # up to the parent's last), rolled back to the new length. Its draft
  # state: its root's (positions up to the old step, which it shares).
  # (An element that had stopped takes no step and keeps garbage states:
  # it never steps again.)
  target_state = gather_rows(rows_state, beam_rows(row, num_rows))
  target_state = target.truncate(target_state, per_beam(new_beams.step, k))
  roots = jnp.take_along_axis(parent, row, axis=1)
  alive = beam_search.elements_alive(beams, alpha, max_decode_len)
  histogram = state.steps_per_call.at[steps].add(alive.astype(jnp.int32))
  return _LoopState(beams=new_beams, target_state=target_state,
                    draft_state=gather_rows(root_state, beam_rows(roots, k)),
                    draft_known=beams.step + 1, calls=state.calls + 1,
                    steps_per_call=histogram, **_traced(state, alive, steps))


def _traced(state: _LoopState, alive: Array, steps: Array) -> dict:
  """The per-element call counts and trace after a call that advanced each
  element alive [B] by steps [B] (an element advances at least one step a
  call, so it makes at most L calls and its trace has room)."""
  batch, length = state.trace_steps.shape
  column = jnp.minimum(state.element_calls, length - 1)
  rows = jnp.arange(batch)
  old = state.trace_steps[rows, column]
  trace = state.trace_steps.at[rows, column].set(jnp.where(alive, steps, old))
  return dict(element_calls=state.element_calls + alive.astype(jnp.int32),
              trace_steps=trace)


def speculative_beam_loop(target: Target, draft: Target,
                          encoder_input_tokens: Array, alpha: Array,
                          eos_id: Array, *, beam_size: int, width: int,
                          gamma: int, num_rows: int,
                          max_decode_len: int) -> SpeculativeBeamOutput:
  """`speculative_beam_search` unchecked and unjitted."""
  batch = encoder_input_tokens.shape[0]
  # Room for a verification chunk of γ+1 positions at any step <= L (an
  # element that has stopped is still fed, and ignored).
  max_len = max_decode_len + gamma + 1
  target_state = target.start(encoder_input_tokens, max_len)
  draft_state = start_model(draft, encoder_input_tokens, max_len,
                            target_encoder_output(target, target_state))
  copies = jnp.repeat(jnp.arange(batch), beam_size)
  start = jnp.asarray(target.start_token(encoder_input_tokens), jnp.int32)
  # One step counter per batch element.
  beams = beam_search.init_beams(start, beam_size, max_decode_len)
  beams = dataclasses.replace(beams, step=jnp.zeros((batch,), jnp.int32))
  state = _LoopState(
      beams=beams, target_state=gather_rows(target_state, copies),
      draft_state=gather_rows(draft_state, copies), draft_known=jnp.zeros(
          (batch,), jnp.int32), calls=jnp.zeros(
              (), jnp.int32), steps_per_call=jnp.zeros((gamma + 2,), jnp.int32),
      element_calls=jnp.zeros((batch,), jnp.int32), trace_steps=jnp.full(
          (batch, max_decode_len), -1, jnp.int32))

  def alive(state):
    return jnp.any(
        beam_search.elements_alive(state.beams, alpha, max_decode_len))

  def iteration(state):
    return _iteration(target, draft, state, alpha, eos_id, width=width,
                      gamma=gamma, num_rows=num_rows,
                      max_decode_len=max_decode_len)

  state = carried_while.while_loop(alive, iteration, state)
  tokens, scores = beam_search.final_beams(state.beams)
  return SpeculativeBeamOutput(tokens=tokens, scores=scores,
                               steps=state.beams.step, calls=state.calls,
                               steps_per_call=state.steps_per_call,
                               element_calls=state.element_calls,
                               trace_steps=state.trace_steps)


# XLA:CPU copy insertion by region analysis (`kernels`): 176 -> 45 KB of
# copies per iteration on the tiny test pair; other backends compile
# without it.
SPECULATIVE_BEAM_LOOP_PROGRAM = LoopProgram(
    speculative_beam_loop,
    ("beam_size", "width", "gamma", "num_rows", "max_decode_len"),
    kernels.CPU_IN_PLACE_COMPILER_OPTIONS)


def _check_int(name: str, value: Any, low: int, high: int, what: str) -> None:
  is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  if not is_int or not low <= value <= high:
    raise ValueError(f"{name} must be an integer in [{low}, {high}] ({what}), "
                     f"got {value!r}.")


def check_speculative_beam_settings(*, beam_size: int, width: Any, gamma: Any,
                                    num_rows: Any) -> None:
  """γ >= 1, k <= u, k <= num_rows <= γ·u + k; ValueError naming it."""
  _check_int("gamma", gamma, 1, 1 << 20, "draft beam steps per target call")
  _check_int("width", width, beam_size, 1 << 20,
             f"u, the draft's beam width, at least beam_size k = {beam_size}")
  most = gamma * width + beam_size
  _check_int(
      "num_rows", num_rows, beam_size, most,
      "rows of the target call: one per beam at least, one per draft "
      "beam and beam at most, gamma * width + beam_size")


def speculative_beam_search(
    target: Target, draft: Target, encoder_input_tokens: Any, *, beam_size: int,
    max_decode_len: int, gamma: int, width: Any = None, num_rows: Any = None,
    alpha: float = 0.6,
    eos_id: int = beam_search.EOS_ID) -> SpeculativeBeamOutput:
  """Beam search identical to `beam_search.beam_search`, with a draft model.

  Args:
    target: the target model (`Target`, e.g. `models.T5Model`).
    draft: the draft model (a `Target` too: `models.T5Model`, or a
      `SharedEncoderModel` reading the target's encoder output).
    encoder_input_tokens: [B, S] integer ids, 0-padded.
    beam_size: k, the target's beams.
    max_decode_len: the most tokens per beam.
    gamma: γ, the draft's beam steps per target call (up to γ+1 target
      steps per call).
    width: u >= k, the draft's beam width (default k).
    num_rows: R, the candidate sequences the target scores per call, in
      [k, γ·u + k] (default 2u): more rows cover more of the draft's
      beams (more steps per call) at a higher cost per call.
    alpha: the brevity penalty's exponent (traced).
    eos_id: the end-of-sequence token (traced).

  Returns:
    `SpeculativeBeamOutput`: the baseline's beams and scores, with the
    number of target calls and steps per call.

  Raises:
    ValueError naming the bad argument, before anything is compiled.
  """
  width = beam_size if width is None else width
  beam_search.check_beam_settings(beam_size=beam_size, alpha=alpha,
                                  max_decode_len=max_decode_len)
  if num_rows is None and isinstance(gamma, int) and isinstance(width, int):
    num_rows = 2 * width
  check_speculative_beam_settings(beam_size=beam_size, width=width, gamma=gamma,
                                  num_rows=num_rows)
  check_target(target)
  check_target(draft)
  check_vocab_sizes(target.vocab_size, draft.vocab_size)
  if target.vocab_size < 2 * beam_size:
    raise ValueError(
        f"beam_size ({beam_size}) must be at most vocab_size / 2 "
        f"({target.vocab_size} / 2): each batch element stops on its own, "
        "which equals T5X's joint stopping when k live beams always have 2k "
        "real candidates.")
  check_encoder_inputs(encoder_input_tokens, target.vocab_size)
  check_eos_id(eos_id)
  return SPECULATIVE_BEAM_LOOP_PROGRAM(
      target, draft, jnp.asarray(encoder_input_tokens, jnp.int32),
      np.float32(alpha), np.int32(eos_id), beam_size=int(beam_size),
      width=int(width), gamma=int(gamma), num_rows=int(num_rows),
      max_decode_len=int(max_decode_len))
