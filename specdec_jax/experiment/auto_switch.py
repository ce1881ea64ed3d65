"""SPECULATION='auto''s online correction (issue 45): the run keeps
measuring its choice batch by batch and chooses again, between batches,
when the measured speedup falls below the prediction by more than its
noise.

The rule (pure functions, `tests/harness/test_auto_switch.py`):

* measure: after each batch, the choice's seconds and the target alone's
  (MODE='walltime' decodes both anyway; MODE='infer' estimates the target
  alone as the priced target step times the batch's longest output), and
  its acceptance histogram. The batches one choice decodes in a row are a
  segment (`Segment`).
* test (`below_prediction`): once the segment has AUTO_SWITCH_MIN_BATCHES
  batches, after every batch: is the upper end of the 95% interval of its
  speedup (`speedup_interval`: Σ baseline / Σ choice over its batches, the
  ratio estimator's t interval with batches as samples) below the speedup
  it was chosen on?
* predict again (`corrected_rows`): the choice's mode (and tree width)
  gets the α measured on its segment (the pilots' estimator); every other
  speculative candidate's prediction is multiplied by κ, the choice's
  measured speedup over its own prediction at that α (the cost model's
  error on this machine, shared by candidates that run the same loop,
  drafter and target); a candidate that has run keeps its measured
  speedup; the target alone is 1.
* choose (`rechoose`): as the first choice (`auto_mode.choose`), but the
  run leaves its choice only for a candidate predicted at least
  AUTO_MIN_GAIN times the choice's measured speedup (hysteresis), and for
  the target alone only when the choice is measured slower than it (the
  interval's upper end below 1: `may_leave_for_the_target_alone`).

No flapping: a new segment is tested only after AUTO_SWITCH_MIN_BATCHES
batches of its own, a run switches at most AUTO_SWITCH_MAX_SWITCHES
times, a candidate that ran is predicted by its measurement (never again
by the model that was wrong about it), and the target alone, once chosen,
is kept (it drafts nothing: there is nothing new to measure).

Nothing here changes what a batch decodes: a choice is made between
batches from past batches only, every candidate is exact (or the target
alone), and batch i is decoded with the run's rng for batch i whatever
decodes it. A newly chosen candidate is compiled (and run once per input
width) outside the timed decode; its seconds are recorded.

Several processes: process 0 decides on its own seconds, every process
follows its decision (as for the first choice).
"""
import dataclasses
import math
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.experiment import auto_mode
from specdec_jax.experiment import auto_tree
from specdec_jax.experiment import decode_modes

# A segment is tested only once it has this many batches (and so a run
# switches at most once per this many batches) ...
AUTO_SWITCH_MIN_BATCHES = 4
# ... and at most this many times.
AUTO_SWITCH_MAX_SWITCHES = 2
# Student's t, 97.5% quantile, by degrees of freedom 1..30 (then
# Cornish-Fisher's first term, within 0.1% of the table from 30 on).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


def t975(df: int) -> float:
  """Student's t 97.5% quantile with `df` >= 1 degrees of freedom."""
  if df < 1:
    raise ValueError(f"df={df!r}: allowed: an integer >= 1.")
  if df <= len(_T975):
    return _T975[df - 1]
  return _Z975 + (_Z975**3 + _Z975) / (4 * df)


def speedup_interval(
    baseline_s: Sequence[float],
    speculative_s: Sequence[float]) -> Tuple[float, float, float]:
  """(speedup, low, high): Σ baseline / Σ speculative over the batches and
  its 95% interval (the ratio estimator's standard error with batches as
  samples, Student's t with n - 1 degrees of freedom); (ratio, 0, inf)
  with fewer than 2 batches."""
  b = np.asarray(baseline_s, np.float64)
  s = np.asarray(speculative_s, np.float64)
  if b.shape != s.shape or b.ndim != 1 or not b.size or np.any(s <= 0):
    raise ValueError("baseline_s and speculative_s: one positive time per "
                     f"batch each, got {b.shape} and {s.shape}.")
  ratio = float(b.sum() / s.sum())
  n = b.size
  if n < 2:
    return ratio, 0.0, math.inf
  spread = float(np.sum((b - ratio * s)**2)) / (n - 1)
  half = t975(n - 1) * math.sqrt(spread / n) / float(s.mean())
  return ratio, max(0.0, ratio - half), ratio + half


