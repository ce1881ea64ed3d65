"""The device check (`specdec_jax.device_check`, docs/usage/gpu.md).

* Its arithmetic: the two-sample chi-square, the paper's Table 2 rows read
  from the experiment files, Theorem 3.8's table, the verdicts.
* What it runs without gin is what the gin files say: the T5 v1.1 shapes,
  the shipped pair's configs (model_config.json) and the main job's
  settings.
* A CPU-only setting on another backend is a one-line error.

End to end on the CPU (`scripts/device_check.sh --small`):
tests/e2e/test_device_check_e2e.py.
"""
import json
import os
import re

from conftest import REPO
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.config import gin_reader
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import param_shapes
from specdec_jax.device_check import cli
from specdec_jax.device_check import common
from specdec_jax.device_check import env
from specdec_jax.device_check import pretrained_pair
from specdec_jax.device_check import stats
from specdec_jax.metrics import analysis


# ---------------------------------------------------------------------------
# Arithmetic.
# ---------------------------------------------------------------------------
def _draw(rng, probs, n):
  """[n, 2] sequences of two i.i.d. tokens drawn from `probs`."""
  return rng.choice(len(probs), size=(n, 2), p=probs)


def test_chisquare_passes_one_distribution_and_fails_two():
  rng = np.random.default_rng(0)
  p = np.array([0.4, 0.3, 0.2, 0.1])
  q = np.array([0.3, 0.3, 0.2, 0.2])
  same = stats.two_sample_chisquare(_draw(rng, p, 4000), _draw(rng, p, 4000))
  assert same["p_value"] > 1e-3 and same["dof"] == same["cells"] - 1
  assert same["cells"] == 16  # 4 x 4 two-token sequences, none sparse
  different = stats.two_sample_chisquare(_draw(rng, p, 4000),
                                         _draw(rng, q, 4000))
  assert different["p_value"] < 1e-6


def test_chisquare_pools_sparse_cells_and_counts_like_the_formula():
  a = np.array([[0]] * 50 + [[1]] * 50 + [[2]] * 1)
  b = np.array([[0]] * 40 + [[1]] * 60 + [[3]] * 2)
  out = stats.two_sample_chisquare(a, b)
  # Cells 2 and 3 (3 rows) are pooled: cells 0, 1 and the pool.
  assert out["cells"] == 3 and out["dof"] == 2
  counts = np.array([[50, 50, 1], [40, 60, 2]], float)
  share = counts.sum(axis=1, keepdims=True) / counts.sum()
  expected = share * counts.sum(axis=0, keepdims=True)
  assert out["statistic"] == pytest.approx(
      np.sum((counts - expected)**2 / expected))


def test_chisquare_of_one_cell_and_bad_shapes():
  one = np.zeros((10, 3), int)
  assert stats.two_sample_chisquare(one, one)["p_value"] == 1.0
  with pytest.raises(ValueError, match=r"\[N, T\] and \[M, T\]"):
    stats.two_sample_chisquare(np.zeros((3, 2)), np.zeros((3, 3)))


def test_paper_rows_are_table_2():
  rows = stats.paper_rows()
  assert len(rows) == 12
  assert {(r["task"], r["draft"], r["temperature"]) for r in rows
         } == {(t, d, temp)
               for t in ("EnDe", "CNNDM")
               for d in ("small", "base", "large")
               for temp in (0.0, 1.0)}
  ende_small = [
      r for r in rows
      if (r["task"], r["draft"], r["temperature"]) == ("EnDe", "small", 0.0)
  ]
  assert ende_small == [{
      "task": "EnDe",
      "draft": "small",
      "temperature": 0.0,
      "gamma": 7,
      "alpha": 0.75,
      "speedup": 3.4,
      "source": "ende_small.gin"
  }]


