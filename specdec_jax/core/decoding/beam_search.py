"""Beam search over a `Target`, step for step T5X's `decoding.beam_search`.

The search keeps, per batch element, k live beams (not yet ended by EOS)
and k finished beams, as T5X does:

* each step scores every live beam's next token, takes the top 2k of the
  k×V candidates (sum of log-probabilities; `lax.top_k`, so ties go to the
  lower flat index beam*V + token), keeps the best k that did not end in
  EOS as the new live beams, and merges those that did, scored by
  log-probability / brevity_penalty(α, length), into the k finished ones;
* live and finished beams are kept in increasing order (best LAST), as T5X
  flips its top-k indices: the order decides later ties;
* the search stops at `max_decode_len` steps or when no live beam can still
  beat the worst finished one (T5X's `beam_search_loop_cond_fn`, with its
  default `min_log_prob`); a batch element with no finished beam at the end
  returns its live beams and their raw log-probabilities.

The steps are pure functions of the beams and the target's logits
(`beam_step` = `top_candidates` then `step_from_candidates`; `beams_alive`):
the baseline below feeds them one target call per step, and
`speculative_beam` feeds them logits from a verification call over draft
candidates; the same functions deciding both is what makes the speculative
search identical to this one.

The target's state is reordered by beam with `gather_rows` (T5X's
`cache_gather_beams`): every leaf of the state has the B*k rows on its
leading axis (row b*k + i is beam i of batch element b).

One T5X quirk is not reproduced: T5X left-aligns its outputs after
prefilling an (empty) prompt, so a beam whose first generated tokens are 0
(padding) comes back shifted left; here tokens are returned where they
were generated.
"""
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax.core import carried_while
from specdec_jax.core import structs
from specdec_jax.core.decoding.checks import check_encoder_inputs
from specdec_jax.core.decoding.checks import check_eos_id
from specdec_jax.core.decoding.checks import check_target
from specdec_jax.core.decoding.programs import LoopProgram
from specdec_jax.core.protocols import Target

Array = jax.Array

# T5X's `decoding.NEG_INF`: a finite "minus infinity" (one-hot gathers and
# sums of it stay finite).
NEG_INF = -1.0e7
EOS_ID = 1


def brevity_penalty(alpha: Any, length: Any) -> Array:
  """T5X's length penalty ((5 + length) / 6) ** α, float32.

  Args:
    alpha: [] α >= 0 (0: no penalty).
    length: int or int32 array of sequence lengths.
  """
  return jnp.power((5.0 + jnp.asarray(length)) / 6.0,
                   jnp.asarray(alpha, jnp.float32))


def gather_rows(state: Any, rows: Array) -> Any:
  """Every leaf of `state` gathered along its leading (row) axis.

  The reordering of caches by beam (T5X's `cache_gather_beams`), and the
  copying of a beam's state into several rows.

  Args:
    state: a pytree whose array leaves all have the same leading size R.
    rows: [R'] int32 indices in [0, R).

  Returns:
    The state with R' rows: row r' is row rows[r'] of `state`.
  """
  leaves = jax.tree_util.tree_leaves(state)
  sizes = {leaf.shape[0] for leaf in leaves if jnp.ndim(leaf) > 0}
  if len(sizes) != 1 or any(jnp.ndim(leaf) == 0 for leaf in leaves):
    raise ValueError(
        "gather_rows: every leaf of the state must have the rows on its "
        f"leading axis; got leading sizes {sorted(sizes)} (and scalars: "
        f"{any(jnp.ndim(leaf) == 0 for leaf in leaves)}).")
  return jax.tree_util.tree_map(lambda leaf: jnp.take(leaf, rows, axis=0),
                                state)


def beam_rows(indices: Array, width: int) -> Array:
  """[B, n] indices in [0, width) -> [B*n] rows b*width + indices[b]."""
  batch = indices.shape[0]
  return (jnp.arange(batch)[:, None] * width + indices).reshape(-1)


@structs.dataclass
class Beams:
  """The beams of a search after `step` steps (T5X's `BeamState` without
  its cache; the target's state is kept beside it).

  B batch elements, k beams each, T = max_decode_len + 1 positions.

  Attributes:
    step: [] int32 steps taken (T5X's cur_index): live beams hold tokens at
      positions 0..step; the target state holds positions 0..step-1.
    live_logprobs: [B, k] float32 log-probabilities of the live beams,
      increasing (best last); NEG_INF-ish for filler beams.
    finished_scores: [B, k] float32 brevity-penalized scores of finished
      beams, increasing; NEG_INF for empty slots.
    live_seqs: [B, k, T] int32 live sequences, start token at position 0.
    finished_seqs: [B, k, T] int32 finished sequences (EOS included).
    finished_flags: [B, k] bool, True where a finished slot is occupied.
  """
  step: Array
  live_logprobs: Array
  finished_scores: Array
  live_seqs: Array
  finished_seqs: Array
  finished_flags: Array


