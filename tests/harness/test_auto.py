"""The 'auto' choices as pure functions (issues 45, 57, 58): candidates,
predictions, calibration by family, the choice, the online rule (a switch
only when the measurement beats the prediction by more than its noise,
each family re-predicted with its own calibration), the tree model, the
pilots' order (warmed up, interleaved), GAMMA='auto''s record; the price
and pilot caches; bad values refused before anything is loaded (tiny runs
end to end: tests/e2e/test_auto_mode_e2e.py, test_auto_switch_e2e.py)."""
import dataclasses
import types

from conftest import tiny_config
import jax
import numpy as np
import pytest
from run_helpers import parse_local_tiny_out

from specdec_jax import run as run_lib
from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto
from specdec_jax.experiment import batches
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import online
from specdec_jax.experiment import plan as plan_lib
from specdec_jax.experiment import pilots as pilots_lib
from specdec_jax.experiment import price_cache
from specdec_jax.experiment import summary
from specdec_jax.metrics import analysis

Candidate = auto.Candidate
MODEL_MODES = ("token", "block", "tree", "beam")  # DRAFTER='model'
MIN = auto.AUTO_SWITCH_MIN_BATCHES
C = 0.02  # the drafter's cost coefficient in the pure tests
TOKEN3 = Candidate(decode_modes.TOKEN, 3)
TREE32 = Candidate(decode_modes.TREE, 3, 2)
ALONE = Candidate(decode_modes.target_alone(decode_modes.TOKEN))


def _prices(call_cost: float = 1.0, c: float = C) -> auto.Prices:
  """Every K-token call (K >= 2) at `call_cost` steps, a guess at c."""
  return auto.Prices(call_cost_by_k={
      1: 1.0,
      2: call_cost,
      13: call_cost
  }, cost_coefficient=c)


def _pilots(first_depth: float):
  """A token pilot and a tree pilot, both at α = 0.8."""
  return {
      "token": {
          "alpha": 0.8
      },
      "tree": {
          "alpha": 0.8,
          "first_depth": first_depth,
          "deeper": 0.8
      }
  }


def _token_candidates():
  return auto.candidates(decode_modes.TOKEN, ("token",),
                         auto.gammas_considered("auto"), greedy=True,
                         vocab_size=100)


# ---------------------------------------------------------------------------
# Candidates, predictions, the first choice.
# ---------------------------------------------------------------------------
def test_costly_calls_and_low_alpha_choose_the_target_alone():
  candidates = auto.candidates(decode_modes.TOKEN, ("token", "block"),
                               auto.gammas_considered("auto"), greedy=True,
                               vocab_size=100)
  rows = auto.predict_all(candidates, _prices(1.6, 0.3),
                          {"token": {
                              "alpha": 0.4
                          }})
  chosen = auto.choose(rows)
  assert chosen == 0 and rows[0]["label"] == "the target alone"
  assert all(r["predicted_speedup"] < 1 for r in rows[1:])
  line = auto.reason(rows, chosen)
  assert line.startswith("auto: speculation off — on this machine a ")
  assert "-token call costs 1.60 steps and α is 0.40" in line
  assert "the target alone is fastest (runner-up: token γ=" in line


def test_cheap_calls_and_high_alpha_choose_section_3_4s_gamma():
  alpha = 0.8
  candidates = _token_candidates()
  rows = auto.predict_all(candidates, _prices(), {"token": {"alpha": alpha}})
  choice = rows[auto.choose(rows)]
  assert choice["mode"] == "token"
  assert choice["gamma"] == analysis.optimal_gamma(alpha, C, max_gamma=12)
  assert choice["predicted_speedup"] == pytest.approx(
      analysis.expected_speedup(alpha, choice["gamma"], C))
  line = auto.reason(rows, auto.choose(rows))
  assert line.startswith(f"auto: chose token γ={choice['gamma']}, predicted "
                         f"{choice['predicted_speedup']:.2f}×")


def test_the_auto_line_names_the_runner_up_and_the_gamma_it_did_not_choose():
  """Issue 58: the line named no runner-up and did not say that γ is
  GAMMA's unless GAMMA='auto'."""
  prices = dataclasses.replace(_prices(1.2), tree_call_cost_by_nodes={
      1: 1.0,
      7: 1.5
  }, cost_coefficient_by_width={2: 0.05})
  pilots = _pilots(first_depth=0.9)
  rows = auto.predict_all([ALONE, TOKEN3, TREE32], prices, pilots)
  chosen = auto.choose(rows)
  runner_up = rows[3 - chosen]
  line = auto.reason(rows, chosen, fixed_gamma=3)
  assert (f"; runner-up: {runner_up['label']}, predicted "
          f"{runner_up['predicted_speedup']:.2f}×" in line)
  assert line.endswith("; γ=3 is GAMMA's, not chosen (GAMMA='auto' "
                       "chooses it)")
  assert "GAMMA's" not in auto.reason(rows, chosen)  # GAMMA='auto'
  # The target alone chosen: the best speculative row is the runner-up.
  rows = auto.predict_all([ALONE, TOKEN3], _prices(3.0),
                          {"token": pilots["token"]})
  line = auto.reason(rows, auto.choose(rows), fixed_gamma=3)
  assert "(runner-up: token γ=3, predicted " in line and "GAMMA's" in line


def test_a_speculative_mode_must_beat_the_target_alone_by_min_gain():
  rows = [{"predicted_speedup": 1.0}, {"predicted_speedup": 1.03}]
  assert auto.choose(rows) == 0
  assert auto.choose(rows, min_gain=1.02) == 1
  # Ties go to the earlier row: fewer guesses, simpler mode.
  assert auto.choose([{
      "predicted_speedup": 1.0
  }] + [{
      "predicted_speedup": 1.2
  }] * 2) == 1
  assert auto.best(rows) == 1  # GAMMA='auto': no target alone to beat


def test_the_prediction_is_the_summarys_formula_at_the_measured_call_cost():
  prices = auto.Prices(call_cost_by_k={
      1: 1.0,
      2: 1.1,
      5: 1.3
  }, cost_coefficient=0.05)
  row = auto.predict(TOKEN3, prices, {"token": {"alpha": 0.6}})
  call = float(np.interp(4, [1, 2, 5], [1.0, 1.1, 1.3]))
  assert row["call_cost"] == pytest.approx(call)
  assert row["predicted_speedup"] == pytest.approx(
      decode_modes.TOKEN.measured_theory(0.6, 3, 0.05, call, 0.0))
  assert row["tokens_per_call"] == pytest.approx(
      analysis.expected_tokens_per_iteration(0.6, 3))