def below_prediction(predicted: float, baseline_s: Sequence[float],
                     speculative_s: Sequence[float],
                     min_batches: int = AUTO_SWITCH_MIN_BATCHES) -> bool:
  """Whether a segment's measured speedup is below `predicted` by more than
  its noise: at least `min_batches` batches and the 95% interval's upper
  end below the prediction."""
  if len(baseline_s) < max(min_batches, 2):
    return False
  return speedup_interval(baseline_s, speculative_s)[2] < predicted


def with_measured_alpha(pilots: Mapping[str, Mapping[str, Any]],
                        candidate: auto_mode.Candidate,
                        histogram: Sequence[int]) -> Dict[str, Any]:
  """`pilots` ({pilot_key: `auto_run.run_pilot`'s record}) with the
  acceptance of `candidate`'s mode (and tree width) measured on its
  segment's histogram [γ + 1], by the pilots' own estimator (kept /
  min(n + 1, γ) trials; a tree's a_1 and a). Unchanged when the segment
  made no acceptance trial or the candidate has no pilot."""
  out = dict(pilots)
  key = candidate.pilot_key
  counts = np.asarray(histogram, np.int64)
  gamma = counts.size - 1
  if key not in out or gamma < 1 or not acceptance_trials(counts, gamma):
    return out
  alpha = float(np.arange(gamma + 1) @ counts) / acceptance_trials(
      counts, gamma)
  out[key] = dict(out[key], alpha=alpha)
  if candidate.mode.branches:
    first, out[key]["deeper"] = auto_tree.depth_acceptance(counts)
    # The pilot's a_1 by width, with this width's as measured.
    by_width = list(out[key].get("first_depth_by_width") or ())
    if candidate.tree_width and candidate.tree_width <= len(by_width):
      by_width[candidate.tree_width - 1] = first
      out[key]["first_depth_by_width"] = by_width
    else:
      out[key]["first_depth"] = first
  return out


def corrected_rows(
    candidates: Sequence[auto_mode.Candidate], current: int, measured: float,
    prices: Optional[auto_mode.Prices], pilots: Mapping[str, Mapping[str, Any]],
    ran: Mapping[int, float]) -> Tuple[List[Dict[str, Any]], float]:
  """Every candidate predicted again after a segment of candidate `current`
  measured `measured` (the module's rule); (rows, κ).

  Args:
    candidates: the run's candidates (`auto_mode.candidates`).
    current: the index of the segment's candidate.
    measured: its measured speedup.
    prices: the call prices (None: nothing priced, beams).
    pilots: {pilot_key: the pilot's record}, the current candidate's with
      the α its segment measured (`with_measured_alpha`).
    ran: {index: measured speedup} of candidates that ran before.

  Returns:
    `auto_mode.predict`'s rows with `basis`: 'measured' (it ran: its
    measured speedup), 'corrected' (its prediction at the measured α, times
    κ) or 'target alone' (1); and κ = measured / the current candidate's
    prediction at the measured α.
  """
  rows = [auto_mode.predict(c, prices, pilots) for c in candidates]
  own = rows[current]["predicted_speedup"]
  kappa = measured / own if own > 0 else 1.0
  done = {**ran, current: measured}
  for i, row in enumerate(rows):
    if candidates[i].mode.target_alone:
      row["basis"] = "target alone"
    elif i in done:
      row.update(predicted_speedup=float(done[i]), basis="measured")
    else:
      row.update(predicted_speedup=row["predicted_speedup"] * kappa,
                 basis="corrected")
  return rows, float(kappa)


def rechoose(rows: Sequence[Mapping[str, Any]], current: int,
             min_gain: float = auto_mode.AUTO_MIN_GAIN) -> int:
  """The candidate to run next: `auto_mode.choose`'s, if it is predicted at
  least `min_gain` times the current one's (`corrected_rows`: its measured
  speedup); else the current one."""
  best = auto_mode.choose(rows, min_gain)
  if best != current and (rows[best]["predicted_speedup"]
                          >= min_gain * rows[current]["predicted_speedup"]):
    return best
  return current


def may_leave_for_the_target_alone(speedup_upper: float) -> bool:
  """Whether a speculative choice may give way to the target alone: only
  when it is measured slower than the target alone, the upper end of its
  speedup's 95% interval below 1. The target alone is kept once chosen, so
  a few noisy first batches measured below the prediction (5 sentences
  measured a 1.12x setting below 0.95x) must not end speculation for the
  rest of the run."""
  return speedup_upper < 1.0


