"""ACCEPTANCE='tree' with GAMMA='auto' and/or TREE_WIDTH='auto': the tree's
shape (γ, k) that maximizes the predicted speedup, from acceptance and call
costs measured on the run's first examples (`pilot_tree_shape`).

The model (docs/design/beyond_the_paper.md, "Choosing the tree's shape"):
an iteration of a k-branch tree with γ guesses per branch yields

  E(γ, k) = 1 + a_1(k) · (1 + a(k) + ... + a(k)^(γ-1))

tokens, where a_1(k) is the chance that some depth-1 candidate is kept and
a(k) that of each deeper depth (without replacement only one branch carries
the prefix below depth 1; i.i.d. branches may carry it on several, which
a(k) averages in). Both come from one pilot decode with the widest k
(`_pilot_widths`): a_1(k) from its first rounds (a narrower tree keeps a
first guess exactly when the wide one's first round is below k), a from
its deeper depths (`depth_acceptance`), for every k. An iteration costs
γ·c_k + C(1 + k·γ) target steps: γ depths of the k-branch draft (c_k: one
depth over one target step) and the tree call over 1 + k·γ nodes (C(N):
its measured cost in steps). The predicted speedup is
E / (γ·c_k + C(1 + k·γ)); with k = 1 and a_1 = a = α it is Theorem 3.8
with the measured call cost (`auto_gamma.best_gamma`).
"""
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment.plan import Loaded
from specdec_jax.metrics import step_costs
from specdec_jax.terminal import console

# Trees of at most this many nodes 1 + k·γ (24 guesses and the root).
AUTO_TREE_MAX_NODES = arguments.AUTO_TREE_MAX_NODES
# The tree call's cost is measured at these N and interpolated linearly.
AUTO_TREE_CALL_NODES = (1, 2, 4, 7, 13, 19, AUTO_TREE_MAX_NODES)

Acceptance = Tuple[float, float]  # (a_1, a): depth 1, each deeper depth


def depth_acceptance(histogram: Sequence[int]) -> Acceptance:
  """(a_1, a) from a tree pilot's accepted histogram.

  Args:
    histogram: [γ + 1] counts of the iterations that kept n = 0..γ guesses.

  Returns:
    a_1 = iterations that kept >= 1 / all iterations; a = guesses kept at
    depths >= 2 / the depth >= 2 tests made (an iteration that kept n >= 1
    passed n - 1 deeper tests and failed one more when n < γ). With γ = 1
    or no deeper test, a = a_1.
  """
  counts = np.asarray(histogram, np.float64)
  if counts.ndim != 1 or counts.size < 2 or np.any(counts < 0):
    raise ValueError(f"histogram={list(histogram)!r}: allowed: [γ + 1] "
                     "counts >= 0 of the iterations that kept n = 0..γ "
                     "guesses, γ >= 1.")
  gamma = counts.size - 1
  calls = counts.sum()
  if calls == 0:
    raise ValueError("histogram has no iterations: the pilot decoded nothing")
  first = float(counts[1:].sum() / calls)
  n = np.arange(1, gamma + 1)
  deeper_kept = float((n - 1) @ counts[1:])
  deeper_tests = float(np.minimum(n, gamma - 1) @ counts[1:])
  return first, (deeper_kept / deeper_tests if deeper_tests else first)


def first_depth_by_width(rounds: Sequence[int]) -> List[float]:
  """[k] a_1 of trees of k' = 1..k branches from a k-branch tree's calls
  counted by their first round ([k + 1]: `TreeOutput.first_round_histogram`
  summed over rows): the share of calls whose first round is below k'."""
  counts = np.asarray(rounds, np.float64)
  return [float(x) for x in np.cumsum(counts[:-1]) / max(counts.sum(), 1.0)]


def expected_tree_tokens(first: float, deeper: float, gamma: int) -> float:
  """E(γ, k) = 1 + a_1 · (1 + a + ... + a^(γ-1)): the model's tokens per
  iteration (k = 1, a_1 = a = α: Equation (1)'s (1 - α^(γ+1)) / (1 - α))."""
  return 1.0 + first * float(np.sum(deeper**np.arange(gamma)))


def tree_call_costs(call_seconds: Mapping[int, float]) -> np.ndarray:
  """[AUTO_TREE_MAX_NODES] the tree call's cost in target steps, entry N-1
  for N nodes: the N-node call's seconds over the one-token step's
  (`call_seconds[1]`), made non-decreasing in N (a running maximum: a call
  over more nodes does all the work of one over fewer, so a dip is timing
  noise, and pricing it low would pick too big a tree), interpolated
  linearly between the measured N."""
  ns = sorted(call_seconds)
  if not ns or ns[0] != 1:
    raise ValueError(f"call_seconds needs N=1 (the target step); got N={ns}")
  ratios = np.maximum.accumulate(
      [call_seconds[n] / call_seconds[1] for n in ns])
  return np.interp(np.arange(1, AUTO_TREE_MAX_NODES + 1), ns, ratios)


