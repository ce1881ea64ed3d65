"""Tests for specdec_jax.metrics.analysis against hand-computed values."""
import math

import numpy as np
import pytest

from specdec_jax.metrics import analysis


class TestExpectedTokens:

  def test_paper_example(self):
    # alpha = 0.75, gamma = 7: (1 - 0.75^8) / 0.25 = 3.59954833984375.
    value = analysis.expected_tokens_per_iteration(0.75, 7)
    assert isinstance(value, float)
    assert value == pytest.approx((1 - 0.75**8) / 0.25)
    assert value == pytest.approx(3.5995483398, abs=1e-9)

  def test_edges_and_limit(self):
    # alpha = 0: only the target's token; alpha = 1: all gamma + the bonus.
    assert analysis.expected_tokens_per_iteration(0.0, 5) == 1.0
    assert analysis.expected_tokens_per_iteration(1.0, 5) == 6.0
    # Continuous at alpha -> 1.
    assert analysis.expected_tokens_per_iteration(1 - 1e-9,
                                                  5) == (pytest.approx(
                                                      6.0, rel=1e-6))

  def test_matches_capped_geometric_mean(self):
    # E[min(G, gamma)] + 1 with G ~ Geometric (number of leading acceptances).
    alpha, gamma = 0.6, 4
    mean = sum((k + 1) * (alpha**k * (1 - alpha) if k < gamma else alpha**gamma)
               for k in range(gamma + 1))
    assert analysis.expected_tokens_per_iteration(
        alpha, gamma) == (pytest.approx(mean))

  def test_vectorized(self):
    out = analysis.expected_tokens_per_iteration(np.array([0.0, 0.5, 1.0]),
                                                 np.array([[3], [1]]))
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out, [[1.0, 1.875, 4.0], [1.0, 1.5, 2.0]])


class TestSentenceEnds:

  def test_edges(self):
    # alpha = 0: one token per call; alpha = 1: gamma + 1 per call, the
    # last call cut; one token: one call whatever alpha.
    assert analysis.expected_target_calls(0.0, 3, 7) == pytest.approx(7.0)
    assert analysis.expected_target_calls(1.0, 3, 9) == pytest.approx(3.0)
    assert analysis.expected_target_calls(0.7, 3, 1) == pytest.approx(1.0)
    assert analysis.expected_target_calls(0.7, 3, 0) == 0.0
    # Two tokens at gamma = 1: one call if the guess is kept, else two.
    assert analysis.expected_target_calls(0.6, 1, 2) == pytest.approx(1.4)

  def test_long_outputs_reach_equation_1(self):
    long = analysis.expected_tokens_per_call_with_ends(0.7, 4, [4000])
    assert long == pytest.approx(analysis.expected_tokens_per_iteration(0.7, 4),
                                 rel=1e-3)
    short = analysis.expected_tokens_per_call_with_ends(0.7, 4, [8, 14, 20])
    assert short < 0.95 * long

  def test_matches_simulation(self):
    # Algorithm 1 with i.i.d. acceptance on outputs of 13 tokens: the mean
    # of 20000 simulated sentences' calls within 4 standard errors.
    rng = np.random.default_rng(0)
    alpha, gamma, length = 0.7, 3, 13
    calls = []
    for _ in range(20000):
      left, n = length, 0
      while left > 0:
        kept = 0
        while kept < gamma and rng.random() < alpha:
          kept += 1
        left -= kept + 1
        n += 1
      calls.append(n)
    expected = analysis.expected_target_calls(alpha, gamma, length)
    stderr = np.std(calls) / np.sqrt(len(calls))
    assert abs(np.mean(calls) - expected) < 4 * stderr, (np.mean(calls),
                                                         expected)

  def test_any_calls_distribution(self):
    # A call emitting 1 or 3 tokens, each half the time: 3 tokens take one
    # call half the time, else 1 + calls(2), calls(2) = 1 + 1/2 · 1 = 1.5:
    # 1/2 · 1 + 1/2 · 2.5.
    assert analysis.calls_to_emit([0.5, 0.0, 0.5], 3) == pytest.approx(1.75)
    assert analysis.calls_to_emit([1.0], 5) == pytest.approx(5.0)
    # Equation (1)'s distribution gives expected_target_calls'.
    probs = analysis.call_token_probs(0.7, 4)
    assert probs.shape == (5,) and probs.sum() == pytest.approx(1.0)
    assert probs @ np.arange(1, 6) == pytest.approx(
        analysis.expected_tokens_per_iteration(0.7, 4))
    assert analysis.tokens_per_call_with_ends(probs, [8, 14]) == pytest.approx(
        analysis.expected_tokens_per_call_with_ends(0.7, 4, [8, 14]))
    with pytest.raises(ValueError, match="summing to 1"):
      analysis.calls_to_emit([0.5, 0.4], 3)
    with pytest.raises(ValueError, match="token_probs=1.1"):
      analysis.calls_to_emit([1.1, -0.1], 3)

  def test_bad_values_are_named(self):
    with pytest.raises(ValueError, match="length=-1"):
      analysis.expected_target_calls(0.5, 2, -1)
    with pytest.raises(ValueError, match="alpha"):
      analysis.expected_target_calls(1.5, 2, 3)
    with pytest.raises(ValueError, match="positive total"):
      analysis.expected_tokens_per_call_with_ends(0.5, 2, [0, 0])


