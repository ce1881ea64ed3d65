"""GAMMA='auto': Theorem 3.8's best γ for the α, c and verification-call
costs measured on the run's first examples (`pilot_gamma`), and the checks
and cost curve it needs.
"""
import math
from typing import Any, Dict, Optional, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.experiment import arguments
from specdec_jax.experiment.plan import PILOT_SIZES
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import Providers
from specdec_jax.metrics import analysis
from specdec_jax.metrics import step_costs
from specdec_jax.terminal import console

AUTO_GAMMA = arguments.AUTO_GAMMA
# GAMMA='auto': decode the first AUTO_GAMMA_EXAMPLES examples with γ =
# `PilotSizes.gamma_pilot`, then take Theorem 3.8's best γ <= AUTO_GAMMA_MAX
# for the measured α and c (the default of `PilotSizes`, which a run takes
# from `Providers.pilot_sizes`).
AUTO_GAMMA_MAX = PILOT_SIZES.gamma_max
AUTO_GAMMA_EXAMPLES = 8
# The verification call's cost is measured at these K = γ + 1 and
# interpolated linearly in between (on a CPU it grows with K; the theorem's
# "one step" would make near-free drafters pick γ = AUTO_GAMMA_MAX).
AUTO_GAMMA_CALL_KS = (1, 2, 4, 7, AUTO_GAMMA_MAX + 1)
# The pilot's α is a proportion of acceptance trials: its 95% interval
# (Wilson's), and the γ chosen at either end, say how firm the choice is.
_Z95 = 1.96


def call_costs(call_seconds: Dict[int, float],
               max_gamma: int = AUTO_GAMMA_MAX) -> np.ndarray:
  """[max_gamma] verification-call costs in target steps, entry γ-1 for
  γ: the K = γ+1 call's seconds over the K = 1 call's, linearly
  interpolated between the measured K (`call_seconds`: K -> seconds, K = 1
  included)."""
  ks = sorted(call_seconds)
  if ks[0] != 1:
    raise ValueError(f"call_seconds needs K=1 (the target step); got K={ks}")
  ratios = [call_seconds[k] / call_seconds[1] for k in ks]
  return np.interp(np.arange(2, max_gamma + 2), ks, ratios)


def best_gamma(alpha: float, cost_coefficient: float,
               costs: Optional[np.ndarray] = None,
               max_gamma: int = AUTO_GAMMA_MAX) -> int:
  """GAMMA='auto': the γ <= max_gamma maximizing Theorem 3.8, with the
  verification call priced by `costs` ([max_gamma], `call_costs`) or at
  one step when None."""
  alpha = min(max(float(alpha), 0.0), 1.0)
  return analysis.optimal_gamma(alpha, max(float(cost_coefficient), 0.0),
                                max_gamma=max_gamma, call_costs=costs)


def alpha_interval(kept: int, trials: int) -> Tuple[float, float]:
  """Wilson's 95% interval of α = kept / trials ((0, 1) without trials).

  The trials of one sentence are not independent (an easy sentence keeps
  most guesses), so the true uncertainty is larger: a lower bound of it.
  """
  if trials <= 0:
    return 0.0, 1.0
  p, z2 = kept / trials, _Z95**2
  center = (p + z2 / (2 * trials)) / (1 + z2 / trials)
  half = _Z95 * math.sqrt(p * (1 - p) / trials + z2 /
                          (4 * trials**2)) / (1 + z2 / trials)
  return max(0.0, center - half), min(1.0, center + half)


