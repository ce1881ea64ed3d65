"""SPECULATION='auto' while the run decodes (issue 45): the choice keeps
being measured batch by batch and may change between batches when the
measurement says its prediction was wrong (the rule:
`below_prediction`, `corrected_rows`, `rechoose`).

`pilots.choose_mode` injects an `OnlineChoice` into the plan it returns
(`DecodePlan.online`); MODE='walltime' and MODE='infer' call its
`after_batch` after each batch and its `outcome` at the end, and know
nothing else of it. A run that chose nothing has none.

* measure: after each batch, the choice's seconds and the target alone's
  (MODE='walltime' decodes both anyway; MODE='infer' estimates the target
  alone as the priced target step times the batch's longest output), and
  its outputs (`batches.Tally`). The batches one choice decodes in a row
  are a segment (`Segment`).
* test: once the segment has AUTO_SWITCH_MIN_BATCHES batches, after every
  batch, at most AUTO_SWITCH_MAX_SWITCHES switches per run.
* switch: to `rechoose`'s candidate; it is compiled (and run once per
  input width) outside the timed decode, its seconds recorded.

No flapping: a new segment is tested only after AUTO_SWITCH_MIN_BATCHES
batches of its own; each family is predicted with its own calibration
(a tree is never re-predicted with a chain's calibration); a switch needs the
evidence to beat the choice by more than the upper end of its measured
interval; a candidate that ran is predicted by its measurement; the
target alone, once chosen, is kept (it drafts nothing: there is nothing
new to measure).

Nothing here changes what a batch decodes: a choice is made between
batches from past batches only, every candidate is exact (or the target
alone), and batch i is decoded with the run's rng for batch i whatever
decodes it. Several processes: process 0 decides on its own seconds, every
process follows its decision (as for the first choice).
"""
import dataclasses
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from specdec_jax import multihost
from specdec_jax.experiment import auto
from specdec_jax.experiment import batches as batches_lib
from specdec_jax.experiment import decode_modes

# Student's t, 97.5% quantile, by degrees of freedom 1..30 (then
# Cornish-Fisher's first term, within 0.1% of the table from 30 on).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


# -- the rule ------------------------------------------------------------------
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
                     min_batches: int = auto.AUTO_SWITCH_MIN_BATCHES) -> bool:
  """Whether a choice's measured speedup is below `predicted` by more than
  its noise: at least `min_batches` batches and the 95% interval's upper
  end below the prediction."""
  if len(baseline_s) < max(min_batches, 2):
    return False
  return speedup_interval(baseline_s, speculative_s)[2] < predicted


def with_measured_alpha(pilots: Mapping[str, Mapping[str, Any]],
                        candidate: auto.Candidate,
                        histogram: Sequence[int]) -> Dict[str, Any]:
  """`pilots` with the acceptance of `candidate`'s mode (and tree width)
  measured on the run's histogram [γ + 1] of its batches, by the pilots'
  own estimator (kept / min(n + 1, γ) trials; a tree's a_1 and a).
  Unchanged when there was no acceptance trial or no such pilot."""
  out = dict(pilots)
  key = candidate.pilot_key
  counts = np.asarray(histogram, np.int64)
  gamma = counts.size - 1
  trials = float(np.minimum(np.arange(gamma + 1) + 1, gamma) @ counts)
  if key not in out or gamma < 1 or not trials:
    return out
  out[key] = dict(out[key], alpha=float(np.arange(gamma + 1) @ counts) / trials)
  if candidate.mode.branches:
    first, out[key]["deeper"] = auto.depth_acceptance(counts)
    # The pilot's a_1 by width, with this width's as measured.
    by_width = list(out[key].get("first_depth_by_width") or ())
    if candidate.tree_width and candidate.tree_width <= len(by_width):
      by_width[candidate.tree_width - 1] = first
      out[key]["first_depth_by_width"] = by_width
    else:
      out[key]["first_depth"] = first
  return out


