"""The run command: gin files, flags, and end-to-end runs offline."""
import dataclasses
import json
import pathlib
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment import summary
from specdec_jax.experiment import runner
from specdec_jax.experiment import loading
from specdec_jax.experiment import arguments
from specdec_jax.metrics import run_metrics
from specdec_jax.core.models import init_params
from specdec_jax.core.models import param_shapes

GIN_DIR = gin_reader.GIN_DIR
REPO = GIN_DIR.parent
EXPERIMENTS = sorted(
    p.name for p in GIN_DIR.glob("*.gin") if p.name not in ("run.gin",))

# T5X's T5 v1.1 hyperparameters (t5x/examples/t5/t5_1_1/*.gin):
# emb_dim, num_heads, layers (enc = dec), head_dim, mlp_dim.
T5X_SIZES = {
    "small": (512, 6, 8, 64, 1024),
    "base": (768, 12, 12, 64, 2048),
    "large": (1024, 16, 24, 64, 2816),
    "xl": (2048, 32, 24, 64, 5120),
    "xxl": (4096, 64, 24, 64, 10240),
}

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = pytest.mark.usefixtures("clean_gin")


def _parse(files, bindings=()):
  gin_utils.parse_gin(files, bindings, finalize=False)


@pytest.mark.parametrize("size", sorted(T5X_SIZES))
def test_model_gin_files_have_t5x_hyperparameters(size):
  emb, heads, layers, head_dim, mlp = T5X_SIZES[size]
  for role in ("target", "draft"):
    gin.clear_config()
    _parse([f"models/{role}/t5_1_1_{size}.gin"],
           [f"{role.upper()}_DTYPE = 'float32'"])
    config = loading.model_config(role)
    assert (config.emb_dim, config.num_heads, config.num_encoder_layers,
            config.num_decoder_layers, config.head_dim,
            config.mlp_dim) == (emb, heads, layers, layers, head_dim, mlp)
    assert config.vocab_size == 32128
    assert config.mlp_activations == ("gelu", "linear")
    assert not config.logits_via_embedding


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_gin_parses_and_builds(name):
  _parse([name])
  target, draft = loading.model_config("target"), loading.model_config("draft")
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
  expected_gamma = {
      "ende_small": 7,
      "ende_base": 7,
      "ende_large": 7,
      "cnndm_small": 5,
      "cnndm_base": 5,
      "cnndm_large": 3
  }
  for name, gamma in expected_gamma.items():
    gin.clear_config()
    _parse([f"{name}.gin"])
    assert gin.get_bindings("run")["gamma"] == gamma, name
    assert loading.model_config("draft").emb_dim == T5X_SIZES[name.split("_")
                                                              [1]][0]


def test_gin_flag_shorthand_and_missing_file():
  assert gin_utils.rewrite_gin_args([
      "prog", "--gin.GAMMA=3", "--gin_file=x.gin"
  ]) == ["prog", "--gin_bindings=GAMMA=3", "--gin_file=x.gin"]
  with pytest.raises(ValueError, match="--gin.GAMMA"):
    gin_utils.rewrite_gin_args(["--gin.GAMMA"])
  with pytest.raises(ValueError, match="no_such_file.gin"):
    _parse(["no_such_file.gin"])


