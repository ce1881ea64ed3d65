"""metrics.json's fixed cost per example and marginal overheads: a line
through each batch's seconds against its loop iterations
(`walltime.fixed_and_marginal`, `walltime.fixed_cost_metrics`)."""
import numpy as np
import pytest

from specdec_jax.experiment import walltime


def test_the_line_is_recovered_from_noisy_batches():
  rng = np.random.default_rng(0)
  iterations = rng.integers(3, 20, size=200)
  seconds = 0.006 + 0.004 * iterations + rng.normal(0, 1e-4, size=200)
  intercept, slope = walltime.fixed_and_marginal(seconds, iterations)
  assert intercept == pytest.approx(0.006, abs=1e-4)
  assert slope == pytest.approx(0.004, abs=1e-5)


def test_too_few_batches_or_one_count_fix_no_line():
  assert walltime.fixed_and_marginal(np.array([1.0, 2.0]),
                                     np.array([1, 2])) is None
  assert walltime.fixed_and_marginal(np.array([1.0, 2.0, 3.0]),
                                     np.array([4, 4, 4])) is None


def test_metrics_divide_by_rows_and_by_the_priced_parts():
  iterations = np.array([4, 6, 9, 12])
  batches = walltime.BatchTimes(seconds_base=0.010 + 0.003 * iterations,
                                seconds_spec=0.008 + 0.005 * iterations,
                                iterations_base=iterations,
                                iterations_spec=iterations,
                                rows=np.array([2, 2, 2, 2]))
  steps = walltime.StepTimes(target_step_s=0.0025, draft_step_s=0.0002,
                             verification_call_s=0.004)
  out = walltime.fixed_cost_metrics(batches, steps, gamma=3)
  assert out["fixed_cost_per_example_s"]["baseline"] == pytest.approx(0.005)
  assert out["fixed_cost_per_example_s"]["speculative"] == pytest.approx(0.004)
  assert out["marginal_baseline_overhead"] == pytest.approx(0.003 / 0.0025)
  assert out["marginal_iteration_overhead"] == pytest.approx(0.005 / 0.0046)
  assert walltime.fixed_cost_metrics(None, steps, gamma=3) == {}
