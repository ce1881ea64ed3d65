"""GAMMA='auto': Theorem 3.8's best γ for the α, c and verification-call
costs measured on the run's first examples (`pilot_gamma`), and the checks
and cost curve it needs.
"""
from typing import Any, Dict, Optional

from absl import logging
import jax
import numpy as np

from specdec_jax import analysis
from specdec_jax import multihost
from specdec_jax.experiment import arguments
from specdec_jax.experiment import step_costs
from specdec_jax.experiment.plan import RunPlan

AUTO_GAMMA = arguments.AUTO_GAMMA
# GAMMA='auto': decode the first AUTO_GAMMA_EXAMPLES examples with γ =
# AUTO_GAMMA_PILOT, then take Theorem 3.8's best γ <= AUTO_GAMMA_MAX for
# the measured α and c.
AUTO_GAMMA_PILOT = 4
AUTO_GAMMA_MAX = 12
AUTO_GAMMA_EXAMPLES = 8
# The verification call's cost is measured at these K = γ + 1 and
# interpolated linearly in between (on a CPU it grows with K; the theorem's
# "one step" would make near-free drafters pick γ = AUTO_GAMMA_MAX).
AUTO_GAMMA_CALL_KS = (1, 2, 4, 7, AUTO_GAMMA_MAX + 1)


def call_costs(call_seconds: Dict[int, float]) -> np.ndarray:
  """[AUTO_GAMMA_MAX] verification-call costs in target steps, entry γ-1
  for γ: the K = γ+1 call's seconds over the K = 1 call's, linearly
  interpolated between the measured K (`call_seconds`: K -> seconds, K = 1
  included)."""
  ks = sorted(call_seconds)
  if ks[0] != 1:
    raise ValueError(f"call_seconds needs K=1 (the target step); got K={ks}")
  ratios = [call_seconds[k] / call_seconds[1] for k in ks]
  return np.interp(np.arange(2, AUTO_GAMMA_MAX + 2), ks, ratios)


def best_gamma(alpha: float, cost_coefficient: float,
               costs: Optional[np.ndarray] = None) -> int:
  """GAMMA='auto': the γ <= AUTO_GAMMA_MAX maximizing Theorem 3.8, with the
  verification call priced by `costs` ([AUTO_GAMMA_MAX], `call_costs`) or
  at one step when None."""
  alpha = min(max(float(alpha), 0.0), 1.0)
  return analysis.optimal_gamma(alpha, max(float(cost_coefficient), 0.0),
                                max_gamma=AUTO_GAMMA_MAX, call_costs=costs)


def pilot_gamma(pilot: RunPlan, feed) -> Dict[str, Any]:
  """GAMMA='auto': α and c on the first batches, then Theorem 3.8.

  Args:
    pilot: the loaded plan at γ = AUTO_GAMMA_PILOT.
    feed: the run's batches (`multihost.Feeder`).

  Returns:
    metrics.json's `gamma_auto`: the pilot's γ and batches, its α and c,
    the verification costs by γ, the maximum and the chosen γ.
  """
  args = pilot.args
  gamma = args.gamma  # AUTO_GAMMA_PILOT
  rng = jax.random.PRNGKey(args.seed)
  batches = min(feed.num_batches, max(1,
                                      AUTO_GAMMA_EXAMPLES // args.batch_size))
  kept = trials = tokens = rows = 0
  for b in range(batches):
    stats = multihost.to_host(pilot.speculative(feed.batch(b),
                                                rng)).statistics()
    kept += int(np.arange(gamma + 1) @ np.asarray(stats["accepted_histogram"]))
    trials += stats["acceptance_trials"]
    tokens += stats["tokens_generated"]
    rows += args.batch_size
  alpha = kept / max(trials, 1)
  fill = max(1, tokens // rows)
  by_k, t_draft = step_costs.price_calls(
      args, pilot.drafter, pilot.models.target, feed.batch(0),
      AUTO_GAMMA_CALL_KS, fill,
      pilot.baseline(feed.batch(0), rng).tokens)
  c = t_draft / by_k[1]
  costs = call_costs(by_k)
  chosen = best_gamma(alpha, c, costs)
  logging.info(
      "GAMMA='auto': alpha %.3f, c %.3f and verification calls "
      "of %s steps on %d batches (γ=%d) -> γ=%d (Theorem 3.8)", alpha, c,
      np.round(costs, 2).tolist(), batches, gamma, chosen)
  return {
      "pilot_gamma": gamma,
      "pilot_batches": batches,
      "alpha": alpha,
      "cost_coefficient_c": c,
      "call_cost_by_gamma": [float(x) for x in costs],
      "max_gamma": AUTO_GAMMA_MAX,
      "chosen_gamma": chosen
  }
