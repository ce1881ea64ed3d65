"""SPECULATION='off' (or 'auto' choosing it): the target alone in the place
of the speculative decoder.

`TargetAloneDecoder` runs the run's baseline decoder (the target's sampling
or its own beam search) and returns its output in the shape the run reads
from a speculative decoder (`TargetAloneOutput`: every target call kept
n = 0 guesses), so that a walltime run, MODE='infer' and the summary need
no branch of their own. A walltime run does not decode twice: it takes the
baseline's output and seconds for the speculative column
(`TargetAloneDecoder.of_baseline`), so the speedup is 1 by definition.
"""
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp

from specdec_jax.core.decoding import outputs

Array = jax.Array


@flax.struct.dataclass
class TargetAloneOutput(outputs.CallStatistics):
  """The target alone's output, read as a speculative decoder's of γ
  guesses per call (`CallStatistics` with the run's γ: a walltime run adds
  its histogram to the speculative column's [γ + 1] one).

  Attributes:
    tokens: [B, T] int32 the target's tokens (0 after EOS).
    lengths: [B] int32 tokens per row, EOS included.
    target_calls: [B] int32 target calls (one per token; beam search: one
      per step).
    accepted_histogram: [B, γ + 1] int32: every call in column 0 (no
      guess was made, so none was kept).
    trace_num_accepted: [B, T] int32: 0 for each call, -1 after the last.
  """
  tokens: Array
  lengths: Array
  target_calls: Array
  accepted_histogram: Array
  trace_num_accepted: Array


def as_target_alone_output(out: Any, gamma: int) -> TargetAloneOutput:
  """The baseline's `out` (a `CallStatistics` with γ = 0: every call in
  histogram column 0) with its histogram widened to γ + 1 columns."""
  histogram = jnp.asarray(out.accepted_histogram, jnp.int32)
  histogram = jnp.pad(histogram,
                      ((0, 0), (0, int(gamma) + 1 - histogram.shape[1])))
  return TargetAloneOutput(
      tokens=jnp.asarray(out.tokens), lengths=jnp.asarray(out.lengths),
      target_calls=jnp.asarray(out.target_calls,
                               jnp.int32), accepted_histogram=histogram,
      trace_num_accepted=jnp.asarray(out.trace_num_accepted, jnp.int32))


class TargetAloneDecoder:
  """The speculative decoder's place, held by the target alone.

  Attributes:
    baseline: the run's baseline decoder, (inputs [B, S], rng) -> output.
    gamma: the histogram's γ (columns γ + 1; metrics.json's `gamma`).
  """

  def __init__(self, baseline: Callable[[Array, Array], Any], gamma: int):
    self.baseline = baseline
    self.gamma = int(gamma)

  def __call__(self, encoder_input_tokens: Array,
               rng: Array) -> TargetAloneOutput:
    return self.of_baseline(self.baseline(encoder_input_tokens, rng))

  def of_baseline(self, out: Any) -> TargetAloneOutput:
    """The baseline's output of the same batch and rng, as this decoder's
    (a walltime run decodes once: `walltime.decode_examples`)."""
    return as_target_alone_output(out, self.gamma)