def test_short_outputs_buy_fewer_tokens_and_each_family_has_its_overhead():
  """With the pilot's output lengths each output's last call is cut at its
  end (the larger γ, the more it costs); each family's rows are
  calibrated by its own overhead per call, the target alone never."""
  prices = auto.Prices(call_cost_by_k={1: 1.0, 9: 1.4}, cost_coefficient=0.02)
  token8 = Candidate(decode_modes.TOKEN, 8)
  short = {"token": {"alpha": 0.9, "output_lengths": [11, 9, 12]}}
  cut = auto.predict(token8, prices, short)
  full = auto.predict(token8, prices, {"token": {"alpha": 0.9}})
  assert cut["tokens_per_call"] == pytest.approx(
      analysis.expected_tokens_per_call_with_ends(0.9, 8, [11, 9, 12]))
  assert cut["tokens_per_call"] < 0.8 * full["tokens_per_call"]
  assert cut["predicted_speedup"] < full["predicted_speedup"]
  prices = dataclasses.replace(prices, tree_call_cost_by_nodes={
      1: 1.0,
      9: 1.4
  }, cost_coefficient_by_width={2: 0.02})
  pilots = {**short, "tree": {"alpha": 0.9, "first_depth": 0.9, "deeper": 0.9}}
  tree = Candidate(decode_modes.TREE, 4, 2)
  raw = auto.predict_all([ALONE, token8, tree], prices, pilots)
  overheads = {"chains": 0.5, "trees": 1.0}
  rows = auto.predict_all([ALONE, token8, tree], prices, pilots, overheads)
  assert rows[0]["predicted_speedup"] == 1.0 and "model_speedup" not in rows[0]
  # Each family's overhead is added to each of its calls: tokens / (γ·c +
  # C + o).
  for row in raw[1:]:
    steps = row["gamma"] * row["cost_coefficient_c"] + row["call_cost"]
    assert steps == pytest.approx(row["tokens_per_call"] /
                                  row["predicted_speedup"])
  assert [r["predicted_speedup"] for r in rows[1:]] == pytest.approx([
      r["tokens_per_call"] /
      (r["gamma"] * r["cost_coefficient_c"] + r["call_cost"] + o)
      for r, o in zip(raw[1:], overheads.values())
  ])
  assert rows[1]["model_speedup"] == raw[1]["predicted_speedup"]
  assert auto.kappa(50.0, 1.0) == 4.0 and auto.kappa(1.5, 2.0) == 0.75


def test_a_trees_short_outputs_cut_its_last_call_too():
  """A tree's calls are cut at each output's end as a chain's are: a tree
  of one branch predicts what the chain predicts at the same prices, and
  wider trees lose the same way (2026-12-02: without it a tree of γ 8 was
  predicted 2.94× on 10-token captions and ran 1.9×)."""
  prices = auto.Prices(call_cost_by_k={
      1: 1.0,
      9: 1.4
  }, cost_coefficient=0.02, tree_call_cost_by_nodes={
      1: 1.0,
      9: 1.4,
      17: 2.0
  }, cost_coefficient_by_width={
      1: 0.02,
      2: 0.03
  })
  lengths = [11, 9, 12]
  pilots = {
      "token": {
          "alpha": 0.9,
          "output_lengths": lengths
      },
      "tree": {
          "alpha": 0.9,
          "first_depth_by_width": [0.9, 0.95],
          "first_depth": 0.95,
          "deeper": 0.9,
          "output_lengths": lengths
      }
  }
  chain = auto.predict(Candidate(decode_modes.TOKEN, 8), prices, pilots)
  one = auto.predict(Candidate(decode_modes.TREE, 8, 1), prices, pilots)
  assert one["tokens_per_call"] == pytest.approx(chain["tokens_per_call"])
  assert one["predicted_speedup"] == pytest.approx(chain["predicted_speedup"])
  two = auto.predict(Candidate(decode_modes.TREE, 8, 2), prices, pilots)
  probs = auto.tree_token_probs(0.95, 0.9, 8)
  assert two["tokens_per_call"] == pytest.approx(
      analysis.tokens_per_call_with_ends(probs, lengths))
  assert two["tokens_per_call"] < 0.8 * auto.expected_tree_tokens(0.95, 0.9, 8)
  # Without lengths: Equation (1)'s tree form, E(γ, k).
  del pilots["tree"]["output_lengths"]
  assert auto.predict(Candidate(decode_modes.TREE, 8, 2), prices,
                      pilots)["tokens_per_call"] == pytest.approx(
                          auto.expected_tree_tokens(0.95, 0.9, 8))


def _tree_prices(nodes):
  return auto.Prices(call_cost_by_k={
      1: 1.0,
      5: 1.3
  }, cost_coefficient=0.05, tree_call_cost_by_nodes=nodes,
                     cost_coefficient_by_width={
                         1: 0.05,
                         2: 0.06,
                         3: 0.07
                     })


def test_a_trees_prediction_is_its_tokens_over_its_calls():
  nodes = {1: 1.0, 5: 1.5, 9: 2.3, 13: 2.9}
  # One pilot with k = 3 gives a_1 of k = 1, 2, 3 (its first rounds).
  pilots = {
      "tree": {
          "alpha": 0.6,
          "first_depth": 0.85,
          "first_depth_by_width": [0.7, 0.8, 0.85],
          "deeper": 0.6
      }
  }
  prices = _tree_prices(nodes)
  for gamma, k in ((2, 2), (4, 2), (2, 3), (4, 3)):
    row = auto.predict(Candidate(decode_modes.TREE, gamma, k), prices, pilots)
    first = {2: 0.8, 3: 0.85}[k]
    call = np.interp(1 + k * gamma, sorted(nodes),
                     [nodes[n] for n in sorted(nodes)])
    assert row["first_depth_alpha"] == first
    assert row["predicted_speedup"] == pytest.approx(
        auto.expected_tree_tokens(first, 0.6, gamma) / (gamma * {
            2: 0.06,
            3: 0.07
        }[k] + call))
  # A record without a_1 by width (a pilot of one k): its own a_1.
  alone = {"tree": dict(pilots["tree"], first_depth_by_width=None)}
  assert auto.predict(TREE32, prices, alone)["first_depth_alpha"] == 0.85
  # The tree call's cost never dips with more nodes (a dip is noise).
  dipped = _tree_prices({1: 1.0, 5: 1.5, 13: 2.5, 25: 2.0})
  assert dipped.tree_call_cost(25) == 2.5
  assert dipped.tree_call_cost(9) == pytest.approx(2.0)


def test_width_one_predicts_gamma_autos_theorem_3_8():
  """A tree of one branch with a_1 = a = α is Theorem 3.8 at the measured
  call cost: the best shape is analysis.optimal_gamma's γ, for random α, c
  and call-cost curves."""
  rng = np.random.default_rng(0)
  gammas = list(range(1, 13))
  for _ in range(100):
    alpha = float(rng.uniform(0.05, 0.98))
    c = float(rng.uniform(0.0, 0.6))
    costs = np.sort(rng.uniform(1.0, 4.0, 12))
    prices = auto.Prices(
        call_cost_by_k={1: 1.0}, cost_coefficient=c, tree_call_cost_by_nodes={
            1: 1.0,
            **{
                g + 1: costs[g - 1] for g in gammas
            }
        }, cost_coefficient_by_width={1: c})
    candidates = auto.mode_candidates(decode_modes.TREE, gammas, [1], False,
                                      100)
    rows = auto.predict_all(
        candidates, prices,
        {"tree": {
            "alpha": alpha,
            "first_depth": alpha,
            "deeper": alpha
        }})
    want = analysis.optimal_gamma(alpha, c, 12, np.maximum.accumulate(costs))
    assert candidates[auto.best(rows)].gamma == want, (alpha, c)


