"""metrics.json's fixed cost per example and marginal overheads: a line
through each batch's seconds against its loop iterations
(`overheads.fixed_and_marginal`, `overheads.fixed_cost_metrics`)."""
import numpy as np
import pytest

from specdec_jax.metrics import overheads


def test_the_line_is_recovered_from_noisy_batches():
  rng = np.random.default_rng(0)
  iterations = rng.integers(3, 20, size=200)
  seconds = 0.006 + 0.004 * iterations + rng.normal(0, 1e-4, size=200)
  intercept, slope = overheads.fixed_and_marginal(seconds, iterations)
  assert intercept == pytest.approx(0.006, abs=1e-4)
  assert slope == pytest.approx(0.004, abs=1e-5)


def test_too_few_batches_or_one_count_fix_no_line():
  assert overheads.fixed_and_marginal(np.array([1.0, 2.0]),
                                      np.array([1, 2])) is None
  assert overheads.fixed_and_marginal(np.array([1.0, 2.0, 3.0]),
                                      np.array([4, 4, 4])) is None


def test_metrics_divide_by_rows_and_by_the_priced_parts():
  iterations = np.array([4, 6, 9, 12])
  batches = overheads.BatchTimes(seconds_base=0.010 + 0.003 * iterations,
                                 seconds_spec=0.008 + 0.005 * iterations,
                                 iterations_base=iterations,
                                 iterations_spec=iterations,
                                 rows=np.array([2, 2, 2, 2]))
  # A target step 2.5 ms; an iteration's model calls 3 x 0.2 + 4 = 4.6 ms.
  out = overheads.fixed_cost_metrics(batches, 0.0025, 0.0046)
  assert out["fixed_cost_per_example_s"]["baseline"] == pytest.approx(0.005)
  assert out["fixed_cost_per_example_s"]["speculative"] == pytest.approx(0.004)
  assert out["marginal_baseline_overhead"] == pytest.approx(0.003 / 0.0025)
  assert out["marginal_iteration_overhead"] == pytest.approx(0.005 / 0.0046)
  assert overheads.fixed_cost_metrics(None, 0.0025, 0.0046) == {}
