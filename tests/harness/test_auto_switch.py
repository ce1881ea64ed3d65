"""SPECULATION='auto''s online correction (issue 45): the rule as pure
functions: a switch when the measured speedup falls below the prediction
by more than its noise, not on noise, not more often than allowed (tiny
runs made to switch, exact at T = 0 and at T > 0:
tests/e2e/test_auto_switch_e2e.py)."""
import types

import numpy as np
import pytest

from specdec_jax.metrics import analysis
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto_mode
from specdec_jax.experiment import auto_switch
from specdec_jax.experiment import decode_modes

Candidate = auto_mode.Candidate
MIN = auto_switch.AUTO_SWITCH_MIN_BATCHES
C = 0.02  # the drafter's cost coefficient in the pure tests


# ---------------------------------------------------------------------------
# The rule, pure.
# ---------------------------------------------------------------------------
def test_the_speedup_interval_is_the_ratio_estimators_t_interval():
  assert auto_switch.speedup_interval([1.0] * 5, [2.0] * 5) == (0.5, 0.5, 0.5)
  assert auto_switch.speedup_interval([1.0], [2.0])[2] == float("inf")
  rng = np.random.default_rng(0)
  spec = rng.uniform(0.5, 1.5, 30)
  base = 1.2 * spec * rng.lognormal(0, 0.2, 30)
  speedup, low, high = auto_switch.speedup_interval(base, spec)
  assert speedup == pytest.approx(base.sum() / spec.sum())
  assert low < speedup < high and low < 1.2 < high
  assert auto_switch.t975(1) == 12.706 and auto_switch.t975(30) == 2.042
  assert auto_switch.t975(60) == pytest.approx(2.000, abs=2e-3)
  with pytest.raises(ValueError, match="one positive time per batch"):
    auto_switch.speedup_interval([1.0, 1.0], [1.0])


def test_a_test_fires_only_below_the_prediction_by_more_than_its_noise():
  # Measured 0.5x against a predicted 2x, after the minimum batches.
  assert auto_switch.below_prediction(2.0, [1.0] * MIN, [2.0] * MIN)
  assert not auto_switch.below_prediction(2.0, [1.0] * (MIN - 1), [2.0] *
                                          (MIN - 1))
  # Measured 1.8x on average, but noisy: 2x is inside its interval.
  noisy = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
  spec = [1 / 1.2, 1 / 2.4, 1 / 1.3, 1 / 2.3, 1 / 1.4, 1 / 2.2]
  assert not auto_switch.below_prediction(2.0, noisy, spec)
  # The same mean measured steadily is below it.
  assert auto_switch.below_prediction(2.0, [1.0] * 6, [1 / 1.8] * 6)


def test_a_choice_measuring_its_prediction_within_noise_is_rarely_tested():
  """One look at 8 batches whose speedup is the prediction (20% noise per
  batch): the one-sided 97.5% bound is below it about 2.5% of the time."""
  rng = np.random.default_rng(1)
  fired = 0
  for _ in range(2000):
    spec = rng.uniform(0.5, 1.5, 8)
    base = 1.3 * spec * rng.lognormal(0, 0.2, 8)
    fired += auto_switch.below_prediction(1.3 * np.exp(0.02), base, spec)
  assert fired / 2000 < 0.05


def _histogram(alpha: float, gamma: int, calls: int = 10**6) -> np.ndarray:
  """Calls by kept guesses as i.i.d. acceptance at `alpha` makes them."""
  n = np.arange(gamma + 1)
  probs = np.where(n < gamma, alpha**n * (1 - alpha), alpha**gamma)
  return np.round(probs * calls).astype(np.int64)


def _token_candidates():
  return auto_mode.candidates(decode_modes.TOKEN, ("token",),
                              auto_mode.gammas_considered("auto"), greedy=True,
                              vocab_size=100)


def _prices():
  return auto_mode.Prices(call_cost_by_k={1: 1.0, 13: 1.0}, cost_coefficient=C)


