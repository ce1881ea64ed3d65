"""MODE='walltime': both decoders timed over the examples (the paper's
experiment), one call of each kind priced (`StepTimes`), and metrics.json.
"""
import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.data import tasks
from specdec_jax.experiment import batches as batches_lib
from specdec_jax.experiment import predictions
from specdec_jax.experiment import price_cache
from specdec_jax.experiment import summary
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.metrics import analysis
from specdec_jax.metrics import exactness
from specdec_jax.metrics import overheads
from specdec_jax.metrics import quality as quality_lib
from specdec_jax.metrics import run_metrics
from specdec_jax.terminal import console

Tally = batches_lib.Tally


@dataclasses.dataclass(frozen=True)
class Decoded:
  """Both decoders' tallies, [N, T] tokens (0 after EOS), texts, records
  and seconds (the slowest process's) over the N examples, on the host."""
  base: Tally
  spec: Tally
  base_tokens: np.ndarray
  spec_tokens: np.ndarray
  base_text: List[str]
  spec_text: List[str]
  per_example: List[Dict[str, Any]]
  time_base: float
  time_spec: float

  @property
  def tokens_generated(self) -> int:
    return int(np.sum(self.spec_tokens != 0))

  @property
  def batches(self) -> overheads.BatchTimes:
    return overheads.BatchTimes(
        *(np.asarray(c)
          for c in (self.base.seconds, self.spec.seconds, self.base.iterations,
                    self.spec.iterations, self.base.rows)))


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds of a one-token target call, one guess (a tree: one depth of
  k branches) and the verification call (a tree: over 1 + k·γ nodes)."""
  target_step_s: float
  draft_step_s: float
  verification_call_s: float

  @property
  def cost_coefficient(self) -> float:
    """c of Definition 3.7."""
    return self.draft_step_s / self.target_step_s


def decode_examples(plan: DecodePlan, feed: multihost.Feeder,
                    examples: Sequence[Dict[str, Any]],
                    writer: predictions.PredictionsWriter) -> Decoded:
  """Both decoders on every batch, timed; each batch's rows written as it
  finishes (nothing measured in them). SPECULATION='auto': each batch's
  speculative decoder is `plan.online`'s choice."""
  clock = plan.providers.clock
  base, spec = Tally(), Tally()
  base_tokens, spec_tokens, base_text, spec_text, per_example = ([], [], [], [],
                                                                 [])
  current = plan
  for batch in batches_lib.batches(feed, plan.rng):
    out_b, dt_b = batch.decode(plan.baseline, clock)
    if current.mode.target_alone:  # one decode, the baseline's, both columns
      out_s, dt_s = current.speculative.of_baseline(out_b), dt_b
    else:
      out_s, dt_s = batch.decode(current.speculative, clock)
    keep = batch.keep
    base.add(out_b, keep, seconds=dt_b)
    spec.add(out_s, keep, current.mode, dt_s)
    base_tokens.append(np.asarray(out_b.tokens)[keep])
    spec_tokens.append(np.asarray(out_s.tokens)[keep])
    start = len(per_example)
    base_text += tasks.decode_tokens(plan.vocab, base_tokens[-1])
    spec_text += tasks.decode_tokens(plan.vocab, spec_tokens[-1])
    records = (predictions.traces(plan.vocab, out_s, keep) if
               current.mode.one_path else predictions.tree_traces(out_s, keep))
    per_example.extend(records)
    writer.add([
        predictions.row(start + j, examples[start + j], spec_text[start + j],
                        len(r["accepted_counts"]), base_text[start + j], r)
        for j, r in enumerate(records)
    ])
    logging.info(
        "batch %d/%d: baseline %.3fs, speculative %.3fs (running speedup "
        "%.2fx)", batch.index + 1, feed.num_batches, dt_b, dt_s,
        sum(base.seconds) / max(sum(spec.seconds), 1e-9))
    if plan.online is not None:  # the next batch's choice (between batches)
      current = plan.online.after_batch(batch, dt_b, dt_s, out_s, feed)
  return Decoded(base, spec, np.concatenate(base_tokens),
                 np.concatenate(spec_tokens), base_text, spec_text, per_example,
                 sum(base.seconds), sum(spec.seconds))


