"""The run's drafting choices, measured: GAMMA='auto' (α and c on the first
batches, then Theorem 3.8), the price of one guess of a drafter that is not
a model step, and the drafter / lenience / adaptive-γ keys of metrics.json.
"""
from typing import Any, Dict, List, Optional

from absl import logging
import jax
import numpy as np

from specdec_jax import analysis
from specdec_jax import decoding
from specdec_jax import multihost
from specdec_jax import timing
from specdec_jax.drafters import choice as drafter_choice
from specdec_jax.experiment import arguments


def draft_seconds(args: arguments.RunArguments, drafter, target, draft,
                  batch: jax.Array, gamma: int, fill: int) -> float:
  """One draft step (DRAFTER='model'), or one guess of `drafter`: its
  `propose` on the target's own output for `batch`, divided by γ.

  Timed as `timing.decode_call_seconds` times a step: the speculative
  loop's cache (max_decode_length + γ + 1 slots) filled to `fill`.
  """
  cache_len = args.max_decode_length + gamma + 1
  inputs = np.asarray(multihost.to_host(batch))
  if args.drafter == "model":
    return timing.decode_call_seconds(draft, inputs, k=1, fill=fill,
                                      cache_len=cache_len)
  method = args.method()
  context = np.asarray(multihost.to_host(decoding.temperature_sample(
      target, batch, jax.random.PRNGKey(args.seed),
      max_decode_length=args.max_decode_length, method=method).tokens))
  buffer = np.pad(context, ((0, 0), (1, gamma + 2)))
  return drafter_choice.propose_seconds(
      drafter, inputs, buffer,
      np.full((len(inputs),), max(fill, 1), np.int32), gamma=gamma,
      method=method, max_len=cache_len) / gamma


def cost_coefficient(args: arguments.RunArguments, drafter, target, draft,
                     batch: jax.Array, gamma: int, fill: int) -> float:
  """c: one draft step (or guess) over one target step, both timed as
  `draft_seconds` times."""
  cache_len = args.max_decode_length + gamma + 1
  seconds = draft_seconds(args, drafter, target, draft, batch, gamma, fill)
  return seconds / timing.decode_call_seconds(
      target, np.asarray(multihost.to_host(batch)), k=1, fill=fill,
      cache_len=cache_len)


def call_costs(args: arguments.RunArguments, target, batch: jax.Array,
               fill: int) -> np.ndarray:
  """[AUTO_GAMMA_MAX] the target's (γ+1)-token call in target steps for
  γ = 1..AUTO_GAMMA_MAX (`drafter_choice.call_costs`), timed as a step."""
  cache_len = args.max_decode_length + drafter_choice.AUTO_GAMMA_MAX + 1
  inputs = np.asarray(multihost.to_host(batch))
  fill = min(fill, cache_len - drafter_choice.AUTO_GAMMA_MAX - 1)
  return drafter_choice.call_costs({
      k: timing.decode_call_seconds(target, inputs, k=k, fill=fill,
                                    cache_len=cache_len)
      for k in drafter_choice.AUTO_GAMMA_CALL_KS})


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
  batches = min(feed.num_batches, max(
      1, drafter_choice.AUTO_GAMMA_EXAMPLES // args.batch_size))
  kept = trials = tokens = rows = 0
  for b in range(batches):
    stats = multihost.to_host(speculative(feed.batch(b), rng)).statistics()
    kept += int(np.arange(pilot + 1) @ np.asarray(
        stats["accepted_histogram"]))
    trials += stats["acceptance_trials"]
    tokens += stats["tokens_generated"]
    rows += args.batch_size
  alpha = kept / max(trials, 1)
  fill = max(1, tokens // rows)
  c = cost_coefficient(args, drafter, target, draft, feed.batch(0), pilot,
                       fill)
  costs = call_costs(args, target, feed.batch(0), fill)
  chosen = drafter_choice.choose_gamma(alpha, c, costs)
  logging.info("GAMMA='auto': alpha %.3f, c %.3f and verification calls "
               "of %s steps on %d batches (γ=%d) -> γ=%d (Theorem 3.8)",
               alpha, c, np.round(costs, 2).tolist(), batches, pilot,
               chosen)
  return {"pilot_gamma": pilot, "pilot_batches": batches,
          "alpha": alpha, "cost_coefficient_c": c,
          "call_cost_by_gamma": [float(x) for x in costs],
          "max_gamma": drafter_choice.AUTO_GAMMA_MAX,
          "chosen_gamma": chosen}


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
  return label


def drafting_metrics(args: arguments.RunArguments,
                     per_example: List[Dict[str, Any]], tokens: int,
                     c: float, gamma_auto: Optional[Dict[str, Any]]
                     ) -> Dict[str, Any]:
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
  guessed = [len(t["draft_tokens"]) for e in per_example
             for t in e["trace"]]
  bound = analysis.per_iteration_gamma_bound(kept, guessed, args.gamma, c,
                                             tokens)
  return {
      "drafter": args.drafter,
      "draft_model": draft_label(args, gamma_auto),
      "drafter_settings": args.drafting.record(),
      "lenience": args.lenience,
      "exact": args.lenience == 1,
      "adaptive_threshold": args.adaptive_threshold,
      "gamma_auto": gamma_auto,
      "guesses_per_target_call": float(np.mean(guessed)) if guessed else 0.0,
      # §3.5: Theorem 3.8's cost model (target call 1, guess c) applied to
      # this run's iterations: every call drafting γ, drafting what it
      # did, and drafting exactly what was kept (the per-call oracle).
      "per_iteration_gamma": {"fixed_gamma_speedup": bound["fixed"],
                              "achieved_speedup": bound["achieved"],
                              "oracle_speedup": bound["oracle"]},
  }
