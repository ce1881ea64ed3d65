"""The one loop over a run's batches, and the one tally of what a decoder
decoded in them.

Every decode of the examples goes through `batches`: MODE='walltime''s
timed decode (`walltime.decode_examples`), MODE='infer'
(`infer.run_infer`), MODE='alpha''s target samples
(`runner.sampled_betas`) and the 'auto' pilots (`pilots.run_pilots`).
Batch b is decoded with the run's rng folded with b, whatever decodes it
(a pilot's rows are the run's, an 'auto' switch between batches changes
nothing a batch samples), and only its kept rows count (`Feeder.kept_rows`:
the last batch's padding rows are decoded, never counted).

`Tally` counts one decoder's outputs over its batches, the one way every
reader needs them: the calls by kept guesses and the acceptance trials
(metrics.json's and infer.json's `alpha`, `accepted_histogram`, a pilot's
α and its interval, an 'auto' segment's), β, target calls, tokens and each
batch's seconds (`overheads.BatchTimes`). `alpha_interval` is the one 95%
interval of α.

The target alone in the speculative decoder's place (SPECULATION='off',
or 'auto' choosing it) reads as a decoder that guessed nothing
(`TargetAloneDecoder`), so the loop and the tally need no branch of their
own.
"""
import dataclasses
import functools
import math
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from absl import logging
import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import multihost
from specdec_jax.core.decoding import outputs
from specdec_jax.terminal import console

Array = jax.Array
# (decoder, inputs, rng) -> (its output, ready; seconds): `Providers.clock`.
Clock = Callable[..., Tuple[Any, float]]
_Z95 = 1.96


@dataclasses.dataclass(frozen=True)
class Batch:
  """One batch of the run (`batches`).

  Attributes:
    index: b, its place among the run's batches.
    inputs: [B, width] its rows on the mesh.
    keep: the rows holding examples, in example order (the outputs to
      count: `to_host(out)[keep]`).
    rng: the run's rng folded with b.
  """
  index: int
  inputs: Array
  keep: np.ndarray
  rng: Array

  def decode(self, decoder: Callable[[Array, Array], Any],
             clock: Optional[Clock] = None) -> Tuple[Any, float]:
    """(`decoder`'s output of this batch with its rng, every row on the
    host; its seconds by `clock`, 0.0 when None: untimed)."""
    if clock is None:
      out, seconds = decoder(self.inputs, self.rng), 0.0
    else:
      out, seconds = clock(decoder, self.inputs, self.rng)
    return multihost.to_host(out), seconds


def batches(feed: multihost.Feeder, rng: Array,
            width: Optional[int] = None) -> Iterator[Batch]:
  """The run's batches in order, each with `rng` folded with its index.

  `width`: every batch padded to it and wider ones skipped (a pilot's: one
  compiled shape); None: each batch at its own width. Between batches a
  SIGTERM ends the loop (`console.raise_if_terminated`).
  """
  for b in range(feed.num_batches):
    console.raise_if_terminated()
    if width is not None and feed.batch_width(b) > width:
      continue
    yield Batch(b, feed.batch(b, width), feed.kept_rows(b),
                jax.random.fold_in(rng, b))


def compile_widths(feed: multihost.Feeder,
                   decoders: Sequence[Tuple[str, Callable[[Array, Array],
                                                          Any]]],
                   rng: Array) -> float:
  """Compiles (or reads from the persistent compilation cache) and runs
  each (name, decoder) once per input width of `feed`, outside any timed
  call, one progress line each; the seconds."""
  t0 = time.perf_counter()
  firsts = feed.first_of_each_width()
  widths = [feed.batch_width(b) for b in firsts]
  what = ("both decoders"
          if len(decoders) == 2 else f"the {decoders[0][0]} decoder")
  logging.info(
      "Compiling %s for input widths %s (read from the persistent "
      "compilation cache after a first run)", what, widths)
  console.numbered([(f"the {name} decoder, input width {feed.batch_width(b)}",
                     functools.partial(_run_once, decoder, feed, b, rng))
                    for b in firsts
                    for name, decoder in decoders])
  seconds = time.perf_counter() - t0
  logging.info("Compiled and warmed up %s for input widths %s in %.1fs", what,
               widths, seconds)
  return seconds


