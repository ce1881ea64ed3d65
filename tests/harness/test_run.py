"""The run command: gin files, flags, and settings refused before anything
loads (end to end: tests/e2e/test_run_e2e.py)."""
import dataclasses
import json
import pathlib

import gin
import pytest

from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment import summary
from specdec_jax.experiment import loading
from specdec_jax.experiment import arguments

from run_helpers import parse_gin_files
from run_helpers import run_cli

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


@pytest.mark.parametrize("size", sorted(T5X_SIZES))
def test_model_gin_files_have_t5x_hyperparameters(size):
  emb, heads, layers, head_dim, mlp = T5X_SIZES[size]
  for role in ("target", "draft"):
    gin.clear_config()
    parse_gin_files([f"models/{role}/t5_1_1_{size}.gin"],
                    [f"{role.upper()}_DTYPE = 'float32'"])
    config = loading.model_config(role)
    assert (config.emb_dim, config.num_heads, config.num_encoder_layers,
            config.num_decoder_layers, config.head_dim,
            config.mlp_dim) == (emb, heads, layers, layers, head_dim, mlp)
    assert config.vocab_size == 32128
    assert config.mlp_activations == ("gelu", "linear")
    assert not config.logits_via_embedding


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
    parse_gin_files([f"{name}.gin"])
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
    parse_gin_files(["no_such_file.gin"])


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
  # Without the measured call cost (older metrics.json): the ideal, named
  # as everywhere (issue 58: one name per formula).
  assert ("1.62x faster than the target alone (Theorem 3.8 at call cost 1 "
          "(the paper's ideal) 1.71x)") in text
  metrics["theoretical_speedup_measured_call_cost"] = 1.44
  text = "\n".join(summary.summary_lines(metrics, args))
  assert ("1.62x faster than the target alone (Theorem 3.8 at the measured "
          "call cost 1.44x)") in text
  # α as outputs.md defines metrics.json's alpha (not "the share of draft
  # tokens accepted", which the histogram gives lower).
  assert "alpha 0.61 (kept guesses / acceptance trials)" in text
  assert "share of draft tokens" not in text
  assert "not compared token by token" in text and "chi-square" in text
  assert "identical" not in text
  # T > 0: the quality difference is sampling noise, said so.
  assert ("ROUGE rouge1 40.00/39.00, rougeLsum 37.50/36.50 (target alone / "
          "speculative); T > 0: different samples of the same distribution, "
          "so they differ by sampling noise") in text
  assert "meaningless" not in text


def test_theory_and_alpha_read_the_same_on_stdout_and_stderr():
  """Issue 58: the summary said 'theory at the measured call cost 2.43x'
  while the log said 'theory 3.19x' (the ideal): both now print the same
  formula under the same name, α under outputs.md's name; BLEU at T > 0
  with its paired bootstrap's p."""
  metrics = dict(
      task="captions", num_examples=50, speedup=1.95, theoretical_speedup=3.19,
      theoretical_speedup_measured_call_cost=2.43, alpha=0.898, alpha_beta=0.9,
      tokens_per_target_call=3.0, cost_coefficient_c=0.028,
      greedy_outputs_identical=None, random_weights=False, bleu={
          "baseline": 30.1,
          "speculative": 29.4
      }, quality_noise={
          "metric": "bleu",
          "difference": -0.7,
          "p_value": 0.6234,
          "resamples": 1000
      })
  args = arguments.RunArguments(temperature=1.0, gamma=3, mode="walltime",
                                output_dir="/tmp/x")
  lines = summary.summary_lines(metrics, args)
  log = summary.log_words(metrics)
  shown = "Theorem 3.8 at the measured call cost 2.43x"
  assert shown in lines[1] and shown in log and "3.19" not in log
  assert "alpha 0.90 (kept guesses / acceptance trials)" in lines[1]
  assert log == ("speedup 1.95x (Theorem 3.8 at the measured call cost "
                 "2.43x), alpha 0.898 (kept guesses / acceptance trials), "
                 "c 0.028")
  assert lines[2] == (
      "quality: BLEU 30.10 (target alone) vs 29.40 (speculative); T > 0: "
      "different samples of the same distribution, so they differ by "
      "sampling noise (paired bootstrap over the 50 examples: p = 0.62)")
  # Lenient: not the same distribution, said so; T = 0: no note.
  lenient = summary.summary_lines(dict(metrics, exact=False, lenience=0.5),
                                  args)
  assert "LENIENCE < 1 samples another distribution" in lenient[2]
  greedy = dict(metrics, greedy_outputs_identical=True,
                greedy_identical_examples=50)
  lines = summary.summary_lines(greedy,
                                dataclasses.replace(args, temperature=0.0))
  assert lines[2] == "quality: BLEU 30.10 (target alone) vs 29.40 (speculative)"
  # Batch 8: what waiting for each batch's slowest row cost, said; batch 1
  # (a factor of 1) says nothing.
  split = {"sentence_ends": 0.89, "batch": 0.877, "time": 0.89}
  lines = summary.summary_lines(
      dict(greedy, batch_size=8, efficiency_split=split),
      dataclasses.replace(args, temperature=0.0))
  assert ("batch size 8: each batch's loop runs to its slowest row, and the "
          "speculative loop's rows end less together; it cost 0.88 of the "
          "speedup") in lines[2]
  lines = summary.summary_lines(
      dict(greedy, batch_size=1, efficiency_split=dict(split, batch=1.0)),
      dataclasses.replace(args, temperature=0.0))
  assert not any("slowest row" in line for line in lines)
  # Examples without references (a file of inputs alone): said so.
  bare = {k: v for k, v in greedy.items() if k not in ("bleu", "quality_noise")}
  lines = summary.summary_lines(bare,
                                dataclasses.replace(args, temperature=0.0))
  assert lines[2] == ("quality: none (the examples have no references to "
                      "score against)")