def corrected_rows(
    candidates_: Sequence[auto.Candidate], current: int, measured: float,
    prices: Optional[auto.Prices], pilots: Mapping[str, Mapping[str, Any]],
    ran: Mapping[int, float],
    overheads: Mapping[str, float]) -> Tuple[List[Dict[str, Any]], float]:
  """Every candidate predicted again after candidate `current` measured
  `measured`; (rows, the overhead per call of the current one's family
  as measured: `overhead_steps`).

  Args:
    candidates_: the run's candidates (`candidates`).
    current: the index of the candidate that decoded the last batches.
    measured: its measured speedup.
    prices: the call prices (None: nothing priced, beams).
    pilots: {pilot_key: the pilot's record}, the current candidate's with
      the α it measured (`with_measured_alpha`).
    ran: {index: measured speedup} of candidates that ran before.
    overheads: {family: steps} each family's calibration so far (its
      pilot's, or its last measured one).

  Returns:
    `predict_all`'s rows with `basis`: 'measured' (it ran: its measured
    speedup), 'corrected' (the current one's family: its model at the
    measured α with the overhead the measurement implies), 'calibrated'
    (another family: its own overhead, never the current one's) or
    'target alone' (1); and that overhead.
  """
  rows = auto.predict_all(candidates_, prices, pilots, overheads)
  family = candidates_[current].family
  own = rows[current]
  # Unpriced (beams): a walltime ratio, no calls to add an overhead to.
  priced = own["call_cost"] is not None
  overhead = auto.overhead_steps(measured, own) if priced else 0.0
  own_model = own.get("model_speedup", own["predicted_speedup"])
  done = {**ran, current: measured}
  for i, (c, row) in enumerate(zip(candidates_, rows)):
    if c.mode.target_alone:
      row["basis"] = "target alone"
    elif i in done:
      row.update(predicted_speedup=float(done[i]), basis="measured")
    elif c.family == family and priced:
      row.update(
          model_speedup=row.get("model_speedup", row["predicted_speedup"]),
          predicted_speedup=auto.calibrated(row, overhead), basis="corrected")
    elif c.family == family:
      row.update(
          predicted_speedup=row["predicted_speedup"] * measured /
          own_model if own_model > 0 else row["predicted_speedup"],
          basis="corrected")
    else:
      row["basis"] = "calibrated"
  return rows, float(overhead)


def rechoose(rows: Sequence[Mapping[str, Any]], current: int, upper: float,
             min_gain: float = auto.AUTO_MIN_GAIN) -> int:
  """The candidate to run next: `choose`'s, if it is predicted above
  `min_gain` times `upper`, the upper end of the current one's measured
  speedup's 95% interval (the evidence must beat the choice by more than
  its noise); else the current one."""
  best = auto.choose(rows, min_gain)
  if best != current and rows[best]["predicted_speedup"] >= min_gain * upper:
    return best
  return current


def switch_reason(batch: int, rows: Sequence[Mapping[str, Any]], current: int,
                  chosen: int, predicted: float,
                  interval: Tuple[float, float, float], scale: float) -> str:
  """The stdout line of a switch: 'auto: after batch 4, token γ=12 ran
  1.20× (95%: 1.10–1.30), below its predicted 2.40×; switched to token γ=6
  (predicted 1.41× at the measured α 0.62, the cost model as this run measured it (κ 0.95))'."""
  speedup, low, high = interval
  row = rows[chosen]
  if row["basis"] == "measured":
    why = f"measured {row['predicted_speedup']:.2f}× when it ran"
  elif row["basis"] == "target alone":
    why = "1.00×"
  else:
    same = ((row["mode"], row["tree_width"]) == (rows[current]["mode"],
                                                 rows[current]["tree_width"]))
    alpha = ("" if row["alpha"] is None else
             f" at {'the measured' if same else 'the pilot'} α "
             f"{row['alpha']:.2f}")
    model = (f"the cost model as this run measured it (κ {scale:.2f})"
             if row["basis"] == "corrected" else "its own pilot's calibration")
    why = f"predicted {row['predicted_speedup']:.2f}×{alpha}, {model}"
  return (f"auto: after batch {batch}, {rows[current]['label']} ran "
          f"{speedup:.2f}× (95%: {low:.2f}–{high:.2f}), below its predicted "
          f"{predicted:.2f}×; switched to {row['label']} ({why})")


