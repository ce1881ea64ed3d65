"""The run and sweep commands with tree verification (ACCEPTANCE='tree').

* Bad tree settings (TREE_WIDTH, and what 'tree' needs: LENIENCE=1, a draft
  model without adaptive γ) stop the run before any model is loaded,
  naming the macro; nothing is written.
* The tree loop's two calls are priced as the loop makes them
  (`tree_costs`: the tree call over 1 + k·γ nodes scores what
  `decode_tree` scores; the tree drafter proposes what `propose_tree` does).
* A tiny run end to end stays exact (greedy: the target's tokens) and
  records the tree's settings and counts; a sweep over TREE_WIDTH runs;
  GAMMA='auto' with TREE_WIDTH='auto' runs the pilots, records the chosen
  (γ, k) in metrics.json and decodes with them.
"""
import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.metrics import timing
from specdec_jax.core import drafters
from specdec_jax.core import sampling
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment import auto_tree
from specdec_jax.metrics import step_costs
from specdec_jax.experiment import summary
from specdec_jax.metrics import tree_costs

from conftest import perturbed
from conftest import random_model
from conftest import tiny_config

pytestmark = pytest.mark.usefixtures("clean_gin")

# A tiny, fast run: two examples of at most 6 tokens, one-layer target.
SMALL = [
    "GAMMA = 2", "NUM_EXAMPLES = 2",
    "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 6}",
    "target/T5Config.num_encoder_layers = 1",
    "target/T5Config.num_decoder_layers = 1"
]


def _parse(bindings):
  gin_utils.parse_gin(["local_tiny.gin"], bindings, finalize=False)


