"""SPECULATION='auto' beside the fixed settings (tools.benchmarks.auto_table2):
the arithmetic of each group's row, on hand-made metrics."""
import pytest

from tools.benchmarks import auto_table2


def _metrics(gamma, speedup, base_s, *, draft="1m", temperature=0.0,
             decode="sample", batch=1, auto=None, speculation=None):
  spec_s = base_s / speedup
  out = {
      "settings": {
          "run": {
              "draft_name": draft,
              "temperature": temperature,
              "decode": decode,
              "batch_size": batch,
          }
      },
      "gamma": gamma,
      "speedup": speedup,
      "walltime_baseline_s": base_s,
      "walltime_speculative_s": spec_s,
      "num_examples": 1000,
      "greedy_outputs_identical": True,
  }
  if auto is not None:
    out["auto"] = auto
  if speculation is not None:
    out["speculation"] = speculation
  return out


def test_auto_against_the_best_fixed_point_with_its_choosing_time():
  fixed = [_metrics(3, 1.36, 85.0), _metrics(4, 1.29, 86.0)]
  auto = _metrics(
      5, 1.40, 84.0, auto={
          "choice": {
              "label": "token γ=5",
              "predicted_speedup": 1.54
          },
          "choice_s": 3.0
      })
  [row] = auto_table2.compare(fixed + [auto])
  assert row["best_fixed"] == {"gamma": 3, "speedup": 1.36}
  assert row["auto_speedup"] == pytest.approx(1.40)
  decode_s = 84.0 / 1.40
  assert row["auto_speedup_with_choosing"] == pytest.approx(84.0 /
                                                            (decode_s + 3.0))
  assert row["auto_vs_best_fixed"] == pytest.approx(1.40 / 1.36)
  assert row["choosing_share_of_decode"] == pytest.approx(3.0 / decode_s)
  assert row["prediction_error"] == pytest.approx(1.54 / 1.40 - 1)
  assert row["bar"] == auto_table2.MIN_VS_BEST_FIXED
  # 84 / 63 = 1.333 with choosing: 0.98 of 1.36, above 0.95.
  assert row["meets_bar"]
  slow = _metrics(2, 1.20, 84.0, auto={"choice": {}, "choice_s": 3.0})
  [row] = auto_table2.compare(fixed + [slow])
  assert not row["meets_bar"]  # 1.14 / 1.36 = 0.84


def test_where_nothing_pays_auto_is_held_to_the_target_alone():
  # Two groups: the beam rows (speculative beams lose), and T = 1.
  beams = [_metrics(3, 0.27, 38.0, decode="beam")]
  alone = _metrics(
      None, 1.0, 39.0, decode="beam", speculation="off", auto={
          "choice": {
              "label": "the target's own beam search"
          },
          "choice_s": 0.5
      })
  other = [_metrics(3, 1.3, 90.0, temperature=1.0)]
  rows = auto_table2.compare(beams + [alone] + other)
  assert len(rows) == 1  # the T = 1 group has no auto point
  [row] = rows
  assert row["bar"] == auto_table2.MIN_VS_TARGET_ALONE
  # The target alone's walltime is the fixed point's baseline (38 s); auto
  # decoded for 39 s and chose for 0.5 s.
  assert row["auto_vs_target_alone"] == pytest.approx(38.0 / 39.5)
  assert row["auto_speedup"] == pytest.approx(38.0 / 39.0)
  assert "prediction_error" not in row
  assert not row["meets_bar"]  # 0.962 < 0.98
  quick = dict(alone, walltime_speculative_s=37.0)
  [row] = auto_table2.compare(beams + [quick])
  assert row["meets_bar"]


def test_two_auto_points_in_one_group_are_refused():
  auto = _metrics(3, 1.3, 80.0, auto={"choice": {}})
  with pytest.raises(ValueError, match="two SPECULATION='auto' points"):
    auto_table2.compare([_metrics(3, 1.2, 80.0), auto, dict(auto)])