class TestExpectedSpeedup:

  def test_hand_computed(self):
    # alpha=0.8, gamma=3, c=0.05: (1 - 0.8^4) / (0.2 * 1.15)
    #   = 0.5904 / 0.23 = 2.566956...
    assert analysis.expected_speedup(0.8, 3,
                                     0.05) == pytest.approx(0.5904 / 0.23)
    assert analysis.expected_speedup(0.8, 3, 0.05) == pytest.approx(
        2.5669565, abs=1e-6)
    # alpha=0.75, gamma=7, c=0: just Equation (1).
    assert analysis.expected_speedup(0.75, 7, 0.0) == pytest.approx(
        3.59954834, abs=1e-8)
    # alpha=1, gamma=4, c=0.25: 5 / 2.
    assert analysis.expected_speedup(1.0, 4, 0.25) == pytest.approx(2.5)

  def test_vectorized(self):
    out = analysis.expected_speedup([0.5, 0.8], 3, [0.0, 0.05])
    np.testing.assert_allclose(out, [1.875, 0.5904 / 0.23])

  def test_no_gain_when_alpha_not_above_c(self):
    # Corollary 3.9: improvement > 1 is possible iff alpha > c.
    for g in range(1, 20):
      assert analysis.expected_speedup(0.1, g, 0.1) <= 1.0 + 1e-12


class TestOptimalGamma:

  @pytest.mark.parametrize("alpha,c", [(0.5, 0.01), (0.75, 0.02), (0.8, 0.05),
                                       (0.9, 0.01), (0.6, 0.2), (0.99, 0.001),
                                       (0.3, 0.5)])
  def test_brute_force(self, alpha, c):
    speedups = {
        g: (1 - alpha**(g + 1)) / ((1 - alpha) * (g * c + 1))
        for g in range(1, 65)
    }
    best = max(speedups.values())
    expected = min(g for g, s in speedups.items() if s == best)
    got = analysis.optimal_gamma(alpha, c)
    assert isinstance(got, int)
    assert got == expected
    assert analysis.speedup_at_optimal_gamma(alpha, c) == pytest.approx(best)

  def test_known_values(self):
    # alpha = 0.8, c = 0.05: speedups for gamma=7,8,9 are 3.0823, 3.0921,
    # 3.0780 (hand-computed), so gamma* = 8.
    assert analysis.optimal_gamma(0.8, 0.05) == 8
    # Small alpha, expensive draft: one draft token at most.
    assert analysis.optimal_gamma(0.3, 0.5) == 1

  def test_max_gamma_caps(self):
    assert analysis.optimal_gamma(1.0, 0.0, max_gamma=10) == 10
    with pytest.raises(ValueError, match="max_gamma"):
      analysis.optimal_gamma(0.5, 0.1, max_gamma=0)


class TestArithmeticIncrease:

  def test_hand_computed(self):
    # alpha=0.8, gamma=3, c_hat=0.1: 0.2 * (0.3 + 3 + 1) / 0.5904.
    assert analysis.expected_arithmetic_increase(0.8, 3, 0.1) == (pytest.approx(
        0.2 * 4.3 / 0.5904))
    # alpha = 0: every draft token wasted, gamma c_hat + gamma + 1.
    assert analysis.expected_arithmetic_increase(0.0, 3,
                                                 0.1) == (pytest.approx(4.3))
    # alpha = 1 limit: (gamma c_hat + gamma + 1) / (gamma + 1).
    assert analysis.expected_arithmetic_increase(1.0, 3, 0.1) == (pytest.approx(
        4.3 / 4))