@pytest.mark.slow
def test_local_tiny_end_to_end(tmp_path, caplog):
  # Three examples (one longer than the inputs length) but NUM_EXAMPLES = 5.
  data = tmp_path / "data.tsv"
  data.write_text("a small house\tein kleines Haus\n"
                  f"{'a very long sentence ' * 3}\tein sehr langer Satz\n"
                  "the garden\tder Garten\n")
  caplog.set_level("WARNING")
  _parse(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{tmp_path / 'a'}'", f"SOURCE_FILE = '{data}'",
      "NUM_EXAMPLES = 5", "BATCH_SIZE = 2", "TASK_FEATURE_LENGTHS = "
      "{'inputs': 24, 'targets': 16}"
  ])
  first = RunPlan.build(arguments.run_arguments())
  metrics, models = runner.execute(first)
  assert metrics["greedy_outputs_identical"] is True
  written = json.loads((tmp_path / "a" / "metrics.json").read_text())
  # What run writes is what report and sweep read (`RunMetrics`).
  assert run_metrics.load(
      (tmp_path / "a" / "metrics.json").read_text()).to_dict() == written
  for key in ("gamma", "temperature", "alpha", "num_examples",
              "tokens_generated", "target_calls_baseline",
              "target_calls_speculative", "walltime_baseline_s",
              "walltime_speculative_s", "speedup", "cost_coefficient_c",
              "theoretical_speedup", "bleu", "draft_step_s", "target_step_s",
              "settings"):
    assert key in written, key
  # Fewer examples than asked for, and a truncated input: logged, recorded.
  assert (written["num_examples"], written["num_examples_requested"]) == (3, 5)
  assert "NUM_EXAMPLES=5" in caplog.text and "only 3 examples" in caplog.text
  assert written["inputs_truncated"] == 1 and written["inputs_length"] == 24
  assert written["longest_input_tokens"] == 3 * len("a very long sentence ") + 1
  assert "truncates 1 of 3 inputs" in caplog.text
  assert written["greedy_identical_examples"] == 3
  assert written["random_weights"] is True
  # The efficiency's factors multiply to it (at T = 0 the outputs match).
  split = written["efficiency_split"]
  assert split["output_lengths"] == 1.0
  assert written["theory_tokens_per_call_with_ends"] <= written[
      "theory_tokens_per_call"]
  assert np.prod(list(split.values())) == pytest.approx(
      written["speedup"] / written["theoretical_speedup_measured_call_cost"],
      rel=1e-9)
  # Two batches cannot fix a line through the batches' times: no fixed
  # cost is claimed (the fit itself: test_overheads).
  assert "fixed_cost_per_example_s" not in written
  assert written["bleu"]["baseline"] == written["bleu"]["speculative"]
  predictions = (tmp_path / "a" / "predictions.jsonl").read_text()
  rows = [json.loads(line) for line in predictions.splitlines()]
  assert len(rows) == 3
  for row in rows:
    assert row["baseline"] == row["speculative"]
    assert len(row["accepted_counts"]) == len(row["trace"])
    assert "timeline" not in row  # measured times live in metrics.json
  assert sum(len(r["accepted_counts"])
             for r in rows) == written["target_calls_speculative"]

  # Same settings and seed: the same predictions.jsonl, byte for byte; the
  # same OUTPUT_DIR may be re-run.
  for out in ("b", "a"):
    again = RunPlan.build(
        arguments.run_arguments(overrides={"output_dir": str(tmp_path / out)}))
    runner.execute(again, models=models)
    assert (tmp_path / out / "predictions.jsonl").read_text() == predictions

  lines = summary.summary_lines(metrics, first.args)
  text = "\n".join(lines)
  assert "speculative decoding: " in lines[1]
  assert ("faster than the target alone" in lines[1] or
          "slower than the target alone" in lines[1])
  assert "alpha" in lines[1] and "tokens per target call" in lines[1]
  assert "greedy outputs identical to the target's on 3/3 examples" in text
  assert "quality: BLEU" in text
  assert "random weights" in text and "meaningless" in text
  assert "NUM_EXAMPLES=5, but the data has only 3" in text
  assert "1 of 3 inputs were truncated" in text
  assert lines[-1].startswith("results: ")


