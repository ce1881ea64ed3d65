"""The decode benchmark: synthetic acceptance, end-to-end JSON, flag errors.

No timing is asserted beyond positivity (the machine may be shared).
"""
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import benchmarking
from specdec_jax import decoding

ROWS = 20_000


@jax.jit
def _jit_accept(rng, target_probs, draft_probs, draft_tokens, alpha):
  return benchmarking.synthetic_accept(rng, target_probs, draft_probs,
                                       draft_tokens, alpha=alpha)


def _accept(alpha, gamma, rows=ROWS, vocab=5, seed=0):
  """One jitted call per (rows, γ) shape; alpha is traced."""
  target_probs = np.random.default_rng(seed).random((rows, gamma + 1, vocab),
                                                    dtype=np.float32)
  draft_probs = np.full((rows, gamma, vocab), 1.0 / vocab, np.float32)
  draft_tokens = np.zeros((rows, gamma), np.int32)
  n, next_token = _jit_accept(jax.random.PRNGKey(seed), target_probs,
                              draft_probs, draft_tokens, np.float32(alpha))
  return np.asarray(n), np.asarray(next_token), target_probs


@pytest.mark.parametrize("alpha,gamma", [(0.5, 3), (0.8, 5), (0.9, 1)])
def test_synthetic_accept_mean_matches_truncated_bernoulli_runs(alpha, gamma):
  n, next_token, target_probs = _accept(alpha, gamma)
  mean, var = benchmarking.expected_accepted(alpha, gamma)
  # Closed form: E[n] = sum_{k=1..γ} α^k.
  assert mean == pytest.approx(sum(alpha**k for k in range(1, gamma + 1)))
  assert n.dtype == np.int32 and n.min() >= 0 and n.max() <= gamma
  assert abs(n.mean() - mean) < 5 * math.sqrt(var / ROWS)
  # The next token is the argmax of the target's row n.
  rows = np.arange(n.shape[0])
  np.testing.assert_array_equal(next_token,
                                target_probs[rows, n].argmax(axis=-1))


def test_synthetic_accept_extremes():
  n, _, _ = _accept(1.0, 3)
  assert np.all(n == 3)
  n, _, _ = _accept(0.0, 3)
  assert np.all(n == 0)


def test_synthetic_accept_is_a_valid_static_accept_fn():
  fn = benchmarking.SyntheticAccept(0.5)
  assert fn == benchmarking.SyntheticAccept(0.5)
  assert hash(fn) == hash(benchmarking.SyntheticAccept(0.5))
  # Never what the exact decoder uses.
  assert fn is not decoding.sampling.speculative_accept


@pytest.fixture(scope="module")
def e2e_result(tmp_path_factory):
  """One end-to-end CLI run on tiny/mini configs (compiled less optimized)."""
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    status = benchmarking.main([
        "--target", "tiny", "--draft", "mini", "--alphas", "0.75",
        "--gammas", "1", "--chunk_sizes", "1,2", "--input_length", "4",
        "--max_decode_length", "8", "--repeats", "1", "--inner_steps", "2",
        "--dtype", "float32", "--device_bandwidth_gbps", "100",
        "--output", str(out)])
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
  assert r["cost_coefficient_c"] == pytest.approx(
      r["draft_ms_per_step"] / r["target_ms_per_step"])
  assert r["compile_time_s"] >= 0
  split = r["iteration_split_ms"]["1"]
  for key in ("draft_ms", "target_ms", "total_ms"):
    assert split[key] > 0, key
  assert split["other_ms"] == pytest.approx(
      split["total_ms"] - split["draft_ms"] - split["target_ms"])
  [point] = r["points"]
  assert point["alpha"] == 0.75 and point["gamma"] == 1
  for key in ("measured_speedup", "theoretical_speedup", "efficiency",
              "tokens_per_target_call"):
    assert point[key] > 0, key
  assert point["efficiency"] == pytest.approx(
      point["measured_speedup"] / point["theoretical_speedup"])
  # γ=1: 1 or 2 tokens per target call.
  assert 1.0 <= point["tokens_per_target_call"] <= 2.0