class TestAlphaEstimates:

  def test_histogram_hand_example(self):
    # gamma = 3; h = [1, 0, 2, 1]: one call rejected the first draft token
    # (1 trial), two calls accepted 2 then rejected (3 trials each), one call
    # accepted all 3 (3 trials). successes = 0 + 4 + 3 = 7, trials = 10.
    assert analysis.alpha_from_acceptance_counts([1, 0, 2, 1],
                                                 3) == (pytest.approx(0.7))
    assert analysis.alpha_standard_error_from_counts(
        [1, 0, 2, 1], 3) == (pytest.approx(math.sqrt(0.7 * 0.3 / 10)))

  def test_histogram_consistent_with_equation_1(self):
    # With the exact expected histogram, alpha_hat recovers alpha.
    alpha, gamma = 0.65, 5
    h = [alpha**k * (1 - alpha) for k in range(gamma)] + [alpha**gamma]
    assert analysis.alpha_from_acceptance_counts(np.array(h) * 1e6,
                                                 gamma) == pytest.approx(alpha)

  def test_histogram_edge_cases(self):
    assert math.isnan(analysis.alpha_from_acceptance_counts([0, 0, 0], 2))
    assert math.isnan(analysis.alpha_standard_error_from_counts([0, 0], 2))
    assert analysis.alpha_from_acceptance_counts([5], 4) == 0.0
    assert analysis.alpha_from_acceptance_counts([0, 0, 3], 2) == 1.0
    with pytest.raises(ValueError, match="bins"):
      analysis.alpha_from_acceptance_counts([1, 1, 1, 1], 2)
    with pytest.raises(ValueError, match="histogram"):
      analysis.alpha_from_acceptance_counts([1, -1], 2)

  def test_beta_samples(self):
    mean, se = analysis.alpha_from_beta_samples([0.5, 0.7, 0.9])
    assert mean == pytest.approx(0.7)
    assert se == pytest.approx(0.2 / math.sqrt(3))
    mean, se = analysis.alpha_from_beta_samples([0.4])
    assert mean == 0.4 and math.isnan(se)
    with pytest.raises(ValueError, match="betas"):
      analysis.alpha_from_beta_samples([0.5, 1.5])

  def test_beta_from_distributions(self):
    p = np.array([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    q = np.array([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(analysis.beta_from_distributions(p, q),
                               [0.7, 1.0])

  def test_cost_coefficient(self):
    assert analysis.cost_coefficient(0.002, 0.04) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="target_step_s"):
      analysis.cost_coefficient(0.002, 0.0)


class TestTheoryVsMeasured:

  def test_rows(self):
    points = [{
        "gamma": 3,
        "alpha": 0.8,
        "cost_coefficient_c": 0.05,
        "speedup": 2.4,
        "tokens_per_target_call": 2.9,
        "name": "a"
    }, {
        "gamma": 7,
        "alpha": 0.75,
        "cost_coefficient_c": 0.0,
        "speedup": 3.4
    }]
    rows = analysis.theory_vs_measured(points)
    assert "theoretical_speedup" not in points[0]  # Inputs untouched.
    assert rows[0]["name"] == "a"
    assert rows[0]["theoretical_speedup"] == pytest.approx(0.5904 / 0.23)
    assert rows[0]["expected_tokens_per_call"] == pytest.approx(2.952)
    assert rows[0]["speedup_ratio"] == pytest.approx(2.4 / (0.5904 / 0.23))
    assert rows[0]["tokens_per_call_ratio"] == pytest.approx(2.9 / 2.952)
    assert rows[1]["speedup_ratio"] == pytest.approx(3.4 / 3.59954834)
    assert "tokens_per_call_ratio" not in rows[1]

  def test_missing_key(self):
    with pytest.raises(ValueError, match="speedup"):
      analysis.theory_vs_measured([{
          "gamma": 3,
          "alpha": 0.5,
          "cost_coefficient_c": 0.1
      }])


class TestValidation:

  @pytest.mark.parametrize("fn", [
      lambda a: analysis.expected_tokens_per_iteration(a, 3),
      lambda a: analysis.expected_speedup(a, 3, 0.1),
      lambda a: analysis.expected_arithmetic_increase(a, 3, 0.1),
      lambda a: analysis.optimal_gamma(a, 0.1),
  ])
  @pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
  def test_alpha_range(self, fn, alpha):
    with pytest.raises(ValueError, match=r"alpha=.*\[0, 1\]"):
      fn(alpha)

  @pytest.mark.parametrize("gamma", [0, -2, 0.5])
  def test_gamma_range(self, gamma):
    with pytest.raises(ValueError, match=r"gamma=.*\[1, inf\)"):
      analysis.expected_speedup(0.5, gamma, 0.1)
    with pytest.raises(ValueError, match="gamma="):
      analysis.alpha_from_acceptance_counts([1, 1], gamma)

  def test_negative_c(self):
    with pytest.raises(ValueError, match=r"cost_coefficient=-0\.1.*\[0, inf\)"):
      analysis.expected_speedup(0.5, 3, -0.1)
    with pytest.raises(ValueError, match="cost_coefficient_hat=-1"):
      analysis.expected_arithmetic_increase(0.5, 3, -1)
    with pytest.raises(ValueError, match="cost_coefficient"):
      analysis.optimal_gamma(0.5, -0.1)

  def test_array_error_names_bad_element(self):
    with pytest.raises(ValueError, match=r"alpha=1\.2"):
      analysis.expected_speedup([0.5, 1.2], 3, 0.1)


def test_expected_speedup_with_a_measured_call_cost():
  # alpha 0.6, gamma 3, c 0.1: 2.176 tokens per iteration.
  tokens = (1 - 0.6**4) / 0.4
  assert analysis.expected_speedup(0.6, 3, 0.1) == pytest.approx(tokens / 1.3)
  assert analysis.expected_speedup(
      0.6, 3, 0.1, call_cost=1.5) == (pytest.approx(tokens / 1.8))
  np.testing.assert_allclose(
      analysis.expected_speedup(0.6, 3, 0.1, call_cost=np.array([1.0, 2.0])),
      tokens / np.array([1.3, 2.3]))
  for bad in (0.0, -1.0, float("nan")):
    with pytest.raises(ValueError, match="call_cost"):
      analysis.expected_speedup(0.6, 3, 0.1, call_cost=bad)
