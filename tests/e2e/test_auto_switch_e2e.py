"""SPECULATION='auto''s online correction (issue 45) end to end (the rule as
pure functions: tests/harness/test_auto.py): tiny runs made to
switch by a clock and call prices handed in through `Providers`: at T = 0
the outputs are the target's, token for token, and metrics.json /
infer.json record the segments; at T > 0 the outputs of a run that
switches between batches follow the target's exact distribution
(chi-square, significance 1e-3, with a power check)."""
import json

from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import model_sequence_distribution
import jax
import numpy as np
import pytest
from run_helpers import parse_local_tiny_out

from specdec_jax import run as run_lib
from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto
from specdec_jax.experiment import batches
from specdec_jax.experiment import loading
from specdec_jax.experiment import plan
from specdec_jax.experiment import summary
from specdec_jax.metrics import run_metrics

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]

MIN = auto.AUTO_SWITCH_MIN_BATCHES


# ---------------------------------------------------------------------------
# End to end: a clock and prices handed in make the first choice measure
# badly; the run switches to the target alone.
# ---------------------------------------------------------------------------
class SlowSpeculation:
  """`Providers.decoders` and `.clock`: every decoder runs for real; the
  clock says each call of a speculative decoder took 2 s and each of the
  target alone 1 s. Records each timed call's (is it the target alone,
  tokens)."""

  def __init__(self):
    self.baselines = []
    self.calls = []

  def decoders(self, run_plan, *args):
    baseline, speculative = plan.make_decoders(run_plan, *args)
    self.baselines.append(baseline)
    if isinstance(speculative, batches.TargetAloneDecoder):
      self.baselines.append(speculative)
    return baseline, speculative

  def __call__(self, decoder, inputs, rng):
    out = jax.block_until_ready(decoder(inputs, rng))
    alone = any(decoder is b for b in self.baselines)
    self.calls.append((alone, np.asarray(out.tokens)))
    return out, 1.0 if alone else 2.0

  def speculative_columns(self):
    """Each timed batch's speculative tokens (MODE='walltime': a batch
    decoded by the target alone has no speculative call)."""
    columns = []
    for alone, tokens in self.calls:
      if alone:
        columns.append(tokens)
      else:
        columns[-1] = tokens
    return columns


def cheap_calls(loaded, feed, candidates, fill, context_plan):
  """`Providers.auto_prices`: every K-token call at a tenth of a step and
  a guess at 0.001 (token verification predicted far above 1, even with
  batches of 1000 rows waiting for their slowest, and the pilot's κ
  clipped at 1/4), tree calls at 50 steps (trees lose)."""
  del loaded, feed, fill, context_plan
  widths = {c.tree_width for c in candidates if c.tree_width}
  prices = auto.Prices(call_cost_by_k={
      1: 1.0,
      2: 0.1,
      13: 0.1
  }, cost_coefficient=0.001, tree_call_cost_by_nodes={
      1: 1.0,
      2: 50.0
  }, cost_coefficient_by_width={k: 1.0 for k in widths})
  return prices, {
      "cached": False,
      "file": None,
      "seconds": 0.0,
      "target_step_s": 0.001,
      "handed_in": True
  }


# Tree candidates of k = 2 only: fewer pilots to compile.
TREES_OF_2 = plan.PilotSizes(tree_max_width=2)


def _self_draft(config, path, seed, mesh, what, decode_path=None):
  """The target drafting for itself (α = 1 at T = 0: GAMMA='auto' picks
  γ = 12), from the target's config and seed."""
  del config
  if what == "draft":
    seed -= 1
  return loading.load_model(loading.model_config("target"), path, seed, mesh,
                            what, decode_path)


@pytest.mark.parametrize("mode", ["walltime", "infer"])
def test_a_run_measuring_badly_switches_and_stays_exact(tmp_path, monkeypatch,
                                                        mode):
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
  clock = SlowSpeculation()
  providers = plan.Providers(load_model=_self_draft, decoders=clock.decoders,
                             clock=clock, auto_prices=cheap_calls,
                             pilot_sizes=TREES_OF_2)
  parse_local_tiny_out(tmp_path, "SPECULATION = 'auto'", "GAMMA = 'auto'",
                       f"MODE = '{mode}'")
  result = run_lib.run(providers=providers)
  auto = result["auto"]
  assert auto["choice"]["label"] == "token γ=12"
  assert [(s["label"], s["first_batch"], s["batches"]) for s in auto["segments"]
         ] == [("token γ=12", 0, MIN), ("the target alone", MIN, 12 - MIN)]
  (switch,) = auto["switches"]
  assert switch["after_batch"] == MIN and switch["to"] == "the target alone"
  assert switch["reason"].startswith(f"auto: after batch {MIN}, token γ=12 ran")
  assert result["speculation"] == "auto" and result["gamma"] == 12
  # The token segment's guesses, all kept (MODE='infer' counts the trials
  # from the histogram: a call cut by the output's end counts one failed).
  assert result["alpha"] == 1.0 if mode == "walltime" else result["alpha"] > 0.9
  lines = summary.summary_lines(result, arguments.run_arguments())
  assert switch["reason"] in lines
  name = run_metrics.METRICS_FILE if mode == "walltime" else (
      run_metrics.INFER_FILE)
  written = json.loads((tmp_path / "out" / name).read_text())
  assert written["auto"]["segments"] == auto["segments"]
  rows = [
      json.loads(line)
      for line in (tmp_path / "out" /
                   "predictions.jsonl").read_text().splitlines()
  ]
  if mode == "infer":
    assert auto["segments"][0]["baseline_estimated"] is True
    assert result["decode_s"] == pytest.approx(2.0 * MIN + 12 - MIN)
    return
  run_metrics.RunMetrics.from_dict(written)  # well-formed
  assert result["greedy_outputs_identical"] is True
  assert all(r["prediction"] == r["aux"]["baseline"] for r in rows)
  assert result["speedup"] == pytest.approx(12 / (2.0 * MIN + 12 - MIN))
  assert len(result["accepted_histogram"]) == 13
  assert sum(result["accepted_histogram"]) == result["target_calls_speculative"]
  assert result["theoretical_speedup"] is None
  assert "call_cost_priced" not in result
  assert auto["segments"][1]["measured_speedup"] == 1.0
  assert any("no theory: the run switched decode modes" in l for l in lines)


