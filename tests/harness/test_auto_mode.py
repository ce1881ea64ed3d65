"""SPECULATION='auto' / 'off' (issue 45): the candidates, the prediction and
the choice as pure functions; the price cache; the target alone in the
speculative decoder's place; bad values refused before anything is
loaded (tiny runs end to end: tests/e2e/test_auto_mode_e2e.py)."""
import types

from conftest import tiny_config
import numpy as np
import pytest
from run_helpers import parse_local_tiny_out

from specdec_jax import run as run_lib
from specdec_jax.benchmarking import auto_prediction
from specdec_jax.core import decoding
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto_mode
from specdec_jax.experiment import auto_run
from specdec_jax.experiment import auto_tree
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import output_dir
from specdec_jax.experiment import price_cache
from specdec_jax.metrics import analysis

Candidate = auto_mode.Candidate
MODEL_MODES = ("token", "block", "tree", "beam")  # DRAFTER='model'


def _prices(call_cost: float, c: float) -> auto_mode.Prices:
  """Every K-token call (K >= 2) at `call_cost` steps, a guess at c."""
  return auto_mode.Prices(call_cost_by_k={
      1: 1.0,
      2: call_cost,
      13: call_cost
  }, cost_coefficient=c)


def _rows(prices, pilots, candidates):
  return [auto_mode.predict(c, prices, pilots) for c in candidates]


def test_costly_calls_and_low_alpha_choose_the_target_alone():
  candidates = auto_mode.candidates(decode_modes.TOKEN, ("token", "block"),
                                    auto_mode.gammas_considered("auto"),
                                    greedy=True, vocab_size=100)
  rows = _rows(_prices(1.6, 0.3), {"token": {"alpha": 0.4}}, candidates)
  chosen = auto_mode.choose(rows)
  assert chosen == 0 and rows[0]["label"] == "the target alone"
  assert all(r["predicted_speedup"] < 1 for r in rows[1:])
  line = auto_mode.reason(rows, chosen)
  assert line.startswith("auto: speculation off — on this machine a ")
  assert "-token call costs 1.60 steps and α is 0.40" in line
  assert "the target alone is fastest" in line


def test_cheap_calls_and_high_alpha_choose_section_3_4s_gamma():
  alpha, c = 0.8, 0.02
  candidates = auto_mode.candidates(decode_modes.TOKEN, ("token", "block"),
                                    auto_mode.gammas_considered("auto"),
                                    greedy=True, vocab_size=100)
  rows = _rows(_prices(1.0, c), {"token": {"alpha": alpha}}, candidates)
  choice = rows[auto_mode.choose(rows)]
  assert choice["mode"] == "token"
  assert choice["gamma"] == analysis.optimal_gamma(alpha, c, max_gamma=12)
  assert choice["predicted_speedup"] == pytest.approx(
      analysis.expected_speedup(alpha, choice["gamma"], c))
  line = auto_mode.reason(rows, auto_mode.choose(rows))
  assert line.startswith(f"auto: chose token γ={choice['gamma']}, predicted "
                         f"{choice['predicted_speedup']:.2f}×")


def test_a_speculative_mode_must_beat_the_target_alone_by_min_gain():
  rows = [{"predicted_speedup": 1.0}, {"predicted_speedup": 1.03}]
  assert auto_mode.choose(rows) == 0
  assert auto_mode.choose(rows, min_gain=1.02) == 1
  # Ties go to the earlier row: fewer guesses, simpler mode.
  assert auto_mode.choose([{
      "predicted_speedup": 1.0
  }] + [{
      "predicted_speedup": 1.2
  }] * 2) == 1


def test_the_prediction_is_the_summarys_formula_at_the_measured_call_cost():
  prices = auto_mode.Prices(call_cost_by_k={
      1: 1.0,
      2: 1.1,
      5: 1.3
  }, cost_coefficient=0.05)
  row = auto_mode.predict(Candidate(decode_modes.TOKEN, 3), prices,
                          {"token": {
                              "alpha": 0.6
                          }})
  call = float(np.interp(4, [1, 2, 5], [1.0, 1.1, 1.3]))
  assert row["call_cost"] == pytest.approx(call)
  assert row["predicted_speedup"] == pytest.approx(
      decode_modes.TOKEN.measured_theory(0.6, 3, 0.05, call, 0.0))
  assert row["tokens_per_call"] == pytest.approx(
      analysis.expected_tokens_per_iteration(0.6, 3))


