"""The one loop over a run's batches (`batches`: batch b decoded with the
run's rng folded with b, whatever decodes it) and the one tally of what a
decoder decoded in their kept rows (`Tally`); the target alone reads as a
decoder that guessed nothing (`TargetAloneDecoder`).
"""
import dataclasses
import math
import time
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import multihost
from specdec_jax.core import structs
from specdec_jax.core.decoding import outputs
from specdec_jax.metrics import replay
from specdec_jax.terminal import console

Array = jax.Array
# (decoder, inputs, rng) -> (its output, ready; seconds): `Providers.clock`.
Clock = Callable[..., Tuple[Any, float]]
_Z95 = 1.96


@dataclasses.dataclass(frozen=True)
class Batch:
  """Batch b of the run: [B, width] inputs on the mesh, the rows holding
  examples (`keep`, in example order) and the run's rng folded with b."""
  index: int
  inputs: Array
  keep: np.ndarray
  rng: Array

  def decode(self, decoder: Callable[[Array, Array], Any],
             clock: Optional[Clock] = None) -> Tuple[Any, float]:
    """(`decoder`'s output on the host, its seconds by `clock`; 0.0: None)."""
    if clock is None:
      out, seconds = decoder(self.inputs, self.rng), 0.0
    else:
      out, seconds = clock(decoder, self.inputs, self.rng)
    return multihost.to_host(out), seconds


def batches(feed: multihost.Feeder, rng: Array, width: Optional[int] = None,
            start: int = 0) -> Iterator[Batch]:
  """The run's batches in order from batch `start` (`width`: padded to
  it, wider ones skipped); a SIGTERM between batches ends the loop."""
  for b in range(start, feed.num_batches):
    console.raise_if_terminated()
    if width is not None and feed.batch_width(b) > width:
      continue
    yield Batch(b, feed.batch(b, width), feed.kept_rows(b),
                jax.random.fold_in(rng, b))


def compile_widths(feed: multihost.Feeder,
                   decoders: Sequence[Tuple[str, Callable[[Array, Array],
                                                          Any]]],
                   rng: Array) -> float:
  """Compiles and runs each (name, decoder) once per input width of
  `feed`, outside any timed call; the seconds."""
  t0 = time.perf_counter()
  firsts = feed.first_of_each_width()
  widths = [feed.batch_width(b) for b in firsts]
  what = ("both decoders"
          if len(decoders) == 2 else f"the {decoders[0][0]} decoder")
  logging.info(
      "Compiling %s for input widths %s (read from the persistent "
      "compilation cache after a first run)", what, widths)
  console.numbered([
      (f"the {name} decoder, input width {feed.batch_width(b)}",
       lambda d=decoder, b=b: jax.block_until_ready(d(feed.batch(b), rng)))
      for b in firsts
      for name, decoder in decoders
  ])
  seconds = time.perf_counter() - t0
  logging.info("Compiled and warmed up %s for input widths %s in %.1fs", what,
               widths, seconds)
  return seconds


def padded_sum(total: np.ndarray, histogram: np.ndarray) -> np.ndarray:
  """Two histograms added, the shorter padded with zeros (a run that
  switched γ)."""
  width = max(total.size, histogram.size)
  return (np.pad(total,
                 (0, width - total.size)) + np.pad(histogram,
                                                   (0, width - histogram.size)))