def test_candidates_follow_the_drafter_the_temperature_and_the_tree_size():
  every = auto.candidates(decode_modes.TOKEN, MODEL_MODES, [1, 6, 12],
                          greedy=False, vocab_size=100)
  labels = [c.label for c in every]
  assert labels[0] == "the target alone" and every[0].mode.target_alone
  assert {"token γ=6", "block γ=6", "tree γ=6 k=4",
          "tree γ=12 k=2"} <= set(labels)
  assert "tree γ=12 k=3" not in labels  # 37 nodes > AUTO_TREE_MAX_NODES
  assert {c.family for c in every} == {None, "chains", "trees"}
  greedy = auto.candidates(decode_modes.TOKEN, ("token", "block"), [3],
                           greedy=True, vocab_size=100)
  assert [c.label for c in greedy] == ["the target alone", "token γ=3"]
  beams = auto.candidates(decode_modes.BEAM, MODEL_MODES, [3], greedy=True,
                          vocab_size=100)
  assert [c.label for c in beams
         ] == ["the target's own beam search", "speculative beams γ=3"]
  assert beams[0].mode.beam and beams[0].mode.target_alone
  # GAMMA / TREE_WIDTH 'auto': the run's mode only; greedy k <= vocab.
  shapes = auto.mode_candidates(decode_modes.TREE, [1, 2], [1, 2, 3], True, 2)
  assert [c.label for c in shapes
         ] == ["tree γ=1 k=1", "tree γ=2 k=1", "tree γ=1 k=2", "tree γ=2 k=2"]


def test_speculative_beams_are_predicted_by_their_pilots_walltime():
  beams = auto.candidates(decode_modes.BEAM, MODEL_MODES, [3], greedy=True,
                          vocab_size=100)
  rows = auto.predict_all(beams, None,
                          {"beam": {
                              "alpha": 0.5,
                              "speedup": 0.36
                          }})
  assert rows[1]["predicted_speedup"] == 0.36
  line = auto.reason(rows, auto.choose(rows), pilot_examples=8)
  assert line == (
      "auto: speculation off — speculative beams γ=3 ran 0.36× the target's "
      "own beam search on the pilot's 8 examples; the target's own beam "
      "search is fastest (runner-up: speculative beams γ=3, predicted "
      "0.36×, below the 1.05× it must reach)")


# ---------------------------------------------------------------------------
# The pilots: how long, in which order, warmed up; the one α interval.
# ---------------------------------------------------------------------------
def test_the_pilot_stops_on_its_interval_or_its_cap():
  assert batches.alpha_interval([3], [5]) == (0.0, 1.0)
  few = batches.alpha_interval([3, 3], [5, 5])
  many = batches.alpha_interval([3] * 40, [5] * 40)
  assert few[1] - few[0] > many[1] - many[0] and many[0] < 0.6 < many[1]
  # Sentences that differ widen it beyond Wilson's (trials not independent).
  mixed = batches.alpha_interval([5, 0] * 20, [5] * 40)
  assert mixed[1] - mixed[0] > many[1] - many[0]
  # Wilson's: 50 of 100 trials in two like examples.
  assert batches.alpha_interval([25, 25], [50, 50]) == pytest.approx(
      (0.4038, 0.5962), abs=1e-3)
  assert auto.pilot_cap(12) == auto.AUTO_PILOT_MIN_EXAMPLES == 8
  assert auto.pilot_cap(100) == 25
  assert auto.pilot_cap(10**6) == auto.AUTO_PILOT_MAX_EXAMPLES
  assert auto.pilot_done(64, (0.0, 1.0), cap=64)
  assert not auto.pilot_done(7, (0.5, 0.52), cap=64)
  assert auto.pilot_done(8, (0.5, 0.55), cap=64)
  assert not auto.pilot_done(40, (0.4, 0.6), cap=64)


class _Decoder:
  """A decoder that logs its calls ('<pilot> base/spec') and returns one
  row whose every guess is kept."""

  def __init__(self, log, name, gamma=3):
    self.log, self.name, self.gamma = log, name, gamma

  def __call__(self, inputs, rng):
    del inputs, rng
    self.log.append(self.name)
    histogram = np.zeros((1, self.gamma + 1), np.int32)
    histogram[0, -1] = 2
    return types.SimpleNamespace(accepted_histogram=histogram,
                                 target_calls=np.array([2]), tokens=np.ones(
                                     (1, 8), np.int32), lengths=np.array([8]),
                                 trace_num_accepted=_trace(histogram),
                                 beta_count=np.array([6.0]),
                                 beta_sum=np.array([5.0]))


def test_pilots_warm_up_take_turns_and_alternate_what_is_timed_first():
  """Issue 58: the timed pilot's target alone ran slower than in the run
  (its first batches): a timed pilot now runs both decoders
  WARMUP_CALLS times untimed first, the pilots take turns on each batch,
  and the decoder timed first alternates."""
  log = []
  args = arguments.RunArguments(output_dir="/tmp/x", gamma=3)

  def plan(key, mode):
    return types.SimpleNamespace(args=args, rng=jax.random.PRNGKey(0),
                                 mode=mode,
                                 baseline=_Decoder(log, f"{key} base"),
                                 speculative=_Decoder(log, f"{key} spec"))

  feed = types.SimpleNamespace(num_batches=5, batch_width=lambda b: 16,
                               common_width=lambda n: 16,
                               batch=lambda b, w: np.zeros((1, 16), np.int32),
                               kept_rows=lambda b: np.array([0]))
  records = pilots_lib.run_pilots(
      {
          "token": plan("token", decode_modes.TOKEN),
          "block": plan("block", decode_modes.BLOCK)
      }, {
          "token": True,
          "block": False
      }, feed, cap=3)
  warm = ["token base", "token spec"] * pilots_lib.WARMUP_CALLS
  assert log == [
      *warm,
      "token base",
      "token spec",
      "block spec",  # batch 0
      "block spec",
      "token spec",
      "token base",  # batch 1: turns, alternated
      "token base",
      "token spec",
      "block spec"  # batch 2: cap reached
  ]
  token = records["token"]
  assert (token["examples"], token["batches"], token["batches_read"]) == (3, 3,
                                                                          3)
  assert token["alpha"] == 1.0 and token["acceptance_trials"] == 18
  assert token["speedup"] == pytest.approx(token["baseline_s"] /
                                           token["speculative_s"])
  assert "speedup" not in records["block"]
  assert token["output_lengths"] == [8, 8, 8]
  # One row a batch: nothing waits, at the pilot's γ or any other.
  assert token["batch_factor_by_gamma"] == pytest.approx({"3": 1.0})
  assert records["block"]["batch_factor_by_gamma"] == pytest.approx({"3": 1.0})
  # An adaptive drafter's short call is no rejection: nothing replayed.
  args = dataclasses.replace(
      args, drafting=drafter_registry.ModelSpec(adaptive_threshold=0.5))
  adaptive = pilots_lib.run_pilots({"token": plan("token", decode_modes.TOKEN)},
                                   {"token": False}, feed, cap=1, gammas=[2])
  assert "batch_factor_by_gamma" not in adaptive["token"]


class _TwoRows(_Decoder):
  """Two rows of 8 tokens at γ 3: row 0 two calls keeping all 3 guesses,
  row 1 eight calls keeping none."""

  def __call__(self, inputs, rng):
    histogram = np.array([[0, 0, 0, 2], [8, 0, 0, 0]], np.int32)
    return types.SimpleNamespace(accepted_histogram=histogram,
                                 target_calls=histogram.sum(1), tokens=np.ones(
                                     (2, 8), np.int32), lengths=np.array([8,
                                                                          8]),
                                 trace_num_accepted=_trace(histogram),
                                 beta_count=np.zeros(2), beta_sum=np.zeros(2))