@pytest.mark.parametrize("bindings,expect", [
    (["TREE_WIDTH = 0", "ACCEPTANCE = 'tree'"
     ], ["TREE_WIDTH=0: allowed: an integer >= 1"]),
    (["TREE_WIDTH = 2.5", "ACCEPTANCE = 'tree'"], ["TREE_WIDTH=2.5"]),
    (["TREE_WIDTH = 3"], [
        "TREE_WIDTH=3 with ACCEPTANCE='token'",
        "allowed: TREE_WIDTH=1, or ACCEPTANCE='tree'"
    ]),
    (["TREE_WIDTH = 2", "ACCEPTANCE = 'block'"
     ], ["TREE_WIDTH=2 with ACCEPTANCE='block'"]),
    (["TREE_WITHOUT_REPLACEMENT = False"
     ], ["TREE_WITHOUT_REPLACEMENT=False with ACCEPTANCE='token'"]),
    (["TREE_WITHOUT_REPLACEMENT = 1", "ACCEPTANCE = 'tree'"
     ], ["TREE_WITHOUT_REPLACEMENT=1", "allowed: True or False"]),
    (["ACCEPTANCE = 'tree'", "LENIENCE = 0.5"
     ], ["ACCEPTANCE='tree' with LENIENCE=0.5", "allowed: LENIENCE=1"]),
    (["ACCEPTANCE = 'tree'", "DRAFTER = 'prompt_lookup'"], [
        "ACCEPTANCE='tree' with DRAFTER='prompt_lookup'",
        "allowed: DRAFTER 'model' or 'shared_encoder'"
    ]),
    (["ACCEPTANCE = 'tree'", "ADAPTIVE_THRESHOLD = 0.5"
     ], ["ACCEPTANCE='tree' with ADAPTIVE_THRESHOLD=0.5"]),
    (["TREE_WIDTH = 'wide'", "ACCEPTANCE = 'tree'"
     ], ["TREE_WIDTH='wide': allowed: an integer >= 1", "or 'auto'"]),
    (["TREE_WIDTH = 'auto'"], ["TREE_WIDTH='auto' with ACCEPTANCE='token'"]),
    ([
        "ACCEPTANCE = 'tree'", "TREE_WIDTH = 'auto'", "GAMMA = 25",
        "TASK_FEATURE_LENGTHS = {'inputs': 8, 'targets': 32}"
    ], ["TREE_WIDTH='auto' with GAMMA=25", "allowed: GAMMA <= 24"]),
    (["ACCEPTANCE = 'tree'", "TREE_WIDTH = 260"
     ], ["TREE_WIDTH=260 is more than the models' vocab_size (259)"]),
    ([
        "ACCEPTANCE = 'tree'", "TREE_WIDTH = 'auto'",
        "COMPILE_TOPOLOGY = 'v4-8'"
    ], ["TREE_WIDTH='auto' with COMPILE_TOPOLOGY='v4-8'"]),
])
def test_bad_tree_settings_fail_before_loading(bindings, expect, tmp_path,
                                               no_load):
  out = tmp_path / "out"
  _parse([f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  assert not out.exists()
  for text in expect:
    assert text in str(e.value), (text, str(e.value))


def test_tree_width_one_is_allowed_with_every_acceptance(tmp_path):
  for acceptance in ("token", "block", "tree"):
    args = arguments.run_arguments({
        "output_dir": str(tmp_path),
        "acceptance": acceptance
    })
    assert args.tree_width == 1 and args.tree_without_replacement is True


def test_the_tree_calls_are_priced_as_the_loop_makes_them(monkeypatch):
  config = tiny_config(vocab_size=32)
  target = random_model(config, seed=1)
  draft = perturbed(target, 0.3, seed=2)
  enc = np.random.default_rng(0).integers(2, 32, size=(2, 5)).astype(np.int32)
  width, gamma, fill = 2, 3, 4
  parents = tuple(int(p) for p in tree_acceptance.chain_parents(width, gamma))
  nodes = np.random.default_rng(1).integers(
      2, 32, size=(2, 1 + width * gamma)).astype(np.int32)
  cache = target.start(enc, 20)
  prefix = np.random.default_rng(2).integers(2, 32, size=(2, fill))
  _, cache = target.decode_chunk(jnp.asarray(prefix, jnp.int32), cache)
  call = tree_costs.TreeCall(target, parents)
  got, _ = call.decode_chunk(nodes, cache)
  want, _ = target.decode_tree(nodes, jnp.asarray(parents), cache)
  np.testing.assert_allclose(got, want, atol=1e-6)

  tree_drafter = drafters.TreeModelDrafter(draft)
  proposer = tree_costs.TreeProposer(tree_drafter, width)
  state = proposer.init(enc, 20)
  buffer = jnp.asarray(np.pad(prefix, ((0, 0), (1, 8))), jnp.int32)
  length = jnp.full((2,), fill, jnp.int32)
  rng = jax.random.PRNGKey(0)
  method = sampling.Greedy()
  after, tokens, probs = proposer.propose(state, buffer, length, rng,
                                          gamma=gamma, method=method)
  _, want_tokens, _ = tree_drafter.propose_tree(state, buffer, length, rng,
                                                gamma=gamma, width=width,
                                                method=method)
  assert probs is None
  np.testing.assert_array_equal(tokens, np.reshape(want_tokens, (2, -1)))
  assert isinstance(after, type(state))  # one branch kept: as `init`'s

  # `price_tree_calls` times exactly these three calls (few steps here).
  monkeypatch.setattr(step_costs, "STEPS", 2)
  monkeypatch.setattr(step_costs, "REPEATS", 1)
  args = arguments.run_arguments({
      "output_dir": "/tmp/unused",
      "acceptance": "tree",
      "tree_width": width,
      "gamma": gamma,
      "temperature": 1.0,  # the drafter's q too
      "task_feature_lengths": {
          "inputs": 5,
          "targets": 10
      }
  })
  timed = []
  real = timing.call_seconds

  def spy(calls, *a, **kw):
    timed.append({name: k for name, (_, k) in calls.items()})
    return real(calls, *a, **kw)

  monkeypatch.setattr(timing, "call_seconds", spy)
  step, depth, tree = tree_costs.price_tree_calls(args, draft, target, enc,
                                                  fill, jnp.asarray(prefix))
  assert timed == [{"step": 1, "tree": 1 + width * gamma, "draft": gamma}]
  assert step > 0 and depth > 0 and tree > 0


def _stand_in_seconds(calls, *args, **kwargs):
  """1 ms plus 0.1 ms per token (or guess) of a call: no timing in tests."""
  del args, kwargs
  return {name: 1e-3 * (1 + k / 10) for name, (_, k) in calls.items()}


@pytest.mark.slow
def test_tree_verification_end_to_end(tmp_path, monkeypatch):
  monkeypatch.setattr(timing, "call_seconds", _stand_in_seconds)
  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2", *SMALL
  ])
  metrics = run_lib.run()
  assert metrics["greedy_outputs_identical"] is True
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert "draft tiny tree k=2" in lines[0]
  assert "the tree's measured tokens per call and call costs" in lines[1]
  written = json.loads((out / "metrics.json").read_text())
  assert written["acceptance"] == "tree" and written["exact"] is True
  assert written["tree_width"] == 2
  assert written["tree_without_replacement"] is True
  assert written["draft_model"].endswith(" tree k=2")
  run_settings = written["settings"]["run"]
  assert run_settings["acceptance"] == "tree"
  assert run_settings["tree_width"] == 2
  assert written["alpha_beta"] is None
  assert written["per_iteration_gamma"] is None
  assert written["guesses_per_target_call"] == 4.0
  # The tree call over 1 + 2·2 = 5 nodes at the stand-in's 1 + 5/10 ms.
  assert written["verification_cost_ratio"] == pytest.approx(1.5 / 1.1)
  assert written["cost_coefficient_c"] == pytest.approx(1.2 / 2 / 1.1)
  c, ratio = written["cost_coefficient_c"], written["verification_cost_ratio"]
  assert written["theoretical_speedup_measured_call_cost"] == pytest.approx(
      written["tokens_per_target_call"] / (2 * c + ratio))
  rows = [
      json.loads(line)
      for line in (out / "predictions.jsonl").read_text().splitlines()
  ]
  counts = [n for r in rows for n in r["accepted_counts"]]
  assert len(counts) == written["target_calls_speculative"]
  assert np.bincount(counts,
                     minlength=3).tolist() == written["accepted_histogram"]
  assert all(r["trace"] is None for r in rows)
  kept = sum(counts)
  trials = sum(min(n + 1, 2) for n in counts)
  assert written["alpha"] == pytest.approx(kept / trials)