def init_beams(start_tokens: Array, beam_size: int,
               max_decode_len: int) -> Beams:
  """The beams before the first step (T5X's `beam_init`).

  Args:
    start_tokens: [B] int32 token at position 0 (T5: 0).
    beam_size: k.
    max_decode_len: the most tokens a beam generates.
  """
  batch = start_tokens.shape[0]
  seqs = jnp.zeros((batch, beam_size, max_decode_len + 1), jnp.int32)
  seqs = seqs.at[:, :, 0].set(start_tokens[:, None])
  logprobs = jnp.tile(
      jnp.array([0.0] + [NEG_INF] * (beam_size - 1), jnp.float32), [batch, 1])
  empty = jnp.full((batch, beam_size), NEG_INF, jnp.float32)
  return Beams(step=jnp.zeros((), jnp.int32), live_logprobs=logprobs,
               finished_scores=empty, live_seqs=seqs,
               finished_seqs=jnp.zeros_like(seqs), finished_flags=jnp.zeros(
                   (batch, beam_size), bool))


def beams_alive(beams: Beams, alpha: Array, max_decode_len: int) -> Array:
  """[] bool: whether T5X's beam search would take another step.

  False at max_decode_len steps, or when for every batch element every
  finished slot is occupied and beats the best live beam's best possible
  final score (its log-probability over the largest brevity penalty), or
  (T5X's default min_log_prob) when every best live beam is below NEG_INF.
  """
  not_at_end = beams.step < max_decode_len
  # T5X counts the dummy start position: its max_decode_len is ours + 1.
  min_penalty = brevity_penalty(alpha, float(max_decode_len + 1))
  best_live = beams.live_logprobs[:, -1:] / min_penalty
  worst_finished = jnp.min(beams.finished_scores, axis=1, keepdims=True)
  worst_finished = jnp.where(beams.finished_flags, worst_finished, NEG_INF)
  terminated = jnp.all(worst_finished > best_live)
  below_min = jnp.all(best_live < NEG_INF / min_penalty) & (beams.step > 0)
  return not_at_end & ~terminated & ~below_min


def elements_alive(beams: Beams, alpha: Array, max_decode_len: int) -> Array:
  """[B] bool: `beams_alive`'s test for each batch element on its own.

  For beams with one step counter per element ([B] `step`). An element it
  stops stays stopped under `beams_alive` too (its best live score only
  falls, its finished set is then full and beats every later candidate),
  so the two searches agree whenever no element's best live beam is a
  NEG_INF filler, which cannot happen after step 0 when V >= 2k.
  """
  not_at_end = beams.step < max_decode_len
  min_penalty = brevity_penalty(alpha, float(max_decode_len + 1))
  best_live = beams.live_logprobs[:, -1:] / min_penalty
  worst_finished = jnp.min(beams.finished_scores, axis=1, keepdims=True)
  worst_finished = jnp.where(beams.finished_flags, worst_finished, NEG_INF)
  terminated = jnp.all(worst_finished > best_live, axis=1)
  below_min = (best_live[:, 0] < NEG_INF / min_penalty) & (beams.step > 0)
  return not_at_end & ~terminated & ~below_min