def test_a_tree_pilot_records_and_its_rows_multiply_their_waiting():
  """Trees' rows wait for a batch's slowest as chains' do, more at a larger
  γ (the shipped pair at batch 8, 2 branches: 0.85 at γ 3, 0.74 at γ 7,
  each within 0.03 of a tree's counts replayed as a chain's): a tree pilot
  records each γ's factor, a tree row multiplies its γ's, and the tree
  pilot's calibration then reads none of it as overhead."""
  args = arguments.RunArguments(output_dir="/tmp/x", gamma=3, batch_size=2)
  mode = dataclasses.replace(decode_modes.TREE, width=2)
  plan = types.SimpleNamespace(args=args, rng=jax.random.PRNGKey(0), mode=mode,
                               baseline=_TwoRows([], "base"),
                               speculative=_TwoRows([], "spec"))
  feed = types.SimpleNamespace(num_batches=1, batch_width=lambda b: 16,
                               common_width=lambda n: 16,
                               batch=lambda b, w: np.zeros((2, 16), np.int32),
                               kept_rows=lambda b: np.array([0, 1]))
  record = pilots_lib.run_pilots({"tree": plan}, {"tree": False}, feed, cap=2,
                                 gammas=[1])["tree"]
  # The baseline's rows end together (8 tokens each). γ 3: calls 2 and 8
  # (mean 5, most 8); γ 1: row 0 4 calls (each keeps 1 and adds 1), row 1
  # 8 (mean 6, most 8).
  waits = {"1": 6 / 8, "3": 5 / 8}
  assert record["batch_factor_by_gamma"] == pytest.approx(waits)
  prices = auto.Prices(call_cost_by_k={1: 1.0}, cost_coefficient=0.05,
                       tree_call_cost_by_nodes={
                           1: 1.0,
                           7: 1.1
                       }, cost_coefficient_by_width={2: 0.05})
  tree = Candidate(decode_modes.TREE, 3, 2)
  pilot = {"alpha": 0.8, "first_depth": 0.9, "deeper": 0.8}
  free = auto.predict(tree, prices, {"tree": pilot})
  pilot_waits = dict(pilot,
                     batch_factor_by_gamma=record["batch_factor_by_gamma"])
  row = auto.predict(tree, prices, {"tree": pilot_waits})
  assert free["batch_factor"] == 1.0 and row["batch_factor"] == waits["3"] < 1
  assert row["predicted_speedup"] == pytest.approx(waits["3"] *
                                                   free["predicted_speedup"])
  assert auto.overhead_steps(row["predicted_speedup"],
                             row) == pytest.approx(0.0, abs=1e-12)
  rows = auto.predict_all([ALONE, tree], prices, {"tree": pilot_waits})
  assert f"rows waiting {5 / 8:.2f}" in auto.reason(rows, 1)
  widths = pilots_lib.shape_record([tree], [row], 0,
                                   dict(pilot_waits, batches=1, gamma=3),
                                   prices, [2])
  assert widths["batch_factor_by_gamma"] == [1.0, 1.0, waits["3"]]
  assert (f"trees of at most 25 nodes and rows waiting {5 / 8:.2f}) for the "
          "acceptance" in summary._drafting_lines({"gamma_auto": widths})[0])


def test_a_pilot_reads_the_cache_only_for_the_same_inputs():
  rows = {0: np.array([[3, 4, 1]]), 1: np.array([[5, 1, 0]])}
  feed = types.SimpleNamespace(num_batches=2, host_rows=lambda b: rows[b],
                               kept_rows=lambda b: np.array([0]))
  first = pilots_lib.inputs_digest(feed, 1)
  assert first != pilots_lib.inputs_digest(feed, 2)  # what the pilot read
  rows[1] = np.array([[6, 1, 0]])  # a batch after the pilot's: the same
  assert pilots_lib.inputs_digest(feed, 1) == first
  rows[0] = np.array([[3, 5, 1]])
  assert pilots_lib.inputs_digest(feed, 1) != first


def _gamma_pilot(examples, alpha_interval):
  return {
      "gamma": 4,
      "batches": examples,
      "examples": examples,
      "alpha": 1.0,
      "acceptance_trials": 32 * examples,
      "alpha_interval": list(alpha_interval)
  }


def _gamma_candidates():
  """Token verification at γ 1..12, every call 1 step, c 0.1."""
  return (auto.mode_candidates(decode_modes.TOKEN, range(1, 13), [None], True,
                               100),
          auto.Prices(call_cost_by_k={
              1: 1.0,
              2: 1.0,
              13: 1.0
          }, cost_coefficient=0.1))


def test_gamma_autos_record_holds_every_gamma_and_how_firm_the_choice_is():
  """GAMMA='auto' on one example picked γ = 12 from α = 1.00 (32 trials)
  and said nothing about how little that is: its record gives the γ at
  either end of α's interval, and a caveat below
  AUTO_PILOT_MIN_EXAMPLES."""
  candidates, prices = _gamma_candidates()
  pilot = _gamma_pilot(1, batches.alpha_interval([32], [32]))
  rows = auto.predict_all(candidates, prices, {"token": pilot})
  record = pilots_lib.shape_record(candidates, rows, auto.best(rows), pilot,
                                   prices, None)
  assert record["chosen_gamma"] == 12 and record["max_gamma"] == 12
  assert record["alpha"] == 1.0 and record["cost_coefficient_c"] == 0.1
  assert record["call_cost_by_gamma"] == [1.0] * 12
  assert len(record["predicted_speedup"]) == 12
  assert record["pilot_examples"] == 1 and record["acceptance_trials"] == 32
  assert record["alpha_interval"] == [0.0, 1.0]  # one example: no interval
  assert record["gamma_interval"] == [1, 12]
  need = auto.AUTO_PILOT_MIN_EXAMPLES
  assert record["caveat"].startswith(
      f"GAMMA='auto': the pilot decoded 1 example, fewer than the {need} "
      "it needs")
  assert f"NUM_EXAMPLES >= {need}" in record["caveat"]
  full = pilots_lib.pilot_confidence(candidates,
                                     _gamma_pilot(need, (0.97, 1.0)), prices)
  assert full["caveat"] is None and full["gamma_interval"] == [12, 12]
  assert record["batch_factor_by_gamma"] == [1.0] * 12  # batch 1
  assert " and rows waiting" not in summary._drafting_lines(
      {"gamma_auto": record})[0]