def pilot_confidence(examples: int, kept: int, trials: int,
                     cost_coefficient: float,
                     costs: np.ndarray) -> Dict[str, Any]:
  """How firm the pilot's choice is (metrics.json's `gamma_auto`).

  Args:
    examples: the examples the pilot decoded.
    kept, trials: its kept guesses and acceptance trials (α = kept/trials).
    cost_coefficient: its c.
    costs: its verification costs by γ (`call_costs`).

  Returns:
    `pilot_examples`, `acceptance_trials`, `alpha_interval` (95%),
    `gamma_interval` (the γ chosen at either end of it) and `caveat`: a
    line when the pilot decoded fewer than AUTO_GAMMA_EXAMPLES examples
    (logged as a warning), else None.
  """
  low, high = alpha_interval(kept, trials)
  gammas = [
      int(best_gamma(a, cost_coefficient, costs, len(costs)))
      for a in (low, high)
  ]
  caveat = None
  if examples < AUTO_GAMMA_EXAMPLES:
    caveat = (
        f"GAMMA='auto': the pilot decoded {examples} "
        f"example{'s' if examples != 1 else ''}, fewer than the "
        f"{AUTO_GAMMA_EXAMPLES} it needs: alpha {kept / max(trials, 1):.2f} "
        f"from {trials} acceptance trials (95% interval {low:.2f} to "
        f"{high:.2f}: γ from {gammas[0]} to {gammas[1]}) is a rough "
        f"estimate; for a firm choice use NUM_EXAMPLES >= "
        f"{AUTO_GAMMA_EXAMPLES} (and that many lines of data), or an "
        "integer GAMMA.")
    logging.warning("%s", caveat)
  return {
      "pilot_examples": int(examples),
      "acceptance_trials": int(trials),
      "alpha_interval": [low, high],
      "gamma_interval": gammas,
      "caveat": caveat
  }


def pilot_gamma(pilot: DecodePlan, feed,
                providers: Optional[Providers] = None) -> Dict[str, Any]:
  """GAMMA='auto': α and c on the first batches, then Theorem 3.8.

  Args:
    pilot: the loaded plan at the pilot γ (`PilotSizes.gamma_pilot`).
    feed: the run's batches (`multihost.Feeder`).
    providers: the run's: its pilot sizes (the largest γ) and pricing
      (None: the defaults).

  Returns:
    metrics.json's `gamma_auto`: the pilot's γ and batches, its α and c,
    the verification costs by γ, the maximum and the chosen γ, and how
    firm the choice is (`pilot_confidence`: a caveat for a small pilot).
  """
  args, providers = pilot.args, providers or Providers()
  gamma = args.gamma  # the pilot γ
  max_gamma = providers.pilot_sizes.gamma_max
  rng = jax.random.PRNGKey(args.seed)
  batches = min(feed.num_batches, max(1,
                                      AUTO_GAMMA_EXAMPLES // args.batch_size))
  kept = trials = tokens = rows = 0
  sample = min(batches * args.batch_size, getattr(feed, "num_examples",
                                                  1 << 30))
  with console.phase(
      f"GAMMA='auto': pilot decode of the first {sample} examples "
      f"({batches} batches, γ={gamma}; compiling first)"):
    # One width for every pilot batch: one compile (`Feeder.widest`).
    width = feed.widest(batches)
    for b in range(batches):
      stats = multihost.to_host(pilot.speculative(feed.batch(b, width),
                                                  rng)).statistics()
      kept += int(
          np.arange(gamma + 1) @ np.asarray(stats["accepted_histogram"]))
      trials += stats["acceptance_trials"]
      tokens += stats["tokens_generated"]
      rows += args.batch_size
  alpha = kept / max(trials, 1)
  fill = max(1, tokens // rows)
  with console.phase("GAMMA='auto': pricing c and the target calls of K = "
                     f"{', '.join(map(str, AUTO_GAMMA_CALL_KS))} tokens"):
    by_k, t_draft = step_costs.price_calls(
        args, pilot.drafter, pilot.models.target, feed.batch(0),
        AUTO_GAMMA_CALL_KS, fill,
        pilot.baseline(feed.batch(0), rng).tokens, providers.pricing)
  c = t_draft / by_k[1]
  costs = call_costs(by_k, max_gamma)
  chosen = best_gamma(alpha, c, costs, max_gamma)
  # The last batch may hold padding rows: count the examples.
  examples = min(rows, getattr(feed, "num_examples", rows))
  confidence = pilot_confidence(examples, kept, trials, c, costs)
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
      "max_gamma": max_gamma,
      "chosen_gamma": chosen,
      **confidence
  }