def _run_once(decoder: Callable[[Array, Array], Any], feed: multihost.Feeder,
              b: int, rng: Array) -> None:
  jax.block_until_ready(decoder(feed.batch(b), rng))


def padded_sum(total: np.ndarray, histogram: np.ndarray) -> np.ndarray:
  """Two histograms of kept guesses added, the shorter padded with zeros
  (a run that switched γ: metrics.json's is as wide as its largest γ)."""
  width = max(total.size, histogram.size)
  return (np.pad(total,
                 (0, width - total.size)) + np.pad(histogram,
                                                   (0, width - histogram.size)))


class Tally:
  """One decoder's outputs over its batches, counted over their kept rows.

  Attributes:
    batches, examples: batches and kept rows counted.
    seconds: [batches] each batch's seconds (0.0: untimed).
    iterations: [batches] each batch's most target calls of a row, padding
      rows included (the loop runs until its last row is done).
    rows: [batches] each batch's rows.
    calls, tokens: the kept rows' target calls and non-zero tokens.
    histogram: calls by kept guesses, as wide as the widest batch's γ + 1
      (`padded_sum`).
    kept: guesses kept.
    trials: acceptance trials as each batch's mode counts them: β's
      (`beta_count`, the trials whose context reached the output) for a
      one-path mode, min(n + 1, γ) per call that kept n for trees and
      beams, none for the target alone (metrics.json's `alpha`).
    call_trials: min(n + 1, γ) per call of every speculative batch (the
      histogram's own estimator, `analysis.alpha_from_acceptance_counts`:
      a pilot's α, an 'auto' segment's).
    beta: [Σ β, its trials] over the one-path batches; None once a tree or
      beam batch came, or when the target alone decoded the first.
    per_example: each kept row's (kept, call trials, output length): the
      pilots' α interval (`interval`) and output lengths.
    rounds: trees: calls by their first round [k + 1], else None.
  """

  def __init__(self):
    self.batches = self.examples = self.calls = self.tokens = self.kept = 0
    self.seconds: List[float] = []
    self.iterations: List[int] = []
    self.rows: List[int] = []
    self.histogram = np.zeros(0, np.int64)
    self.trials = self.call_trials = 0.0
    self.beta: Optional[List[float]] = [0.0, 0.0]
    self.per_example: List[Tuple[int, int, int]] = []
    self.rounds: Optional[np.ndarray] = None

  def add(self, out: Any, keep: np.ndarray, mode: Any = None,
          seconds: float = 0.0) -> None:
    """One batch: `out` (a `CallStatistics` on the host) of its rows,
    `keep` the rows counted, `mode` the `DecodeMode` that decoded it (None:
    the target alone's own decode), its seconds."""
    alone = mode is None or mode.target_alone
    calls = np.asarray(out.target_calls)
    rows = np.asarray(out.accepted_histogram)[keep].astype(np.int64)
    gamma = rows.shape[1] - 1
    n = np.arange(gamma + 1)
    kept_rows = rows @ n
    trials_rows = (np.zeros_like(kept_rows)
                   if alone else rows @ np.minimum(n + 1, gamma))
    counts = rows.sum(0)
    self.seconds.append(float(seconds))
    self.iterations.append(int(calls.max()))
    self.rows.append(int(calls.shape[0]))
    self.calls += int(np.sum(calls[keep]))
    self.tokens += int(np.sum(np.asarray(out.tokens)[keep] != 0))
    self.histogram = padded_sum(self.histogram, counts)
    self.kept += int(kept_rows.sum())
    self.call_trials += float(trials_rows.sum())
    if mode is not None and mode.one_path:
      beta_count = float(np.sum(np.asarray(out.beta_count)[keep]))
      self.trials += beta_count
      if self.beta is not None:
        self.beta = [
            self.beta[0] + float(np.sum(np.asarray(out.beta_sum)[keep])),
            self.beta[1] + beta_count
        ]
    else:
      self.trials += float(trials_rows.sum())
      if not (alone and self.batches):  # a tree, beams, or alone from the 1st
        self.beta = None
    self.per_example += zip(kept_rows.tolist(), trials_rows.tolist(),
                            np.asarray(out.lengths)[keep].tolist())
    if hasattr(out, "first_round_histogram"):
      counted = np.asarray(out.first_round_histogram)[keep].sum(0)
      self.rounds = counted if self.rounds is None else self.rounds + counted
    self.batches += 1
    self.examples += len(keep)

  @property
  def alpha(self) -> float:
    """Kept guesses / `trials` (metrics.json's and infer.json's `alpha`)."""
    return self.kept / max(self.trials, 1.0)

  @property
  def call_alpha(self) -> float:
    """Kept guesses / `call_trials` (the pilots')."""
    return self.kept / max(self.call_trials, 1.0)

  @property
  def alpha_beta(self) -> Optional[float]:
    """Σ β / its trials (Corollary 3.6), or None (`beta`)."""
    return None if self.beta is None else self.beta[0] / max(self.beta[1], 1.0)

  @property
  def lengths(self) -> List[int]:
    """Each kept row's output length (EOS included)."""
    return [length for _, _, length in self.per_example]

  def interval(self) -> Tuple[float, float]:
    """The 95% interval of `call_alpha` (`alpha_interval`)."""
    kept, trials, _ = zip(*self.per_example) if self.per_example else ((), (),
                                                                       ())
    return alpha_interval(kept, trials)