def test_gamma_autos_timed_pilot_calibrates_its_choice_and_its_interval():
  """GAMMA='auto''s pilot is timed as `auto`'s: its overhead per call is in
  every row, the record and the summary give the choice's prediction
  beside its model and what the pilot ran, and the γ interval is chosen
  with the overhead too (a fixed cost a call favours a larger γ)."""
  candidates, prices = _gamma_candidates()
  pilot = dict(_gamma_pilot(20, (0.6, 0.8)), alpha=0.7)
  calibration = {
      "pilot": "token",
      "gamma": 4,
      "tree_width": None,
      "measured_speedup": 0.85,
      "model_speedup": 1.98,
      "kappa": 0.43,
      "overhead_steps": 2.0
  }
  rows = auto.predict_all(candidates, prices, {"token": pilot}, {"chains": 2.0})
  chosen = auto.best(rows)
  record = pilots_lib.shape_record(candidates, rows, chosen, pilot, prices,
                                   None, {"chains": calibration})
  assert record["chosen_gamma"] == 6  # uncalibrated: 4
  assert record["calibration"] == calibration
  assert record["chosen_predicted_speedup"] == pytest.approx(
      rows[chosen]["predicted_speedup"])
  assert record["chosen_model_speedup"] == pytest.approx(
      rows[chosen]["model_speedup"])
  assert record["chosen_predicted_speedup"] < record["chosen_model_speedup"]
  assert record["gamma_interval"] == [5, 9]  # uncalibrated: [3, 6]
  assert pilots_lib.pilot_confidence(candidates, pilot,
                                     prices)["gamma_interval"] == [3, 6]
  line = summary._drafting_lines({"gamma_auto": record})[0]
  assert line.endswith(
      f", predicted {record['chosen_predicted_speedup']:.2f}× (the pilot ran "
      "0.85×, its model 1.98×)")
  # A record from before it (no prediction kept) says nothing of it.
  old = {k: v for k, v in record.items() if not k.startswith("chosen_pred")}
  assert "predicted" not in summary._drafting_lines({"gamma_auto": old})[0]


def test_every_process_decodes_process_0s_choice(monkeypatch):
  """Each process times its own pilots and prices, so two hosts could
  choose two γ and compile two programs: GAMMA='auto' (like
  SPECULATION='auto') takes process 0's record and its choice."""
  candidates, _ = _gamma_candidates()
  mine, first = {"chosen_gamma": 5}, {"chosen_gamma": 7}
  exchanged = []

  def allgather(name, value):
    exchanged.append((name, value))
    return [first, value]

  monkeypatch.setattr(pilots_lib.multihost, "allgather", allgather)
  record, chosen = pilots_lib.first_process_choice(
      "gamma_auto", mine, candidates, lambda c, r: c.gamma == r["chosen_gamma"])
  assert exchanged == [("gamma_auto", mine)]
  assert record is first and candidates[chosen].gamma == 7


def test_gamma_auto_at_batch_8_weighs_each_gammas_rows_waiting():
  """At α = 1 and free calls Theorem 3.8 grows with γ; rows waiting for a
  batch's slowest more at a larger γ move GAMMA='auto' down (here to γ 6,
  the largest whose rows do not wait)."""
  candidates = auto.mode_candidates(decode_modes.TOKEN, range(1, 13), [None],
                                    True, 100)
  prices = auto.Prices(call_cost_by_k={1: 1.0, 13: 1.0}, cost_coefficient=0.1)
  waits = {str(g): 1.0 if g <= 6 else 0.5 for g in range(1, 13)}
  pilot = dict(_gamma_pilot(8, (0.97, 1.0)), batch_factor_by_gamma=waits)
  rows = auto.predict_all(candidates, prices, {"token": pilot})
  record = pilots_lib.shape_record(candidates, rows, auto.best(rows), pilot,
                                   prices, None)
  assert record["chosen_gamma"] == 6
  assert record["batch_factor_by_gamma"] == [
      waits[str(g)] for g in range(1, 13)
  ]
  assert record["predicted_speedup"]["gamma=12"] == pytest.approx(
      0.5 * 13 / (12 * 0.1 + 1))
  record["chosen_gamma"] = 7  # as if chosen where its rows wait
  assert ("c 0.100 and rows waiting 0.50 measured on the first 8 batches"
          in summary._drafting_lines({"gamma_auto": record})[0])


# ---------------------------------------------------------------------------
# The tree model.
# ---------------------------------------------------------------------------
def test_depth_acceptance_counts_depth_one_and_the_deeper_tests():
  # γ = 3: 2 calls kept 0, 3 kept 1, 1 kept 2, 4 kept 3 (all).
  first, deeper = auto.depth_acceptance([2, 3, 1, 4])
  assert first == pytest.approx(8 / 10)
  # Deeper kept: 0·3 + 1·1 + 2·4 = 9; tests: 1·3 + 2·1 + 2·4 = 13.
  assert deeper == pytest.approx(9 / 13)
  assert auto.depth_acceptance([1, 3]) == (0.75, 0.75)  # γ = 1: a = a_1
  for histogram in ([3], [1, -1, 2], [[1, 2], [3, 4]]):
    with pytest.raises(ValueError, match="histogram="):
      auto.depth_acceptance(histogram)
  with pytest.raises(ValueError, match="no iterations"):
    auto.depth_acceptance([0, 0, 0])


def test_expected_tree_tokens_is_equation_one_at_k_one():
  for alpha in (0.0, 0.3, 0.71, 1.0):
    for gamma in (1, 2, 5, 12):
      assert auto.expected_tree_tokens(alpha, alpha, gamma) == pytest.approx(
          analysis.expected_tokens_per_iteration(alpha, gamma))
  assert auto.expected_tree_tokens(0.9, 0.5, 3) == pytest.approx(1 + 0.9 * 1.75)
  # Its distribution: P(1) = 1 - a_1, P(1 + j) = a_1 a^(j-1) (1 - a), P(γ + 1)
  # = a_1 a^(γ-1); at a_1 = a, Equation (1)'s.
  probs = auto.tree_token_probs(0.9, 0.5, 3)
  np.testing.assert_allclose(probs, [0.1, 0.45, 0.225, 0.225])
  np.testing.assert_allclose(auto.tree_token_probs(0.7, 0.7, 5),
                             analysis.call_token_probs(0.7, 5))


def test_narrower_trees_a1_is_the_share_of_calls_whose_first_round_is_below_k():
  # 10 calls of a 3-branch tree: 4 kept branch 0's guess, 3 branch 1's,
  # 1 branch 2's, 2 none.
  assert auto.first_depth_by_width([4, 3, 1,
                                    2]) == pytest.approx([0.4, 0.7, 0.8])
  assert auto.first_depth_by_width([0, 0, 5]) == [0.0, 0.0]


# ---------------------------------------------------------------------------
# While the run decodes.
# ---------------------------------------------------------------------------
def test_the_speedup_interval_is_the_ratio_estimators_t_interval():
  assert online.speedup_interval([1.0] * 5, [2.0] * 5) == (0.5, 0.5, 0.5)
  assert online.speedup_interval([1.0], [2.0])[2] == float("inf")
  rng = np.random.default_rng(0)
  spec = rng.uniform(0.5, 1.5, 30)
  base = 1.2 * spec * rng.lognormal(0, 0.2, 30)
  speedup, low, high = online.speedup_interval(base, spec)
  assert speedup == pytest.approx(base.sum() / spec.sum())
  assert low < speedup < high and low < 1.2 < high
  # Two batches: Student's t at 1 degree of freedom, 12.706.
  assert online.speedup_interval([1.0, 3.0], [1.0, 1.0]) == pytest.approx(
      (2.0, 0.0, 2.0 + 12.706), abs=1e-3)
  with pytest.raises(ValueError, match="one positive time per batch"):
    online.speedup_interval([1.0, 1.0], [1.0])