def _gather(x: Array, indices: Array) -> Array:
  """x [B, n, ...] -> [B, m, ...] rows indices [B, m] (T5X's gather_beams)."""
  return jnp.take_along_axis(
      x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def top_candidates(beams: Beams, logits: Array,
                   scored: Optional[Array] = None) -> Tuple[Array, Array]:
  """The top 2k (live beam, token) candidates of a step.

  Args:
    beams: the beams after `beams.step` steps.
    logits: [B, k, V] float32 the target's logits for the token after each
      live beam (position beams.step + 1).
    scored: optional [B, k] bool; where False the beam's logits are unknown
      and its candidates are left out (-inf). The result is the full step's
      whenever each such beam's log-probability is below the 2k-th value
      returned: its candidates (log-probability + log p <= log-probability)
      could not have entered the top 2k.

  Returns:
    (values [B, 2k] float32 summed log-probabilities, decreasing; indices
    [B, 2k] int32 beam·V + token; ties go to the lower index).
  """
  batch, k, vocab = logits.shape
  log_probs = jax.nn.log_softmax(logits) + beams.live_logprobs[:, :, None]
  if scored is not None:
    log_probs = jnp.where(scored[:, :, None], log_probs, -jnp.inf)
  return lax.top_k(log_probs.reshape(batch, k * vocab), 2 * k)


def step_from_candidates(beams: Beams, topk_log_probs: Array,
                         topk_indices: Array, vocab: int, alpha: Array,
                         eos_id: Array) -> Tuple[Beams, Array]:
  """The beams after a step, from its top 2k candidates (`top_candidates`).

  `beams.step` may be [] (T5X's one counter) or [B] (one per element).

  Returns:
    (beams after one more step, parents [B, k] int32: the live beam each new
    live beam extends, to reorder the target's state with).
  """
  k = beams.live_logprobs.shape[1]
  t = beams.step
  # [B or 1, 1]: one step counter (T5X's), or one per batch element.
  position = jnp.reshape(t, (-1, 1)) + 1
  topk_parents = topk_indices // vocab
  topk_ids = topk_indices % vocab
  topk_seqs = _gather(beams.live_seqs, topk_parents)
  at_position = jnp.arange(topk_seqs.shape[2]) == position[:, :, None]
  topk_seqs = jnp.where(at_position, topk_ids[:, :, None], topk_seqs)
  newly_finished = topk_ids == eos_id
  # Live: the best k of the 2k that did not just end (best last).
  live_candidates = topk_log_probs + newly_finished * jnp.float32(NEG_INF)
  _, keep = lax.top_k(live_candidates, k)
  keep = jnp.flip(keep, axis=1)
  parents = _gather(topk_parents, keep)
  # Finished: merge the ones that just ended into the finished set.
  scores = topk_log_probs / brevity_penalty(alpha, position)
  scores += (~newly_finished) * jnp.float32(NEG_INF)
  all_scores = jnp.concatenate([beams.finished_scores, scores], axis=1)
  all_seqs = jnp.concatenate([beams.finished_seqs, topk_seqs], axis=1)
  all_flags = jnp.concatenate([beams.finished_flags, newly_finished], axis=1)
  _, best = lax.top_k(all_scores, k)
  best = jnp.flip(best, axis=1)
  live = dict(live_logprobs=_gather(live_candidates, keep),
              live_seqs=_gather(topk_seqs, keep))
  finished = dict(finished_scores=_gather(all_scores, best),
                  finished_seqs=_gather(all_seqs, best),
                  finished_flags=_gather(all_flags, best))
  return Beams(step=t + 1, **live, **finished), parents


def beam_step(beams: Beams, logits: Array, alpha: Array,
              eos_id: Array) -> Tuple[Beams, Array]:
  """One step of T5X's beam search, given the live beams' next-token logits.

  Args:
    beams: the beams after `beams.step` steps.
    logits: [B, k, V] float32 the target's logits for the token after each
      live beam (position beams.step + 1).
    alpha: [] float32 brevity-penalty exponent α.
    eos_id: [] int32 end-of-sequence token.

  Returns:
    (beams after one more step, parents [B, k] int32).
  """
  values, indices = top_candidates(beams, logits)
  return step_from_candidates(beams, values, indices, logits.shape[2], alpha,
                              eos_id)


def final_beams(beams: Beams) -> Tuple[Array, Array]:
  """T5X's output: finished beams, or live ones where none finished.

  Returns:
    (tokens [B, k, max_decode_len] int32 without the start token, 0 after
    EOS; scores [B, k] float32), both in increasing score order (best
    last).
  """
  any_finished = jnp.any(beams.finished_flags, axis=1)
  seqs = jnp.where(any_finished[:, None, None], beams.finished_seqs,
                   beams.live_seqs)
  scores = jnp.where(any_finished[:, None], beams.finished_scores,
                     beams.live_logprobs)
  return seqs[:, :, 1:], scores


@structs.dataclass
class BeamOutput:
  """Result of `beam_search`.

  Attributes:
    tokens: [B, k, max_decode_len] int32 beams, best LAST (T5X's order),
      EOS included, 0 after it.
    scores: [B, k] float32 their scores (brevity-penalized log-probability
      for finished beams; raw log-probability where no beam finished).
    steps: [] int32 beam-search steps taken (target calls).
    element_steps: [B] int32 the steps each batch element's own search was
      going (`elements_alive`); `steps` is their maximum.
  """
  tokens: Array
  scores: Array
  steps: Array
  element_steps: Array

  @property
  def best(self) -> Array:
    """[B, max_decode_len] int32 the best beam of each batch element."""
    return self.tokens[:, -1]


def start_beams(target: Target, encoder_input_tokens: Array, beam_size: int,
                max_len: int) -> Tuple[Beams, Any]:
  """The initial beams and the target's state with one row per beam.

  The inputs are encoded once per batch element; the state's rows are then
  copied k times (row b*k + i: beam i of element b).
  """
  state = target.start(encoder_input_tokens, max_len)
  batch = encoder_input_tokens.shape[0]
  state = gather_rows(state, jnp.repeat(jnp.arange(batch), beam_size))
  start = jnp.asarray(target.start_token(encoder_input_tokens), jnp.int32)
  return init_beams(start, beam_size, max_len), state


def beam_search_loop(target: Target, encoder_input_tokens: Array, alpha: Array,
                     eos_id: Array, *, beam_size: int,
                     max_decode_len: int) -> BeamOutput:
  """`beam_search` unchecked and unjitted (for one's own `jax.jit`)."""
  beams, state = start_beams(target, encoder_input_tokens, beam_size,
                             max_decode_len)
  batch = encoder_input_tokens.shape[0]

  def body(carry):
    beams, state, element_steps = carry
    element_steps += elements_alive(beams, alpha, max_decode_len)
    tokens = lax.dynamic_slice_in_dim(beams.live_seqs, beams.step, 1, axis=2)
    logits, state = target.decode_chunk(tokens.reshape(batch * beam_size, 1),
                                        state)
    logits = logits.reshape(batch, beam_size, -1).astype(jnp.float32)
    beams, parents = beam_step(beams, logits, alpha, eos_id)
    return (beams, gather_rows(state, beam_rows(parents,
                                                beam_size)), element_steps)

  beams, _, element_steps = carried_while.while_loop(
      lambda carry: beams_alive(carry[0], alpha, max_decode_len), body,
      (beams, state, jnp.zeros((batch,), jnp.int32)))
  tokens, scores = final_beams(beams)
  return BeamOutput(tokens=tokens, scores=scores, steps=beams.step,
                    element_steps=element_steps)


BEAM_SEARCH_PROGRAM = LoopProgram(beam_search_loop,
                                  ("beam_size", "max_decode_len"))


def _is_int(value: Any) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_beam_settings(*, beam_size: Any, alpha: Any,
                        max_decode_len: Any) -> None:
  """k >= 1, α a finite number >= 0, max_decode_len >= 1; ValueError."""
  if not _is_int(beam_size) or beam_size < 1:
    raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}.")
  if not _is_int(max_decode_len) or max_decode_len < 1:
    raise ValueError(
        f"max_decode_len must be an integer >= 1, got {max_decode_len!r}.")
  is_number = isinstance(
      alpha, (int, float, np.number)) and not isinstance(alpha, bool)
  if not is_number or not np.isfinite(alpha) or alpha < 0:
    raise ValueError(
        f"alpha (the brevity penalty's exponent) must be a finite number >= "
        f"0, got {alpha!r}.")