def test_short_outputs_buy_fewer_tokens_per_call_and_a_timed_pilot_calibrates():
  """With the pilot's output lengths each output's last call is cut at its
  end (the larger γ, the more it costs); a timed chain pilot scales every
  priced row by κ = its measured / its modelled speedup."""
  prices = auto_mode.Prices(call_cost_by_k={
      1: 1.0,
      9: 1.4
  }, cost_coefficient=0.02)
  short = {"token": {"alpha": 0.9, "output_lengths": [11, 9, 12]}}
  long = {"token": {"alpha": 0.9}}
  cut = auto_mode.predict(Candidate(decode_modes.TOKEN, 8), prices, short)
  full = auto_mode.predict(Candidate(decode_modes.TOKEN, 8), prices, long)
  assert cut["tokens_per_call"] == pytest.approx(
      analysis.expected_tokens_per_call_with_ends(0.9, 8, [11, 9, 12]))
  assert cut["tokens_per_call"] < 0.8 * full["tokens_per_call"]
  assert cut["predicted_speedup"] < full["predicted_speedup"]
  alone = {
      "label": "the target alone",
      "predicted_speedup": 1.0,
      "alpha": None,
      "call_cost": 1.0
  }
  rows, kappa = auto_mode.calibrated([alone, cut], measured=1.5, predicted=2.0)
  assert kappa == pytest.approx(0.75)
  assert rows[0]["predicted_speedup"] == 1.0  # the target alone is 1
  assert rows[1]["predicted_speedup"] == pytest.approx(0.75 *
                                                       cut["predicted_speedup"])
  assert rows[1]["model_speedup"] == cut["predicted_speedup"]
  assert auto_mode.calibrated([cut], measured=50.0, predicted=1.0)[1] == 4.0
  # A timed tree pilot scales the tree rows, the chain pilot the others.
  tree = dict(cut, tree_width=2, label="tree γ=8 k=2")
  rows, _ = auto_mode.calibrated([alone, cut, tree], 1.5, 2.0, trees=False)
  rows, _ = auto_mode.calibrated(rows, 1.0, 2.0, trees=True)
  assert [r["predicted_speedup"] for r in rows] == pytest.approx(
      [1.0, 0.75 * cut["predicted_speedup"], 0.5 * cut["predicted_speedup"]])


def test_a_trees_prediction_is_auto_trees():
  nodes = {1: 1.0, 5: 1.5, 9: 2.3, 13: 2.9}
  prices = auto_mode.Prices(call_cost_by_k={
      1: 1.0,
      5: 1.3
  }, cost_coefficient=0.05, tree_call_cost_by_nodes=nodes,
                            cost_coefficient_by_width={
                                2: 0.06,
                                3: 0.07
                            })
  # One pilot with k = 3 gives a_1 of k = 1, 2, 3 (its first rounds).
  pilots = {
      "tree": {
          "alpha": 0.6,
          "first_depth": 0.85,
          "first_depth_by_width": [0.7, 0.8, 0.85],
          "deeper": 0.6
      }
  }
  costs = np.interp(np.arange(1, 26), sorted(nodes),
                    [nodes[n] for n in sorted(nodes)])
  expected = auto_tree.predicted_speedups({
      2: (0.8, 0.6),
      3: (0.85, 0.6)
  }, {
      2: 0.06,
      3: 0.07
  }, costs, [2, 4])
  for (gamma, k), speedup in expected.items():
    row = auto_mode.predict(Candidate(decode_modes.TREE, gamma, k), prices,
                            pilots)
    assert row["predicted_speedup"] == pytest.approx(speedup)
    assert row["first_depth_alpha"] == {2: 0.8, 3: 0.85}[k]
  # A record without a_1 by width (a pilot of one k): its own a_1.
  alone = {"tree": dict(pilots["tree"], first_depth_by_width=None)}
  assert auto_mode.predict(Candidate(decode_modes.TREE, 2, 2), prices,
                           alone)["first_depth_alpha"] == 0.85


def test_candidates_follow_the_drafter_the_temperature_and_the_tree_size():
  every = auto_mode.candidates(decode_modes.TOKEN, MODEL_MODES, [1, 6, 12],
                               greedy=False, vocab_size=100)
  labels = [c.label for c in every]
  assert labels[0] == "the target alone" and every[0].mode.target_alone
  assert {"token γ=6", "block γ=6", "tree γ=6 k=4",
          "tree γ=12 k=2"} <= set(labels)
  assert "tree γ=12 k=3" not in labels  # 37 nodes > AUTO_TREE_MAX_NODES
  greedy = auto_mode.candidates(decode_modes.TOKEN, ("token", "block"), [3],
                                greedy=True, vocab_size=100)
  assert [c.label for c in greedy] == ["the target alone", "token γ=3"]
  beams = auto_mode.candidates(decode_modes.BEAM, MODEL_MODES, [3], greedy=True,
                               vocab_size=100)
  assert [c.label for c in beams
         ] == ["the target's own beam search", "speculative beams γ=3"]
  assert beams[0].mode.beam and beams[0].mode.target_alone