def test_the_measured_alpha_moves_gamma_and_the_measured_cost_error_scales():
  """GAMMA='auto' chose γ = 12 from a pilot's α of 0.95; the run measures
  α = 0.6: Section 3.4's γ for 0.6 is chosen. A run measuring a third of its
  prediction at the measured α switches to the target alone."""
  candidates = _token_candidates()
  pilots = {"token": {"alpha": 0.95}}
  rows = [auto_mode.predict(c, _prices(), pilots) for c in candidates]
  first = auto_mode.choose(rows)
  assert candidates[first].gamma == 12
  measured_pilots = auto_switch.with_measured_alpha(pilots, candidates[first],
                                                    _histogram(0.6, 12))
  assert measured_pilots["token"]["alpha"] == pytest.approx(0.6, abs=1e-4)
  at_06 = float(analysis.expected_speedup(0.6, 12, C))
  rows, kappa = auto_switch.corrected_rows(candidates, first, at_06, _prices(),
                                           measured_pilots, {})
  assert kappa == pytest.approx(1.0, abs=1e-3)
  assert rows[first]["basis"] == "measured"
  chosen = auto_switch.rechoose(rows, first)
  assert candidates[chosen].gamma == analysis.optimal_gamma(
      0.6, C, max_gamma=12)
  # A third of the prediction at the measured α: κ = 1/3 scales every
  # candidate below the target alone.
  rows, kappa = auto_switch.corrected_rows(candidates, first, at_06 / 3,
                                           _prices(), measured_pilots, {})
  assert kappa == pytest.approx(1 / 3, abs=1e-3)
  assert max(r["predicted_speedup"] for r in rows[1:]) < 1.0
  assert auto_switch.rechoose(rows, first) == 0  # the target alone


def test_the_target_alone_replaces_a_choice_only_measured_slower_than_it():
  # The 11M pair at T = 1 (docs/results/2026-11-27-auto-vs-fixed-table2.md):
  # 5 sentences measured block γ=2 below 0.95x, the interval reaching 1.3x;
  # it ran 1.12x fixed. Only an interval wholly below 1 ends speculation.
  assert not auto_switch.may_leave_for_the_target_alone(1.3)
  assert not auto_switch.may_leave_for_the_target_alone(1.0)
  assert auto_switch.may_leave_for_the_target_alone(0.98)
  # Five batches like those: 0.93x in all, one slow batch among them.
  baseline = [1.0, 1.0, 1.0, 1.0, 1.0]
  speculative = [1.0, 0.95, 1.4, 0.9, 1.1]
  speedup, _, high = auto_switch.speedup_interval(baseline, speculative)
  assert speedup < 0.952  # 1.05 x 0.93 < 1: rechoose would pick the alone
  assert not auto_switch.may_leave_for_the_target_alone(high)


def test_hysteresis_keeps_a_choice_within_min_gain_of_the_best():
  rows = [{
      "predicted_speedup": 1.0
  }, {
      "predicted_speedup": 1.2
  }, {
      "predicted_speedup": 1.24
  }]
  assert auto_mode.choose(rows) == 2
  assert auto_switch.rechoose(rows, 1) == 1  # 1.24 < 1.05 × 1.2
  rows[2]["predicted_speedup"] = 1.3
  assert auto_switch.rechoose(rows, 1) == 2
  # Measured 0.97x: the target alone (1.0) is within the gain: kept.
  assert auto_switch.rechoose([{
      "predicted_speedup": 1.0
  }, {
      "predicted_speedup": 0.97
  }], 1) == 1


class _Out(types.SimpleNamespace):
  """A decoder's output as the run reads it (one row)."""


def _batch(histogram):
  return _Out(accepted_histogram=np.asarray(histogram)[None], tokens=np.ones(
      (1, 3), np.int32), target_calls=np.array([int(np.sum(histogram))]),
              lengths=np.array([3]))