def beam_search(target: Target, encoder_input_tokens: Any, *, beam_size: int,
                max_decode_len: int, alpha: float = 0.6,
                eos_id: int = EOS_ID) -> BeamOutput:
  """Beam search with the target alone, as T5X's `decoding.beam_search`.

  Args:
    target: the target model (`Target`, e.g. `models.T5Model`).
    encoder_input_tokens: [B, S] integer ids, 0-padded.
    beam_size: k, the beams kept (T5X's num_decodes).
    max_decode_len: the most tokens per beam.
    alpha: the brevity penalty's exponent (traced: no recompile).
    eos_id: the end-of-sequence token (traced).

  Returns:
    `BeamOutput` (beams best last, as T5X's `return_all_decodes=True`).

  Raises:
    ValueError naming the bad argument, before anything is compiled.
  """
  check_beam_settings(beam_size=beam_size, alpha=alpha,
                      max_decode_len=max_decode_len)
  check_target(target)
  check_encoder_inputs(encoder_input_tokens, target.vocab_size)
  check_eos_id(eos_id)
  return BEAM_SEARCH_PROGRAM(target, jnp.asarray(encoder_input_tokens,
                                                 jnp.int32), np.float32(alpha),
                             np.int32(eos_id), beam_size=int(beam_size),
                             max_decode_len=int(max_decode_len))
