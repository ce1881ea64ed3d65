"""Beam search as a run's two decoders: checked once, a function of the batch.

A run decodes every batch with a baseline and a speculative decoder and
reads the same fields from both (`decoding.decoders`: tokens, lengths,
target calls; the speculative one's kept-guess histogram and per-call
trace). `beam_decoder` (the target's own beam search, `beam_search`) and
`speculative_beam_decoder` (`speculative_beam`) return their top beam in
that form, so the run writes predictions, BLEU, speedup and step counts as
for the sampled decoders.

In a beam run a "kept guess" is a draft beam step: a call that advanced an
element m steps (1 to γ+1) kept m - 1 of the γ steps the draft's beam
search proposed, as a call of Algorithm 1 that emits m tokens kept m - 1
guesses.
"""
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import kernels
from specdec_jax.core import structs
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding import speculative_beam
from specdec_jax.core.decoding.checks import check_eos_id
from specdec_jax.core.decoding.outputs import CallStatistics
from specdec_jax.core.decoding.outputs import OneTokenPerCall
from specdec_jax.core.decoding.programs import LoopProgram
from specdec_jax.core.decoding.programs import token_batch
from specdec_jax.core.decoding.checks import check_target
from specdec_jax.core.decoding.checks import check_vocab_sizes

Array = jax.Array
# The speculative beam loop updates its caches in place on XLA:CPU
# (`kernels`; the baseline keeps XLA's default); other backends ignore it.


@structs.dataclass
class BeamDecodeOutput(OneTokenPerCall):
  """The top beam of `beam_search`, as a run reads a decoder's output.

  Attributes:
    tokens: [B, max_decode_len] int32 the best beam (EOS included, 0 after).
    lengths: [B] int32 its tokens (EOS included).
    target_calls: [B] int32 the steps each element's search was going (one
      target call over its k beams per step).
  """
  tokens: Array
  lengths: Array
  target_calls: Array


@structs.dataclass
class SpeculativeBeamDecodeOutput(CallStatistics):
  """The top beam of `speculative_beam_search`, with its step counts.

  Attributes:
    tokens, lengths: as `BeamDecodeOutput` (the same beams).
    target_calls: [B] int32 target calls while the element was searching.
    accepted_histogram: [B, γ+1] int32; entry n counts the element's calls
      that kept n draft beam steps (advanced n + 1 steps).
    trace_num_accepted: [B, max_decode_len] int32; entry i is the draft
      steps the element's (i+1)-th call kept; -1 after its last call.
  """
  tokens: Array
  lengths: Array
  target_calls: Array
  accepted_histogram: Array
  trace_num_accepted: Array


def _lengths(tokens: Array) -> Array:
  """[B] tokens before the 0 padding (a beam is 0 after EOS only)."""
  return jnp.sum(tokens != 0, axis=1).astype(jnp.int32)


def _as_run_output(out: speculative_beam.SpeculativeBeamOutput,
                   gamma: int) -> SpeculativeBeamDecodeOutput:
  kept = jnp.where(out.trace_steps > 0, out.trace_steps - 1, -1)
  histogram = jnp.sum(jax.nn.one_hot(kept, gamma + 1, dtype=jnp.int32), axis=1)
  best = out.best
  return SpeculativeBeamDecodeOutput(tokens=best, lengths=_lengths(best),
                                     target_calls=out.element_calls,
                                     accepted_histogram=histogram,
                                     trace_num_accepted=kept)


def beam_decoder(target: Any, *, beam_size: int, max_decode_length: int,
                 alpha: float, eos_id: int = beam_search.EOS_ID):
  """`beam_search` with its settings checked now, not per call: returns
  decode(encoder_input_tokens [B, S] int32, rng) -> `BeamDecodeOutput` (rng
  unused: beam search draws nothing; the batch is not checked).

  Raises:
    ValueError naming the bad argument.
  """
  beam_search.check_beam_settings(beam_size=beam_size, alpha=alpha,
                                  max_decode_len=max_decode_length)
  check_target(target)
  check_eos_id(eos_id)
  program = BEAM_PROGRAM.bound(target, alpha=np.float32(alpha),
                               eos_id=np.int32(eos_id),
                               beam_size=int(beam_size),
                               max_decode_len=int(max_decode_length))

  def decode(encoder_input_tokens: Array, rng: Array) -> BeamDecodeOutput:
    del rng
    return program(token_batch(encoder_input_tokens))

  return decode