class Tally:
  """One decoder's outputs over its batches, counted over their kept rows.

  Attributes:
    seconds, iterations, rows: [batches] seconds, most calls of a row.
    calls, tokens, kept: target calls, tokens, guesses kept; histogram:
      calls by kept guesses [widest γ + 1].
    trials: acceptance trials as the mode counts them (one-path: β's;
      else min(n + 1, γ) per call); call_trials: the latter, every batch.
    beta: [Σ β, its trials]; None after a tree or beam batch.
    per_example: each kept row's (kept, call trials, output length).
    rounds: trees: calls by their first round [k + 1], else None.
    chains: modes whose counts replay (`replays`: chains, trees): each
      kept row's guesses kept by each call [its calls] (`replay`'s input).
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
    self.chains: List[List[int]] = []

  def add(self, out: Any, keep: np.ndarray, mode: Any = None,
          seconds: float = 0.0) -> None:
    """One batch's `out` (on the host), decoded by `mode` (None: the
    baseline)."""
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
    if mode is not None and mode.replays:
      trace = np.asarray(out.trace_num_accepted)
      self.chains += [trace[r, :calls[r]].tolist() for r in keep]
    self.per_example += zip(kept_rows.tolist(), trials_rows.tolist(),
                            np.asarray(out.lengths)[keep].tolist())
    if hasattr(out, "first_round_histogram"):
      counted = np.asarray(out.first_round_histogram)[keep].sum(0)
      self.rounds = counted if self.rounds is None else self.rounds + counted
    self.batches += 1
    self.examples += len(keep)

  def state(self) -> Dict[str, Any]:
    """Every count as JSON-able values (`from_state` rebuilds the tally:
    a resumed MODE='infer' run, `resume`)."""
    return {
        name: value.tolist() if isinstance(value, np.ndarray) else value
        for name, value in vars(self).items()
    }

  @classmethod
  def from_state(cls, state: Dict[str, Any]) -> "Tally":
    """The tally whose `state()` was `state`."""
    tally = cls()
    unknown = set(state) - set(vars(tally))
    if unknown:
      raise ValueError(f"not a Tally's state: unknown {sorted(unknown)}")
    for name, value in state.items():
      if name == "histogram":
        value = np.asarray(value, np.int64)
      elif name == "rounds" and value is not None:
        value = np.asarray(value, np.int64)
      elif name == "per_example":
        value = [tuple(v) for v in value]
      setattr(tally, name, value)
    return tally

  @property
  def alpha(self) -> float:
    """metrics.json's and infer.json's `alpha`."""
    return self.kept / max(self.trials, 1.0)

  @property
  def call_alpha(self) -> float:
    """The pilots' α."""
    return self.kept / max(self.call_trials, 1.0)

  @property
  def alpha_beta(self) -> Optional[float]:
    """Σ β / its trials (Corollary 3.6), or None."""
    return None if self.beta is None else self.beta[0] / max(self.beta[1], 1.0)

  @property
  def lengths(self) -> List[int]:
    return [length for _, _, length in self.per_example]

  def batch_factor_by_gamma(self, gamma: int, gammas: Sequence[int],
                            batch_size: int) -> Dict[str, float]:
    """{str(γ): `replay.batch_factors`} at `gamma` and each of `gammas`,
    replayed from `chains` (decoded at `gamma`), `replay.monotone`, as
    records hold it."""
    factors = replay.batch_factors(self.chains, self.lengths, gamma,
                                   sorted({gamma, *gammas}), batch_size)
    return {str(g): b for g, b in replay.monotone(factors).items()}

  def interval(self) -> Tuple[float, float]:
    kept, trials, _ = zip(*self.per_example) if self.per_example else ((), (),
                                                                       ())
    return alpha_interval(kept, trials)


def alpha_interval(kept: Sequence[float],
                   trials: Sequence[float]) -> Tuple[float, float]:
  """The 95% interval of α = Σ kept / Σ trials over [examples]: the wider
  of Wilson's and the ratio estimator's with examples as clusters (an
  easy sentence keeps most guesses); (0, 1) below 2 examples or trials."""
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
@structs.dataclass
class TargetAloneOutput(outputs.CallStatistics):
  """The target alone's output as a speculative decoder's of γ guesses
  per call: [B, T] tokens, [B] lengths and target calls, [B, γ + 1]
  histogram (every call in column 0), [B, T] trace (0, -1 after the last)."""
  tokens: Array
  lengths: Array
  target_calls: Array
  accepted_histogram: Array
  trace_num_accepted: Array


class TargetAloneDecoder:
  """The speculative decoder's place (SPECULATION='off', or 'auto'
  choosing it), held by the run's baseline decoder at the histogram's γ."""

  def __init__(self, baseline: Callable[[Array, Array], Any], gamma: int):
    self.baseline = baseline
    self.gamma = int(gamma)

  def __call__(self, encoder_input_tokens: Array,
               rng: Array) -> TargetAloneOutput:
    return self.of_baseline(self.baseline(encoder_input_tokens, rng))

  def of_baseline(self, out: Any) -> TargetAloneOutput:
    """The baseline's output as this decoder's, its histogram widened to
    γ + 1 columns (a walltime run decodes once: its speedup is 1)."""
    histogram = jnp.asarray(out.accepted_histogram, jnp.int32)
    histogram = jnp.pad(histogram,
                        ((0, 0), (0, self.gamma + 1 - histogram.shape[1])))
    return TargetAloneOutput(
        tokens=jnp.asarray(out.tokens), lengths=jnp.asarray(out.lengths),
        target_calls=jnp.asarray(out.target_calls,
                                 jnp.int32), accepted_histogram=histogram,
        trace_num_accepted=jnp.asarray(out.trace_num_accepted, jnp.int32))