def _check_inputs(acceptance, cost_coefficients, call_costs, gammas):
  """ValueError naming the first bad argument of `best_tree_shape`."""
  if not acceptance:
    raise ValueError("acceptance is empty: allowed: {k: (a_1, a)} for k >= 1")
  for k, rates in acceptance.items():
    if not (isinstance(k, (int, np.integer)) and k >= 1):
      raise ValueError(f"acceptance has width {k!r}: allowed: integers >= 1")
    if len(rates) != 2 or not all(
        np.isfinite(r) and 0 <= r <= 1 for r in rates):
      raise ValueError(f"acceptance[{k}]={rates!r}: allowed: (a_1, a), "
                       "two numbers in [0, 1]")
    c = cost_coefficients.get(k)
    if c is None or not (np.isfinite(c) and c >= 0):
      raise ValueError(f"cost_coefficients[{k}]={c!r}: allowed: a finite "
                       "number >= 0 (one draft depth over one target step)")
  costs = np.asarray(call_costs, np.float64)
  if costs.ndim != 1 or costs.size < 2 or not np.all(
      np.isfinite(costs) & (costs > 0)):
    raise ValueError(f"call_costs={call_costs!r}: allowed: [N_max >= 2] "
                     "positive costs in target steps, entry N-1 for N nodes")
  if not gammas or min(gammas) < 1:
    raise ValueError(f"gammas={list(gammas)!r}: allowed: integers >= 1")
  if 1 + min(acceptance) * min(gammas) > costs.size:
    raise ValueError(
        f"no shape fits: the smallest tree, 1 + {min(acceptance)}·"
        f"{min(gammas)} nodes, is more than the {costs.size} priced")


def predicted_speedups(acceptance: Mapping[int, Acceptance],
                       cost_coefficients: Mapping[int, float],
                       call_costs: np.ndarray,
                       gammas: Sequence[int]) -> Dict[Tuple[int, int], float]:
  """{(γ, k): E(γ, k) / (γ·c_k + C(1 + k·γ))} for every γ in `gammas` and
  k in `acceptance` whose tree of 1 + k·γ nodes is priced.

  Args:
    acceptance: k -> (a_1, a) (`depth_acceptance`; k = 1: (α, α)).
    cost_coefficients: k -> c_k, one depth of the k-branch draft in target
      steps.
    call_costs: [N_max] the tree call over N nodes in target steps, entry
      N-1 (`tree_call_costs`).
    gammas: the γ to consider.
  """
  _check_inputs(acceptance, cost_coefficients, call_costs, gammas)
  costs = np.asarray(call_costs, np.float64)
  out = {}
  for k, (first, deeper) in sorted(acceptance.items()):
    for gamma in sorted(set(int(g) for g in gammas)):
      nodes = 1 + k * gamma
      if nodes <= costs.size:
        out[(gamma, k)] = expected_tree_tokens(first, deeper, gamma) / (
            gamma * float(cost_coefficients[k]) + costs[nodes - 1])
  return out


def _nodes_then_width(shape: Tuple[int, int]) -> Tuple[int, int]:
  gamma, width = shape
  return 1 + gamma * width, width


def best_tree_shape(acceptance: Mapping[int, Acceptance],
                    cost_coefficients: Mapping[int, float], call_costs,
                    gammas: Sequence[int]) -> Tuple[int, int]:
  """The (γ, k) maximizing `predicted_speedups` (same arguments); ties go
  to the fewer nodes, then the smaller k (fewer wasted draft steps and
  positions)."""
  speedups = predicted_speedups(acceptance, cost_coefficients, call_costs,
                                gammas)
  best = max(speedups.values())
  return min((s for s, v in speedups.items() if v == best),
             key=_nodes_then_width)


def _pilot_widths(plan: Loaded, feed, gamma: int, widths: Sequence[int],
                  batches: int) -> Tuple[Dict[int, Acceptance], int]:
  """({k: (a_1, a)} for each k in `widths`, tokens per row) from one pilot
  decode of `batches` batches with the widest k: a tree of k branches
  keeps a first guess exactly when the wide tree's first round
  (`tree_acceptance.first_round`) is below k; a, the deeper depths' rate,
  is the wide pilot's for every k."""
  width = max(widths)
  pilot = plan.decoding(gamma=gamma, tree_width=width)
  rng = jax.random.PRNGKey(plan.args.seed)
  histogram = np.zeros(gamma + 1, np.int64)
  rounds = np.zeros(width + 1, np.int64)
  tokens = 0
  examples = min(batches * plan.args.batch_size,
                 getattr(feed, "num_examples", 1 << 30))
  with console.phase(
      f"GAMMA/TREE_WIDTH='auto': pilot decode of the first {examples} "
      f"examples ({batches} batches, γ={gamma}, k={width}; compiling first)"):
    padded = feed.widest(batches)  # one compile, not one per width
    for b in range(batches):
      out = multihost.to_host(pilot.speculative(feed.batch(b, padded), rng))
      stats = out.statistics()
      histogram += np.asarray(stats["accepted_histogram"])
      rounds += np.asarray(out.first_round_histogram).sum(0)
      tokens += stats["tokens_generated"]
  deeper = depth_acceptance(histogram)[1]
  first = first_depth_by_width(rounds)
  acceptance = {int(k): (first[k - 1], deeper) for k in widths}
  return acceptance, tokens // (batches * plan.args.batch_size)


