"""The run command: gin files, flags, and end-to-end runs offline."""
import json
import pathlib

import gin
import jax
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax import gin_utils
from specdec_jax import run as run_lib
from specdec_jax.models import init_params
from specdec_jax.models import param_shapes

GIN_DIR = gin_utils.GIN_DIR
EXPERIMENTS = sorted(p.name for p in GIN_DIR.glob("*.gin")
                     if p.name not in ("run.gin",))

# T5X's T5 v1.1 hyperparameters (t5x/examples/t5/t5_1_1/*.gin):
# emb_dim, num_heads, layers (enc = dec), head_dim, mlp_dim.
T5X_SIZES = {
    "small": (512, 6, 8, 64, 1024),
    "base": (768, 12, 12, 64, 2048),
    "large": (1024, 16, 24, 64, 2816),
    "xl": (2048, 32, 24, 64, 5120),
    "xxl": (4096, 64, 24, 64, 10240),
}


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(files, bindings=()):
  gin_utils.parse_gin(files, bindings, finalize=False)


@pytest.mark.parametrize("size", sorted(T5X_SIZES))
def test_model_gin_files_have_t5x_hyperparameters(size):
  emb, heads, layers, head_dim, mlp = T5X_SIZES[size]
  for role in ("target", "draft"):
    gin.clear_config()
    _parse([f"models/{role}/t5_1_1_{size}.gin"],
           [f"{role.upper()}_DTYPE = 'float32'"])
    config = run_lib.model_config(role)
    assert (config.emb_dim, config.num_heads, config.num_encoder_layers,
            config.num_decoder_layers, config.head_dim, config.mlp_dim) == (
                emb, heads, layers, layers, head_dim, mlp)
    assert config.vocab_size == 32128
    assert config.mlp_activations == ("gelu", "linear")
    assert not config.logits_via_embedding


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_gin_parses_and_builds(name):
  _parse([name])
  target, draft = run_lib.model_config("target"), run_lib.model_config("draft")
  assert target.vocab_size == draft.vocab_size
  # Shapes only (jax.eval_shape): XXL is never allocated.
  for config in (target, draft):
    shapes = param_shapes(config)["params"]
    kernel = shapes["decoder"]["logits_dense"]["kernel"]
    assert kernel.shape == (config.emb_dim, config.vocab_size)
  bindings = gin.get_bindings("run")
  assert bindings["gamma"] >= 1 and bindings["output_dir"]
  if name.startswith(("ende_", "cnndm_")):
    assert target.emb_dim == 4096 and target.num_decoder_layers == 24
    assert bindings["target_checkpoint_path"].startswith("gs://")
    assert bindings["temperature"] == 0.0


def test_experiment_defaults_follow_paper_table2():
  expected_gamma = {"ende_small": 7, "ende_base": 7, "ende_large": 7,
                    "cnndm_small": 5, "cnndm_base": 5, "cnndm_large": 3}
  for name, gamma in expected_gamma.items():
    gin.clear_config()
    _parse([f"{name}.gin"])
    assert gin.get_bindings("run")["gamma"] == gamma, name
    assert run_lib.model_config("draft").emb_dim == T5X_SIZES[
        name.split("_")[1]][0]


def test_gin_flag_shorthand_and_missing_file():
  assert gin_utils.rewrite_gin_args(
      ["prog", "--gin.GAMMA=3", "--gin_file=x.gin"]) == [
          "prog", "--gin_bindings=GAMMA=3", "--gin_file=x.gin"]
  with pytest.raises(ValueError, match="--gin.GAMMA"):
    gin_utils.rewrite_gin_args(["--gin.GAMMA"])
  with pytest.raises(ValueError, match="no_such_file.gin"):
    _parse(["no_such_file.gin"])