def test_a_test_fires_only_below_the_prediction_by_more_than_its_noise():
  assert online.below_prediction(2.0, [1.0] * MIN, [2.0] * MIN)
  assert not online.below_prediction(2.0, [1.0] * (MIN - 1), [2.0] * (MIN - 1))
  # Measured 1.8x on average, but noisy: 2x is inside its interval.
  spec = [1 / 1.2, 1 / 2.4, 1 / 1.3, 1 / 2.3, 1 / 1.4, 1 / 2.2]
  assert not online.below_prediction(2.0, [1.0] * 6, spec)
  # The same mean measured steadily is below it.
  assert online.below_prediction(2.0, [1.0] * 6, [1 / 1.8] * 6)
  # A choice measuring its prediction within 20% noise per batch is tested
  # positive about 2.5% of the time (one look at 8 batches).
  rng = np.random.default_rng(1)
  fired = 0
  for _ in range(2000):
    spec = rng.uniform(0.5, 1.5, 8)
    base = 1.3 * spec * rng.lognormal(0, 0.2, 8)
    fired += online.below_prediction(1.3 * np.exp(0.02), base, spec)
  assert fired / 2000 < 0.05


def _histogram(alpha: float, gamma: int, calls: int = 10**6) -> np.ndarray:
  """Calls by kept guesses as i.i.d. acceptance at `alpha` makes them."""
  n = np.arange(gamma + 1)
  probs = np.where(n < gamma, alpha**n * (1 - alpha), alpha**gamma)
  return np.round(probs * calls).astype(np.int64)


def _trace(histogram: np.ndarray) -> np.ndarray:
  """[B, most calls] guesses kept by each call (-1 after a row's last), in
  the order of kept guesses, from [B, γ + 1] calls by kept guesses."""
  histogram = np.asarray(histogram)
  rows = [np.repeat(np.arange(histogram.shape[1]), h) for h in histogram]
  out = np.full((len(rows), max(map(len, rows))), -1, np.int32)
  for r, row in enumerate(rows):
    out[r, :len(row)] = row
  return out


def test_the_measured_alpha_moves_gamma_and_the_measured_cost_error_scales():
  """GAMMA='auto' chose γ = 12 from a pilot's α of 0.95; the run measures
  α = 0.6: Section 3.4's γ for 0.6 is chosen. A run measuring a third of
  its prediction at the measured α switches to the target alone."""
  candidates = _token_candidates()
  pilots = {"token": {"alpha": 0.95}}
  rows = auto.predict_all(candidates, _prices(), pilots)
  first = auto.choose(rows)
  assert candidates[first].gamma == 12
  measured = online.with_measured_alpha(pilots, candidates[first],
                                        _histogram(0.6, 12))
  assert measured["token"]["alpha"] == pytest.approx(0.6, abs=1e-4)
  at_06 = float(analysis.expected_speedup(0.6, 12, C))
  rows, overhead = online.corrected_rows(candidates, first, at_06, _prices(),
                                         measured, {}, {})
  assert overhead == pytest.approx(0.0, abs=1e-3)
  assert rows[first]["basis"] == "measured"
  chosen = online.rechoose(rows, first, upper=at_06)
  assert candidates[chosen].gamma == analysis.optimal_gamma(
      0.6, C, max_gamma=12)
  rows, overhead = online.corrected_rows(candidates, first, at_06 / 3,
                                         _prices(), measured, {}, {})
  # A third of the model: each call costs its modelled 12·c + 1 steps
  # twice over again.
  assert overhead == pytest.approx(2 * (12 * C + 1), rel=1e-3)
  assert max(r["predicted_speedup"] for r in rows[1:]) < 1.0
  assert online.rechoose(rows, first, upper=at_06 / 3) == 0  # the target alone


def test_each_family_is_re_predicted_with_its_own_calibration():
  """Issue 58: token chosen; measured below its prediction, the online
  check re-predicted a tree with the token's κ (predicted 1.62×,
  re-predicted 2.19×), switched, measured 1.70×, switched back. The tree
  keeps its own κ: no switch."""
  prices = auto.Prices(call_cost_by_k={
      1: 1.0,
      4: 1.1
  }, cost_coefficient=0.05, tree_call_cost_by_nodes={
      1: 1.0,
      7: 1.1
  }, cost_coefficient_by_width={2: 0.05})
  pilots = _pilots(first_depth=0.95)
  candidates = [ALONE, TOKEN3, TREE32]
  model = [
      r["predicted_speedup"]
      for r in auto.predict_all(candidates, prices, pilots)
  ]
  rows = auto.predict_all(candidates, prices, pilots)
  # The tree pilot measured 0.67 of its model.
  overheads = {
      "chains": 0.0,
      "trees": auto.overhead_steps(0.67 * model[2], rows[2])
  }
  rows = auto.predict_all(candidates, prices, pilots, overheads)
  assert auto.choose(rows) == 1  # token: its model beats the tree's 0.67×
  assert rows[2]["predicted_speedup"] == pytest.approx(0.67 * model[2])
  # Token measures 0.905 of its model (95% up to 0.05 more).
  measured = 0.905 * model[1]
  upper = measured + 0.05
  rows, overhead = online.corrected_rows(candidates, 1, measured, prices,
                                         pilots, {}, overheads)
  assert overhead == pytest.approx(auto.overhead_steps(measured, rows[1]))
  assert overhead > 0
  assert rows[1]["basis"] == "measured"
  assert rows[2]["basis"] == "calibrated"
  assert rows[2]["predicted_speedup"] == pytest.approx(0.67 * model[2])
  assert online.rechoose(rows, 1, upper) == 1  # stays
  # With the token's calibration the tree would have been predicted above.
  assert auto.calibrated(dict(rows[2], model_speedup=model[2]),
                         overhead) > auto.AUTO_MIN_GAIN * upper


def test_a_family_calibration_is_an_overhead_per_call():
  """A pilot's κ becomes the loop's own work per call, o = s (1/κ - 1)
  steps (s = γ·c + C): at the pilot's own setting the prediction is what
  it measured; a cheaper call of the same family pays the same o, so its
  ratio to the model is lower (issue 58: a tree of k = 2 predicted from a
  pilot at k = 4 by κ alone ran 14-21% below its prediction); a pilot
  above its model implies none (2026-12-02: a 17-node tree pilot's -1.5
  steps lifted a 4-node tree to 6.4× for its 1.1×), and a negative
  overhead handed in lifts it at most KAPPA_BOUNDS[1] times."""
  prices = dataclasses.replace(_tree_prices({
      1: 1.0,
      7: 1.2,
      13: 1.9
  }), cost_coefficient_by_width={
      2: 0.04,
      4: 0.05
  })
  pilots = _pilots(first_depth=0.9)
  wide, narrow = (auto.predict(Candidate(decode_modes.TREE, 3, k), prices,
                               pilots) for k in (4, 2))
  o = auto.overhead_steps(0.8 * wide["predicted_speedup"], wide)
  steps = 3 * wide["cost_coefficient_c"] + wide["call_cost"]
  assert o == pytest.approx(steps * (1 / 0.8 - 1))
  assert auto.calibrated(wide,
                         o) == pytest.approx(0.8 * wide["predicted_speedup"])
  assert auto.calibrated(narrow, o) < 0.8 * narrow["predicted_speedup"]
  assert auto.calibrated(narrow, o) == pytest.approx(
      narrow["tokens_per_call"] /
      (3 * narrow["cost_coefficient_c"] + narrow["call_cost"] + o))
  assert auto.overhead_steps(1.2 * wide["predicted_speedup"], wide) == 0.0
  assert auto.overhead_steps(wide["predicted_speedup"],
                             wide) == pytest.approx(0.0, abs=1e-12)
  high = auto.KAPPA_BOUNDS[1]
  assert auto.calibrated(narrow, -100.0) == pytest.approx(
      high * narrow["predicted_speedup"])


