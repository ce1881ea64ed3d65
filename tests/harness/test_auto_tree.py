"""GAMMA / TREE_WIDTH = 'auto' with ACCEPTANCE='tree': the (γ, k) choice
(`experiment.auto_tree`) on stub acceptance and call costs (no timing).

* The pilot's histogram gives the model's two rates, counted by hand.
* k = 1 with a_1 = a = α is GAMMA='auto''s choice (`auto_gamma.best_gamma`)
  for every α, c and call-cost curve tried.
* The chosen (γ, k) is the argmax of the predicted speedup over all
  shapes (brute force), and it moves with the costs: cheap wide calls pick
  a wide tree, steep call costs a narrow one.
* Bad input fails with a ValueError naming the argument.
"""
import numpy as np
import pytest

from specdec_jax.metrics import analysis
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment import auto_tree

GAMMAS = list(range(1, auto_gamma.AUTO_GAMMA_MAX + 1))


def test_depth_acceptance_counts_depth_one_and_the_deeper_tests():
  # γ = 3: 2 calls kept 0, 3 kept 1, 1 kept 2, 4 kept 3 (all).
  first, deeper = auto_tree.depth_acceptance([2, 3, 1, 4])
  assert first == pytest.approx(8 / 10)
  # Deeper kept: 0·3 + 1·1 + 2·4 = 9; tests: 1·3 + 2·1 + 2·4 = 13.
  assert deeper == pytest.approx(9 / 13)
  # γ = 1: no deeper test; a = a_1.
  assert auto_tree.depth_acceptance([1, 3]) == (0.75, 0.75)


def test_expected_tree_tokens_is_equation_one_at_k_one():
  for alpha in (0.0, 0.3, 0.71, 1.0):
    for gamma in (1, 2, 5, 12):
      assert auto_tree.expected_tree_tokens(
          alpha, alpha, gamma) == (pytest.approx(
              analysis.expected_tokens_per_iteration(alpha, gamma)))
  # A better first depth adds a_1 - α times the rest of the chain.
  assert auto_tree.expected_tree_tokens(
      0.9, 0.5, 3) == pytest.approx(1 + 0.9 * (1 + 0.5 + 0.25))


def _tree_costs_from_gamma_costs(costs):
  """[25] tree-call costs whose N = γ + 1 entry is `costs`' γ entry."""
  out = np.linspace(1.0, 5.0, auto_tree.AUTO_TREE_MAX_NODES)
  out[1:len(costs) + 1] = costs
  return out


def test_width_one_is_gamma_auto():
  rng = np.random.default_rng(0)
  for _ in range(200):
    alpha = float(rng.uniform(0.05, 0.98))
    c = float(rng.uniform(0.0, 0.6))
    costs = np.sort(rng.uniform(1.0, 4.0, auto_gamma.AUTO_GAMMA_MAX))
    if rng.uniform() < 0.3:
      costs = None
    want = auto_gamma.best_gamma(alpha, c, costs)
    tree = _tree_costs_from_gamma_costs(
        np.ones(auto_gamma.AUTO_GAMMA_MAX) if costs is None else costs)
    assert auto_tree.best_tree_shape({1: (alpha, alpha)}, {1: c}, tree,
                                     GAMMAS) == (want, 1), (alpha, c, costs)


def _stub(first_gain=0.25, call_slope=0.02):
  """Acceptance growing with k at depth 1, a draft depth costing more with
  k, and a tree call of 1 + call_slope·(N - 1) steps."""
  alpha = 0.6
  acceptance = {
      k: (1 - (1 - alpha)**(1 + first_gain * (k - 1)), alpha)
      for k in (1, 2, 3, 4)
  }
  cost_coefficients = {k: 0.05 * (1 + 0.1 * (k - 1)) for k in acceptance}
  calls = 1 + call_slope * np.arange(auto_tree.AUTO_TREE_MAX_NODES)
  return acceptance, cost_coefficients, calls


def _brute_force(acceptance, cost_coefficients, calls):
  best, shape = -1.0, None
  for k, (first, deeper) in sorted(acceptance.items()):
    for gamma in GAMMAS:
      if 1 + k * gamma > len(calls):
        continue
      tokens = 1 + sum(first * deeper**d for d in range(gamma))
      speedup = tokens / (gamma * cost_coefficients[k] + calls[k * gamma])
      if speedup > best + 1e-12:
        best, shape = speedup, (gamma, k)
  return shape, best


@pytest.mark.parametrize("first_gain,call_slope", [(0.25, 0.02), (1.0, 0.01),
                                                   (0.25, 0.3), (0.0, 0.05)])