def switch_reason(batch: int, rows: Sequence[Mapping[str, Any]], current: int,
                  chosen: int, predicted: float,
                  interval: Tuple[float, float, float], kappa: float) -> str:
  """The stdout line of a switch: 'auto: after batch 4, token γ=12 ran
  1.20× (95%: 1.10–1.30), below its predicted 2.40×; switched to token γ=6
  (predicted 1.31× at the measured α 0.62, the cost model ×0.95)'."""
  speedup, low, high = interval
  row = rows[chosen]
  if row["basis"] == "measured":
    why = f"measured {row['predicted_speedup']:.2f}× when it ran"
  elif row["basis"] == "corrected":
    same = ((row["mode"], row["tree_width"]) == (rows[current]["mode"],
                                                 rows[current]["tree_width"]))
    alpha = ("" if row["alpha"] is None else
             f" at {'the measured' if same else 'the pilot'} α "
             f"{row['alpha']:.2f}")
    why = (f"predicted {row['predicted_speedup']:.2f}×{alpha}, the cost "
           f"model ×{kappa:.2f}")
  else:
    why = "1.00×"
  return (f"auto: after batch {batch}, {rows[current]['label']} ran "
          f"{speedup:.2f}× (95%: {low:.2f}–{high:.2f}), below its predicted "
          f"{predicted:.2f}×; switched to {row['label']} ({why})")


def switched(record: Optional[Mapping[str, Any]]) -> bool:
  """Whether an `auto` record (metrics.json's) switched choices."""
  return bool(record and record.get("switches"))


def acceptance_trials(histogram: np.ndarray, gamma: int) -> float:
  """Acceptance trials of calls counted by kept guesses [γ + 1]: min(n + 1,
  γ) per call that kept n (`analysis.alpha_from_acceptance_counts`)."""
  return float(np.minimum(np.arange(gamma + 1) + 1, gamma) @ histogram)


def batch_acceptance(mode: decode_modes.DecodeMode, out: Any,
                     keep: np.ndarray) -> Tuple[np.ndarray, float]:
  """(a batch's [γ + 1] calls by kept guesses, its acceptance trials) over
  its kept rows, as its mode counts trials: β's for token and block
  verification (`beta_count`), min(n + 1, γ) per call for trees and beams,
  none for the target alone (it guesses nothing)."""
  counts = np.asarray(out.accepted_histogram)[keep].sum(0).astype(np.int64)
  if mode.target_alone:
    return counts, 0.0
  if mode.one_path:
    return counts, float(np.sum(np.asarray(out.beta_count)[keep]))
  return counts, acceptance_trials(counts, counts.size - 1)


def padded_sum(total: np.ndarray, histogram: np.ndarray) -> np.ndarray:
  """Two histograms of kept guesses added, the shorter padded with zeros
  (a run that switched: metrics.json's is as wide as its largest γ)."""
  width = max(total.size, histogram.size)
  return (np.pad(total,
                 (0, width - total.size)) + np.pad(histogram,
                                                   (0, width - histogram.size)))


