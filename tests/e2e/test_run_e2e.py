"""The run command end to end: the experiment files build, local_tiny.gin
runs and re-runs byte for byte, a self-draft accepts everything, the
progress lines and PRICE_CALL_COST=False, MODE='infer', and the command
line's first screen in a subprocess."""
import json
import pathlib

import gin
import jax
import numpy as np
import pytest

from specdec_jax import report
from specdec_jax import checkpoints
from specdec_jax import run as run_lib
from specdec_jax.experiment import arguments
from specdec_jax.files import io_utils
from specdec_jax.experiment import price_cache
from specdec_jax.experiment import loading
from specdec_jax.experiment import predictions
from specdec_jax.experiment import resume
from specdec_jax.experiment import runner
from specdec_jax.experiment import summary
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.metrics import run_metrics
from specdec_jax.core.models import decode_paths
from specdec_jax.core.models import init_params
from specdec_jax.core.models import param_shapes
from tools.benchmarks import batch_waits

from run_helpers import parse_gin_files
from run_helpers import run_cli

EXPERIMENTS = sorted(p.name
                     for p in io_utils.GIN_DIR.glob("*.gin")
                     if p.name not in ("run.gin",))
BEFORE_43 = pathlib.Path(__file__).parents[1] / "fixtures" / "before_issue43"

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_gin_parses_and_builds(name):
  parse_gin_files([name])
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