@pytest.mark.parametrize("flag,value", [
    ("--alphas", "0.5,1.5"),
    ("--alphas", "abc"),
    ("--gammas", "0"),
    ("--gammas", "1,2.5"),
    ("--batch_size", "0"),
    ("--max_decode_length", "-3"),
    ("--repeats", "x"),
    ("--dtype", "float16"),
    ("--target", "gigantic"),
    ("--draft", "/no/such/file.gin"),
    ("--device_bandwidth_gbps", "-1"),
    ("--chunk_sizes", "1,,2"),
])
def test_bad_flags_error_before_running(flag, value, monkeypatch, capsys):
  def fail(*args, **kwargs):
    raise AssertionError("run_benchmark must not be reached")
  monkeypatch.setattr(benchmarking, "run_benchmark", fail)
  with pytest.raises(benchmarking.BenchmarkFlagError) as e:
    benchmarking.parse_flags([flag, value])
  message = str(e.value)
  assert flag in message and "allowed" in message
  assert benchmarking.main([flag, value]) == 2
  err = capsys.readouterr().err
  assert flag in err and "error" in err


def test_vocab_mismatch_is_a_flag_error():
  with pytest.raises(benchmarking.BenchmarkFlagError, match="--draft"):
    benchmarking.parse_flags(["--target", "small", "--draft", "tiny"])


def test_gin_file_config(tmp_path):
  gin = tmp_path / "t5_1_1_test.gin"
  gin.write_text(
      "from __gin__ import dynamic_registration\n"
      "include 't5x/examples/t5/t5_1_1/base.gin'\n"
      "EMB = 48\n"
      "network.T5Config:\n"
      "  vocab_size = 128\n"
      "  emb_dim = %EMB\n"
      "  num_heads = 3\n"
      "  head_dim = 16\n"
      "  mlp_dim = 96\n"
      "  num_encoder_layers = 2\n"
      "  num_decoder_layers = 3\n"
      "  dtype = 'bfloat16'\n"
      "network.Transformer.config = @network.T5Config()\n")
  cfg = benchmarking.parse_flags(["--target", str(gin), "--draft", "mini",
                                  "--dtype", "float32"])
  t = cfg.target_config
  assert (t.emb_dim, t.num_heads, t.head_dim, t.mlp_dim,
          t.num_encoder_layers, t.num_decoder_layers) == (48, 3, 16, 96, 2, 3)
  assert t.dtype == jnp.float32  # --dtype wins over the file's.
  assert cfg.target == str(gin)
  assert any("base.gin" in w for w in cfg.warnings)  # Missing include.


def test_gin_file_scopes(tmp_path):
  gin = tmp_path / "pair.gin"
  gin.write_text(
      "T5Config.vocab_size = 128\n"
      "T5Config.num_heads = 2\n"
      "target/T5Config.emb_dim = 64\n"
      "draft/T5Config.emb_dim = 16\n")
  target, _ = benchmarking.load_gin_config(gin, role="target")
  draft, _ = benchmarking.load_gin_config(gin, role="draft")
  assert (target.emb_dim, draft.emb_dim) == (64, 16)
  assert target.num_heads == draft.num_heads == 2  # Unscoped base.
  only_draft = tmp_path / "draft_only.gin"
  only_draft.write_text("draft/T5Config.emb_dim = 24\n"
                        "draft/T5Config.vocab_size = 128\n")
  config, _ = benchmarking.load_gin_config(only_draft, role="target")
  assert config.emb_dim == 24  # The file's only scope.


@pytest.mark.parametrize("size", ["small", "base", "large", "xl", "xxl"])
def test_repo_gin_files_match_sizes(size):
  repo = pathlib.Path(__file__).resolve().parents[1]
  for path in [repo / "gin" / "models" / f"t5_1_1_{size}.gin",
               repo / "gin" / "models" / "target" / f"t5_1_1_{size}.gin"]:
    if not path.exists():
      pytest.skip(f"{path} not in this checkout")
    config, _ = benchmarking.load_gin_config(path, role="target")
    expected = benchmarking.MODEL_SIZES[size]
    assert {k: getattr(config, k) for k in expected} == expected, path
