"""MODE='walltime': both decoders timed over the examples (the paper's
experiment), the cost coefficient c, and the `RunMetrics` they make.

`choose_shape` runs GAMMA='auto''s pilot (`auto_gamma`, `auto_tree`)
before anything is timed; `run_walltime` is the one decode path, end to
end: compile every decoder for every input width
(`compile_decoders`); decode each batch with the target alone and with
speculative decoding (SPECULATION='auto': the choice of the batches before,
`auto_switch`), timing each call, decoding its text once and writing
its predictions.jsonl rows (`decode_examples`); time one target step, one
draft step (or one guess) and the (γ+1)-token verification call the one way
`timing` defines (`step_times`); put it together (`walltime_metrics`) and
write metrics.json.
"""
import dataclasses
import functools
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.core import decoding
from specdec_jax.data import tasks
from specdec_jax.experiment import arguments
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment import auto_mode
from specdec_jax.experiment import auto_run
from specdec_jax.experiment import auto_switch
from specdec_jax.experiment import auto_tree
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import predictions
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import Loaded
from specdec_jax.metrics import analysis
from specdec_jax.metrics import overheads
from specdec_jax.metrics import run_metrics
from specdec_jax.terminal import console

Decoder = decoding.Decoder


@dataclasses.dataclass(frozen=True)
class Decoded:
  """Both decoders' outputs over all examples (N of them, T = max decode
  length), on the host.

  Attributes:
    base_tokens: [N, T] the target alone's tokens (0 after EOS).
    spec_tokens: [N, T] speculative decoding's tokens.
    base_text / spec_text: N decoded strings of each.
    per_example: N predictions.jsonl records (`predictions.traces`).
    time_base / time_spec: seconds of all timed calls of each decoder.
    calls_base / calls_spec: target calls of each decoder.
    histogram: [γ + 1] target calls that kept n = 0..γ guesses.
    beta_sum / beta_count: Σ β and the acceptance trials it is over; None
      for a tree run (`TreeOutput` computes no β: `alpha` counts trials
      from the histogram).
    batches: each batch's seconds and iterations (`BatchTimes`), or None.
    trials: a run that switched choices (SPECULATION='auto'): the
      acceptance trials of its speculative batches, each counted as its
      choice counts them (β's for token and block verification, min(n + 1,
      γ) per call for trees and beams); `histogram` is then as wide as
      the largest γ. None otherwise.
  """
  base_tokens: np.ndarray
  spec_tokens: np.ndarray
  base_text: List[str]
  spec_text: List[str]
  per_example: List[Dict[str, Any]]
  time_base: float
  time_spec: float
  calls_base: int
  calls_spec: int
  histogram: np.ndarray
  beta_sum: Optional[float]
  beta_count: Optional[float]
  batches: Optional[overheads.BatchTimes] = None
  trials: Optional[float] = None

  @property
  def tokens_generated(self) -> int:
    return int(np.sum(self.spec_tokens != 0))

  @property
  def alpha(self) -> float:
    """Kept guesses / acceptance trials (beta_count counts the trials whose
    context reached the output, so guesses cut by EOS are not counted; a
    tree run: the accepted path's trials, min(n + 1, γ) per call that kept
    n, as `analysis.alpha_from_acceptance_counts` counts them)."""
    kept = float(np.arange(len(self.histogram)) @ self.histogram)
    if self.trials is not None:  # a run that switched choices
      return kept / max(self.trials, 1.0)
    if self.beta_count is None:
      gamma = len(self.histogram) - 1
      trials = float(
          np.minimum(np.arange(gamma + 1) + 1, gamma) @ self.histogram)
      return kept / max(trials, 1.0)
    return kept / max(self.beta_count, 1.0)

  @property
  def alpha_beta(self) -> Optional[float]:
    if self.beta_sum is None or self.beta_count is None:
      return None
    return self.beta_sum / max(self.beta_count, 1.0)


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds of one call of each kind (`timing.call_seconds`).

  Attributes:
    target_step_s: one one-token target call.
    draft_step_s: one guess: a `propose` of γ guesses as the loop runs it,
      divided by γ (ACCEPTANCE='tree': a `propose_tree` of k branches).
    verification_call_s: the target's (γ+1)-token call (ACCEPTANCE='tree':
      the tree call over 1 + k·γ nodes).
  """
  target_step_s: float
  draft_step_s: float
  verification_call_s: float

  @property
  def cost_coefficient(self) -> float:
    """c of Definition 3.7."""
    return self.draft_step_s / self.target_step_s


def compile_decoders(feed: multihost.Feeder, baseline: Decoder,
                     speculative: Decoder, rng: jax.Array) -> float:
  """Compiles and runs both decoders once per input width; the seconds."""
  t0 = time.perf_counter()
  widths = feed.first_of_each_width()
  logging.info(
      "Compiling both decoders for input widths %s (read from the "
      "persistent compilation cache after a first run)",
      [feed.batch_width(b) for b in widths])
  console.numbered([(f"the {name} decoder, input width {feed.batch_width(b)}",
                     functools.partial(_compile_one, fn, feed, b, rng))
                    for b in widths
                    for name, fn in (("baseline", baseline), ("speculative",
                                                              speculative))])
  compile_s = time.perf_counter() - t0
  logging.info(
      "Compiled and warmed up both decoders for input widths %s "
      "in %.1fs", [feed.batch_width(b) for b in widths], compile_s)
  return compile_s


def _compile_one(decoder: Decoder, feed: multihost.Feeder, b: int,
                 rng: jax.Array) -> None:
  """Compiles (or reads from the cache) and runs `decoder` on batch b."""
  jax.block_until_ready(decoder(feed.batch(b), rng))


def decode_examples(plan: DecodePlan, feed: multihost.Feeder,
                    examples: Sequence[Dict[str, Any]],
                    writer: predictions.PredictionsWriter) -> Decoded:
  """Both decoders on every batch (same rng per batch), each call timed;
  each batch's text decoded once and its predictions.jsonl rows written as
  it finishes. SPECULATION='auto': the speculative column of each batch is
  decoded by the choice of the batches before it (`plan.online`).

  Nothing measured goes in the rows: same settings and seed, same file.
  """
  vocab, rng, clock = plan.vocab, plan.rng, plan.plan.providers.clock
  base_tokens, spec_tokens, base_text, spec_text, per_example = ([], [], [], [],
                                                                 [])
  time_base = time_spec = trials = 0.0
  calls_base = calls_spec = 0
  histogram = np.zeros(plan.args.gamma + 1, np.int64)
  # A tree or beam run counts kept guesses per call only (no β, no trace
  # of guesses: `predictions.tree_traces`).
  one_path = decode_modes.mode_of(plan.args).one_path
  beta: Optional[List[float]] = [0.0, 0.0] if one_path else None
  per_batch: List[Tuple[float, float, int, int, int]] = []
  current = plan
  for i, (batch, keep) in enumerate(feed.batches()):
    console.raise_if_terminated()
    mode = decode_modes.mode_of(current.args)
    brng = jax.random.fold_in(rng, i)
    out_b, dt_b = clock(plan.baseline, batch, brng)
    if mode.target_alone:  # one decode, the baseline's, fills both columns
      out_s, dt_s = current.speculative.of_baseline(out_b), dt_b
    else:
      out_s, dt_s = clock(current.speculative, batch, brng)
    out_b, out_s = multihost.to_host((out_b, out_s))  # every row
    time_base += dt_b
    time_spec += dt_s
    rows_b = np.asarray(out_b.target_calls)  # [rows] target calls per row
    rows_s = np.asarray(out_s.target_calls)
    calls_base += int(np.sum(rows_b[keep]))
    calls_spec += int(np.sum(rows_s[keep]))
    per_batch.append(
        (dt_b, dt_s, int(rows_b.max()), int(rows_s.max()), rows_b.shape[0]))
    counts, batch_trials = auto_switch.batch_acceptance(mode, out_s, keep)
    histogram = auto_switch.padded_sum(histogram, counts)
    trials += batch_trials
    beta = _add_beta(beta, mode, out_s, keep)
    base_tokens.append(np.asarray(out_b.tokens)[keep])
    spec_tokens.append(np.asarray(out_s.tokens)[keep])
    start = len(per_example)
    base_text += tasks.decode_tokens(vocab, base_tokens[-1])
    spec_text += tasks.decode_tokens(vocab, spec_tokens[-1])
    records = (predictions.traces(vocab, out_s, keep)
               if mode.one_path else predictions.tree_traces(out_s, keep))
    per_example.extend(records)
    writer.add([{
        "index": start + j,
        "input": examples[start + j]["input"],
        "reference": examples[start + j]["reference"],
        "baseline": base_text[start + j],
        "speculative": spec_text[start + j],
        **r
    } for j, r in enumerate(records)])
    logging.info(
        "batch %d/%d: baseline %.3fs, speculative %.3fs (running speedup "
        "%.2fx)", i + 1, feed.num_batches, dt_b, dt_s,
        time_base / max(time_spec, 1e-9))
    if plan.online is not None:  # the next batch's choice (between batches)
      current = plan.online.after_batch(i, dt_b, dt_s, out_s, keep, feed)
  columns = [np.asarray(c) for c in zip(*per_batch)]
  return Decoded(
      np.concatenate(base_tokens), np.concatenate(spec_tokens), base_text,
      spec_text, per_example, time_base, time_spec, calls_base, calls_spec,
      histogram, *(beta or (None, None)),
      overheads.BatchTimes(*columns) if columns else None,
      trials if plan.online is not None and plan.online.switched else None)


def _add_beta(beta: Optional[List[float]], mode: decode_modes.DecodeMode,
              out: Any, keep: np.ndarray) -> Optional[List[float]]:
  """[Σ β, its trials] with a batch added: one-path batches add theirs, a
  tree or beam batch ends it (None: no β), the target alone adds none."""
  if beta is None or mode.target_alone:
    return beta
  if not mode.one_path:
    return None
  return [
      beta[0] + float(np.sum(np.asarray(out.beta_sum)[keep])),
      beta[1] + float(np.sum(np.asarray(out.beta_count)[keep]))
  ]


def choose_shape(
    loaded: Loaded,
    feed: multihost.Feeder) -> Tuple[DecodePlan, Optional[Dict[str, Any]]]:
  """Every choice, before the timed decode: GAMMA='auto' (and a tree's
  TREE_WIDTH='auto') by its pilot, with the pilot's record; SPECULATION
  'auto' (`auto_run.choose_mode`; its record in `DecodePlan.auto`) or
  'off' (the target alone). Returns the `DecodePlan` at the choice (the
  run's own settings when there is nothing to choose) and the γ pilot's
  record or None."""
  args = loaded.args
  if args.speculation == decode_modes.SPECULATION_AUTO:
    return auto_run.choose_mode(loaded, feed), None
  if decode_modes.mode_of(args).target_alone:
    return auto_run.target_alone_plan(loaded), None
  if decode_modes.mode_of(args).branches and (args.auto_gamma or
                                              args.auto_tree_width):
    gamma_auto = auto_tree.pilot_tree_shape(loaded, feed)  # (γ, k)
    return loaded.decoding(
        gamma=gamma_auto["chosen_gamma"],
        tree_width=gamma_auto["chosen_tree_width"]), gamma_auto
  if args.auto_gamma:
    pilot = loaded.decoding(gamma=loaded.plan.providers.pilot_sizes.gamma_pilot)
    gamma_auto = auto_gamma.pilot_gamma(pilot, feed, loaded.plan.providers)
    return loaded.decoding(gamma=gamma_auto["chosen_gamma"]), gamma_auto
  return loaded.decoding(), None


def run_walltime(plan: DecodePlan, feed: multihost.Feeder,
                 examples: Sequence[Dict[str, Any]], data_info: Dict[str, Any],
                 on_result: Callable[[Dict[str, Any]], None],
                 gamma_auto: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """MODE='walltime' end to end at the plan's γ (chosen before: see
  `choose_shape`, whose record `gamma_auto` is): compile, decode, text,
  rows, step costs, metrics; predictions.jsonl written as batches finish,
  then metrics.json (a sweep takes it as "done").

  `on_result(metrics)` is called before anything is written (the summary:
  a failed write loses no result). Returns metrics.json's dict.
  """
  compile_s = compile_decoders(feed, plan.baseline, plan.speculative, plan.rng)
  out = plan.args.output_dir
  writer = predictions.PredictionsWriter(out, multihost.is_first())
  try:
    decoded = decode_examples(plan, feed, examples, writer)
  except KeyboardInterrupt:
    writer.close()
    raise KeyboardInterrupt(f"kept {writer.kept()}; "
                            f"{run_metrics.METRICS_FILE} was not "
                            "written") from None
  # SPECULATION='auto': the choice the run ended with, its record.
  args, auto, switch_compile_s = auto_switch.outcome(plan)
  compile_s += switch_compile_s
  mode = decode_modes.mode_of(args)
  steps = None
  if auto_switch.switched(auto):
    logging.info("SPECULATION='auto' switched choices: c and the theory are "
                 "not priced (metrics.json's auto.segments: each choice's "
                 "predicted and measured speedup)")
  elif not mode.priced:
    logging.info(
        "%s: c and Theorem 3.8 are not priced (they model sampling "
        "one sequence)", mode.description)
  elif not plan.args.price_call_cost:
    logging.info("PRICE_CALL_COST=False: c and the verification call are "
                 "not priced (metrics.json: call_cost_priced false, no "
                 "theory)")
  else:
    with console.phase(mode.pricing_words(plan.args)):
      steps = step_times(plan, feed.batch(0),
                         int(decoded.tokens_generated / len(examples)))
  decoded, compile_s, steps = slowest_process(decoded, compile_s, steps)
  quality = plan.quality(decoded.base_text, decoded.spec_text,
                         [e["reference"] for e in examples])
  metrics = walltime_metrics(args, decoded, quality, compile_s, steps,
                             data_info, plan.settings, gamma_auto,
                             auto).to_dict()
  on_result(metrics)

  multihost.run_on_first(  # the others wait for it
      "write",
      lambda: predictions.publish(writer, len(
          examples), os.path.join(out, run_metrics.METRICS_FILE), metrics))
  if steps is None:
    logging.info("speedup %.2fx, alpha %.3f; wrote %s", metrics["speedup"],
                 metrics["alpha"], out)
  else:
    logging.info("speedup %.2fx (theory %.2fx), alpha %.3f, c %.3f; wrote %s",
                 metrics["speedup"], metrics["theoretical_speedup"],
                 metrics["alpha"], metrics["cost_coefficient_c"], out)
  return metrics


def step_times(plan: DecodePlan, batch: jax.Array, fill: int) -> StepTimes:
  """One target step, one guess and the verification call (this process's
  seconds: `slowest`); ACCEPTANCE='tree': one depth of the k-branch draft
  and the tree call over 1 + k·γ nodes (`step_costs.price_tree_calls`).

  All are timed the one way `timing` defines, interleaved
  (`step_costs.price_calls`): on `batch`, with the speculative loop's cache
  (max_decode_length + γ + 1 slots) filled to `fill` tokens (the mean
  output length); the drafter as the loop runs it, on the target's own
  output for `batch` (the compiled baseline's).
  """
  context = plan.baseline(batch, plan.rng).tokens
  return StepTimes(*decode_modes.mode_of(plan.args).price(
      plan.args, plan.drafter, plan.models.target, batch, fill, context,
      plan.plan.providers.pricing))


def slowest_process(decoded: Decoded, compile_s: float,
                    steps: Optional[StepTimes]):
  """(decoded, compile_s, steps) with the slowest process's seconds (the
  user waits for it), exchanged in one collective (steps None: a beam run,
  not priced)."""
  if steps is None:
    time_base, time_spec, compile_s = multihost.slowest(decoded.time_base,
                                                        decoded.time_spec,
                                                        compile_s)
    return (dataclasses.replace(decoded, time_base=time_base,
                                time_spec=time_spec), compile_s, None)
  (time_base, time_spec, compile_s, t_target, t_draft,
   t_verify) = multihost.slowest(decoded.time_base, decoded.time_spec,
                                 compile_s, steps.target_step_s,
                                 steps.draft_step_s, steps.verification_call_s)
  return (dataclasses.replace(decoded, time_base=time_base,
                              time_spec=time_spec), compile_s,
          StepTimes(t_target, t_draft, t_verify))


def walltime_metrics(
    args: arguments.RunArguments, decoded: Decoded, quality: Dict[str,
                                                                  Dict[str,
                                                                       Any]],
    compile_s: float, steps: Optional[StepTimes], data_info: Dict[str, Any],
    settings: Dict[str, Any], gamma_auto: Optional[Dict[str, Any]],
    auto: Optional[Dict[str, Any]] = None) -> run_metrics.RunMetrics:
  """The run's metrics.json.

  Args:
    args: the run's arguments (GAMMA='auto': with the chosen γ;
      SPECULATION='auto': `auto_switch.outcome`'s).
    decoded: both decoders' outputs.
    quality: {'bleu' or 'rouge': {'baseline': ..., 'speculative': ...}}.
    compile_s: `compile_decoders`' seconds (the slowest process's).
    steps: `step_times`; None for a beam run or PRICE_CALL_COST=False (not
      priced: c, Theorem 3.8 and the call costs are null).
    data_info: the examples' counts (`run_metrics.RunMetrics`' data keys).
    settings: the run's settings record (`output_dir.settings_record`).
    gamma_auto: GAMMA='auto''s pilot and choice, or None.
    auto: SPECULATION='auto''s candidates, choice, segments and switches
      (`auto_switch.outcome`), or None.
  """
  gamma, c = args.gamma, None if steps is None else steps.cost_coefficient
  alpha = decoded.alpha
  greedy = args.temperature == 0
  base, spec = decoded.base_tokens, decoded.spec_tokens
  tokens = decoded.tokens_generated
  return run_metrics.RunMetrics(
      task=args.label,
      target_model=args.target_name,
      gamma=gamma,
      temperature=args.temperature,
      top_k=args.top_k,
      top_p=args.top_p,
      batch_size=args.batch_size,
      alpha=float(alpha),
      alpha_beta=decoded.alpha_beta,
      alpha_stderr=float(
          analysis.alpha_standard_error_from_counts(decoded.histogram, gamma)
          if decoded.trials is None else  # a run that switched: pooled
          np.sqrt(alpha * (1 - alpha) / max(decoded.trials, 1.0))),
      accepted_histogram=decoded.histogram.tolist(),
      num_examples=len(base),
      tokens_generated=tokens,
      tokens_generated_baseline=int(np.sum(base != 0)),
      target_calls_baseline=decoded.calls_base,
      target_calls_speculative=decoded.calls_spec,
      tokens_per_target_call=tokens / max(decoded.calls_spec, 1),
      walltime_baseline_s=decoded.time_base,
      walltime_speculative_s=decoded.time_spec,
      speedup=decoded.time_base / decoded.time_spec,
      compile_time_s=compile_s,
      target_step_s=None if steps is None else steps.target_step_s,
      draft_step_s=None if steps is None else steps.draft_step_s,
      cost_coefficient_c=c,
      call_cost_priced=(False if steps is None and
                        decode_modes.mode_of(args).priced and
                        not auto_switch.switched(auto) else None),
      **(unpriced_theory_metrics() if steps is None else theory_metrics(
          args, decoded, steps)),
      # Token-for-token identity is the test of exactness at T = 0 only:
      # sampled outputs (T > 0) are compared by distribution (null here).
      greedy_outputs_identical=(bool(np.array_equal(base, spec))
                                if greedy else None),
      greedy_identical_examples=(int(np.sum(np.all(base == spec, axis=1)))
                                 if greedy else None),
      **quality,
      random_weights=args.random_weights,
      backend=jax.default_backend(),
      device_kind=jax.devices()[0].device_kind,
      num_devices=jax.device_count(),
      synthetic=False,
      **data_info,
      settings=settings,
      **drafting_metrics(args, decoded.per_example, tokens, c, gamma_auto),
      **beam_metrics(args, decoded),
      **auto_mode.metrics_keys(args, auto))


def unpriced_theory_metrics() -> Dict[str, Any]:
  """`theory_metrics`' keys of a run that is not priced (DECODE='beam':
  Theorem 3.8 and c model one sampled sequence, not a beam search;
  PRICE_CALL_COST=False: skipped)."""
  return dict.fromkeys(
      ("theoretical_speedup", "verification_call_s", "verification_cost_ratio",
       "theoretical_speedup_measured_call_cost", "iteration_overhead",
       "baseline_overhead"))


def beam_metrics(args: arguments.RunArguments,
                 decoded: Decoded) -> Dict[str, Any]:
  """metrics.json's DECODE and the mode's own keys (`DecodeMode.metrics`:
  beam keys None unless DECODE='beam')."""
  return decode_modes.mode_of(args).metrics(args, decoded)


def theory_metrics(args: arguments.RunArguments, decoded: Decoded,
                   steps: StepTimes) -> Dict[str, Any]:
  """metrics.json's Theorem 3.8 keys, the verification call's cost and the
  loops' overheads against their own cost model (issue 32).

  ACCEPTANCE='tree': `theoretical_speedup` stays Theorem 3.8 for one branch
  at the run's α, γ and c (a reference: a tree keeps more than one branch
  would); `theoretical_speedup_measured_call_cost` is the tree's own cost
  model, the measured tokens per target call over the measured cost of an
  iteration (γ draft depths, each drafting k branches, and the tree call),
  in target steps: tokens_per_target_call / (γ·c + call ratio).
  """
  gamma, c = args.gamma, steps.cost_coefficient
  alpha = min(decoded.alpha, 1.0)
  ratio = steps.verification_call_s / steps.target_step_s
  mode = decode_modes.mode_of(args)
  measured = mode.measured_theory(
      alpha, gamma, c, ratio,
      decoded.tokens_generated / max(decoded.calls_spec, 1))
  out = {
      "theoretical_speedup": float(analysis.expected_speedup(alpha, gamma, c)),
      "verification_call_s": steps.verification_call_s,
      "verification_cost_ratio": ratio,
      "theoretical_speedup_measured_call_cost": measured,
      "iteration_overhead":
          (decoded.time_spec / max(decoded.calls_spec, 1) /
           (gamma * steps.draft_step_s + steps.verification_call_s)),
      "baseline_overhead":
          (decoded.time_base / max(decoded.calls_base, 1) / steps.target_step_s
          ),
  }
  if mode.one_path:
    out.update(
        overheads.efficiency_split(alpha, gamma, decoded.spec_tokens,
                                   decoded.calls_base, decoded.calls_spec, out))
  out.update(
      overheads.fixed_cost_metrics(
          decoded.batches, steps.target_step_s,
          gamma * steps.draft_step_s + steps.verification_call_s))
  return out


def draft_label(args: arguments.RunArguments, gamma_auto) -> str:
  """metrics.json's `draft_model`: the report tells drafts apart by it, so
  variants (adaptive γ, GAMMA='auto', lenience) get their own."""
  label = args.drafting.label(args.draft_name)
  if args.adaptive_threshold is not None:
    label += f" adaptive {args.adaptive_threshold:g}"
  if gamma_auto and "chosen_tree_width" in gamma_auto:
    label += " auto-(γ,k)"
  elif gamma_auto:
    label += " auto-γ"
  if args.lenience != 1:
    label += f" l={args.lenience:g}"
  return label + decode_modes.mode_of(args).label(args)


def drafting_metrics(args: arguments.RunArguments,
                     per_example: List[Dict[str, Any]], tokens: int, c: float,
                     gamma_auto: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """metrics.json's drafter, lenience, adaptive-γ and GAMMA='auto' keys.

  Args:
    args: the run's arguments (GAMMA='auto': with the chosen γ).
    per_example: predictions.jsonl's records (their traces: guesses made
      and kept per target call).
    tokens: tokens generated.
    c: the measured cost coefficient (None: not priced).
    gamma_auto: `choose_gamma`'s record, or None.
  """
  mode = decode_modes.mode_of(args)
  # A tree (k·γ guesses every call) or beams (γ draft steps of u beams):
  # a one-path bound means nothing.
  per_call = mode.guesses_per_call(args)
  tree = mode.branches
  if per_call is not None:
    guessed = [per_call]
    bound = None
  else:
    # A run that switched (SPECULATION='auto'): the one-path calls only.
    calls = [t for e in per_example for t in e["trace"] or ()]
    kept = [t["num_accepted"] for t in calls]
    guessed = [len(t["draft_tokens"]) for t in calls]
    bound = None if c is None else analysis.per_iteration_gamma_bound(
        kept, guessed, args.gamma, c, tokens)  # c None: not priced
  return {
      "drafter": args.drafter,
      "draft_model": draft_label(args, gamma_auto),
      "drafter_settings": args.drafting.record(),
      "lenience": args.lenience,
      "acceptance": args.acceptance,
      # Omitted from metrics.json unless ACCEPTANCE='tree' (`RunMetrics`).
      "tree_width": args.tree_width if tree else None,
      "tree_without_replacement":
          (args.tree_without_replacement if tree else None),
      "exact": args.lenience == 1,
      "adaptive_threshold": args.adaptive_threshold,
      "gamma_auto": gamma_auto,
      "guesses_per_target_call": float(np.mean(guessed)) if guessed else 0.0,
      # §3.5: Theorem 3.8's cost model (target call 1, guess c) applied to
      # this run's iterations: every call drafting γ, drafting what it
      # did, and drafting exactly what was kept (the per-call oracle). A
      # single-path model: null for a tree.
      "per_iteration_gamma": None if bound is None else {
          "fixed_gamma_speedup": bound["fixed"],
          "achieved_speedup": bound["achieved"],
          "oracle_speedup": bound["oracle"]
      },
  }