@dataclasses.dataclass
class Segment:
  """The batches one choice decodes in a row, measured as they finish.

  Attributes:
    index: the candidate's index; candidate: it; row: its first row
      (label, mode, γ, k); plan: its `DecodePlan`.
    first_batch: the segment's first batch (0-based).
    predicted: the speedup it was chosen on.
    compile_s: seconds compiling it when the run switched to it.
    baseline_s / speculative_s: each batch's seconds (MODE='infer': the
      target alone's estimated).
    tally: its outputs' counts.
  """
  index: int
  candidate: auto.Candidate
  row: Mapping[str, Any]
  plan: Any
  first_batch: int
  predicted: float
  compile_s: float = 0.0
  baseline_s: List[float] = dataclasses.field(default_factory=list)
  speculative_s: List[float] = dataclasses.field(default_factory=list)
  tally: batches_lib.Tally = dataclasses.field(
      default_factory=batches_lib.Tally)

  def add(self, baseline_s: Optional[float], speculative_s: float, out: Any,
          keep: np.ndarray) -> None:
    """One batch: its seconds (baseline None: unknown) and the choice's
    output on the host (its kept rows count)."""
    if baseline_s is not None and speculative_s > 0:
      self.baseline_s.append(float(baseline_s))
      self.speculative_s.append(float(speculative_s))
    self.tally.add(out, keep, self.candidate.mode, speculative_s)

  def interval(self) -> Tuple[float, float, float]:
    return speedup_interval(self.baseline_s, self.speculative_s)

  def record(self, estimated: bool) -> Dict[str, Any]:
    """metrics.json's `auto.segments` entry."""
    tally = self.tally
    speedup = low = high = None
    if self.speculative_s:
      speedup, low, high = self.interval()
    alone = self.candidate.mode.target_alone
    return {
        "label": self.row["label"],
        "mode": self.row["mode"],
        "gamma": self.row["gamma"],
        "tree_width": self.row["tree_width"],
        "first_batch": self.first_batch,
        "batches": tally.batches,
        "examples": tally.examples,
        "predicted_speedup": self.predicted,
        "measured_speedup": speedup,
        "speedup_interval": [low, None if high == math.inf else high],
        "baseline_s": float(sum(self.baseline_s)),
        "baseline_estimated": estimated,
        "speculative_s": float(sum(self.speculative_s)),
        "alpha": (None if alone or not tally.call_trials else tally.call_alpha),
        "accepted_histogram": tally.histogram.tolist(),
        "target_calls": tally.calls,
        "tokens_generated": tally.tokens,
        "tokens_per_target_call": tally.tokens / max(tally.calls, 1),
        "compile_s": self.compile_s,
    }