def test_speculative_beams_are_predicted_by_their_pilots_walltime():
  beams = auto_mode.candidates(decode_modes.BEAM, MODEL_MODES, [3], greedy=True,
                               vocab_size=100)
  rows = _rows(None, {"beam": {"alpha": 0.5, "speedup": 0.36}}, beams)
  assert rows[1]["predicted_speedup"] == 0.36
  line = auto_mode.reason(rows, auto_mode.choose(rows), pilot_examples=8)
  assert line == (
      "auto: speculation off — speculative beams γ=3 ran 0.36× the target's "
      "own beam search on the pilot's 8 examples; the target's own beam "
      "search is fastest (best speculative: speculative beams γ=3, predicted "
      "0.36×, below the 1.05× it must reach)")


def test_the_pilot_stops_on_its_interval_or_its_cap():
  assert auto_mode.alpha_interval([3], [5]) == (0.0, 1.0)
  few = auto_mode.alpha_interval([3, 3], [5, 5])
  many = auto_mode.alpha_interval([3] * 40, [5] * 40)
  assert few[1] - few[0] > many[1] - many[0] and many[0] < 0.6 < many[1]
  # Sentences that differ widen it beyond Wilson's (trials not independent).
  mixed = auto_mode.alpha_interval([5, 0] * 20, [5] * 40)
  assert mixed[1] - mixed[0] > many[1] - many[0]
  assert auto_mode.pilot_cap(12) == auto_mode.AUTO_PILOT_MIN_EXAMPLES
  assert auto_mode.pilot_cap(1000) == 50
  assert auto_mode.pilot_cap(10**6) == auto_mode.AUTO_PILOT_MAX_EXAMPLES
  assert auto_mode.pilot_done(64, (0.0, 1.0), cap=64)
  assert not auto_mode.pilot_done(3, (0.5, 0.52), cap=64)
  assert auto_mode.pilot_done(4, (0.5, 0.55), cap=64)
  assert not auto_mode.pilot_done(40, (0.4, 0.6), cap=64)


def test_price_cache_round_trip(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path))
  monkeypatch.delenv(price_cache.ENV_OFF, raising=False)
  fields = {"machine": {"host": "h"}, "input_width": 16, "call_ks": [1, 5]}
  assert price_cache.load(fields) is None
  price_cache.store(fields, {"call_cost_by_k": {"1": 1.0, "5": 1.3}})
  assert price_cache.path(fields).startswith(str(tmp_path / "auto-prices"))
  assert price_cache.load(fields) == {"call_cost_by_k": {"1": 1.0, "5": 1.3}}
  assert price_cache.load({**fields, "input_width": 32}) is None
  with open(price_cache.path(fields), "w", encoding="utf-8") as f:
    f.write("{not json")
  assert price_cache.load(fields) is None
  price_cache.store(fields, {"x": 1})
  monkeypatch.setenv(price_cache.ENV_OFF, "0")
  assert price_cache.load(fields) is None


def test_the_pilot_cache_is_its_own_kind_and_knows_the_weights(
    tmp_path, monkeypatch):
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path))
  monkeypatch.delenv(price_cache.ENV_OFF, raising=False)
  fields = {"settings": {"seed": 0}, "weights": "w"}
  price_cache.store(fields, {"records": {
      "token": {
          "alpha": 0.5
      }
  }}, price_cache.PILOTS)
  assert price_cache.path(fields, price_cache.PILOTS).startswith(
      str(tmp_path / "auto-pilots"))
  assert price_cache.load(fields, price_cache.PILOTS) == {
      "records": {
          "token": {
              "alpha": 0.5
          }
      }
  }
  assert price_cache.load(fields) is None  # not a price entry
  # Other weights (one value of one array) are another digest.
  weights = {"a": np.arange(10000, dtype=np.float32), "b": np.ones((3, 4))}
  digest = price_cache.weights_digest(weights)
  assert digest == price_cache.weights_digest(dict(weights))
  for changed in ({
      **weights, "a": weights["a"] + 1e-3
  }, {
      **weights, "b": np.ones((4, 3))
  }):
    assert price_cache.weights_digest(changed) != digest