def test_run_arguments_are_one_checked_frozen_record(tmp_path):
  parse_gin_files(["local_tiny.gin"],
                  [f"OUTPUT_DIR = '{tmp_path}'", "GAMMA = 3"])
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
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"])
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
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  for text in expect:
    assert text in str(e.value), (text, str(e.value))
  assert not out.exists()


def test_nan_temperature_and_top_p_rejected(tmp_path, no_load):
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"])
  for name, macro in (("temperature", "TEMPERATURE"), ("top_p", "TOPP")):
    with pytest.raises(run_lib.ConfigError, match=f"{macro}=nan"):
      run_lib.run(overrides={name: float("nan")}, providers=no_load)
  assert not list(tmp_path.iterdir())


def test_spm_model_path_not_a_model(tmp_path, no_load):
  bad = tmp_path / "notes.model"
  bad.write_text("not a sentencepiece model\n")
  parse_gin_files(["local_tiny.gin"], [
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
    parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'"])
    with pytest.raises(run_lib.ConfigError) as e:
      run_lib.run(providers=no_load)
    assert f"OUTPUT_DIR={str(out)!r}: not a writable directory" in str(e.value)
  assert a_file.read_text() == "mine"
  # gs:// is written for real (tests/e2e/test_gcs.py); other URLs are refused.
  gin.clear_config()
  parse_gin_files(["local_tiny.gin"], ["OUTPUT_DIR = 's3://bucket/run'"])
  with pytest.raises(run_lib.ConfigError,
                     match="a local directory or gs://bucket/folder"):
    run_lib.run(providers=no_load)


class _Loaded(Exception):
  """Raised by a stand-in load_model: the startup checks had passed."""


def test_refuses_another_runs_metrics_unless_overwrite(tmp_path, monkeypatch,
                                                       no_load):
  out = tmp_path / "out"
  out.mkdir()
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'"])
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


def test_cli_rejects_macro_typo_in_one_line(tmp_path):
  proc = run_cli("--gin_file=local_tiny.gin", "--gin.GAMA=3",
                 f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines() == [
      l for l in proc.stderr.strip().splitlines() if "run: error" in l
  ]
  assert "run: error: --gin.GAMA=3: unknown gin macro 'GAMA'" in proc.stderr
  assert "did you mean GAMMA" in proc.stderr
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "role,name",
    [("target", "multi30k_target"), ("draft", "multi30k_draft_1m"),
     ("draft", "multi30k_draft_4m"),
     *[(r, f"t5_1_1_{s}") for r in ("target", "draft") for s in T5X_SIZES]])
def test_scoped_model_files_match_unscoped(role, name):
  """models/<role>/X.gin binds exactly what the T5X-style models/X.gin does."""
  from specdec_jax.core.models import T5Config  # pylint: disable=g-import-not-at-top
  parse_gin_files(
      [f"models/{name}.gin"],
      ["MODEL_DTYPE = 'float32'"] if name.startswith("t5_1_1") else [])
  unscoped = T5Config()  # pylint: disable=no-value-for-parameter
  gin.clear_config()
  parse_gin_files([
      f"models/{role}/{name}.gin"
  ], [f"{role.upper()}_DTYPE = 'float32'"] if name.startswith("t5_1_1") else [])
  assert loading.model_config(role) == unscoped


def test_multi30k_run_configs_parse():
  for name in ("multi30k_1m", "multi30k_4m", "multi30k_4m_distill"):
    gin.clear_config()
    parse_gin_files([f"{name}.gin"])
    target, draft = loading.model_config("target"), loading.model_config(
        "draft")
    assert target.vocab_size == draft.vocab_size == 8000
    assert draft.num_params < target.num_params / 2