# ---------------------------------------------------------------------------
# T > 0: a run that switches between batches samples the target's
# distribution.
# ---------------------------------------------------------------------------
VOCAB = 5
STEPS = 3
EOS = 1
BATCH = 1000
BATCHES = 2 * MIN
SIGNIFICANCE = 1e-3


class _ConstantVocabulary:
  """Every text is the same input; outputs decoded as their ids."""
  eos_id = EOS
  vocab_size = VOCAB

  def encode(self, text):
    del text
    return [3, 4, 2]

  def decode(self, ids):
    return " ".join(map(str, ids))


def _exact_distribution(model, inputs, temperature):
  """{first STEPS tokens (0 after EOS): probability} by enumeration."""
  return model_sequence_distribution(model, inputs, (temperature, 0, 1.0),
                                     VOCAB, STEPS, EOS)


def test_a_run_that_switches_at_t_above_0_samples_the_targets_distribution(
    tmp_path, monkeypatch):
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "same.tsv"
  source.write_text("same input\tsame output\n" * (BATCH * BATCHES))
  models = {}

  def load_model(config, path, seed, mesh, what, decode_path=None):
    models[what] = loading.load_model(config, path, seed, mesh, what,
                                      decode_path)
    return models[what]

  clock = SlowSpeculation()
  providers = plan.Providers(vocabulary=_ConstantVocabulary,
                             load_model=load_model, decoders=clock.decoders,
                             clock=clock, auto_prices=cheap_calls,
                             pilot_sizes=TREES_OF_2)
  parse_local_tiny_out(
      tmp_path, "SPECULATION = 'auto'", "GAMMA = 2", "TEMPERATURE = 1.0",
      f"SOURCE_FILE = '{source}'", f"NUM_EXAMPLES = {BATCH * BATCHES}",
      f"BATCH_SIZE = {BATCH}", f"target/T5Config.vocab_size = {VOCAB}",
      f"draft/T5Config.vocab_size = {VOCAB}",
      f"TASK_FEATURE_LENGTHS = {{'inputs': 8, 'targets': {STEPS}}}")
  metrics = run_lib.run(providers=providers)
  segments = metrics["auto"]["segments"]
  assert [s["batches"] for s in segments] == [MIN, BATCHES - MIN]
  assert segments[0]["mode"] in ("token", "block")
  assert segments[1]["label"] == "the target alone"
  assert 0.05 < segments[0]["alpha"] < 0.95  # guesses kept and rejected
  columns = clock.speculative_columns()
  assert len(columns) == BATCHES
  inputs = np.array([[3, 4, 2, EOS]], np.int32)
  exact = _exact_distribution(models["target"], inputs, 1.0)
  assert abs(sum(exact.values()) - 1.0) < 1e-5 and len(exact) >= 8
  for tokens in (np.concatenate(columns), np.concatenate(columns[:MIN]),
                 np.concatenate(columns[MIN:])):
    observed, expected = count_sequences(tokens, exact)
    assert chisquare_pvalue(observed, expected) > SIGNIFICANCE
  # Power: the same samples refute a distribution 10% colder.
  colder = _exact_distribution(models["target"], inputs, 0.9)
  observed, expected = count_sequences(np.concatenate(columns), colder)
  assert chisquare_pvalue(observed, expected) < SIGNIFICANCE


# ---------------------------------------------------------------------------
# The shipped pair: no flapping.
# ---------------------------------------------------------------------------
def test_auto_on_the_shipped_pair_never_switches_away_and_back(
    tmp_path, monkeypatch):
  """Issue 58: on the shipped pair at batch 1 the online check re-predicted
  a tree with the token pilot's calibration (1.62× → 2.19×), switched to
  it, measured 1.70× and switched back. Each family keeps its own
  calibration and a switch must beat the measured interval: the run never
  returns to a choice it left (pilots and prices measured afresh)."""
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
  gin_utils.parse_gin(["pretrained_multi30k.gin"], [
      f"OUTPUT_DIR = '{tmp_path / 'out'}'", "SPECULATION = 'auto'",
      "BATCH_SIZE = 1"
  ], finalize=False)
  metrics = run_lib.run()
  auto_record = metrics["auto"]
  labels = [s["label"] for s in auto_record["segments"]]
  assert len(labels) == len(set(labels)), labels
  assert {"token", "tree"} <= set(auto_record["pilots"])
  assert auto_record["tree_calibration"]["pilot"] == "tree"
  assert "; runner-up: " in auto_record["reason"] or ("(runner-up: "
                                                      in auto_record["reason"])
  assert metrics["greedy_outputs_identical"] is True
