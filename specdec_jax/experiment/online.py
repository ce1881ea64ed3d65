"""SPECULATION='auto' while the run decodes (issue 45): the choice is
measured batch by batch and changed between batches when it ran below its
prediction by more than its noise (`OnlineChoice`, `DecodePlan.online`);
the rules keep a run from flapping (docs/usage/running.md).
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


def speedup_interval(
    baseline_s: Sequence[float],
    speculative_s: Sequence[float]) -> Tuple[float, float, float]:
  """(speedup, low, high): Σ baseline / Σ speculative and its 95% interval
  (the ratio estimator's, batches as samples, Student's t); (ratio, 0,
  inf) with fewer than 2 batches."""
  b = np.asarray(baseline_s, np.float64)
  s = np.asarray(speculative_s, np.float64)
  if b.shape != s.shape or b.ndim != 1 or not b.size or np.any(s <= 0):
    raise ValueError("baseline_s and speculative_s: one positive time per "
                     f"batch each, got {b.shape} and {s.shape}.")
  ratio = float(b.sum() / s.sum())
  n = b.size
  if n < 2:
    return ratio, 0.0, math.inf
  from scipy import stats  # pylint: disable=g-import-not-at-top
  spread = float(np.sum((b - ratio * s)**2)) / (n - 1)
  half = stats.t.ppf(0.975, n - 1) * math.sqrt(spread / n) / float(s.mean())
  return ratio, max(0.0, ratio - half), ratio + half


def below_prediction(predicted: float, baseline_s: Sequence[float],
                     speculative_s: Sequence[float],
                     min_batches: int = auto.AUTO_SWITCH_MIN_BATCHES) -> bool:
  """Whether `min_batches` batches put the measured interval's upper end
  below `predicted`."""
  if len(baseline_s) < max(min_batches, 2):
    return False
  return speedup_interval(baseline_s, speculative_s)[2] < predicted


def with_measured_alpha(pilots: Mapping[str, Mapping[str, Any]],
                        candidate: auto.Candidate,
                        histogram: Sequence[int]) -> Dict[str, Any]:
  """`pilots` with `candidate`'s acceptance as its batches' histogram
  [γ + 1] measured it (the pilots' estimator; a tree's a_1 and a);
  unchanged without a trial or such a pilot."""
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
    by_width = list(out[key].get("first_depth_by_width") or ())
    if candidate.tree_width and candidate.tree_width <= len(by_width):
      by_width[candidate.tree_width - 1] = first
      out[key]["first_depth_by_width"] = by_width
    else:
      out[key]["first_depth"] = first
  return out


def with_measured_waits(pilots: Mapping[str, Mapping[str, Any]],
                        candidate: auto.Candidate, tally: batches_lib.Tally,
                        gammas: Sequence[int],
                        batch_size: int) -> Dict[str, Any]:
  """`pilots` with a chain's or tree's `candidate`'s batch factors at
  `gammas` replayed from its own batches' rows (`tally.chains`: more rows
  than its pilot's, whose few batches say little of a batch's slowest
  row); unchanged for other modes, without rows or without such a
  pilot."""
  out = dict(pilots)
  key = candidate.pilot_key
  if not (candidate.mode.replays and tally.chains and key in out):
    return out
  out[key] = dict(
      out[key],
      batch_factor_by_gamma=tally.batch_factor_by_gamma(int(candidate.gamma),
                                                        gammas, batch_size))
  return out


def corrected_rows(
    candidates_: Sequence[auto.Candidate], current: int, measured: float,
    prices: Optional[auto.Prices], pilots: Mapping[str, Mapping[str, Any]],
    ran: Mapping[int, float],
    overheads: Mapping[str, float]) -> Tuple[List[Dict[str, Any]], float]:
  """Every candidate predicted again after candidate `current` measured
  `measured` (`pilots`: with its measured α; `ran`: {index: speedup} of
  those that ran; `overheads`: {family: steps} so far).

  Returns (`predict_all`'s rows with `basis`: 'measured', 'corrected' (the
  current family: the overhead the measurement implies), 'calibrated' or
  'target alone'; that overhead).
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
  """`choose`'s candidate if predicted above `min_gain` times `upper` (the
  current one's interval's upper end), else the current one."""
  best = auto.choose(rows, min_gain)
  if best != current and rows[best]["predicted_speedup"] >= min_gain * upper:
    return best
  return current


def switch_reason(batch: int, rows: Sequence[Mapping[str, Any]], current: int,
                  chosen: int, predicted: float,
                  interval: Tuple[float, float, float], scale: float) -> str:
  """The stdout line of a switch: 'auto: after batch 4, token γ=12 ran
  1.20× (95%: 1.10–1.30), below its predicted 2.40×; switched to ...'."""
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
  """The batches one choice decodes in a row: its candidate (index, row,
  plan), first batch, the speedup it was chosen on, compile seconds, each
  batch's seconds (MODE='infer': the baseline estimated) and tally."""
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
    """One batch (baseline None: unknown)."""
    if baseline_s is not None and speculative_s > 0:
      self.baseline_s.append(float(baseline_s))
      self.speculative_s.append(float(speculative_s))
    self.tally.add(out, keep, self.candidate.mode, speculative_s)

  def record(self, estimated: bool) -> Dict[str, Any]:
    """metrics.json's `auto.segments` entry."""
    tally = self.tally
    speedup = low = high = None
    if self.speculative_s:
      speedup, low, high = speedup_interval(self.baseline_s, self.speculative_s)
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
  """SPECULATION='auto' during the timed decode: the next batch's plan,
  the segments and the switches.

  `record`: metrics.json's `auto` of the first choice; `build`: candidate
  -> its `DecodePlan`; `target_step_s`: the priced step (MODE='infer'
  estimates the baseline by it; None: MODE='infer' never switches).
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
    """Records `batch`, tests the choice when due and switches (compiled
    outside the timed decode); the next batch's plan."""
    segment = self.segments[-1]
    if baseline_s is None and self.target_step_s is not None:
      baseline_s = self.target_step_s * float(np.max(np.asarray(out.lengths)))
    segment.add(baseline_s, speculative_s, out, batch.keep)
    # A test is due (batch counts: the same answer on every process)?
    if (segment.candidate.mode.target_alone or
        len(self.switches) >= auto.AUTO_SWITCH_MAX_SWITCHES or
        segment.tally.batches < auto.AUTO_SWITCH_MIN_BATCHES or
        (self.infer and self.target_step_s is None)):
      return self.plan
    mine = self._decide(batch.index) if multihost.is_first() else None
    decision = multihost.allgather("speculation_auto_switch", mine)[0]
    if decision is not None:
      self._switch(batch.index, decision, feed)
    return self.plan

  def _decide(self, batch: int) -> Optional[Dict[str, Any]]:
    """The switch after batch `batch`, or None (this process's numbers)."""
    segment = self.segments[-1]
    if not below_prediction(segment.predicted, segment.baseline_s,
                            segment.speculative_s):
      return None
    interval = speedup_interval(segment.baseline_s, segment.speculative_s)
    pilots = with_measured_waits(
        with_measured_alpha(self.pilots, segment.candidate,
                            segment.tally.histogram), segment.candidate,
        segment.tally, [c.gamma for c in self.candidates if c.gamma],
        segment.plan.args.batch_size)
    rows, overhead = corrected_rows(self.candidates, segment.index, interval[0],
                                    self.prices, pilots, self.ran,
                                    self.overheads)
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
    """(the plan the result records: after a switch, the last speculative
    one's at SPECULATION='auto' and the largest γ run; metrics.json's
    `auto`; seconds compiling switches)."""
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
