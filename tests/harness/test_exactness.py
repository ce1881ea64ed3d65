"""`metrics.exactness`: the one greedy identity, the two-sample chi-square
and the distribution test with its power check (certify, the device check
and the benchmarks all call these; NumPy only, nothing compiled)."""
import numpy as np
import pytest

from specdec_jax.metrics import exactness


# ---------------------------------------------------------------------------
# Greedy identity.
# ---------------------------------------------------------------------------
def test_greedy_identity_lists_each_mismatch_and_its_first_position():
  base = np.array([[5, 6, 7, 1], [5, 6, 7, 1], [2, 3, 4, 1]])
  spec = np.array([[5, 6, 7, 1], [5, 9, 7, 8], [2, 3, 4, 0]])
  assert exactness.greedy_identity(base, spec) == {
      "examples": 3,
      "identical": 1,
      "mismatches": [{
          "index": 1,
          "position": 1
      }, {
          "index": 2,
          "position": 3
      }]
  }
  same = exactness.greedy_identity(base, base)
  assert same == {"examples": 3, "identical": 3, "mismatches": []}


def test_batch_by_batch_is_the_whole_at_once():
  rng = np.random.default_rng(0)
  base = rng.integers(0, 3, (10, 4))
  spec = np.where(rng.random((10, 4)) < 0.1, 0, base)
  tally = exactness.GreedyIdentity()
  for lo in range(0, 10, 3):  # Batches of 3, 3, 3 and 1.
    tally.add(base[lo:lo + 3], spec[lo:lo + 3])
  whole = exactness.greedy_identity(base, spec)
  assert tally.record() == whole and whole["identical"] < 10


def test_beams_are_compared_whole():
  """[B, beams, L]: an example is identical when every beam is; the
  position is in the flattened example."""
  base = np.zeros((2, 2, 3), int)
  spec = base.copy()
  spec[1, 1, 0] = 4  # Example 1, beam 1, token 0: flattened position 3.
  assert exactness.greedy_identity(base, spec)["mismatches"] == [{
      "index": 1,
      "position": 3
  }]


def test_arrays_of_two_shapes_are_refused():
  with pytest.raises(ValueError, match=r"one shape.*\(2, 3\) and \(2, 4\)"):
    exactness.greedy_identity(np.zeros((2, 3)), np.zeros((2, 4)))


# ---------------------------------------------------------------------------
# The two-sample chi-square.
# ---------------------------------------------------------------------------
def _draw(rng, probs, n):
  """[n, 2] sequences of two i.i.d. tokens drawn from `probs`."""
  return rng.choice(len(probs), size=(n, 2), p=probs)


P = np.array([0.4, 0.3, 0.2, 0.1])
Q = np.array([0.3, 0.3, 0.2, 0.2])


def test_chisquare_passes_one_distribution_and_fails_two():
  rng = np.random.default_rng(0)
  same = exactness.two_sample_chisquare(_draw(rng, P, 4000),
                                        _draw(rng, P, 4000))
  assert same["p_value"] > 1e-3 and same["dof"] == same["cells"] - 1
  assert same["cells"] == 16  # 4 x 4 two-token sequences, none sparse
  different = exactness.two_sample_chisquare(_draw(rng, P, 4000),
                                             _draw(rng, Q, 4000))
  assert different["p_value"] < 1e-6


def test_chisquare_pools_sparse_cells_and_counts_like_the_formula():
  a = np.array([[0]] * 50 + [[1]] * 50 + [[2]] * 1)
  b = np.array([[0]] * 40 + [[1]] * 60 + [[3]] * 2)
  out = exactness.two_sample_chisquare(a, b)
  # Cells 2 and 3 (3 rows) are pooled: cells 0, 1 and the pool.
  assert out["cells"] == 3 and out["dof"] == 2
  counts = np.array([[50, 50, 1], [40, 60, 2]], float)
  share = counts.sum(axis=1, keepdims=True) / counts.sum()
  expected = share * counts.sum(axis=0, keepdims=True)
  assert out["statistic"] == pytest.approx(
      np.sum((counts - expected)**2 / expected))


def test_chisquare_of_one_cell_and_bad_shapes():
  one = np.zeros((10, 3), int)
  assert exactness.two_sample_chisquare(one, one)["p_value"] == 1.0
  with pytest.raises(ValueError, match=r"\[N, T\] and \[M, T\]"):
    exactness.two_sample_chisquare(np.zeros((3, 2)), np.zeros((3, 3)))


# ---------------------------------------------------------------------------
# The distribution test and its power check.
# ---------------------------------------------------------------------------
def test_distribution_test_passes_and_has_the_power_to_fail():
  rng = np.random.default_rng(1)
  out = exactness.distribution_test(_draw(rng, P, 4000), _draw(rng, P, 4000),
                                    _draw(rng, Q, 4000), significance=1e-3)
  assert out["passed"] and out["power_ok"]
  assert out["test"]["p_value"] >= 1e-3 > out["power_check"]["p_value"]
  # A wrong "speculative" sampler fails the test itself.
  bad = exactness.distribution_test(_draw(rng, Q, 4000), _draw(rng, P, 4000),
                                    _draw(rng, P, 4000), significance=1e-3)
  assert not bad["passed"] and bad["power_ok"]


def test_power_check_that_cannot_tell_says_so():
  """Too few draws: the wrong target passes too (power_ok False)."""
  rng = np.random.default_rng(2)
  out = exactness.distribution_test(_draw(rng, P, 30), _draw(rng, P, 30),
                                    _draw(rng, Q, 30), significance=1e-3)
  assert out["passed"] and out["power_ok"] is False


def test_fail_fast_skips_the_power_check_and_draws_nothing():
  rng = np.random.default_rng(3)
  calls = []

  def wrong():
    calls.append(1)
    return _draw(rng, Q, 4000)

  args = (_draw(rng, Q, 4000), _draw(rng, P, 4000), wrong)
  out = exactness.distribution_test(*args, significance=1e-3, fail_fast=True)
  assert not out["passed"] and not calls
  assert out["power_check"] is None and out["power_ok"] is None
  assert out["skipped"] == ["power_check"]
  out = exactness.distribution_test(*args, significance=1e-3)
  assert calls == [1] and "skipped" not in out
  assert out["power_check"]["cells"] > 1


@pytest.mark.parametrize("significance", [0.0, 1.0, -0.5, float("nan")])
def test_a_significance_outside_0_1_is_refused(significance):
  one = np.zeros((4, 1), int)
  with pytest.raises(ValueError, match="significance"):
    exactness.distribution_test(one, one, one, significance=significance)