def test_summary_at_temperature_one_and_rouge():
  metrics = dict(
      task="cnndm", num_examples=10, speedup=1.62, theoretical_speedup=1.71,
      alpha=0.61, alpha_beta=0.6, tokens_per_target_call=2.1,
      greedy_outputs_identical=None, random_weights=False, rouge={
          "baseline": {
              "rouge1": 40.0,
              "rougeLsum": 37.5
          },
          "speculative": {
              "rouge1": 39.0,
              "rougeLsum": 36.5
          }
      })
  args = arguments.RunArguments(temperature=1.0, gamma=5, mode="walltime",
                                target_name="xxl", draft_name="small",
                                output_dir="/tmp/x")
  text = "\n".join(summary.summary_lines(metrics, args))
  # Without the measured call cost (older metrics.json): the ideal, named.
  assert ("1.62x faster than the target alone (theory, a call costing one "
          "step: 1.71x)") in text
  metrics["theoretical_speedup_measured_call_cost"] = 1.44
  text = "\n".join(summary.summary_lines(metrics, args))
  assert ("1.62x faster than the target alone (theory at the measured call "
          "cost 1.44x)") in text
  assert "alpha 0.61 (share of draft tokens accepted)" in text
  assert "not compared token by token" in text and "chi-square" in text
  assert "identical" not in text
  assert "ROUGE rouge1 40.00/39.00, rougeLsum 37.50/36.50" in text
  assert "meaningless" not in text


@pytest.mark.slow
def test_self_draft_from_checkpoint_accepts_everything(tmp_path):
  """Target and draft loaded from the same checkpoint: α = 1 both ways."""
  _parse(["local_tiny.gin"], ["NUM_EXAMPLES = 2", "GAMMA = 3"])
  config = loading.model_config("target")
  params = init_params(config, jax.random.PRNGKey(4))["params"]
  ckpt = checkpoints.save_params(params, str(tmp_path / "ckpt"))
  gin.clear_config()
  _parse(
      ["local_tiny.gin", "models/target/tiny.gin"],
      [
          "NUM_EXAMPLES = 2",
          "GAMMA = 3",
          f"OUTPUT_DIR = '{tmp_path / 'out'}'",
          f"TARGET_CHECKPOINT_PATH = '{ckpt}'",
          f"DRAFT_CHECKPOINT_PATH = '{ckpt}'",
          # The draft gets the target's architecture.
          *[
              f"draft/T5Config.{k} = {v!r}"
              for k, v in (("emb_dim", config.emb_dim),
                           ("num_heads", config.num_heads),
                           ("num_encoder_layers", config.num_encoder_layers),
                           ("num_decoder_layers", config.num_decoder_layers),
                           ("mlp_dim", config.mlp_dim),
                           ("head_dim", config.head_dim))
          ]
      ])
  metrics = run_lib.run()
  assert metrics["alpha"] == 1.0
  assert metrics["greedy_outputs_identical"]
  assert metrics["tokens_per_target_call"] > 3.0
  alpha = run_lib.run(overrides={"mode": "alpha"})
  assert alpha["alpha_beta"] == pytest.approx(1.0, abs=1e-6)
  assert alpha["num_positions"] == metrics["tokens_generated"]
  assert alpha["random_weights"] is False
  lines = summary.summary_lines(
      alpha, arguments.run_arguments(overrides={"mode": "alpha"}))
  assert lines[1].startswith("alpha 1.000 ± 0.000 (share of draft tokens")
  assert not any("random weights" in l for l in lines)
  assert lines[-1].startswith(f"results: {tmp_path / 'out' / 'alpha.json'}")


def test_run_arguments_are_one_checked_frozen_record(tmp_path):
  _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'", "GAMMA = 3"])
  args = arguments.run_arguments()
  assert isinstance(args, arguments.RunArguments)
  assert args.gamma == 3
  assert not hasattr(args, "keys")  # no dict shims: read by attribute
  with pytest.raises(dataclasses.FrozenInstanceError):
    args.gamma = 4  # pytype: disable=not-writable
  with pytest.raises(run_lib.ConfigError, match=r"TEMPERATURE=-1.0 "):
    dataclasses.replace(args, temperature=-1.0)  # checked when built
  with pytest.raises(run_lib.ConfigError, match=r"Unknown run arguments "
                     r"\['gama'\]"):
    arguments.run_arguments(overrides={"gama": 3})
  assert RunPlan.build(args).args is args


