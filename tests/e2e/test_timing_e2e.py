"""`timing_noise.measure` end to end on tiny models: `timing.call_seconds`
on real programs, back to back and interleaved (the timing's order and
arithmetic: tests/benchmarks/test_timing.py).

No timing is asserted beyond positivity (the machine may be shared).
"""
import pytest

from tools.benchmarks import timing_noise

from conftest import random_model, tiny_config

pytestmark = pytest.mark.slow


def test_timing_noise_benchmark_summarizes_both_ways():
  # Also `call_seconds` on real (tiny) models, both ways.
  target = random_model(tiny_config(), seed=0)
  draft = random_model(tiny_config(num_decoder_layers=1), seed=1)
  result = timing_noise.measure(target, draft, gamma=1, fill=2, trials=2)
  assert sorted(result) == ["back_to_back", "interleaved"]
  for way in result.values():
    for key in ("verification_cost_ratio", "cost_coefficient_c"):
      s = way[key]
      assert len(s["values"]) == 2 and all(v > 0 for v in s["values"])
      assert s["min"] <= s["median"] <= s["max"]
      assert 0 <= s["iqr"] <= s["max"] - s["min"]
