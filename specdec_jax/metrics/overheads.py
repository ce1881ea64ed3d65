"""Where a run's walltime goes beyond Theorem 3.8 (issue 32), from what
`walltime.decode_examples` measured anyway: the efficiency split (with
what a batch's slowest row costs, `batch_factor`) and each decoder's fixed
cost per example and marginal cost per iteration.
"""
import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from specdec_jax.metrics import analysis


@dataclasses.dataclass(frozen=True)
class BatchTimes:
  """Each of N timed batches: [N] seconds and loop iterations (its rows'
  most target calls) of each decoder, and its rows (padding included)."""
  seconds_base: np.ndarray
  seconds_spec: np.ndarray
  iterations_base: np.ndarray
  iterations_spec: np.ndarray
  rows: np.ndarray


def fixed_and_marginal(seconds: np.ndarray,
                       iterations: np.ndarray) -> Optional[Tuple[float, float]]:
  """(fixed cost, cost of an iteration): the least-squares line of seconds
  against iterations; None below 3 batches or 2 distinct counts."""
  if len(seconds) < 3 or len(np.unique(iterations)) < 2:
    return None
  slope, intercept = np.polyfit(np.asarray(iterations, np.float64),
                                np.asarray(seconds, np.float64), 1)
  return float(intercept), float(slope)


def fixed_cost_metrics(batches: Optional[BatchTimes], target_step_s: float,
                       iteration_model_s: float) -> Dict[str, Any]:
  """metrics.json's `fixed_cost_per_example_s` (intercept / rows) and
  `marginal_*_overhead` (slope / target_step_s or iteration_model_s, an
  iteration's priced calls); {} when the batches fix no line."""
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


def batch_factor(calls_base: int, calls_spec: int, iterations_base: int,
                 iterations_spec: int) -> float:
  """What waiting for a batch's slowest row costs the speedup: rows' target
  calls per loop iteration, the speculative loop's over the baseline's.

  A batch's loop runs until its last row ends, so a row that ends sooner
  waits; the speculative loop's rows end less together (a row's calls
  follow its acceptances as well as its length). 1 at batch 1; the
  shipped pair at batch 8: 0.88 (`batched_iterations`).

  Args:
    calls_base, calls_spec: target calls summed over the examples' rows.
    iterations_base, iterations_spec: loop iterations summed over batches
      (each batch's rows' most calls).
  """
  if min(calls_base, calls_spec, iterations_base, iterations_spec) <= 0:
    raise ValueError("batch_factor: calls and iterations must be positive, "
                     f"got calls {calls_base}, {calls_spec} and iterations "
                     f"{iterations_base}, {iterations_spec}")
  return (calls_spec / iterations_spec) / (calls_base / iterations_base)


def batch_waits_show(factor: Optional[float]) -> bool:
  """Whether a summary names a batch factor: below 1 at the two decimals
  it prints with (0.996 prints as 1.00, so it is not named)."""
  return factor is not None and round(float(factor), 2) < 1


def batched_iterations(calls: Sequence[int], batch_size: int) -> int:
  """Loop iterations of decoding examples with `calls` [N] target calls
  each in consecutive batches of `batch_size` (the last one short): the sum
  of each batch's most calls. At T = 0 a row's calls do not depend on its
  batch, so a batch-1 run's calls predict any batch size's iterations."""
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size}: must be at least 1")
  calls = np.asarray(calls, np.int64)
  return int(
      sum(calls[i:i + batch_size].max()
          for i in range(0, len(calls), batch_size)))


def efficiency_split(alpha: float, gamma: int, spec_tokens: np.ndarray,
                     calls: Tuple[int, int], iterations: Tuple[int, int],
                     theory: Dict[str, float],
                     one_path: bool = True) -> Dict[str, Any]:
  """metrics.json's `efficiency_split` (factors whose product is speedup /
  Theorem 3.8 at the measured call cost, as `RunMetrics` defines them) and
  Equation (1) without and with sentence ends, from the [N, T] speculative
  tokens (0 after EOS), each decoder's target calls summed over rows and
  loop iterations summed over batches ((baseline, speculative) each) and
  `theory`'s `baseline_overhead` and `iteration_overhead`. A tree's
  (`one_path` False): no Equation (1), and its split has no
  "sentence_ends" or "acceptance" (its model reads the measured tokens
  per call)."""
  calls_base, calls_spec = calls
  iterations_base, iterations_spec = iterations
  lengths = np.sum(spec_tokens != 0, axis=1)
  tokens = int(lengths.sum())
  if tokens == 0 or min(calls) <= 0 or min(iterations) <= 0:
    return {}
  batch = batch_factor(calls_base, calls_spec, iterations_base, iterations_spec)
  split = {
      "output_lengths": calls_base / tokens,
      "batch": batch,
      "time":
          (theory["baseline_overhead"] / theory["iteration_overhead"] / batch),
  }
  if not one_path:
    return {"efficiency_split": split}
  iid = float(analysis.expected_tokens_per_iteration(alpha, gamma))
  ends = analysis.expected_tokens_per_call_with_ends(alpha, gamma, lengths)
  return {
      "theory_tokens_per_call": iid,
      "theory_tokens_per_call_with_ends": ends,
      "efficiency_split": {
          "sentence_ends": ends / iid,
          "acceptance": tokens / calls_spec / ends,
          **split
      },
  }