def test_bad_run_arguments_fail_before_loading(tmp_path):
  _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"])
  # Named as typed (issue 26): GAMMA, MODE, TASK_FEATURE_LENGTHS.
  for override, name in (({
      "gamma": 0
  }, "GAMMA=0"), ({
      "temperature": -1.0
  }, "temperature"), ({
      "batch_size": 0
  }, "BATCH_SIZE"), ({
      "mode": "fast"
  }, "MODE='fast'"), ({
      "task_feature_lengths": {
          "inputs": 8
      }
  }, "TASK_FEATURE_LENGTHS must have exactly"), ({
      "task_feature_lengths": {
          "inputs": 8,
          "targets": 0
      }
  }, r"TASK_FEATURE_LENGTHS\['targets'\]=0")):
    with pytest.raises(ValueError, match=name):
      run_lib.run(overrides=override)
  assert not list(pathlib.Path(tmp_path).iterdir())


# ---------------------------------------------------------------------------
# Bad input (issue 13): rejected before any model load or compilation, with
# the macro, the value and what is allowed; nothing written.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bindings,expect",
    [
        (["TEMPERATURE = 1e999"], ["TEMPERATURE=inf", "finite number >= 0"]),
        (["TOPP = 1e999"], ["TOPP=inf", "finite number in (0, 1]"]),
        (["TASK_FEATURE_LENGTHS = {'inputs': 0, 'targets': 8}"
         ], ["TASK_FEATURE_LENGTHS['inputs']=0", "integer >= 2"]),
        # The byte vocabulary has 259 ids: a 128-token model would clamp them.
        ([
            "target/T5Config.vocab_size = 128",
            "draft/T5Config.vocab_size = 128"
        ], ["259 ids", "target/T5Config.vocab_size = 128", "at most 128 ids"]),
    ])
def test_bad_settings_fail_before_loading(bindings, expect, tmp_path, no_load):
  out = tmp_path / "out"
  _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  for text in expect:
    assert text in str(e.value), (text, str(e.value))
  assert not out.exists()


def test_nan_temperature_and_top_p_rejected(tmp_path, no_load):
  _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"])
  for name, macro in (("temperature", "TEMPERATURE"), ("top_p", "TOPP")):
    with pytest.raises(run_lib.ConfigError, match=f"{macro}=nan"):
      run_lib.run(overrides={name: float("nan")}, providers=no_load)
  assert not list(tmp_path.iterdir())


def test_spm_model_path_not_a_model(tmp_path, no_load):
  bad = tmp_path / "notes.model"
  bad.write_text("not a sentencepiece model\n")
  _parse(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{tmp_path / 'out'}'", "vocabulary.byte_level = False",
      f"SPM_MODEL_PATH = '{bad}'"
  ])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  assert f"SPM_MODEL_PATH={str(bad)!r} is not a SentencePiece model" in str(
      e.value)
  assert not (tmp_path / "out").exists()


def test_output_dir_probed_at_startup(tmp_path, no_load):
  a_file = tmp_path / "file"
  a_file.write_text("mine")
  for out in (a_file, a_file / "sub"):
    gin.clear_config()
    _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'"])
    with pytest.raises(run_lib.ConfigError) as e:
      run_lib.run(providers=no_load)
    assert f"OUTPUT_DIR={str(out)!r}: not a writable directory" in str(e.value)
  assert a_file.read_text() == "mine"
  # gs:// is written for real (tests/harness/test_gcs.py); other URLs are refused.
  gin.clear_config()
  _parse(["local_tiny.gin"], ["OUTPUT_DIR = 's3://bucket/run'"])
  with pytest.raises(run_lib.ConfigError,
                     match="a local directory or gs://bucket/folder"):
    run_lib.run(providers=no_load)


class _Loaded(Exception):
  """Raised by a stand-in load_model: the startup checks had passed."""


