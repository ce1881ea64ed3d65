"""The decode benchmark end to end (synthetic acceptance, flag errors and
gin files: tests/tools/test_benchmarking.py): the command's JSON on
tiny/mini configs, and the greedy identity check reporting a difference.

No timing is asserted beyond positivity (the machine may be shared).
"""
import json

import jax
import jax.numpy as jnp
import pytest

from specdec_jax import checkpoints
from specdec_jax.core import decoding
from specdec_jax.core.models import T5Model
from tools.benchmarks import common
from tools.benchmarks import decode
from tools.benchmarks import decode_measure

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def e2e_result(tmp_path_factory):
  """One end-to-end CLI run on tiny/mini configs (compiled less optimized)."""
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    status = decode.main([
        "--target", "tiny", "--draft", "mini", "--alphas", "0.75", "--gammas",
        "1", "--chunk_sizes", "1,2", "--input_length", "4",
        "--max_decode_length", "8", "--repeats", "1", "--inner_steps", "2",
        "--dtype", "float32", "--device_bandwidth_gbps", "100",
        "--check_greedy_identity", "--output",
        str(out)
    ])
  finally:
    jax.config.update("jax_disable_most_optimizations", previous)
  assert status == 0
  return json.loads(out.read_text()), out


def test_end_to_end_json(e2e_result):
  r, path = e2e_result
  assert not list(path.parent.glob("*.tmp"))  # Atomic write left no temp.
  for key in ("backend", "device_kind", "jax_version", "target", "draft",
              "dtype", "baseline_ms_per_token", "target_cost_ratio_by_k",
              "draft_ms_per_step", "target_ms_per_step", "cost_coefficient_c",
              "iteration_split_ms", "compile_time_s", "points",
              "baseline_bandwidth_bound_ms_per_token",
              "baseline_to_bandwidth_bound_ratio"):
    assert key in r, key
  assert r["synthetic_acceptance"] is True
  assert r["backend"] == jax.default_backend()
  assert r["target"] == "tiny" and r["draft"] == "mini"
  assert r["dtype"] == "float32"
  assert r["target_cost_ratio_by_k"]["1"] == 1.0
  assert set(r["target_cost_ratio_by_k"]) == {"1", "2"}
  for key in ("baseline_ms_per_token", "draft_ms_per_step",
              "target_ms_per_step", "cost_coefficient_c",
              "baseline_bandwidth_bound_ms_per_token"):
    assert r[key] > 0, key
  assert all(v > 0 for v in r["target_cost_ratio_by_k"].values())
  assert r["cost_coefficient_c"] == pytest.approx(r["draft_ms_per_step"] /
                                                  r["target_ms_per_step"])
  assert r["compile_time_s"] >= 0
  split = r["iteration_split_ms"]["1"]
  for key in ("draft_ms", "target_ms", "total_ms"):
    assert split[key] > 0, key
  assert split["other_ms"] == pytest.approx(split["total_ms"] -
                                            split["draft_ms"] -
                                            split["target_ms"])
  [point] = r["points"]
  assert point["alpha"] == 0.75 and point["gamma"] == 1
  for key in ("measured_speedup", "theoretical_speedup", "efficiency",
              "tokens_per_target_call"):
    assert point[key] > 0, key
  assert point["efficiency"] == pytest.approx(point["measured_speedup"] /
                                              point["theoretical_speedup"])
  # γ=1: 1 or 2 tokens per target call.
  assert 1.0 <= point["tokens_per_target_call"] <= 2.0
  # The exactness check ran with real acceptance: float32 on CPU is exact.
  g = r["greedy_identity"]
  assert g["gamma"] == 1 and g["examples"] == 1
  assert g["identical"] == 1 and g["mismatches"] == []
  assert g["chunk_vs_step_argmax_agreement"] == 1.0
  assert g["chunk_vs_step_max_abs_logit_diff"] < 1e-4


def test_greedy_identity_check_reports_a_difference(monkeypatch):
  """A speculative decoder that diverges is reported row by row."""
  config = common.resolve_model_config("tiny", "target")[0]
  target = T5Model(
      config, {
          "params": checkpoints.random_params(config, jax.random.PRNGKey(0),
                                              dtype=jnp.float32)
      })
  inputs = jnp.full((2, 4), 5, jnp.int32)
  real = decoding.speculative_sample

  def diverging(*args, **kwargs):
    out = real(*args, **kwargs)
    return out.replace(tokens=out.tokens.at[1, 3].add(1))

  monkeypatch.setattr(decoding, "speculative_sample", diverging)
  g = decode_measure.greedy_identity_check(target, target, inputs, gamma=2,
                                           max_decode_length=6)
  assert g["examples"] == 2 and g["identical"] == 1
  assert g["mismatches"] == [{"index": 1, "position": 3}]
  assert g["alpha_hat"] == 1.0  # The target drafting for itself.
