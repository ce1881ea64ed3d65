"""The run's drafting choices, measured: GAMMA='auto' (α and c on the first
batches, then Theorem 3.8), the price of one guess of a drafter that is not
a model step, and the drafter / lenience / adaptive-γ keys of metrics.json.
"""
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import analysis
from specdec_jax import decoding
from specdec_jax import multihost
from specdec_jax import timing
from specdec_jax.experiment import drafter_choice
from specdec_jax.experiment import arguments


def call_seconds(args: arguments.RunArguments, drafter, target, draft,
                 batch: jax.Array, target_ks: Tuple[int, ...],
                 fill: int) -> Tuple[Dict[int, float], float]:
  """The target's k-token calls and one draft step (or guess), in seconds.

  Timed the one way `timing.call_seconds` defines, on `batch`, with a cache
  of max_decode_length + max(target_ks) slots (the speculative loop's when
  max(target_ks) = γ+1) filled to `fill`; the target's calls and the draft
  model's step are timed in interleaved rounds. A drafter that is not a
  model step is priced by one `propose` on the target's own output for
  `batch`, divided by γ = max(target_ks) - 1.

  Args:
    target_ks: the target's k values to time (1, a step, is always
      timed; γ+1: the call).
    fill: the mean output length (clipped to the cache).

  Returns:
    ({k: seconds of the target's k-token call}, seconds of one draft step
    or guess).
  """
  gamma = max(target_ks) - 1
  cache_len = args.max_decode_length + gamma + 1
  fill = min(max(1, fill), cache_len - gamma - 1)
  inputs = np.asarray(multihost.to_host(batch))
  # k = 1 first: the reference the others' ratios are taken to.
  calls = {k: (target, k) for k in sorted(set(target_ks) | {1})}
  if args.drafting.is_model_step:
    calls["draft"] = (draft, 1)
  seconds = timing.call_seconds(calls, inputs, fill=fill, cache_len=cache_len)
  t_draft = seconds.pop("draft", None)
  if t_draft is None:
    method = args.method()
    context = np.asarray(
        multihost.to_host(
            decoding.temperature_sample(
                target, batch, jax.random.PRNGKey(args.seed),
                max_decode_length=args.max_decode_length,
                method=method).tokens))
    buffer = np.pad(context, ((0, 0), (1, gamma + 2)))
    t_draft = drafter_choice.propose_seconds(
        drafter, inputs, buffer, np.full((len(inputs),), fill, np.int32),
        gamma=gamma, method=method, max_len=cache_len) / gamma
  return seconds, t_draft


def choose_gamma(args: arguments.RunArguments, speculative, feed, drafter,
                 target, draft) -> Dict[str, Any]:
  """GAMMA='auto': α and c on the first batches, then Theorem 3.8.

  Args:
    args: the run's arguments.
    speculative: the speculative decoder at γ = AUTO_GAMMA_PILOT.
    feed: the run's batches (`multihost.Feeder`).
    drafter, target, draft: the run's drafter and models.

  Returns:
    metrics.json's `gamma_auto`: the pilot's γ and batches, its α and c,
    the verification costs by γ, the maximum and the chosen γ.
  """
  pilot = drafter_choice.AUTO_GAMMA_PILOT
  rng = jax.random.PRNGKey(args.seed)
  batches = min(feed.num_batches,
                max(1, drafter_choice.AUTO_GAMMA_EXAMPLES // args.batch_size))
  kept = trials = tokens = rows = 0
  for b in range(batches):
    stats = multihost.to_host(speculative(feed.batch(b), rng)).statistics()
    kept += int(np.arange(pilot + 1) @ np.asarray(stats["accepted_histogram"]))
    trials += stats["acceptance_trials"]
    tokens += stats["tokens_generated"]
    rows += args.batch_size
  alpha = kept / max(trials, 1)
  fill = max(1, tokens // rows)
  by_k, t_draft = call_seconds(args, drafter, target, draft, feed.batch(0),
                               drafter_choice.AUTO_GAMMA_CALL_KS, fill)
  c = t_draft / by_k[1]
  costs = drafter_choice.call_costs(by_k)
  chosen = drafter_choice.choose_gamma(alpha, c, costs)
  logging.info(
      "GAMMA='auto': alpha %.3f, c %.3f and verification calls "
      "of %s steps on %d batches (γ=%d) -> γ=%d (Theorem 3.8)", alpha, c,
      np.round(costs, 2).tolist(), batches, pilot, chosen)
  return {
      "pilot_gamma": pilot,
      "pilot_batches": batches,
      "alpha": alpha,
      "cost_coefficient_c": c,
      "call_cost_by_gamma": [float(x) for x in costs],
      "max_gamma": drafter_choice.AUTO_GAMMA_MAX,
      "chosen_gamma": chosen
  }


def draft_label(args: arguments.RunArguments, gamma_auto) -> str:
  """metrics.json's `draft_model`: the report tells drafts apart by it, so
  variants (adaptive γ, GAMMA='auto', lenience) get their own."""
  label = args.drafting.label(args.draft_name)
  if args.adaptive_threshold is not None:
    label += f" adaptive {args.adaptive_threshold:g}"
  if gamma_auto:
    label += " auto-γ"
  if args.lenience != 1:
    label += f" l={args.lenience:g}"
  if args.acceptance != "token":
    label += f" {args.acceptance}"
  return label


def drafting_metrics(args: arguments.RunArguments,
                     per_example: List[Dict[str, Any]], tokens: int, c: float,
                     gamma_auto: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """metrics.json's drafter, lenience, adaptive-γ and GAMMA='auto' keys.

  Args:
    args: the run's arguments (GAMMA='auto': with the chosen γ).
    per_example: predictions.jsonl's records (their traces: guesses made
      and kept per target call).
    tokens: tokens generated.
    c: the measured cost coefficient.
    gamma_auto: `choose_gamma`'s record, or None.
  """
  kept = [t["num_accepted"] for e in per_example for t in e["trace"]]
  guessed = [len(t["draft_tokens"]) for e in per_example for t in e["trace"]]
  bound = analysis.per_iteration_gamma_bound(kept, guessed, args.gamma, c,
                                             tokens)
  return {
      "drafter": args.drafter,
      "draft_model": draft_label(args, gamma_auto),
      "drafter_settings": args.drafting.record(),
      "lenience": args.lenience,
      "acceptance": args.acceptance,
      "exact": args.lenience == 1,
      "adaptive_threshold": args.adaptive_threshold,
      "gamma_auto": gamma_auto,
      "guesses_per_target_call": float(np.mean(guessed)) if guessed else 0.0,
      # §3.5: Theorem 3.8's cost model (target call 1, guess c) applied to
      # this run's iterations: every call drafting γ, drafting what it
      # did, and drafting exactly what was kept (the per-call oracle).
      "per_iteration_gamma": {
          "fixed_gamma_speedup": bound["fixed"],
          "achieved_speedup": bound["achieved"],
          "oracle_speedup": bound["oracle"]
      },
  }
