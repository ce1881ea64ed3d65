"""metrics.json's fixed cost per example and marginal overheads: a line
through each batch's seconds against its loop iterations
(`overheads.fixed_and_marginal`, `overheads.fixed_cost_metrics`); what a
batch's slowest row costs (`overheads.batch_factor`,
`overheads.batched_iterations`) and the efficiency split it joins."""
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


def test_batched_iterations_sum_each_batchs_most_calls():
  calls = [4, 2, 3, 3, 5, 1, 2]
  assert overheads.batched_iterations(calls, 1) == sum(calls)
  # Batches [4, 2, 3], [3, 5, 1], [2]: the last one short.
  assert overheads.batched_iterations(calls, 3) == 4 + 5 + 2
  assert overheads.batched_iterations(calls, 7) == 5
  with pytest.raises(ValueError, match="batch_size=0"):
    overheads.batched_iterations(calls, 0)


def test_batch_factor_is_one_at_batch_1_and_below_when_rows_wait():
  lengths = np.array([10, 12, 9, 11])  # the baseline's calls: a token each
  calls = np.array([3, 6, 3, 3])  # one row keeps few guesses
  one = overheads.batch_factor(lengths.sum(), calls.sum(),
                               overheads.batched_iterations(lengths, 1),
                               overheads.batched_iterations(calls, 1))
  assert one == 1.0
  # Batch 4: the baseline waits 12 - 10.5 tokens on average, the
  # speculative loop 6 - 3.75 calls: (15 / 6) / (42 / 12).
  four = overheads.batch_factor(lengths.sum(), calls.sum(),
                                overheads.batched_iterations(lengths, 4),
                                overheads.batched_iterations(calls, 4))
  assert four == pytest.approx((15 / 6) / (42 / 12))
  with pytest.raises(ValueError, match="iterations 12, 0"):
    overheads.batch_factor(42, 15, 12, 0)


def test_a_batch_factor_is_named_where_it_prints_below_one():
  # Both summaries (the run's, the device check's) print it with two
  # decimals: 0.996 reads 1.00 and is not named, 0.994 reads 0.99.
  assert overheads.batch_waits_show(0.88)
  assert overheads.batch_waits_show(0.994)
  assert not overheads.batch_waits_show(0.996)
  assert not overheads.batch_waits_show(1.0)
  assert not overheads.batch_waits_show(None)


def test_the_split_multiplies_to_the_efficiency_with_batches():
  # Two rows in one batch at T = 0: the baseline's 6 and 4 tokens (their
  # calls), the speculative loop's 2 and 3 calls; each loop's walltime per
  # iteration over its model calls 1.2 (baseline) and 1.5 (speculative).
  tokens = np.array([[5, 6, 7, 8, 9, 1], [5, 6, 7, 1, 0, 0]])
  calls, iterations = (10, 5), (6, 3)
  theory = {
      "baseline_overhead": 1.2 * 6 / 10,  # walltime per row call
      "iteration_overhead": 1.5 * 3 / 5,
  }
  out = overheads.efficiency_split(0.8, 3, tokens, calls, iterations, theory)
  split = out["efficiency_split"]
  assert split["batch"] == pytest.approx((5 / 3) / (10 / 6))
  assert split["time"] == pytest.approx(1.2 / 1.5)
  ends = out["theory_tokens_per_call_with_ends"]
  iid = out["theory_tokens_per_call"]
  # speedup / Theorem 3.8 at the call's cost, as RunMetrics defines them:
  # (tokens per call over i.i.d.) x (baseline's overhead per token over the
  # speculative one's per call).
  expected = (10 / 5) / iid * (theory["baseline_overhead"] /
                               theory["iteration_overhead"])
  assert np.prod(list(split.values())) == pytest.approx(expected)
  assert split["sentence_ends"] == pytest.approx(ends / iid)
  assert overheads.efficiency_split(0.8, 3, tokens, calls, (6, 0), theory) == {}
  # A tree's model reads its measured tokens per call (`TreeMode.
  # measured_theory`): no Equation (1), so no ends or acceptance factor,
  # and the rest multiply to speedup / that model: the baseline's calls
  # over the tokens, times the loops' overheads.
  tree = overheads.efficiency_split(0.8, 3, tokens, calls, iterations, theory,
                                    one_path=False)
  assert set(tree) == {"efficiency_split"}
  assert tree["efficiency_split"] == pytest.approx(
      {k: split[k] for k in ("output_lengths", "batch", "time")})
  assert np.prod(list(tree["efficiency_split"].values())) == pytest.approx(
      (10 / 10) * theory["baseline_overhead"] / theory["iteration_overhead"])