def run_walltime(plan: DecodePlan, feed: multihost.Feeder,
                 examples: Sequence[Dict[str, Any]], data_info: Dict[str, Any],
                 on_result: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
  """MODE='walltime' end to end; metrics.json (a sweep's "done") written
  last, after `on_result(metrics)` (the summary: a failed write loses no
  result). Returns metrics.json's dict."""
  compile_s = batches_lib.compile_widths(feed,
                                         [("baseline", plan.baseline),
                                          ("speculative", plan.speculative)],
                                         plan.rng)
  out = plan.args.output_dir
  writer = predictions.PredictionsWriter(out, multihost.is_first())
  try:
    decoded = decode_examples(plan, feed, examples, writer)
  except KeyboardInterrupt:
    writer.close()
    raise KeyboardInterrupt(f"kept {writer.kept()}; "
                            f"{run_metrics.METRICS_FILE} was not "
                            "written") from None
  ended, auto, switch_compile_s = (plan.online.outcome() if plan.online else
                                   (plan, None, 0.0))
  steps = None
  if _priced(ended, run_metrics.switched(auto)):
    with console.phase(ended.mode.pricing_words(plan.args)):
      # On batch 0, the cache filled to the mean output length, the
      # drafter reading the baseline's output (`step_costs.price_calls`).
      batch = feed.batch(0)
      steps = StepTimes(*plan.mode.price(
          plan.args, plan.drafter, plan.models.target, batch,
          int(decoded.tokens_generated / len(examples)),
          plan.baseline(batch, plan.rng).tokens, plan.providers.pricing))
  decoded, compile_s, steps = slowest_process(decoded,
                                              compile_s + switch_compile_s,
                                              steps)
  references = [e["reference"] for e in examples]
  quality = plan.quality(decoded.base_text, decoded.spec_text, references)
  if plan.args.temperature > 0 and "bleu" in quality and not plan.mode.beam:
    quality["quality_noise"] = quality_lib.paired_bootstrap_bleu(
        decoded.base_text, decoded.spec_text, references)
  metrics = walltime_metrics(ended, decoded, quality, compile_s, steps,
                             data_info, auto).to_dict()
  on_result(metrics)

  multihost.run_on_first(  # the others wait for it
      "write",
      lambda: predictions.publish(writer, len(
          examples), os.path.join(out, run_metrics.METRICS_FILE), metrics))
  logging.info("%s; wrote %s", summary.log_words(metrics), out)
  return metrics


def _priced(plan: DecodePlan, switched: bool) -> bool:
  """Whether c and the call are priced (else a line says why not)."""
  if switched:
    logging.info("SPECULATION='auto' switched choices: c and the theory are "
                 "not priced (metrics.json's auto.segments: each choice's "
                 "predicted and measured speedup)")
  elif not plan.mode.priced:
    logging.info(
        "%s: c and Theorem 3.8 are not priced (they model sampling "
        "one sequence)", plan.mode.description)
  elif not plan.args.price_call_cost:
    logging.info("PRICE_CALL_COST=False: c and the verification call are "
                 "not priced (metrics.json: call_cost_priced false, no "
                 "theory)")
  else:
    return True
  return False


def slowest_process(decoded: Decoded, compile_s: float,
                    steps: Optional[StepTimes]):
  """(decoded, compile_s, steps) with the slowest process's seconds, in
  one collective (steps None: not priced)."""
  base, spec, compile_s, *calls = multihost.slowest(
      decoded.time_base, decoded.time_spec, compile_s,
      *(() if steps is None else dataclasses.astuple(steps)))
  return (dataclasses.replace(decoded,
                              time_base=base, time_spec=spec), compile_s,
          StepTimes(*calls) if calls else None)


def walltime_metrics(plan: DecodePlan, decoded: Decoded,
                     quality: Dict[str, Dict[str, Any]], compile_s: float,
                     steps: Optional[StepTimes], data_info: Dict[str, Any],
                     auto: Optional[Dict[str, Any]]) -> run_metrics.RunMetrics:
  """The run's metrics.json.

  `plan`: the settings it records (SPECULATION='auto': the choice it
  ended with); `quality`: {'bleu' or 'rouge': {'baseline', 'speculative'}}
  (and 'quality_noise'); `steps` None: not priced (c, theory null).
  """
  args, spec = plan.args, decoded.spec
  c = None if steps is None else steps.cost_coefficient
  alpha, switched = spec.alpha, run_metrics.switched(auto)
  greedy = args.temperature == 0
  base_tokens, spec_tokens = decoded.base_tokens, decoded.spec_tokens
  identity = exactness.greedy_identity(base_tokens, spec_tokens)
  tokens = decoded.tokens_generated
  return run_metrics.RunMetrics(
      task=args.label,
      target_model=args.target_name,
      gamma=args.gamma,
      temperature=args.temperature,
      top_k=args.top_k,
      top_p=args.top_p,
      batch_size=args.batch_size,
      alpha=float(alpha),
      alpha_beta=spec.alpha_beta,
      alpha_stderr=float(
          np.sqrt(alpha * (1 - alpha) / max(spec.trials, 1.0)
                 ) if switched else  # pooled over the choices' trials
          analysis.alpha_standard_error_from_counts(spec.histogram, args.gamma)
      ),
      accepted_histogram=spec.histogram.tolist(),
      num_examples=len(base_tokens),
      tokens_generated=tokens,
      tokens_generated_baseline=int(np.sum(base_tokens != 0)),
      target_calls_baseline=decoded.base.calls,
      target_calls_speculative=spec.calls,
      tokens_per_target_call=tokens / max(spec.calls, 1),
      walltime_baseline_s=decoded.time_base,
      walltime_speculative_s=decoded.time_spec,
      speedup=decoded.time_base / decoded.time_spec,
      compile_time_s=compile_s,
      target_step_s=None if steps is None else steps.target_step_s,
      draft_step_s=None if steps is None else steps.draft_step_s,
      cost_coefficient_c=c,
      call_cost_priced=(False if steps is None and plan.mode.priced and
                        not switched else None),
      **({} if steps is None else theory_metrics(plan, decoded, steps)),
      # Token-for-token identity is the test of exactness at T = 0 only:
      # sampled outputs (T > 0) are compared by distribution (null here).
      greedy_outputs_identical=(identity["identical"] == identity["examples"]
                                if greedy else None),
      greedy_identical_examples=identity["identical"] if greedy else None,
      **quality,
      random_weights=args.random_weights,
      backend=jax.default_backend(),
      device_kind=jax.devices()[0].device_kind,
      num_devices=jax.device_count(),
      machine=price_cache.machine_fields(),
      synthetic=False,
      **data_info,
      settings=plan.settings,
      **drafting_metrics(plan, decoded.per_example, tokens, c),
      **plan.mode.metrics(args, decoded),  # DECODE and the mode's own keys
      **run_metrics.speculation_keys(args.speculation, auto))


def theory_metrics(plan: DecodePlan, decoded: Decoded,
                   steps: StepTimes) -> Dict[str, Any]:
  """metrics.json's Theorem 3.8 keys, the call's cost and the loops'
  overheads (issue 32); a tree's `theoretical_speedup_measured_call_cost`
  is its own cost model (`DecodeMode.measured_theory`)."""
  gamma, c = plan.args.gamma, steps.cost_coefficient
  calls_base, calls_spec = decoded.base.calls, decoded.spec.calls
  alpha = min(decoded.spec.alpha, 1.0)
  ratio = steps.verification_call_s / steps.target_step_s
  measured = plan.mode.measured_theory(
      alpha, gamma, c, ratio, decoded.tokens_generated / max(calls_spec, 1))
  out = {
      "theoretical_speedup": float(analysis.expected_speedup(alpha, gamma, c)),
      "verification_call_s": steps.verification_call_s,
      "verification_cost_ratio": ratio,
      "theoretical_speedup_measured_call_cost": measured,
      "iteration_overhead":
          (decoded.time_spec / max(calls_spec, 1) /
           (gamma * steps.draft_step_s + steps.verification_call_s)),
      "baseline_overhead":
          (decoded.time_base / max(calls_base, 1) / steps.target_step_s),
  }
  out.update(
      overheads.efficiency_split(
          alpha, gamma, decoded.spec_tokens, (calls_base, calls_spec),
          (sum(decoded.base.iterations), sum(decoded.spec.iterations)), out,
          one_path=plan.mode.one_path))
  out.update(
      overheads.fixed_cost_metrics(
          decoded.batches, steps.target_step_s,
          gamma * steps.draft_step_s + steps.verification_call_s))
  return out


def draft_label(plan: DecodePlan) -> str:
  """metrics.json's `draft_model`, variants named (the report's key)."""
  args, gamma_auto = plan.args, plan.gamma_auto
  label = args.drafting.label(args.draft_name)
  if args.drafting.adaptive_threshold is not None:
    label += f" adaptive {args.drafting.adaptive_threshold:g}"
  if gamma_auto and "chosen_tree_width" in gamma_auto:
    label += " auto-(γ,k)"
  elif gamma_auto:
    label += " auto-γ"
  if plan.mode.lenience != 1:
    label += f" l={plan.mode.lenience:g}"
  return label + plan.mode.label(args)


def drafting_metrics(plan: DecodePlan, per_example: List[Dict[str, Any]],
                     tokens: int, c: Optional[float]) -> Dict[str, Any]:
  """metrics.json's drafter, lenience, adaptive-γ and GAMMA='auto' keys
  (`per_example`: predictions.jsonl's traces; c None: not priced)."""
  args, mode = plan.args, plan.mode
  # A tree or beams: a one-path bound means nothing.
  per_call = mode.guesses_per_call(args)
  tree = mode.record() if mode.branches else {}  # its TREE_* settings
  if per_call is not None:
    guessed, bound = [per_call], None
  else:
    # A run that switched (SPECULATION='auto'): the one-path calls only.
    calls = [t for e in per_example for t in e["trace"] or ()]
    kept = [t["num_accepted"] for t in calls]
    guessed = [len(t["draft_tokens"]) for t in calls]
    bound = None if c is None else analysis.per_iteration_gamma_bound(
        kept, guessed, args.gamma, c, tokens)  # c None: not priced
  return {
      "drafter": args.drafting.name,
      "draft_model": draft_label(plan),
      "drafter_settings": args.drafting.record(args.ngram_corpus),
      "lenience": mode.lenience,
      "acceptance": mode.acceptance,
      # Omitted from metrics.json unless ACCEPTANCE='tree' (`RunMetrics`).
      "tree_width": tree.get("tree_width"),
      "tree_without_replacement": tree.get("tree_without_replacement"),
      "exact": mode.lenience == 1,
      "adaptive_threshold": args.drafting.adaptive_threshold,
      "gamma_auto": plan.gamma_auto,
      "guesses_per_target_call": float(np.mean(guessed)) if guessed else 0.0,
      # §3.5: Theorem 3.8's cost model of this run's calls drafting γ,
      # what they did, and what was kept (the oracle).
      "per_iteration_gamma": None if bound is None else {
          "fixed_gamma_speedup": bound["fixed"],
          "achieved_speedup": bound["achieved"],
          "oracle_speedup": bound["oracle"]
      },
  }