def test_a_pilot_reads_the_cache_only_for_the_same_inputs():
  rows = {0: np.array([[3, 4, 1]]), 1: np.array([[5, 1, 0]])}
  feed = types.SimpleNamespace(num_batches=2, host_rows=lambda b: rows[b],
                               kept_rows=lambda b: np.array([0]))
  first = auto_run.inputs_digest(feed, 1)
  assert first != auto_run.inputs_digest(feed, 2)  # what the pilot read
  rows[1] = np.array([[6, 1, 0]])  # a batch after the pilot's: the same
  assert auto_run.inputs_digest(feed, 1) == first
  rows[0] = np.array([[3, 5, 1]])
  assert auto_run.inputs_digest(feed, 1) != first


def test_the_target_alone_reads_as_a_run_without_guesses():
  out = decoding.DecodeOutput(tokens=np.array([[5, 6, 1, 0], [7, 1, 0, 0]]),
                              lengths=np.array([3, 2]),
                              target_calls=np.array([3, 2]))
  alone = decode_modes.as_target_alone_output(out, gamma=3)
  np.testing.assert_array_equal(alone.accepted_histogram,
                                [[3, 0, 0, 0], [2, 0, 0, 0]])
  np.testing.assert_array_equal(alone.trace_num_accepted,
                                [[0, 0, 0, -1], [0, 0, -1, -1]])
  np.testing.assert_array_equal(alone.tokens, out.tokens)
  assert float(alone.tokens_per_target_call) == 1.0


@pytest.mark.usefixtures("clean_gin")
@pytest.mark.parametrize("bindings, words", [
    (["SPECULATION = 'maybe'"], "SPECULATION='maybe': allowed: 'on'"),
    (["SPECULATION = 1"], "SPECULATION=1: allowed: 'on'"),
    (["SPECULATION = 'auto'", "MODE = 'alpha'"], "with MODE='alpha'"),
    (["SPECULATION = 'auto'", "LENIENCE = 0.5"], "chooses among exact modes"),
])
def test_bad_speculation_fails_before_loading(bindings, words, tmp_path,
                                              no_load):
  parse_local_tiny_out(tmp_path, *bindings)
  with pytest.raises(arguments.ConfigError, match=".*") as e:
    run_lib.run(providers=no_load)
  assert words in str(e.value)
  if "maybe" in words:
    assert "'off'" in str(e.value) and "'auto'" in str(e.value)
  assert not (tmp_path / "out").exists()


def test_candidate_arguments_are_the_runs_at_the_choice():
  args = arguments.RunArguments(output_dir="/tmp/x", gamma="auto",
                                speculation="auto")
  tree = auto_run.candidate_args(args, Candidate(decode_modes.TREE, 4, 2))
  assert (tree.acceptance, tree.gamma, tree.tree_width) == ("tree", 4, 2)
  assert decode_modes.mode_of(tree) is decode_modes.TREE
  alone = auto_run.candidate_args(
      args, Candidate(decode_modes.target_alone(decode_modes.TOKEN)))
  assert alone.speculation == "off" and alone.gamma == 1
  assert decode_modes.mode_of(alone).target_alone


class _Vocab:
  vocab_size = 16


@pytest.mark.parametrize("value, recorded", [("on", False), ("off", True),
                                             ("auto", True)])
def test_only_off_and_auto_are_recorded_in_the_settings(value, recorded):
  """SPECULATION='on' is recorded as before the macro existed: earlier
  results stay the same run (the OVERWRITE rule)."""
  args = arguments.RunArguments(output_dir="/tmp/x", speculation=value)
  run = output_dir.settings_record(args, tiny_config(), tiny_config(),
                                   _Vocab())["run"]
  assert ("speculation" in run) is recorded


def test_the_prediction_script_reads_its_configs_and_fixes_a_candidate():
  script = auto_prediction
  assert script.parse_config("local_tiny.gin GAMMA='auto' TEMPERATURE=1.0") == (
      ["local_tiny.gin"], ["GAMMA='auto'", "TEMPERATURE=1.0"])
  tree = {"mode": "tree", "gamma": 4, "tree_width": 2}
  assert script.fixed_bindings(tree) == [
      "SPECULATION = 'on'", "GAMMA = 4", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"
  ]
  assert script.fixed_bindings({
      "mode": "beam",
      "gamma": 3,
      "tree_width": None
  }) == ["SPECULATION = 'on'", "GAMMA = 3"]
  row = {
      "label": "token γ=3",
      "predicted_speedup": 1.2,
      "alpha": 0.6,
      "call_cost": 1.2
  }
  line = script.compare("x.gin", row, {"speedup": 1.0, "alpha": 0.5}, True)
  assert line["error"] == pytest.approx(0.2)
  assert "| x.gin | token γ=3 | yes | 1.20 | 1.00 | +20% |" in script.table(
      [line])