@dataclasses.dataclass
class Segment:
  """The batches one choice decodes in a row, measured as they finish.

  Attributes:
    index: the candidate's index; candidate: it; row: its first row
      (label, mode, γ, k); plan: its `DecodePlan`.
    first_batch: the segment's first batch (0-based).
    predicted: the speedup it was chosen on.
    compile_s: seconds compiling it when the run switched to it.
    batches: batches decoded; baseline_s / speculative_s: each one's
      seconds (MODE='infer': the target alone's estimated).
    histogram: [γ + 1] its calls by kept guesses (kept rows).
    examples, tokens, calls: kept rows, their tokens and target calls.
  """
  index: int
  candidate: auto_mode.Candidate
  row: Mapping[str, Any]
  plan: Any
  first_batch: int
  predicted: float
  compile_s: float = 0.0
  batches: int = 0
  baseline_s: List[float] = dataclasses.field(default_factory=list)
  speculative_s: List[float] = dataclasses.field(default_factory=list)
  histogram: Optional[np.ndarray] = None
  examples: int = 0
  tokens: int = 0
  calls: int = 0

  def add(self, baseline_s: Optional[float], speculative_s: float, out: Any,
          keep: np.ndarray) -> None:
    """One batch: its seconds (baseline None: unknown) and the choice's
    output on the host (`CallStatistics`; its kept rows count)."""
    self.batches += 1
    if baseline_s is not None and speculative_s > 0:
      self.baseline_s.append(float(baseline_s))
      self.speculative_s.append(float(speculative_s))
    rows = np.asarray(out.accepted_histogram)[keep].sum(0).astype(np.int64)
    self.histogram = rows if self.histogram is None else self.histogram + rows
    self.examples += len(keep)
    self.tokens += int(np.sum(np.asarray(out.tokens)[keep] != 0))
    self.calls += int(np.sum(np.asarray(out.target_calls)[keep]))

  def interval(self) -> Tuple[float, float, float]:
    return speedup_interval(self.baseline_s, self.speculative_s)

  def record(self, estimated: bool) -> Dict[str, Any]:
    """metrics.json's `auto.segments` entry."""
    counts = (np.zeros(1, np.int64)
              if self.histogram is None else self.histogram)
    gamma = counts.size - 1
    trials = acceptance_trials(counts, gamma) if gamma else 0.0
    speedup = low = high = None
    if self.speculative_s:
      speedup, low, high = self.interval()
    return {
        "label": self.row["label"],
        "mode": self.row["mode"],
        "gamma": self.row["gamma"],
        "tree_width": self.row["tree_width"],
        "first_batch": self.first_batch,
        "batches": self.batches,
        "examples": self.examples,
        "predicted_speedup": self.predicted,
        "measured_speedup": speedup,
        "speedup_interval": [low, None if high == math.inf else high],
        "baseline_s": float(sum(self.baseline_s)),
        "baseline_estimated": estimated,
        "speculative_s": float(sum(self.speculative_s)),
        "alpha": (None if self.candidate.mode.target_alone or not trials else
                  float(np.arange(gamma + 1) @ counts) / trials),
        "accepted_histogram": counts.tolist(),
        "target_calls": self.calls,
        "tokens_generated": self.tokens,
        "tokens_per_target_call": self.tokens / max(self.calls, 1),
        "compile_s": self.compile_s,
    }