@pytest.mark.slow
def test_a_sweep_over_tree_width(tmp_path, monkeypatch):
  monkeypatch.setattr(timing, "call_seconds", _stand_in_seconds)
  points = sweep.parse_sweep_args(["TREE_WIDTH=1,2"])
  results = tmp_path / "sweep"
  sweep.run_sweep(points, str(results), ["local_tiny.gin"],
                  ["ACCEPTANCE = 'tree'", *SMALL])
  written = sorted(
      (json.loads(p.read_text()) for p in results.glob("*/metrics.json")),
      key=lambda m: m["tree_width"])
  assert [m["tree_width"] for m in written] == [1, 2]
  assert all(m["greedy_outputs_identical"] for m in written)
  assert [m["draft_model"][-len(" tree k=1"):] for m in written
         ] == [" tree k=1", " tree k=2"]
  gin.clear_config()


@pytest.mark.slow
def test_tree_verification_with_the_shared_encoder_drafter(
    tmp_path, monkeypatch):
  """DRAFTER='shared_encoder': the k branches' draft decoder reads the
  target's encoder output (`tree_loop` starts it from it) and stays exact."""
  monkeypatch.setattr(timing, "call_seconds", _stand_in_seconds)
  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2",
      "DRAFTER = 'shared_encoder'", "draft/T5Config.num_encoder_layers = 0",
      "draft/T5Config.encoder_width = 64", *SMALL
  ])
  metrics = run_lib.run()
  assert metrics["greedy_outputs_identical"] is True
  assert metrics["drafter"] == "shared_encoder"
  assert metrics["tree_width"] == 2


@pytest.mark.slow
def test_a_sampled_tree_run(tmp_path, monkeypatch):
  """T > 0: no token-for-token comparison, no β; the summary says so."""
  monkeypatch.setattr(timing, "call_seconds", _stand_in_seconds)
  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2",
      "TREE_WITHOUT_REPLACEMENT = False", "TEMPERATURE = 1.0", *SMALL
  ])
  metrics = run_lib.run()
  assert metrics["greedy_outputs_identical"] is None
  assert metrics["alpha_beta"] is None
  assert metrics["tree_without_replacement"] is False
  written = json.loads((out / "metrics.json").read_text())
  assert written["settings"]["run"]["tree_without_replacement"] is False
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert "outputs are samples (T=1)" in lines[1]
  assert "chi-square tests in tests/core/test_tree_acceptance.py" in lines[1]
  assert "Σ min(p, q)" not in lines[1]


@pytest.mark.slow
def test_auto_gamma_and_tree_width_end_to_end(tmp_path, monkeypatch):
  """GAMMA='auto', TREE_WIDTH='auto': a pilot per k, the calls priced
  (stand-in seconds), the (γ, k) of the best predicted speedup recorded and
  decoded with, exactly."""
  monkeypatch.setattr(timing, "call_seconds", _stand_in_seconds)
  monkeypatch.setattr(auto_gamma, "AUTO_GAMMA_PILOT", 2)
  monkeypatch.setattr(auto_gamma, "AUTO_GAMMA_MAX", 3)
  monkeypatch.setattr(auto_tree, "AUTO_TREE_MAX_WIDTH", 2)
  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "ACCEPTANCE = 'tree'", *SMALL, "GAMMA = 'auto'",
      "TREE_WIDTH = 'auto'"
  ])
  metrics = run_lib.run()
  assert metrics["greedy_outputs_identical"] is True
  written = json.loads((out / "metrics.json").read_text())
  auto = written["gamma_auto"]
  assert auto["pilot_gamma"] == 2 and auto["pilot_tree_widths"] == [1, 2]
  assert written["gamma"] == auto["chosen_gamma"]
  assert written["tree_width"] == auto["chosen_tree_width"]
  assert written["settings"]["run"]["tree_width"] == "auto"
  predicted = auto["predicted_speedup"]
  assert len(predicted) == 3 * 2
  best = max(predicted, key=predicted.get)
  rates = auto["acceptance_by_tree_width"][str(auto["chosen_tree_width"])]
  assert auto["predicted_tokens_per_call"] == pytest.approx(
      auto_tree.expected_tree_tokens(rates["first_depth"],
                                     rates["deeper_depths"],
                                     auto["chosen_gamma"]))
  assert best == (f"gamma={auto['chosen_gamma']},"
                  f"k={auto['chosen_tree_width']}")
  assert written["draft_model"].endswith(
      f" auto-(γ,k) tree k={auto['chosen_tree_width']}")
  # The stand-in's tree call over N nodes: (1 + N/10) / 1.1 steps.
  costs = auto["tree_call_cost_by_nodes"]
  assert costs[4] == pytest.approx(1.5 / 1.1)
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert any(f"γ={auto['chosen_gamma']}, k={auto['chosen_tree_width']}" in l
             for l in lines)