def test_local_tiny_end_to_end(tmp_path, caplog):
  # Three examples (one longer than the inputs length) but NUM_EXAMPLES = 5.
  data = tmp_path / "data.tsv"
  data.write_text("a small house\tein kleines Haus\n"
                  f"{'a very long sentence ' * 3}\tein sehr langer Satz\n"
                  "the garden\tder Garten\n")
  caplog.set_level("WARNING")
  parse_gin_files(["local_tiny.gin"], [
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
  # Batching's factor: the rows' calls as predictions.jsonl records them
  # give each batch's iterations (tools/benchmarks/batch_waits.py).
  tokens, calls = batch_waits.read_run(str(tmp_path / "a" /
                                           "predictions.jsonl"))
  assert (sum(tokens), sum(calls)) == (written["tokens_generated"],
                                       written["target_calls_speculative"])
  assert batch_waits.batch_table(tokens, calls,
                                 [2])[0]["batch_factor"] == pytest.approx(
                                     split["batch"], rel=1e-12)
  # Two batches cannot fix a line through the batches' times: no fixed
  # cost is claimed (the fit itself: test_overheads).
  assert "fixed_cost_per_example_s" not in written
  assert written["bleu"]["baseline"] == written["bleu"]["speculative"]
  predictions = (tmp_path / "a" / "predictions.jsonl").read_text()
  rows = [json.loads(line) for line in predictions.splitlines()]
  assert len(rows) == 3
  for row in rows:
    aux = row["aux"]
    assert aux["baseline"] == row["prediction"]
    assert len(aux["accepted_counts"]) == len(aux["trace"])
    assert "timeline" not in aux  # measured times live in metrics.json
  assert sum(r["aux"]["target_calls"]
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


def test_self_draft_from_checkpoint_accepts_everything(tmp_path):
  """Target and draft loaded from the same checkpoint: α = 1 both ways."""
  parse_gin_files(["local_tiny.gin"], ["NUM_EXAMPLES = 2", "GAMMA = 3"])
  config = loading.model_config("target")
  params = init_params(config, jax.random.PRNGKey(4))["params"]
  ckpt = checkpoints.save_params(params, str(tmp_path / "ckpt"))
  gin.clear_config()
  parse_gin_files(
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
  # The paths the models ran on, as metrics.json records them.
  assert alpha["decode_paths"] == metrics["decode_paths"]
  assert set(metrics["decode_paths"]) == {"target", "draft"}
  # Which machine ran it, as the price cache keys it (a processor's kind).
  assert metrics["machine"] == price_cache.machine_fields()
  assert "cpu family" in metrics["machine"]["cpu"] or not pathlib.Path(
      "/proc/cpuinfo").exists()
  lines = summary.summary_lines(
      alpha, arguments.run_arguments(overrides={"mode": "alpha"}))
  assert lines[1].startswith("alpha 1.000 ± 0.000 (share of draft tokens")
  assert not any("random weights" in l for l in lines)
  assert lines[-1].startswith(f"results: {tmp_path / 'out' / 'alpha.json'}")


def test_cli_first_screen_is_quiet_and_late_checks_fail_early(tmp_path):
  """Through TensorFlow's import and the vocabulary to the OUTPUT_DIR probe:
  no gin lookup lines, no CUDA/TPU probing, one error line, rc 2."""
  a_file = tmp_path / "file"
  a_file.write_text("x")
  proc = run_cli("--gin_file=local_tiny.gin", f"--gin.OUTPUT_DIR='{a_file}'")
  assert proc.returncode == 2, proc.stderr[-3000:]
  for noise in ("Path not found", "system_path_file_exists", "cuInit",
                "cudart_stub", "Unable to initialize backend", "Traceback"):
    assert noise not in proc.stderr, proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith("run: error")]
  assert len(errors) == 1 and "not a writable directory" in errors[0]


def _messages(caplog):
  return [r.getMessage() for r in caplog.records]


def _run_tiny(tmp_path, *bindings):
  parse_gin_files(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{tmp_path}'", "NUM_EXAMPLES = 3",
      "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 8}", *bindings
  ])
  return run_lib.run()


def test_run_says_what_it_compiles_pilots_and_prices(tmp_path, caplog,
                                                     monkeypatch):
  caplog.set_level("INFO")
  monkeypatch.setenv(price_cache.ENV_OFF, "0")  # piloted and priced now
  metrics = _run_tiny(tmp_path, "GAMMA = 'auto'", "BATCH_SIZE = 3")
  lines = _messages(caplog)
  # Every decoder program, counted, with its seconds.
  compiled = [l for l in lines if l.startswith("compiled ")]
  assert compiled and all(" in " in l for l in compiled)
  n = len(compiled)
  assert compiled[0].startswith(f"compiled 1/{n} (the baseline decoder, ")
  assert compiled[-1].startswith(f"compiled {n}/{n} (the speculative decoder")
  # The pilot with its sample size, then its pricing, each with seconds.
  assert any(
      l.startswith("GAMMA='auto': pilot decode of token γ=4 (timed) on the "
                   "first examples") and ": done in " in l for l in lines)
  assert ("GAMMA='auto': the pilot decoded token: 3 examples (1 batches)"
          in lines)
  assert any(
      l.startswith("GAMMA='auto': pricing c") and ": done in " in l
      for l in lines)
  # The run's own pricing of c.
  assert any(l.startswith("Pricing c") and ": done in " in l for l in lines)
  assert metrics["cost_coefficient_c"] is not None
  assert "call_cost_priced" not in metrics


def test_price_call_cost_false_skips_pricing_and_says_so(tmp_path, caplog):
  caplog.set_level("INFO")
  metrics = _run_tiny(tmp_path, "PRICE_CALL_COST = False")
  assert not any(l.startswith("Pricing c") for l in _messages(caplog))
  written = json.loads((tmp_path / "metrics.json").read_text())
  assert written["call_cost_priced"] is False
  for key in ("cost_coefficient_c", "target_step_s", "draft_step_s",
              "theoretical_speedup", "theoretical_speedup_measured_call_cost",
              "verification_call_s", "per_iteration_gamma"):
    assert written[key] is None, key
  assert written["speedup"] > 0 and written["greedy_outputs_identical"]
  line = summary.summary_lines(metrics, arguments.run_arguments())[1]
  assert "no theory: PRICE_CALL_COST=False skipped pricing c" in line
  # The same decode: a re-run with pricing replaces it without OVERWRITE.
  assert "price_call_cost" not in written["settings"]["run"]
  # `report` leaves it out (its tables need c), saying why.
  with pytest.raises(report.ReportError,
                     match=r"only PRICE_CALL_COST=False runs \(1\)"):
    report.load_results(str(tmp_path))


def _rows(path: pathlib.Path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_infer_writes_the_speculative_column_of_a_walltime_run(
    tmp_path, caplog):
  """Same settings and seed: every prediction is the walltime run's
  `speculative` text (a sampled tree run: the same draws), with no
  baseline decode and no pricing."""
  caplog.set_level("INFO")
  out = tmp_path / "infer"
  parse_gin_files(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{out}'", "MODE = 'infer'", "TEMPERATURE = 1.0",
      "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"
  ])
  record = run_lib.run()
  walltime = _rows(BEFORE_43 / "tree" / "predictions.jsonl")  # older rows
  rows = _rows(out / "predictions.jsonl")
  assert [r["prediction"] for r in rows] == [r["speculative"] for r in walltime]
  # T5X's rows (issue 58; their keys: tests/harness/test_infer.py).
  assert [r["inputs"] for r in rows] == [{
      "inputs_pretokenized": r["input"],
      "targets_pretokenized": r["reference"]
  } for r in walltime]
  assert [r["aux"] for r in rows] == [{
      "index": r["index"],
      "target_calls": len(r["accepted_counts"])
  } for r in walltime]
  assert all(set(r) == {"inputs", "prediction", "aux"} for r in rows)
  assert not (out / "metrics.json").exists()
  written = json.loads((out / "infer.json").read_text())
  assert written == json.loads(json.dumps(record))
  assert written["mode"] == "infer" and written["decode_mode"] == "tree"
  assert written["decode_paths"]["draft"] in decode_paths.DECODE_PATHS
  assert written["num_examples"] == len(walltime) == 12
  assert written["target_calls"] == sum(r["aux"]["target_calls"] for r in rows)
  assert written["tokens_per_target_call"] > 1 and 0 <= written["alpha"] <= 1
  assert set(written["quality"]) == {"bleu"}
  # Nothing but the speculative decoder ran: no baseline, no pricing.
  assert "Compiling both decoders" not in caplog.text
  assert "Pricing c" not in caplog.text
  assert "infer: batch 12/12" in caplog.text and "ETA" in caplog.text
  lines = summary.summary_lines(record, arguments.run_arguments())
  assert lines[1].startswith("inference: 12 examples decoded speculatively "
                             "(tree)")
  assert lines[2].startswith("quality: BLEU ")
  assert lines[-1].startswith(f"results: {out / 'predictions.jsonl'}, ")


def test_run_without_arguments_subprocess():
  proc = run_cli()
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith("run: ")]
  assert len(errors) == 1 and "--gin_file is required" in errors[0]


def test_infer_interrupted_resumes_with_the_same_rows(tmp_path, monkeypatch,
                                                      caplog):
  """A MODE='infer' run interrupted after its 5th batch's decode (its rows
  not written: the checkpoint of 4 batches stands) resumes after 4
  examples and writes the rows and counts of an uninterrupted run (T = 1,
  a tree: the same draws)."""
  caplog.set_level("INFO")
  bindings = [
      "MODE = 'infer'", "TEMPERATURE = 1.0", "ACCEPTANCE = 'tree'",
      "TREE_WIDTH = 2"
  ]
  whole, cut = tmp_path / "whole", tmp_path / "cut"
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{whole}'", *bindings])
  uninterrupted = run_lib.run()

  monkeypatch.setattr(resume, "CHECKPOINT_S", 0.0)  # after every batch
  adds = []
  add = predictions.PredictionsWriter.add

  def add_until_the_fifth(self, rows):
    adds.append(len(rows))
    if len(adds) == 5:
      raise KeyboardInterrupt()
    add(self, rows)

  monkeypatch.setattr(predictions.PredictionsWriter, "add", add_until_the_fifth)
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{cut}'", *bindings])
  with pytest.raises(
      KeyboardInterrupt, match="kept 4 predictions rows in "
      ".*; the same command resumes after them"):
    run_lib.run()
  assert not (cut / "predictions.jsonl").exists()
  assert (cut / resume.STATE_FILE).exists()

  monkeypatch.setattr(predictions.PredictionsWriter, "add", add)
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{cut}'", *bindings])
  resumed = run_lib.run()
  assert ("infer: resuming an interrupted run after 4 of 12 examples (4 "
          "batches; their rows kept)") in _messages(caplog)
  assert ((cut / "predictions.jsonl").read_text() == (
      whole / "predictions.jsonl").read_text())
  assert not (cut / resume.STATE_FILE).exists()
  assert not (cut / predictions.PARTIAL_FILE).exists()
  timed = {"decode_s", "compile_time_s", "tokens_per_second", "settings"}
  assert resumed.pop("resumed_after_examples") == 4
  assert ({
      k: v for k, v in resumed.items() if k not in timed
  } == {
      k: v for k, v in uninterrupted.items() if k not in timed
  })
  assert json.loads(
      (cut / "infer.json").read_text())["resumed_after_examples"] == 4
  line = summary.summary_lines({
      **resumed, "resumed_after_examples": 4
  }, arguments.run_arguments())[1]
  assert line.endswith("; resumed: the first 4 were decoded (and timed) by "
                       "the interrupted run")


def test_a_file_of_inputs_alone_decodes_without_quality(tmp_path):
  """SOURCE_FILE of inputs alone (no REFERENCE_FILE, no tab): decoded and
  timed as any data, rows without `targets_pretokenized`, no BLEU, and the
  summary says why."""
  source = tmp_path / "inputs.en"
  source.write_text("A dog runs.\nTwo men play guitars.\n")
  out = tmp_path / "out"
  metrics = _run_tiny(out, f"SOURCE_FILE = '{source}'", "REFERENCE_FILE = None")
  rows = _rows(out / "predictions.jsonl")
  assert [r["inputs"] for r in rows] == [{
      "inputs_pretokenized": "A dog runs."
  }, {
      "inputs_pretokenized": "Two men play guitars."
  }]
  written = json.loads((out / "metrics.json").read_text())
  assert written["num_examples"] == 2 and written["speedup"] > 0
  assert "bleu" not in written and "rouge" not in written
  assert written["greedy_outputs_identical"] is True
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert lines[2] == ("quality: none (the examples have no references to "
                      "score against)")