def _online(candidates, rows, chosen, pilots):
  built = []

  def build(candidate):
    built.append(candidate.label)
    args = arguments.RunArguments(output_dir="/tmp/x", gamma=candidate.gamma or
                                  1)
    return types.SimpleNamespace(args=args, speculative=None, rng=None)

  first = build(candidates[chosen])
  feed = types.SimpleNamespace(first_of_each_width=lambda: [])
  online = auto_switch.OnlineChoice(candidates, rows, chosen, pilots, _prices(),
                                    build, first)
  return online, feed, built


def test_a_run_switches_at_most_once_per_min_batches_and_max_times():
  """The pilot's α was 0.95 (γ = 12), the data's is 0.6: γ = 6 next. It
  runs at half its prediction: back to γ = 12, measured better. Then γ = 12
  runs at 0.3x, and stays: no switch is left."""
  candidates = _token_candidates()
  pilots = {"token": {"alpha": 0.95}}
  rows = [auto_mode.predict(c, _prices(), pilots) for c in candidates]
  online, feed, built = _online(candidates, rows, auto_mode.choose(rows),
                                pilots)
  switched_after = []
  for batch in range(6 * MIN):
    gamma = online.plan.args.gamma
    factor = (1.0, 0.5, 0.3 / 2.013)[len(online.switches)]
    speedup = float(analysis.expected_speedup(0.6, gamma, C)) * factor
    before = len(online.switches)
    online.after_batch(batch, 1.0, 1.0 / speedup,
                       _batch(_histogram(0.6, gamma, 1000)), np.array([0]),
                       feed)
    if len(online.switches) > before:
      switched_after.append(batch + 1)
  assert built == ["token γ=12", "token γ=6"]  # γ = 12's plan is kept
  assert switched_after == [MIN, 2 * MIN]
  assert len(online.switches) == auto_switch.AUTO_SWITCH_MAX_SWITCHES
  record = online.record()
  assert [s["label"] for s in record["segments"]
         ] == ["token γ=12", "token γ=6", "token γ=12"]
  assert [s["batches"] for s in record["segments"]] == [MIN, MIN, 4 * MIN]
  assert record["segments"][1]["alpha"] == pytest.approx(0.6, abs=0.01)
  assert record["segments"][2]["measured_speedup"] == pytest.approx(
      0.3, rel=1e-3)
  first, second = record["switches"]
  assert first["reason"].startswith(f"auto: after batch {MIN}, token γ=12 ran ")
  assert first["kappa"] == pytest.approx(1.0, abs=1e-2)
  assert second["kappa"] == pytest.approx(0.5, abs=1e-2)
  assert second["candidates"][12]["basis"] == "measured"
  assert online.metrics_args().gamma == 12  # the histogram's width


def test_a_candidate_that_ran_is_predicted_by_its_measurement():
  candidates = _token_candidates()
  rows, _ = auto_switch.corrected_rows(candidates, 3, 0.9, _prices(),
                                       {"token": {
                                           "alpha": 0.5
                                       }}, {5: 0.8})
  assert rows[5]["predicted_speedup"] == 0.8 and rows[5]["basis"] == "measured"
  assert rows[3]["predicted_speedup"] == 0.9
  assert rows[0]["predicted_speedup"] == 1.0
  assert rows[0]["basis"] == "target alone"


def test_histograms_of_two_gammas_add_padded():
  total = auto_switch.padded_sum(np.array([3, 1]), np.array([1, 2, 3, 4]))
  np.testing.assert_array_equal(total, [4, 3, 3, 4])
  assert auto_switch.acceptance_trials(np.array([1, 2, 3, 4]),
                                       3) == 1 + 4 + 9 + 12
  alone = decode_modes.target_alone(decode_modes.TOKEN)
  out = types.SimpleNamespace(accepted_histogram=np.array([[5, 0], [2, 0]]))
  counts, trials = auto_switch.batch_acceptance(alone, out, np.array([0]))
  np.testing.assert_array_equal(counts, [5, 0])
  assert trials == 0.0