def test_a_chains_batch_factor_is_multiplied_in_and_not_read_as_overhead():
  """At batch > 1 rows wait for their batch's slowest, more at a larger γ
  (the shipped pair at batch 8: 0.88 at γ 3, 0.72 at γ 7): a chain's row
  multiplies its γ's factor from the pilot's replay, so a pilot whose
  measurement is its model with its factor implies no overhead and the
  other γ keep their own factors (folded into an overhead per call, γ 7
  would have kept γ 3's loss, less than its own)."""
  prices = auto.Prices(call_cost_by_k={1: 1.0, 8: 1.2}, cost_coefficient=0.05)
  waits = {"3": 0.88, "7": 0.72}
  pilots = {"token": {"alpha": 0.8, "batch_factor_by_gamma": waits}}
  alone = {"token": {"alpha": 0.8}}
  token3, token7 = Candidate(decode_modes.TOKEN,
                             3), Candidate(decode_modes.TOKEN, 7)
  for candidate, factor in ((token3, 0.88), (token7, 0.72)):
    row = auto.predict(candidate, prices, pilots)
    free = auto.predict(candidate, prices, alone)
    assert free["batch_factor"] == 1.0 and row["batch_factor"] == factor
    assert row["predicted_speedup"] == pytest.approx(factor *
                                                     free["predicted_speedup"])
  pilot = auto.predict(token3, prices, pilots)
  assert auto.overhead_steps(pilot["predicted_speedup"],
                             pilot) == (pytest.approx(0.0, abs=1e-12))
  rows = auto.predict_all([ALONE, token3, token7], prices, pilots,
                          {"chains": 0.0})
  assert rows[2]["predicted_speedup"] == pytest.approx(
      0.72 * auto.predict(token7, prices, alone)["predicted_speedup"])
  assert "rows waiting 0.72" in auto.reason(rows, 2)


def test_a_switch_needs_the_evidence_to_beat_the_measured_interval():
  """Hysteresis: a candidate must be predicted above AUTO_MIN_GAIN times
  the upper end of the choice's measured interval, not its point."""
  rows = [{
      "predicted_speedup": 1.0
  }, {
      "predicted_speedup": 1.2
  }, {
      "predicted_speedup": 1.24
  }]
  assert auto.choose(rows) == 2
  assert online.rechoose(rows, 1, upper=1.2) == 1  # 1.24 < 1.05 × 1.2
  rows[2]["predicted_speedup"] = 1.3
  assert online.rechoose(rows, 1, upper=1.2) == 2
  assert online.rechoose(rows, 1, upper=1.25) == 1  # noisy: 1.3 < 1.31
  # The target alone replaces a choice only measured below it: 5 noisy
  # sentences measured block γ=2 at 0.93x, the interval reaching 1.3x.
  baseline = [1.0, 1.0, 1.0, 1.0, 1.0]
  speculative = [1.0, 0.95, 1.4, 0.9, 1.1]
  speedup, _, high = online.speedup_interval(baseline, speculative)
  alone = [{"predicted_speedup": 1.0}, {"predicted_speedup": speedup}]
  assert auto.choose(alone) == 0 and online.rechoose(alone, 1, high) == 1
  assert online.rechoose(alone, 1, upper=0.9) == 0


def test_a_candidate_that_ran_is_predicted_by_its_measurement():
  rows, _ = online.corrected_rows(_token_candidates(), 3, 0.9, _prices(),
                                  {"token": {
                                      "alpha": 0.5
                                  }}, {5: 0.8}, {})
  assert rows[5]["predicted_speedup"] == 0.8 and rows[5]["basis"] == "measured"
  assert rows[3]["predicted_speedup"] == 0.9
  assert rows[0]["predicted_speedup"] == 1.0
  assert rows[0]["basis"] == "target alone"


@dataclasses.dataclass(frozen=True)
class _Plan:
  """A `DecodePlan` as `OnlineChoice` reads it."""
  args: arguments.RunArguments
  mode: decode_modes.DecodeMode = decode_modes.TOKEN
  speculative: object = None
  rng: object = None

  def at(self, mode=None, **changes):
    return dataclasses.replace(self, mode=mode or self.mode,
                               args=dataclasses.replace(self.args, **changes))


def test_a_run_switches_at_most_once_per_min_batches_and_max_times():
  """The pilot's α was 0.95 (γ = 12), the data's is 0.6: γ = 6 next. It
  runs at half its prediction: back to γ = 12, measured better. Then γ = 12
  runs at 0.3x, and stays: no switch is left."""
  candidates = _token_candidates()
  pilots = {"token": {"alpha": 0.95}}
  rows = auto.predict_all(candidates, _prices(), pilots)
  built = []

  def build(candidate):
    built.append(candidate.label)
    return _Plan(
        arguments.RunArguments(output_dir="/tmp/x", gamma=candidate.gamma or 1))

  chosen = auto.choose(rows)
  choice = online.OnlineChoice(candidates, rows, chosen, pilots, _prices(),
                               {"chains": 1.0}, {"reason": "auto: chose"},
                               build, build(candidates[chosen]))
  feed = types.SimpleNamespace(first_of_each_width=lambda: [])
  switched_after = []
  for index in range(6 * MIN):
    gamma = choice.plan.args.gamma
    factor = (1.0, 0.5, 0.3 / 2.013)[len(choice.switches)]
    speedup = float(analysis.expected_speedup(0.6, gamma, C)) * factor
    before = len(choice.switches)
    histogram = _histogram(0.6, gamma, 1000)[None]
    out = types.SimpleNamespace(accepted_histogram=histogram, tokens=np.ones(
        (1, 3), np.int32), target_calls=np.array([histogram.sum()]),
                                lengths=np.array([3]), beta_count=np.ones(1),
                                beta_sum=np.ones(1),
                                trace_num_accepted=_trace(histogram))
    choice.after_batch(batches.Batch(index, None, np.array([0]), None), 1.0,
                       1.0 / speedup, out, feed)
    if len(choice.switches) > before:
      switched_after.append(index + 1)
  assert built == ["token γ=12", "token γ=6"]  # γ = 12's plan is kept
  assert switched_after == [MIN, 2 * MIN]
  assert len(choice.switches) == auto.AUTO_SWITCH_MAX_SWITCHES
  ended, record, _ = choice.outcome()
  assert record["reason"] == "auto: chose"
  assert [s["label"] for s in record["segments"]
         ] == ["token γ=12", "token γ=6", "token γ=12"]
  assert [s["batches"] for s in record["segments"]] == [MIN, MIN, 4 * MIN]
  assert record["segments"][1]["alpha"] == pytest.approx(0.6, abs=0.01)
  assert record["segments"][2]["measured_speedup"] == pytest.approx(
      0.3, rel=1e-3)
  first, second = record["switches"]
  assert first["reason"].startswith(f"auto: after batch {MIN}, token γ=12 ran ")
  assert first["kappa"] == pytest.approx(1.0, abs=1e-2)
  assert second["kappa"] == pytest.approx(0.5, abs=1e-2)
  assert second["candidates"][12]["basis"] == "measured"
  # The settings recorded: the last choice's, γ the histogram's width.
  assert ended.args.gamma == 12 and ended.args.speculation == "auto"