class OnlineChoice:
  """SPECULATION='auto' during the timed decode: the plan the next batch
  decodes with, each segment's measurements, and the switches (the
  module's rule). Built by `auto_run.choose_mode` (`DecodePlan.online`).

  Args:
    candidates, rows: the candidates and their first predictions.
    chosen: the first choice's index.
    pilots, prices: what the rows were predicted from.
    build: candidate -> its `DecodePlan` (built, not compiled).
    plan: the first choice's `DecodePlan`.
    target_step_s: the priced target step in seconds (MODE='infer'
      estimates the target alone's seconds of a batch as it times its
      longest output; None: not priced, so MODE='infer' never switches).
  """

  def __init__(self, candidates: Sequence[auto_mode.Candidate],
               rows: Sequence[Mapping[str, Any]], chosen: int,
               pilots: Mapping[str, Mapping[str, Any]],
               prices: Optional[auto_mode.Prices],
               build: Callable[[auto_mode.Candidate], Any], plan: Any,
               target_step_s: Optional[float] = None):
    self.candidates = list(candidates)
    self.rows = [dict(r) for r in rows]
    self.pilots = dict(pilots)
    self.prices = prices
    self.build = build
    self.target_step_s = target_step_s
    self.infer = plan.args.mode == "infer"
    self.ran: Dict[int, float] = {}
    self.switches: List[Dict[str, Any]] = []
    self.plans = {chosen: plan}  # built (and compiled) so far
    self.segments = [self._segment(chosen, plan, 0, self.rows[chosen])]

  def _segment(self, index: int, plan: Any, first_batch: int,
               row: Mapping[str, Any]) -> Segment:
    return Segment(index, self.candidates[index], self.rows[index], plan,
                   first_batch, float(row["predicted_speedup"]))

  @property
  def plan(self) -> Any:
    """The `DecodePlan` the next batch decodes with."""
    return self.segments[-1].plan

  @property
  def switched(self) -> bool:
    return bool(self.switches)

  def after_batch(self, batch: int, baseline_s: Optional[float],
                  speculative_s: float, out: Any, keep: np.ndarray,
                  feed: multihost.Feeder) -> Any:
    """Records batch `batch` (seconds, the choice's output on the host;
    baseline_s None in MODE='infer': estimated), tests the choice when due
    and switches (compiling the new choice on `feed`'s input widths,
    outside the timed decode). Returns the plan of the next batch."""
    segment = self.segments[-1]
    if baseline_s is None and self.target_step_s is not None:
      baseline_s = self.target_step_s * float(np.max(np.asarray(out.lengths)))
    segment.add(baseline_s, speculative_s, out, keep)
    if not self._due():
      return self.plan
    mine = self._decide(batch) if multihost.is_first() else None
    decision = multihost.allgather("speculation_auto_switch", mine)[0]
    if decision is not None:
      self._switch(batch, decision, feed)
    return self.plan

  def _due(self) -> bool:
    """A test is due: the same answer on every process (batch counts)."""
    segment = self.segments[-1]
    return (not segment.candidate.mode.target_alone and
            len(self.switches) < AUTO_SWITCH_MAX_SWITCHES and
            segment.batches >= AUTO_SWITCH_MIN_BATCHES and
            (not self.infer or self.target_step_s is not None))

  def _decide(self, batch: int) -> Optional[Dict[str, Any]]:
    """The switch after batch `batch`, or None (this process's numbers)."""
    segment = self.segments[-1]
    if not below_prediction(segment.predicted, segment.baseline_s,
                            segment.speculative_s):
      return None
    interval = segment.interval()
    pilots = with_measured_alpha(self.pilots, segment.candidate,
                                 segment.histogram)
    rows, kappa = corrected_rows(self.candidates, segment.index, interval[0],
                                 self.prices, pilots, self.ran)
    chosen = rechoose(rows, segment.index)
    if chosen == segment.index or (
        self.candidates[chosen].mode.target_alone and
        not may_leave_for_the_target_alone(interval[2])):
      return None
    key = segment.candidate.pilot_key
    return {
        "after_batch": batch + 1,
        "from": rows[segment.index]["label"],
        "to": rows[chosen]["label"],
        "to_index": chosen,
        "measured_speedup": interval[0],
        "speedup_interval": [interval[1], interval[2]],
        "predicted_speedup": segment.predicted,
        "alpha": pilots[key]["alpha"] if key in pilots else None,
        "kappa": kappa,
        "candidates": rows,
        "pilots": pilots,
        "reason": switch_reason(batch + 1, rows, segment.index, chosen,
                                segment.predicted, interval, kappa),
    }

  def _switch(self, batch: int, decision: Dict[str, Any],
              feed: multihost.Feeder) -> None:
    segment = self.segments[-1]
    chosen = int(decision.pop("to_index"))
    logging.info("%s", decision["reason"])
    self.ran[segment.index] = float(decision["measured_speedup"])
    self.pilots = dict(decision.pop("pilots"))
    self.switches.append(decision)
    new = chosen not in self.plans
    if new:
      self.plans[chosen] = self.build(self.candidates[chosen])
    plan = self.plans[chosen]
    row = decision["candidates"][chosen]
    self.segments.append(self._segment(chosen, plan, batch + 1, row))
    # (A walltime run takes the target alone's output from its baseline.)
    if new and (self.infer or not self.candidates[chosen].mode.target_alone):
      self.segments[-1].compile_s = warm(plan.speculative, feed, plan.rng)

  def record(self) -> Dict[str, Any]:
    """metrics.json's (infer.json's) `auto.segments` and `auto.switches`."""
    return {
        "segments": [s.record(self.infer) for s in self.segments],
        "switches": self.switches,
    }

  @property
  def compile_s(self) -> float:
    """Seconds compiling the choices switched to."""
    return float(sum(s.compile_s for s in self.segments))

  def metrics_args(self) -> Any:
    """The arguments metrics.json's settings keys are read from: the run's
    choice, or in a run that switched the last speculative choice's, with
    SPECULATION='auto' and γ the largest any segment ran (the width of the
    run's histogram)."""
    if not self.switched:
      return self.plan.args
    last = next(
        s for s in reversed(self.segments) if not s.candidate.mode.target_alone)
    gamma = max(int(s.plan.args.gamma) for s in self.segments)
    return dataclasses.replace(last.plan.args, gamma=gamma,
                               speculation=decode_modes.SPECULATION_AUTO)


def outcome(plan: Any) -> Tuple[Any, Optional[Dict[str, Any]], float]:
  """After the timed decode of `plan` (a `DecodePlan`): (the arguments
  the result's settings keys are read from, its `auto` record with the
  segments and switches, seconds compiling the choices switched to)."""
  online = plan.online
  if online is None:
    return plan.args, plan.auto, 0.0
  return (online.metrics_args(), {
      **(plan.auto or {}),
      **online.record()
  }, online.compile_s)


def warm(decoder: Any, feed: multihost.Feeder, rng: jax.Array) -> float:
  """Compiles (or reads from the cache) and runs `decoder` once per input
  width of `feed`; the seconds (outside the timed decode)."""
  t0 = time.perf_counter()
  for b in feed.first_of_each_width():
    jax.block_until_ready(decoder(feed.batch(b), rng))
  return time.perf_counter() - t0