def test_refuses_another_runs_metrics_unless_overwrite(tmp_path, monkeypatch,
                                                       no_load):
  out = tmp_path / "out"
  out.mkdir()
  _parse(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'"])
  settings = RunPlan.build(arguments.run_arguments(), no_load).settings
  other = json.loads(json.dumps(settings))
  other["run"]["gamma"] = 7
  for record, why in (({
      "settings": other
  }, "other settings: run.gamma: 7 "
                       "-> 4"), ({
                           "loss": 1.0
                       }, "records no settings")):
    (out / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(run_lib.ConfigError) as e:
      run_lib.run(providers=no_load)
    assert f"OUTPUT_DIR={str(out)!r} holds metrics.json" in str(e.value)
    assert why in str(e.value)
    assert "--gin.OVERWRITE=True" in str(e.value)
    assert json.loads((out / "metrics.json").read_text()) == record

  def loaded(*args, **kwargs):
    raise _Loaded()

  loads = Providers(load_model=loaded)
  with pytest.raises(_Loaded):  # OVERWRITE=True: past the checks
    run_lib.run(overrides={"overwrite": True}, providers=loads)
  (out / "metrics.json").write_text(json.dumps({"settings": settings}))
  with pytest.raises(_Loaded):  # the same settings: a re-run, allowed
    run_lib.run(providers=loads)
  # alpha.json of another run counts too (the report merges it).
  (out / "alpha.json").write_text(json.dumps({"settings": other}))
  with pytest.raises(run_lib.ConfigError, match="holds alpha.json"):
    run_lib.run(overrides={"mode": "alpha"}, providers=no_load)


def _cli(args, tmp_path):
  return subprocess.run([sys.executable, "-m", "specdec_jax.run", *args],
                        capture_output=True, text=True, cwd=REPO, timeout=300)


def test_cli_rejects_macro_typo_in_one_line(tmp_path):
  proc = _cli([
      "--gin_file=local_tiny.gin", "--gin.GAMA=3",
      f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'"
  ], tmp_path)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines() == [
      l for l in proc.stderr.strip().splitlines() if "run: error" in l
  ]
  assert "run: error: --gin.GAMA=3: unknown gin macro 'GAMA'" in proc.stderr
  assert "did you mean GAMMA" in proc.stderr
  assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_first_screen_is_quiet_and_late_checks_fail_early(tmp_path):
  """Through TensorFlow's import and the vocabulary to the OUTPUT_DIR probe:
  no gin lookup lines, no CUDA/TPU probing, one error line, rc 2."""
  a_file = tmp_path / "file"
  a_file.write_text("x")
  proc = _cli(["--gin_file=local_tiny.gin", f"--gin.OUTPUT_DIR='{a_file}'"],
              tmp_path)
  assert proc.returncode == 2, proc.stderr[-3000:]
  for noise in ("Path not found", "system_path_file_exists", "cuInit",
                "cudart_stub", "Unable to initialize backend", "Traceback"):
    assert noise not in proc.stderr, proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith("run: error")]
  assert len(errors) == 1 and "not a writable directory" in errors[0]


@pytest.mark.parametrize(
    "role,name",
    [("target", "multi30k_target"), ("draft", "multi30k_draft_1m"),
     ("draft", "multi30k_draft_4m"),
     *[(r, f"t5_1_1_{s}") for r in ("target", "draft") for s in T5X_SIZES]])
def test_scoped_model_files_match_unscoped(role, name):
  """models/<role>/X.gin binds exactly what the T5X-style models/X.gin does."""
  from specdec_jax.core.models import T5Config  # pylint: disable=g-import-not-at-top
  _parse([f"models/{name}.gin"],
         ["MODEL_DTYPE = 'float32'"] if name.startswith("t5_1_1") else [])
  unscoped = T5Config()  # pylint: disable=no-value-for-parameter
  gin.clear_config()
  _parse([f"models/{role}/{name}.gin"], [f"{role.upper()}_DTYPE = 'float32'"]
         if name.startswith("t5_1_1") else [])
  assert loading.model_config(role) == unscoped


def test_multi30k_run_configs_parse():
  for name in ("multi30k_1m", "multi30k_4m", "multi30k_4m_distill"):
    gin.clear_config()
    _parse([f"{name}.gin"])
    target, draft = loading.model_config("target"), loading.model_config(
        "draft")
    assert target.vocab_size == draft.vocab_size == 8000
    assert draft.num_params < target.num_params / 2