# ---------------------------------------------------------------------------
# The one tally.
# ---------------------------------------------------------------------------
def _out(histogram, beta_count=None, lengths=None):
  histogram = np.asarray(histogram)
  rows = histogram.shape[0]
  return types.SimpleNamespace(
      accepted_histogram=histogram, target_calls=histogram.sum(1),
      trace_num_accepted=_trace(histogram), tokens=np.ones((rows, 4), np.int32),
      lengths=np.asarray(lengths if lengths is not None else [4] * rows),
      beta_count=np.asarray(beta_count if beta_count is not None else [0.0] *
                            rows), beta_sum=np.ones(rows))


def test_a_chain_measures_its_rows_waiting_on_its_own_batches():
  """A pilot's few batches say little of a batch's slowest row; once a
  chain (or a tree) has decoded batches of its own, its factors are
  replayed from them (rows of 8 tokens, row 0: 2 calls keeping all 3;
  row 1: 8 keeping none); beams' are not."""
  expected = {"1": 6 / 8, "3": 5 / 8}
  pilots = {"token": {"alpha": 0.8}, "tree": {"alpha": 0.8}, "beam": {}}
  for mode, candidate in ((decode_modes.TOKEN, TOKEN3),
                          (decode_modes.TREE, Candidate(decode_modes.TREE, 3,
                                                        2))):
    tally = batches.Tally()
    tally.add(_out([[0, 0, 0, 2], [8, 0, 0, 0]], lengths=[8, 8]),
              np.array([0, 1]), mode)
    measured = online.with_measured_waits(pilots, candidate, tally, [1, 3], 2)
    # The baseline's rows end together. γ 3: calls 2 and 8 (mean 5, most
    # 8); γ 1: 4 (each keeps 1 and adds 1) and 8 (mean 6).
    assert measured[mode.name]["batch_factor_by_gamma"] == pytest.approx(
        expected), mode.name
    others = {k: v for k, v in measured.items() if k != mode.name}
    assert others == {k: v for k, v in pilots.items() if k != mode.name}
  assert "batch_factor_by_gamma" not in pilots["token"]
  tally = batches.Tally()
  tally.add(_out([[0, 0, 0, 2], [4, 0, 0, 0]], lengths=[8, 4]),
            np.array([0, 1]), decode_modes.BEAM)
  assert not tally.chains  # a beam's kept guesses are no path's
  assert online.with_measured_waits(pilots, Candidate(decode_modes.BEAM, 3),
                                    tally, [3], 2) == pilots


def test_the_tally_counts_trials_as_each_mode_does_and_pads_histograms():
  alone = decode_modes.target_alone(decode_modes.TOKEN)
  tally = batches.Tally()
  tally.add(_out([[1, 2, 3, 4], [9, 9, 9, 9]], beta_count=[8.0, 0.0]),
            np.array([0]), decode_modes.TOKEN, seconds=0.5)
  assert tally.trials == 8.0  # β's, not min(n + 1, γ) per call
  assert tally.call_trials == 1 + 4 + 9 + 12
  assert tally.kept == 2 + 6 + 12
  assert tally.alpha == 20 / 8 and tally.call_alpha == 20 / 26
  assert tally.iterations == [36] and tally.rows == [2]  # padding rows too
  tally.add(_out([[5, 0]]), np.array([0]), alone)  # γ = 1: padded
  np.testing.assert_array_equal(tally.histogram, [6, 2, 3, 4])
  assert tally.trials == 8.0 and tally.alpha_beta == 1 / 8  # alone: no trials
  tally.add(_out([[1, 2, 3]]), np.array([0]), decode_modes.TREE)
  assert tally.trials == 8.0 + 1 + 4 + 6 and tally.beta is None
  assert tally.examples == 3 and tally.seconds == [0.5, 0.0, 0.0]
  np.testing.assert_array_equal(
      batches.padded_sum(np.array([3, 1]), np.array([1, 2, 3, 4])),
      [4, 3, 3, 4])
  first = batches.Tally()  # the target alone from the first batch: no β
  first.add(_out([[5, 0]]), np.array([0]), alone)
  assert first.beta is None and first.alpha == 0.0


def test_the_target_alone_reads_as_a_run_without_guesses():
  out = decoding.DecodeOutput(tokens=np.array([[5, 6, 1, 0], [7, 1, 0, 0]]),
                              lengths=np.array([3, 2]),
                              target_calls=np.array([3, 2]))
  alone = batches.TargetAloneDecoder(None, gamma=3).of_baseline(out)
  np.testing.assert_array_equal(alone.accepted_histogram,
                                [[3, 0, 0, 0], [2, 0, 0, 0]])
  np.testing.assert_array_equal(alone.trace_num_accepted,
                                [[0, 0, 0, -1], [0, 0, -1, -1]])
  np.testing.assert_array_equal(alone.tokens, out.tokens)
  assert float(alone.tokens_per_target_call) == 1.0


# ---------------------------------------------------------------------------
# Settings and caches.
# ---------------------------------------------------------------------------
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


_ZEN = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
        "model\t\t: {model}\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
        "flags\t\t: fpu avx2\n\n")


def test_the_cpu_identity_tells_processor_kinds_of_one_name_apart():
  zen3 = _ZEN.format(n=0, model=1) + _ZEN.format(n=1, model=1)
  zen4 = _ZEN.format(n=0, model=17)
  assert price_cache.cpu_identity(zen3) == (
      "vendor_id: AuthenticAMD; cpu family: 25; model: 1; "
      "model name: AMD EPYC; stepping: 1")
  assert price_cache.cpu_identity(zen3) != price_cache.cpu_identity(zen4)
  assert price_cache.cpu_identity("flags : avx2\n") == ""


def test_prices_are_keyed_by_the_instruction_set_the_kernel_runs():
  """SPECDEC_JAX_KERNEL_ISA's cap changes the kernel's speed, so a capped
  run must not read the uncapped run's prices (nor the reverse)."""
  if not kernels.available():
    pytest.skip("the CPU kernel is not available here (no C++ compiler)")
  widest = kernels.instruction_set()
  try:
    fields = {"machine": price_cache.machine_fields()}
    assert fields["machine"]["cpu_kernel"] == widest
    kernels.instruction_set("portable")
    capped = {"machine": price_cache.machine_fields()}
    assert capped["machine"]["cpu_kernel"] == "portable"
    assert price_cache.path(capped) != price_cache.path(fields)
  finally:
    kernels.instruction_set(widest)


def test_the_pilot_cache_is_its_own_kind_and_knows_the_weights(
    tmp_path, monkeypatch):
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path))
  monkeypatch.delenv(price_cache.ENV_OFF, raising=False)
  fields = {"settings": {"seed": 0}, "weights": "w"}
  entry = {"records": {"token": {"alpha": 0.5}}}
  price_cache.store(fields, entry, price_cache.PILOTS)
  assert price_cache.path(fields, price_cache.PILOTS).startswith(
      str(tmp_path / "auto-pilots"))
  assert price_cache.load(fields, price_cache.PILOTS) == entry
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
  tree = pilots_lib.candidate_args(args, Candidate(decode_modes.TREE, 4, 2))
  assert tree.gamma == 4
  assert decode_modes.mode_of(tree) == decode_modes.TreeMode(width=2)
  alone = pilots_lib.candidate_args(args, ALONE)
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
  run = plan_lib.settings_record(args, decode_modes.mode_of(args),
                                 tiny_config(), tiny_config(), _Vocab())["run"]
  assert ("speculation" in run) is recorded