def test_the_chosen_shape_maximizes_the_predicted_speedup(
    first_gain, call_slope):
  acceptance, cs, calls = _stub(first_gain, call_slope)
  shape = auto_tree.best_tree_shape(acceptance, cs, calls, GAMMAS)
  want, best = _brute_force(acceptance, cs, calls)
  assert shape == want
  speedups = auto_tree.predicted_speedups(acceptance, cs, calls, GAMMAS)
  assert speedups[shape] == pytest.approx(best)
  assert all(v <= best + 1e-12 for v in speedups.values())
  # Only trees of at most 25 nodes: k = 4 stops at γ = 6.
  assert max(g for g, k in speedups if k == 4) == 6


def test_the_choice_follows_the_costs():
  # Wide calls nearly free and a big first-depth gain: a wide tree.
  acceptance, cs, calls = _stub(first_gain=1.0, call_slope=0.005)
  assert auto_tree.best_tree_shape(acceptance, cs, calls, GAMMAS)[1] > 1
  # Every node a full step: one branch (extra nodes cost more than they buy).
  acceptance, cs, calls = _stub(first_gain=1.0, call_slope=1.0)
  assert auto_tree.best_tree_shape(acceptance, cs, calls, GAMMAS)[1] == 1
  # No gain from width at all: k = 1 at any call cost.
  acceptance, cs, calls = _stub(first_gain=0.0, call_slope=0.0)
  assert auto_tree.best_tree_shape(acceptance, cs, calls, GAMMAS)[1] == 1
  # A fixed γ (GAMMA given, TREE_WIDTH='auto'): only k is chosen.
  acceptance, cs, calls = _stub(first_gain=1.0, call_slope=0.005)
  assert auto_tree.best_tree_shape(acceptance, cs, calls, [3])[0] == 3


def test_tree_call_costs_interpolate_between_the_measured_nodes():
  costs = auto_tree.tree_call_costs({1: 2.0, 5: 3.0, 25: 6.0})
  assert costs.shape == (auto_tree.AUTO_TREE_MAX_NODES,)
  assert costs[0] == 1.0 and costs[4] == 1.5 and costs[24] == 3.0
  assert costs[2] == pytest.approx(1.25)
  # A dip (timing noise) is lifted to the cost of fewer nodes.
  dipped = auto_tree.tree_call_costs({1: 2.0, 5: 3.0, 13: 5.0, 25: 4.0})
  assert dipped[12] == 2.5 and dipped[24] == 2.5
  assert np.all(np.diff(dipped) >= 0)
  with pytest.raises(ValueError, match="needs N=1"):
    auto_tree.tree_call_costs({2: 1.0, 5: 2.0})


@pytest.mark.parametrize("change,message", [
    (lambda a, c, t, g: ({}, c, t, g), "acceptance is empty"),
    (lambda a, c, t, g: ({
        **a, 2: (1.2, 0.5)
    }, c, t, g), r"acceptance\[2\]"),
    (lambda a, c, t, g: ({
        **a, 2: (np.nan, 0.5)
    }, c, t, g), r"acceptance\[2\]"),
    (lambda a, c, t, g: ({
        **a, 0: (0.5, 0.5)
    }, c, t, g), "width 0"),
    (lambda a, c, t, g: (a, {
        **c, 3: -0.1
    }, t, g), r"cost_coefficients\[3\]"),
    (lambda a, c, t, g: (a, {
        k: v for k, v in c.items() if k != 4
    }, t, g), r"cost_coefficients\[4\]=None"),
    (lambda a, c, t, g:
     (a, c, np.where(np.arange(25) == 3, 0.0, t), g), "call_costs"),
    (lambda a, c, t, g: (a, c, t, []), "gammas"),
    (lambda a, c, t, g: ({
        4: a[4]
    }, c, t[:4], g), "no shape fits"),
])
def test_bad_input_fails_clearly(change, message):
  args = change(*_stub(), GAMMAS)
  with pytest.raises(ValueError, match=message):
    auto_tree.best_tree_shape(*args)


def test_bad_histograms_fail_clearly():
  for histogram in ([3], [1, -1, 2], [[1, 2], [3, 4]]):
    with pytest.raises(ValueError, match="histogram="):
      auto_tree.depth_acceptance(histogram)
  with pytest.raises(ValueError, match="no iterations"):
    auto_tree.depth_acceptance([0, 0, 0])


def test_narrower_trees_a1_is_the_share_of_calls_whose_first_round_is_below_k():
  # 10 calls of a 3-branch tree: 4 kept branch 0's guess, 3 branch 1's,
  # 1 branch 2's, 2 none.
  assert auto_tree.first_depth_by_width([4, 3, 1,
                                         2]) == pytest.approx([0.4, 0.7, 0.8])
  assert auto_tree.first_depth_by_width([0, 0, 5]) == [0.0, 0.0]