class OnlineChoice:
  """SPECULATION='auto' during the timed decode: the plan the next batch
  decodes with, each segment's measurements, and the switches (the
  module's rule). Built by `pilots.choose_mode` (`DecodePlan.online`).

  Args:
    candidates, rows: the candidates and their first predictions.
    chosen: the first choice's index.
    pilots, prices, overheads: what the rows were predicted from
      ({family: steps}: each family's calibration, `auto.predict_all`).
    record: metrics.json's `auto` of the first choice.
    build: candidate -> its `DecodePlan` (built, not compiled).
    plan: the first choice's `DecodePlan`.
    target_step_s: the priced target step in seconds (MODE='infer'
      estimates the target alone's seconds of a batch as it times its
      longest output; None: not priced, so MODE='infer' never switches).
  """

  def __init__(self, candidates: Sequence[auto.Candidate],
               rows: Sequence[Mapping[str, Any]], chosen: int,
               pilots: Mapping[str, Mapping[str, Any]],
               prices: Optional[auto.Prices], overheads: Mapping[str, float],
               record: Mapping[str, Any], build: Callable[[auto.Candidate],
                                                          Any], plan: Any,
               target_step_s: Optional[float] = None):
    self.candidates = list(candidates)
    self.rows = [dict(r) for r in rows]
    self.pilots = dict(pilots)
    self.prices = prices
    self.overheads = dict(overheads)
    self.first = dict(record)
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

  def after_batch(self, batch: batches_lib.Batch, baseline_s: Optional[float],
                  speculative_s: float, out: Any,
                  feed: multihost.Feeder) -> Any:
    """Records `batch` (its seconds, the choice's output on the host;
    baseline_s None in MODE='infer': estimated), tests the choice when due
    and switches (compiling the new choice on `feed`'s input widths,
    outside the timed decode). Returns the plan of the next batch."""
    segment = self.segments[-1]
    if baseline_s is None and self.target_step_s is not None:
      baseline_s = self.target_step_s * float(np.max(np.asarray(out.lengths)))
    segment.add(baseline_s, speculative_s, out, batch.keep)
    if not self._due():
      return self.plan
    mine = self._decide(batch.index) if multihost.is_first() else None
    decision = multihost.allgather("speculation_auto_switch", mine)[0]
    if decision is not None:
      self._switch(batch.index, decision, feed)
    return self.plan

  def _due(self) -> bool:
    """A test is due: the same answer on every process (batch counts)."""
    segment = self.segments[-1]
    return (not segment.candidate.mode.target_alone and
            len(self.switches) < auto.AUTO_SWITCH_MAX_SWITCHES and
            segment.tally.batches >= auto.AUTO_SWITCH_MIN_BATCHES and
            (not self.infer or self.target_step_s is not None))

  def _decide(self, batch: int) -> Optional[Dict[str, Any]]:
    """The switch after batch `batch`, or None (this process's numbers)."""
    segment = self.segments[-1]
    if not below_prediction(segment.predicted, segment.baseline_s,
                            segment.speculative_s):
      return None
    interval = segment.interval()
    pilots = with_measured_alpha(self.pilots, segment.candidate,
                                 segment.tally.histogram)
    rows, overhead = corrected_rows(self.candidates, segment.index, interval[0],
                                    self.prices, pilots, self.ran,
                                    self.overheads)
    # κ: what this run measured over its model, for the record and line.
    scale = auto.kappa(
        interval[0], rows[segment.index].get("model_speedup",
                                             segment.predicted))
    chosen = rechoose(rows, segment.index, interval[2])
    if chosen == segment.index:
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
        "kappa": scale,
        "overhead_steps": overhead,
        "candidates": rows,
        "pilots": pilots,
        "reason": switch_reason(batch + 1, rows, segment.index, chosen,
                                segment.predicted, interval, scale),
    }

  def _switch(self, batch: int, decision: Dict[str, Any],
              feed: multihost.Feeder) -> None:
    segment = self.segments[-1]
    chosen = int(decision.pop("to_index"))
    logging.info("%s", decision["reason"])
    self.ran[segment.index] = float(decision["measured_speedup"])
    self.pilots = dict(decision.pop("pilots"))
    family = segment.candidate.family
    if family is not None:  # its family's calibration, as measured
      self.overheads[family] = float(decision["overhead_steps"])
    self.switches.append(decision)
    new = chosen not in self.plans
    if new:
      self.plans[chosen] = self.build(self.candidates[chosen])
    plan = self.plans[chosen]
    row = decision["candidates"][chosen]
    self.segments.append(self._segment(chosen, plan, batch + 1, row))
    # (A walltime run takes the target alone's output from its baseline.)
    if new and (self.infer or not self.candidates[chosen].mode.target_alone):
      self.segments[-1].compile_s = batches_lib.compile_widths(
          feed, [("speculative", plan.speculative)], plan.rng)

  def outcome(self) -> Tuple[Any, Dict[str, Any], float]:
    """After the timed decode: (the `DecodePlan` whose settings the result
    records, metrics.json's (infer.json's) `auto` with its segments and
    switches, seconds compiling the choices switched to).

    The plan is the run's choice, or in a run that switched the last
    speculative choice's, with SPECULATION='auto' and γ the largest any
    segment ran (the width of the run's histogram)."""
    record = {
        **self.first,
        "segments": [s.record(self.infer) for s in self.segments],
        "switches": self.switches,
    }
    compile_s = float(sum(s.compile_s for s in self.segments))
    if not self.switches:
      return self.plan, record, compile_s
    last = next(
        s for s in reversed(self.segments) if not s.candidate.mode.target_alone)
    gamma = max(int(s.plan.args.gamma) for s in self.segments)
    return (last.plan.at(gamma=gamma, speculation=decode_modes.SPECULATION_AUTO,
                         mode=last.plan.mode), record, compile_s)