def _beam_run(target: Any, encoder_input_tokens: Array, alpha: Array,
              eos_id: Array, *, beam_size: int,
              max_decode_len: int) -> BeamDecodeOutput:
  """The target's beam search, its top beam as a run reads it."""
  out = beam_search.beam_search_loop(target, encoder_input_tokens, alpha,
                                     eos_id, beam_size=beam_size,
                                     max_decode_len=max_decode_len)
  return BeamDecodeOutput(tokens=out.best, lengths=_lengths(out.best),
                          target_calls=out.element_steps)


def _speculative_beam_run(target: Any, draft: Any, encoder_input_tokens: Array,
                          alpha: Array, eos_id: Array,
                          **settings: int) -> SpeculativeBeamDecodeOutput:
  """Speculative beam search, its top beam as a run reads it."""
  out = speculative_beam.speculative_beam_loop(target, draft,
                                               encoder_input_tokens, alpha,
                                               eos_id, **settings)
  return _as_run_output(out, settings["gamma"])


BEAM_PROGRAM = LoopProgram(_beam_run, ("beam_size", "max_decode_len"))
SPECULATIVE_BEAM_PROGRAM = LoopProgram(
    _speculative_beam_run,
    ("beam_size", "width", "gamma", "num_rows", "max_decode_len"),
    kernels.CPU_IN_PLACE_COMPILER_OPTIONS)


def speculative_beam_decoder(target: Any, draft: Any, *, beam_size: int,
                             gamma: int, max_decode_length: int, alpha: float,
                             width: Optional[int] = None,
                             num_rows: Optional[int] = None,
                             eos_id: int = beam_search.EOS_ID):
  """`speculative_beam_search` with its settings checked now (defaults as
  there: width k, num_rows 2·width): returns decode(encoder_input_tokens,
  rng) -> `SpeculativeBeamDecodeOutput` (rng unused).

  Raises:
    ValueError naming the bad argument.
  """
  width = beam_size if width is None else width
  num_rows = 2 * width if num_rows is None else num_rows
  beam_search.check_beam_settings(beam_size=beam_size, alpha=alpha,
                                  max_decode_len=max_decode_length)
  speculative_beam.check_speculative_beam_settings(beam_size=beam_size,
                                                   width=width, gamma=gamma,
                                                   num_rows=num_rows)
  check_target(target)
  check_target(draft)
  check_vocab_sizes(target.vocab_size, draft.vocab_size)
  check_beam_vocab(beam_size, target.vocab_size)
  check_eos_id(eos_id)
  program = SPECULATIVE_BEAM_PROGRAM.bound(
      target, draft, alpha=np.float32(alpha), eos_id=np.int32(eos_id),
      beam_size=int(beam_size), width=int(width), gamma=int(gamma),
      num_rows=int(num_rows), max_decode_len=int(max_decode_length))

  def decode(encoder_input_tokens: Array,
             rng: Array) -> SpeculativeBeamDecodeOutput:
    del rng
    return program(token_batch(encoder_input_tokens))

  return decode


def check_beam_vocab(beam_size: int, vocab_size: int) -> None:
  """k <= V / 2 (`speculative_beam_search`'s condition); ValueError."""
  if vocab_size < 2 * beam_size:
    raise ValueError(
        f"beam_size ({beam_size}) must be at most vocab_size / 2 "
        f"({vocab_size} / 2): each batch element stops on its own, which "
        "equals T5X's joint stopping when k live beams always have 2k real "
        "candidates.")