def test_theorem_rows_use_each_drafts_c_and_the_call_cost():
  rows = [
      dict(task="EnDe", draft="small", temperature=0.0, gamma=3, alpha=0.7,
           speedup=2.0),
      dict(task="EnDe", draft="large", temperature=0.0, gamma=7, alpha=0.8,
           speedup=1.5),
  ]
  out = stats.theorem_rows(rows, {"small": 0.1}, {4: 1.2})
  theory = analysis.expected_speedup(0.7, 3, 0.1)
  assert out[0]["theorem_3_8"] == pytest.approx(theory)
  assert out[0]["paper_over_theorem"] == pytest.approx(2.0 / theory)
  assert out[0]["theorem_3_8_with_call_cost"] == pytest.approx(
      analysis.expected_speedup(0.7, 3, 0.1, call_cost=1.2))
  assert out[1]["c"] is None and out[1]["theorem_3_8"] is None
  assert stats.theorem_rows(
      rows, {"small": 0.1})[0]["theorem_3_8_with_call_cost"] is None


def test_median_ratio():
  assert stats.median_ratio([2, 6, 3], [1, 2, 3]) == 2.0
  with pytest.raises(ValueError):
    stats.median_ratio([1], [1, 2])


def _report(**exactness_ok):
  modes = {
      m: {
          "ok": ok,
          "greedy": {
              "default_precision": {
                  "rows": 4,
                  "rows_identical": 4
              }
          }
      } for m, ok in exactness_ok.items()
  }
  return {
      "mode": "small",
      "phases": {
          p: {
              "status": "ok",
              "seconds": 1.0
          } for p in common.PHASES
      },
      "env": {
          "gpu_awareness": {
              "ok": True
          },
          "machine": {
              "device_kind": "cpu"
          }
      },
      "exactness": {
          "all_ok": all(exactness_ok.values()),
          "modes": modes
      },
      "pretrained": {
          "identity": {
              "all_identical": True,
              "default_precision": {
                  "examples": 3,
                  "identical": 3
              }
          },
          "main_job": {
              "speedup": 1.5,
              "theorem_3_8": 2.0,
              "alpha": 0.9,
              "c": 0.05
          }
      },
      "physics": {
          "ok": True
      },
  }


def test_verdicts_and_summary():
  good = _report(token=True, beam=True)
  v = cli.verdicts(good)
  assert v["all_ok"] and v["pretrained_identical_count"] == "3/3"
  assert v["exactness_token"] and v["main_job_speedup"] == 1.5
  text = cli.format_summary({**good, "verdicts": v})
  assert "greedy identical 3/3; main job speedup 1.50x" in text
  assert text.splitlines()[-1] == "all checks hold: True"
  bad = _report(token=True, beam=False)
  assert not cli.verdicts(bad)["all_ok"]
  bad = _report(token=True)
  bad["phases"]["physics"]["status"] = "timed out"
  assert not cli.verdicts(bad)["all_ok"]


# ---------------------------------------------------------------------------
# What runs without gin is what the gin files say.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["small", "base", "large", "xl", "xxl"])
def test_t5_sizes_are_the_gin_files(size):
  assert common.t5_size(size) == gin_reader.read_t5_config(
      f"models/t5_1_1_{size}.gin")


@pytest.mark.parametrize("role,directory",
                         [("target", pretrained_pair.TARGET_DIR),
                          ("draft", pretrained_pair.DRAFT_DIR)])
def test_shipped_pair_configs_are_the_main_jobs(role, directory):
  ckpt = os.path.join(directory, os.listdir(directory)[0])
  with open(os.path.join(ckpt, "model_config.json"), encoding="utf-8") as f:
    fields = json.load(f)
  assert T5Config(**fields) == gin_reader.read_t5_config(
      "pretrained_multi30k.gin", scope=role)