def pilot_tree_shape(plan: Loaded, feed) -> Dict[str, Any]:
  """(γ, k) for a tree run with GAMMA='auto' and/or TREE_WIDTH='auto': a
  pilot decode of the first examples with each k considered, the calls
  priced (`step_costs.price_tree_shapes`), then `best_tree_shape`.

  Args:
    plan: the loaded plan (GAMMA and/or TREE_WIDTH 'auto').
    feed: the run's batches (`multihost.Feeder`).

  Returns:
    metrics.json's `gamma_auto`: the pilot's γ, widths and batches, (a_1,
    a) and c_k by k, the tree call's costs by N, the predicted speedups,
    the chosen γ and k.
  """
  args, sizes = plan.args, plan.plan.providers.pilot_sizes
  gamma = sizes.gamma_pilot if args.auto_gamma else int(args.gamma)
  gammas = list(sizes.gammas) if args.auto_gamma else [args.gamma]
  widths = list(
      sizes.tree_widths) if args.auto_tree_width else [args.tree_width]
  if args.method().is_greedy:  # greedy branches start with distinct tokens
    widths = [k for k in widths if k <= plan.target_config.vocab_size]
  batches = min(feed.num_batches,
                max(1, auto_gamma.AUTO_GAMMA_EXAMPLES // args.batch_size))
  acceptance, fill = _pilot_widths(plan, feed, gamma, widths, batches)
  rng = jax.random.PRNGKey(args.seed)
  base = plan.decoding(gamma=gamma, tree_width=widths[0])
  with console.phase(
      f"GAMMA/TREE_WIDTH='auto': pricing a target step, the tree call at N "
      f"in {list(AUTO_TREE_CALL_NODES)} nodes and the draft at k in {widths}"):
    seconds = step_costs.price_tree_shapes(
        args, plan.drafter, plan.models.target, feed.batch(0), max(1, fill),
        base.baseline(feed.batch(0), rng).tokens, gamma=gamma, widths=widths,
        nodes=AUTO_TREE_CALL_NODES, pricing=plan.plan.providers.pricing)
  c_by_width = {
      k: t / seconds["step"] for k, t in seconds["draft_depth"].items()
  }
  costs = tree_call_costs(seconds["tree"])
  speedups = predicted_speedups(acceptance, c_by_width, costs, gammas)
  chosen_gamma, chosen_width = best_tree_shape(acceptance, c_by_width, costs,
                                               gammas)
  logging.info(
      "GAMMA/TREE_WIDTH='auto': acceptance (a_1, a) by k %s, c by k %s, "
      "tree calls of %s steps (N = 1..%d) on %d batches (γ=%d) -> γ=%d, "
      "k=%d", acceptance, c_by_width,
      np.round(costs, 2).tolist(), AUTO_TREE_MAX_NODES, batches, gamma,
      chosen_gamma, chosen_width)
  return {
      "pilot_gamma": gamma,
      "pilot_tree_widths": widths,
      "pilot_batches": batches,
      "alpha": acceptance[widths[0]][1],
      "cost_coefficient_c": c_by_width[widths[0]],
      "acceptance_by_tree_width": {
          str(k): {
              "first_depth": a[0],
              "deeper_depths": a[1]
          } for k, a in acceptance.items()
      },
      "cost_coefficient_by_tree_width": {
          str(k): c for k, c in c_by_width.items()
      },
      "tree_call_cost_by_nodes": [float(x) for x in costs],
      "predicted_speedup": {
          f"gamma={g},k={k}": v for (g, k), v in sorted(speedups.items())
      },
      "max_gamma": max(gammas),
      "max_nodes": AUTO_TREE_MAX_NODES,
      "chosen_gamma": chosen_gamma,
      "chosen_tree_width": chosen_width,
      # The model's E(γ, k) at the choice: against the run's measured
      # tokens_per_target_call, a check of the model.
      "predicted_tokens_per_call": expected_tree_tokens(
          *acceptance[chosen_width], chosen_gamma),
  }