def test_local_tiny_end_to_end(tmp_path):
  _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'",
                              "NUM_EXAMPLES = 3", "BATCH_SIZE = 2"])
  metrics = run_lib.run()
  assert metrics["greedy_outputs_identical"]
  written = json.loads((tmp_path / "metrics.json").read_text())
  for key in ("gamma", "temperature", "alpha", "num_examples",
              "tokens_generated", "target_calls_baseline",
              "target_calls_speculative", "walltime_baseline_s",
              "walltime_speculative_s", "speedup", "cost_coefficient_c",
              "theoretical_speedup", "bleu"):
    assert key in written, key
  assert written["num_examples"] == 3
  assert written["bleu"]["baseline"] == written["bleu"]["speculative"]
  rows = [json.loads(line) for line in
          (tmp_path / "predictions.jsonl").read_text().splitlines()]
  assert len(rows) == 3
  for row in rows:
    assert row["baseline"] == row["speculative"]
    assert len(row["accepted_counts"]) == len(row["trace"])
  assert sum(len(r["accepted_counts"]) for r in rows) == written[
      "target_calls_speculative"]


def test_self_draft_from_checkpoint_accepts_everything(tmp_path):
  """Target and draft loaded from the same checkpoint: α = 1 both ways."""
  _parse(["local_tiny.gin"], ["NUM_EXAMPLES = 2", "GAMMA = 3"])
  config = run_lib.model_config("target")
  params = init_params(config, jax.random.PRNGKey(4))["params"]
  ckpt = checkpoints.save_params(params, str(tmp_path / "ckpt"))
  gin.clear_config()
  _parse(["local_tiny.gin", "models/target/tiny.gin"], [
      "NUM_EXAMPLES = 2", "GAMMA = 3", f"OUTPUT_DIR = '{tmp_path / 'out'}'",
      f"TARGET_CHECKPOINT_PATH = '{ckpt}'",
      f"DRAFT_CHECKPOINT_PATH = '{ckpt}'",
      # The draft gets the target's architecture.
      *[f"draft/T5Config.{k} = {v!r}" for k, v in (
          ("emb_dim", config.emb_dim), ("num_heads", config.num_heads),
          ("num_encoder_layers", config.num_encoder_layers),
          ("num_decoder_layers", config.num_decoder_layers),
          ("mlp_dim", config.mlp_dim), ("head_dim", config.head_dim))]])
  metrics = run_lib.run()
  assert metrics["alpha"] == 1.0
  assert metrics["greedy_outputs_identical"]
  assert metrics["tokens_per_target_call"] > 3.0
  alpha = run_lib.run(overrides={"mode": "alpha"})
  assert alpha["alpha_beta"] == pytest.approx(1.0, abs=1e-6)
  assert alpha["num_positions"] == metrics["tokens_generated"]


def test_bad_run_arguments_fail_before_loading(tmp_path):
  _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"])
  for override, name in (({"gamma": 0}, "gamma"),
                         ({"temperature": -1.0}, "temperature"),
                         ({"batch_size": 0}, "BATCH_SIZE"),
                         ({"mode": "fast"}, "mode"),
                         ({"task_feature_lengths": {"inputs": 8}},
                          "max_decode_length")):
    with pytest.raises(ValueError, match=name):
      run_lib.run(overrides=override)
  assert not list(pathlib.Path(tmp_path).iterdir())


@pytest.mark.parametrize("role,name", [
    ("target", "multi30k_target"), ("draft", "multi30k_draft_1m"),
    ("draft", "multi30k_draft_4m"),
    *[(r, f"t5_1_1_{s}") for r in ("target", "draft") for s in T5X_SIZES]])
def test_scoped_model_files_match_unscoped(role, name):
  """models/<role>/X.gin binds exactly what the T5X-style models/X.gin does."""
  from specdec_jax.models import T5Config  # pylint: disable=g-import-not-at-top
  _parse([f"models/{name}.gin"], ["MODEL_DTYPE = 'float32'"]
         if name.startswith("t5_1_1") else [])
  unscoped = T5Config()  # pylint: disable=no-value-for-parameter
  gin.clear_config()
  _parse([f"models/{role}/{name}.gin"], [f"{role.upper()}_DTYPE = 'float32'"]
         if name.startswith("t5_1_1") else [])
  assert run_lib.model_config(role) == unscoped


def test_multi30k_run_configs_parse():
  for name in ("multi30k_1m", "multi30k_4m", "multi30k_4m_distill"):
    gin.clear_config()
    _parse([f"{name}.gin"])
    target, draft = run_lib.model_config("target"), run_lib.model_config(
        "draft")
    assert target.vocab_size == draft.vocab_size == 8000
    assert draft.num_params < target.num_params / 2
