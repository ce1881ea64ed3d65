"""Where a run's walltime goes beyond Theorem 3.8's model (issue 32).

Two views for metrics.json, both from what `walltime.decode_examples`
measured anyway (no extra timing):

* `efficiency_split`: Table 2's efficiency (speedup / Theorem 3.8 at the
  measured call cost) as a product of factors: the outputs' sentence ends,
  acceptance that is not i.i.d., the outputs' lengths, and time.
* `fixed_cost_metrics`: each decoder's walltime as a fixed cost per example
  plus a marginal cost per loop iteration, from a least-squares line
  through its batches (`BatchTimes`, `fixed_and_marginal`).
"""
import dataclasses
from typing import Any, Dict, Optional, Tuple

import numpy as np

from specdec_jax.metrics import analysis


@dataclasses.dataclass(frozen=True)
class BatchTimes:
  """Each timed batch's seconds and loop iterations (N batches).

  Attributes:
    seconds_base / seconds_spec: [N] each decoder's timed call.
    iterations_base / iterations_spec: [N] the loop's iterations in that
      call: its rows' most target calls (the loop runs until its last row
      is done).
    rows: [N] the batch's rows (examples and padding rows alike: every row
      is decoded).
  """
  seconds_base: np.ndarray
  seconds_spec: np.ndarray
  iterations_base: np.ndarray
  iterations_spec: np.ndarray
  rows: np.ndarray


def fixed_and_marginal(seconds: np.ndarray,
                       iterations: np.ndarray) -> Optional[Tuple[float, float]]:
  """(intercept, slope) of the least-squares line seconds = a + b·iterations
  over the batches: a batch's fixed cost (dispatch, encoders, set-up) and
  one iteration's; None with fewer than 3 batches or 2 distinct counts."""
  if len(seconds) < 3 or len(np.unique(iterations)) < 2:
    return None
  slope, intercept = np.polyfit(np.asarray(iterations, np.float64),
                                np.asarray(seconds, np.float64), 1)
  return float(intercept), float(slope)


def fixed_cost_metrics(batches: Optional[BatchTimes], target_step_s: float,
                       iteration_model_s: float) -> Dict[str, Any]:
  """Each decoder's walltime split into a fixed cost per example and a
  marginal cost per loop iteration ({} when the batches fix no line):

    fixed_cost_per_example_s: {"baseline", "speculative"}: the line's
      intercept over the batch's rows (dispatch, both encoders, set-up);
    marginal_baseline_overhead: the baseline's slope / target_step_s;
    marginal_iteration_overhead: the speculative slope /
      iteration_model_s, an iteration's priced model calls (γ·draft step +
      verification call; ACCEPTANCE='tree': γ draft depths and the tree
      call).
  """
  if batches is None:
    return {}
  base = fixed_and_marginal(batches.seconds_base, batches.iterations_base)
  spec = fixed_and_marginal(batches.seconds_spec, batches.iterations_spec)
  if base is None or spec is None:
    return {}
  rows = float(np.mean(batches.rows))
  return {
      "fixed_cost_per_example_s": {
          "baseline": base[0] / rows,
          "speculative": spec[0] / rows,
      },
      "marginal_baseline_overhead": base[1] / target_step_s,
      "marginal_iteration_overhead": spec[1] / iteration_model_s,
  }


def efficiency_split(alpha: float, gamma: int, spec_tokens: np.ndarray,
                     calls_base: int, calls_spec: int,
                     theory: Dict[str, float]) -> Dict[str, Any]:
  """Where Table 2's efficiency (speedup / Theorem 3.8 at the measured call
  cost) goes, as factors whose product is the efficiency (batch rows each
  count their own target calls, so this holds at any batch size):

    sentence_ends: Equation (1) with each output's last call cut at its
      end (`analysis.expected_tokens_per_call_with_ends`) / Equation (1);
    acceptance: measured tokens per call / that: what i.i.d. acceptance at
      the measured α does not explain (α varies by position and sentence);
    output_lengths: the baseline's tokens / speculative decoding's (1 at
      T = 0; sampled outputs differ in length);
    time: baseline_overhead / iteration_overhead: each decoder's walltime
      per target call against its priced model calls (fixed costs per
      example, dispatch, loop work).

  Args:
    spec_tokens: [N, T] speculative decoding's tokens (0 after EOS).
    calls_base / calls_spec: each decoder's target calls, summed over rows
      (the baseline's are its tokens).
    theory: `baseline_overhead` and `iteration_overhead`.
  """
  lengths = np.sum(spec_tokens != 0, axis=1)
  tokens = int(lengths.sum())
  if tokens == 0 or calls_spec == 0:
    return {}
  iid = float(analysis.expected_tokens_per_iteration(alpha, gamma))
  ends = analysis.expected_tokens_per_call_with_ends(alpha, gamma, lengths)
  return {
      "theory_tokens_per_call": iid,
      "theory_tokens_per_call_with_ends": ends,
      "efficiency_split": {
          "sentence_ends": ends / iid,
          "acceptance": tokens / calls_spec / ends,
          "output_lengths": calls_base / tokens,
          "time": theory["baseline_overhead"] / theory["iteration_overhead"],
      },
  }