def test_main_job_settings_are_the_gin_files():
  text = (REPO / "gin" / "pretrained_multi30k.gin").read_text()
  macros = dict(re.findall(r"^(\w+) = (.+)$", text, flags=re.M))
  pair = pretrained_pair
  assert REPO / macros["TARGET_CHECKPOINT_PATH"].strip("'") == pair.TARGET_DIR
  assert REPO / macros["DRAFT_CHECKPOINT_PATH"].strip("'") == pair.DRAFT_DIR
  assert REPO / macros["SPM_MODEL_PATH"].strip("'") == pair.SPM_MODEL
  assert REPO / macros["SOURCE_FILE"].strip("'") == pair.SOURCE_FILE
  assert int(macros["GAMMA"]) == pair.GAMMA
  assert float(macros["TEMPERATURE"]) == 0.0
  assert int(macros["NUM_EXAMPLES"]) == common.FULL.examples
  assert macros["TASK_FEATURE_LENGTHS"] == (
      f"{{'inputs': {common.FULL.input_length}, 'targets': "
      f"{common.FULL.max_decode_length}}}")
  run_gin = (REPO / "gin" / "run.gin").read_text()
  assert re.search(r"^BATCH_SIZE = 1$", run_gin, flags=re.M)


def test_captions_are_encoded_as_the_main_job_encodes_them():
  from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
  from specdec_jax.data import vocab  # pylint: disable=g-import-not-at-top
  pair = pretrained_pair
  sources = [s for s, _ in tasks.read_parallel_text(pair.SOURCE_FILE)]
  expected = tasks.encode_batch(vocab.SentencePieceFile(str(pair.SPM_MODEL)),
                                sources, 64)
  inputs = pair.encode_captions(len(sources), 64)
  assert inputs.dtype == np.int32 and len(inputs) == 60
  np.testing.assert_array_equal(inputs, expected)


def test_device_params_are_the_models_tree_in_the_storage_dtype():
  config = common.t5_size("xxl", tiny=True)
  params = common.device_params(config, 0, jnp.bfloat16)["params"]
  shapes = param_shapes(config)["params"]
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      shapes)
  for leaf, shape in zip(jax.tree_util.tree_leaves(params),
                         jax.tree_util.tree_leaves(shapes)):
    assert leaf.shape == shape.shape and leaf.dtype == jnp.bfloat16
    assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
  assert bool(jnp.all(params["decoder"]["decoder_norm"]["scale"] == 1))


# ---------------------------------------------------------------------------
# Settings.
# ---------------------------------------------------------------------------
def test_cpu_only_settings_are_one_line_errors_off_the_cpu():
  environ = {
      "SPECDEC_JAX_KERNEL_ISA": "avx2",
      "XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_dump_to=x"
  }
  assert env.settings_errors("cpu", "small", environ) == []
  errors = env.settings_errors("gpu", "full", environ)
  assert len(errors) == 2 and all("\n" not in e for e in errors)
  assert "SPECDEC_JAX_KERNEL_ISA='avx2'" in errors[0] and "CPU-only" in errors[0]
  assert "--xla_cpu_enable_fast_math=false" in errors[1]
  assert env.settings_errors("gpu", "full",
                             {"XLA_FLAGS": "--xla_dump_to=x"}) == []
  (full_on_cpu,) = env.settings_errors("cpu", "full", {})
  assert "needs a GPU" in full_on_cpu and "--small" in full_on_cpu


def test_command_line_rejects_unknown_phases(capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(["--phases=env,warp"])
  assert "allowed: a comma-separated subset" in capsys.readouterr().err
  assert cli.parse_args(["--phases=physics,env"]).phases == ["env", "physics"]


def test_preflight_names_what_the_check_reads():
  assert env.is_needed("pretrained/multi30k/target_38m/checkpoint_1/x")
  assert not env.is_needed("pretrained/multi30k/target")
  folders = env.by_folder({"a/b/c/d": 3, "a/b/c/e": 4, "x": 1})
  assert folders == [("a/b/c", 7), ("x", 1)]