def alpha_interval(kept: Sequence[float],
                   trials: Sequence[float]) -> Tuple[float, float]:
  """The 95% interval of α = Σ kept / Σ trials over examples.

  The wider of Wilson's interval (trials independent) and the ratio
  estimator's normal interval with examples as clusters (a sentence's
  trials are not independent: an easy one keeps most guesses); (0, 1)
  with fewer than 2 examples or no trials.

  Args:
    kept: [examples] guesses kept per example.
    trials: [examples] acceptance trials per example.
  """
  k, n = np.asarray(kept, np.float64), np.asarray(trials, np.float64)
  total = float(n.sum())
  if k.size < 2 or total <= 0:
    return 0.0, 1.0
  alpha, z2 = float(k.sum()) / total, _Z95**2
  center = (alpha + z2 / (2 * total)) / (1 + z2 / total)
  wilson = _Z95 * math.sqrt(alpha * (1 - alpha) / total + z2 /
                            (4 * total**2)) / (1 + z2 / total)
  spread = float(np.sum((k - alpha * n)**2)) / (k.size - 1)
  half = _Z95 * math.sqrt(spread / k.size) / (total / k.size)
  return (max(0.0,
              min(center - wilson,
                  alpha - half)), min(1.0, max(center + wilson, alpha + half)))


# -- the target alone ----------------------------------------------------------
# SPECULATION='off' (or 'auto' choosing it): the target alone in the place
# of the speculative decoder.
#
# `TargetAloneDecoder` runs the run's baseline decoder (the target's sampling
# or its own beam search) and returns its output in the shape the run reads
# from a speculative decoder (`TargetAloneOutput`: every target call kept
# n = 0 guesses), so that a walltime run, MODE='infer' and the summary need
# no branch of their own. A walltime run does not decode twice: it takes the
# baseline's output and seconds for the speculative column
# (`TargetAloneDecoder.of_baseline`), so the speedup is 1 by definition.
@flax.struct.dataclass
class TargetAloneOutput(outputs.CallStatistics):
  """The target alone's output, read as a speculative decoder's of γ
  guesses per call (`CallStatistics` with the run's γ: metrics.json's
  histogram has γ + 1 columns).

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
