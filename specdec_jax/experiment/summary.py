"""The lines `run` ends with (`summary_lines`): what happened, in plain
words, from the metrics dict the run wrote and its arguments."""
import os
from typing import Any, Dict, List, Optional, Tuple

from specdec_jax.metrics import overheads
from specdec_jax.metrics import run_metrics
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import arguments


def _speed_words(speedup: float, theory: str) -> str:
  """The speedup in words, beside the theory's words (`theory_words`)."""
  if speedup >= 1:
    return f"{speedup:.2f}x faster than the target alone ({theory})"
  return (f"{1 / speedup:.2f}x slower than the target alone ({speedup:.2f}x; "
          f"{theory})")


def theory(metrics: Dict[str, Any]) -> Tuple[Optional[float], str]:
  """The theory printed beside the speedup: (its value, its name:
  `run_metrics.THEORY_NAMES`, the measured call cost's first), or (None,
  why there is none)."""
  mode = decode_modes.of_metrics(metrics)
  measured = metrics.get("theoretical_speedup_measured_call_cost")
  if mode.target_alone:
    return None, "nothing was drafted (SPECULATION='off')"
  if mode.beam:
    return None, ("Theorem 3.8 and c model sampling one sequence, not "
                  "beams")
  if mode.branches and measured is not None:
    return measured, run_metrics.TREE_THEORY_NAME
  if metrics.get("call_cost_priced") is False:  # PRICE_CALL_COST=False
    return None, "PRICE_CALL_COST=False skipped pricing c"
  if run_metrics.switched(metrics.get("auto")):  # SPECULATION='auto'
    return None, ("the run switched decode modes (the auto: lines; "
                  "metrics.json's auto.segments)")
  for key, name in run_metrics.THEORY_NAMES.items():
    if metrics.get(key) is not None:
      return metrics[key], name
  return None, "c was not priced"


def theory_words(metrics: Dict[str, Any]) -> str:
  """'Theorem 3.8 at the measured call cost 2.89x', or 'no theory: why'."""
  value, name = theory(metrics)
  return f"no theory: {name}" if value is None else f"{name} {value:.2f}x"


def alpha_words(alpha: float, digits: int = 2) -> str:
  """metrics.json's (and infer.json's) α, named as outputs.md defines it."""
  return f"alpha {alpha:.{digits}f} ({run_metrics.ALPHA_NAME})"


def log_words(metrics: Dict[str, Any]) -> str:
  """`run`'s last log line: the speedup, the theory, α and c."""
  c = metrics.get("cost_coefficient_c")
  return (f"speedup {metrics['speedup']:.2f}x ({theory_words(metrics)}), "
          f"{alpha_words(metrics['alpha'], 3)}" +
          ("" if c is None else f", c {c:.3f}"))


# The quality line of a run whose data holds inputs alone.
NO_REFERENCES = "none (the examples have no references to score against)"


def _quality_words(metrics: Dict[str, Any]) -> Optional[str]:
  if metrics.get("bleu") is not None:
    q = metrics["bleu"]
    return (f"BLEU {q['baseline']:.2f} (target alone) vs "
            f"{q['speculative']:.2f} (speculative)")
  if metrics.get("rouge") is not None:
    base, spec = metrics["rouge"]["baseline"], metrics["rouge"]["speculative"]
    return "ROUGE " + ", ".join(
        f"{k} {base[k]:.2f}/{spec[k]:.2f}"
        for k in base) + (" (target alone / speculative)")
  return None


def _noise_words(metrics: Dict[str, Any]) -> str:
  """At T > 0, why the two quality numbers differ."""
  if metrics.get("exact") is False:
    words = ("; T > 0: different samples, and LENIENCE < 1 samples another "
             "distribution than the target's")
  else:
    words = ("; T > 0: different samples of the same distribution, so they "
             "differ by sampling noise")
  noise = metrics.get("quality_noise")
  if noise and noise.get("p_value") is not None:
    words += (f" (paired bootstrap over the {metrics['num_examples']} "
              f"examples: p = {noise['p_value']:.2f})")
  return words


def _waits_words(auto: Dict[str, Any]) -> str:
  """' and rows waiting 0.88' (GAMMA='auto', or a tree's GAMMA/TREE_WIDTH,
  at batch > 1: the chosen γ's batch factor, in its prediction), or ''."""
  factors = auto.get("batch_factor_by_gamma") or []
  gamma = int(auto["chosen_gamma"])
  factor = factors[gamma - 1] if gamma <= len(factors) else None
  return (f" and rows waiting {factor:.2f}"
          if overheads.batch_waits_show(factor) else "")


def _predicted_words(auto: Dict[str, Any]) -> str:
  """', predicted 1.88× (the pilot ran 1.95×, its model 2.01×)': the
  choice's prediction and the timed pilot that calibrated it, or ''
  (records before 2026-12-02's third change)."""
  predicted = auto.get("chosen_predicted_speedup")
  if predicted is None:
    return ""
  calibration = auto.get("calibration")
  pilot = ("" if not calibration else
           f" (the pilot ran {calibration['measured_speedup']:.2f}×, its "
           f"model {calibration['model_speedup']:.2f}×)")
  return f", predicted {predicted:.2f}×{pilot}"


def _drafting_lines(metrics: Dict[str, Any]) -> List[str]:
  lines = []
  auto = metrics.get("gamma_auto")
  if auto and "chosen_tree_width" in auto:
    lines.append(
        f"GAMMA/TREE_WIDTH='auto': γ={auto['chosen_gamma']}, "
        f"k={auto['chosen_tree_width']}, the best predicted speedup (trees "
        f"of at most {auto['max_nodes']} nodes{_waits_words(auto)}) for the "
        "acceptance and "
        f"costs measured on the first {auto['pilot_batches']} batches with "
        f"γ={auto['pilot_gamma']} and k in {auto['pilot_tree_widths']}"
        f"{_predicted_words(auto)}")
  elif auto:
    lines.append(
        f"GAMMA='auto': γ={auto['chosen_gamma']}, Theorem 3.8's best (at "
        f"most {auto['max_gamma']}) for alpha {auto['alpha']:.2f} and c "
        f"{auto['cost_coefficient_c']:.3f}{_waits_words(auto)} measured on "
        f"the first {auto['pilot_batches']} batches with "
        f"γ={auto['pilot_gamma']}{_predicted_words(auto)}")
  batch = (metrics.get("efficiency_split") or {}).get("batch")
  if overheads.batch_waits_show(batch):
    lines.append(
        f"batch size {metrics.get('batch_size', '?')}: each batch's loop runs "
        "to its slowest row, and the speculative loop's rows end less "
        f"together; it cost {batch:.2f} of the speedup (efficiency_split's "
        "batch; docs/usage/outputs.md)")
  bound = metrics.get("per_iteration_gamma")
  if metrics.get("adaptive_threshold") is not None and bound:
    lines.append(
        f"adaptive γ (ADAPTIVE_THRESHOLD={metrics['adaptive_threshold']:g}): "
        f"{metrics['guesses_per_target_call']:.2f} guesses per target call "
        f"(at most {metrics['gamma']}); Theorem 3.8's model of these calls: "
        f"{bound['achieved_speedup']:.2f}x, vs {bound['fixed_gamma_speedup']:.2f}x"
        f" drafting γ every call, and {bound['oracle_speedup']:.2f}x for "
        "§3.5's oracle (drafting exactly what is kept)")
  return lines


def _exactness_words(metrics: Dict[str, Any], temp: float) -> str:
  """How the outputs compare with the target's."""
  if metrics.get("exact") is False:
    l = metrics["lenience"]
    words = (f"; LENIENCE={l:g} < 1: outputs are NOT the target's "
             f"distribution (a token's probability is at most p(x)/l = "
             f"{1 / l:.2g} p(x); docs/design/beyond_the_paper.md)")
    if temp == 0:
      words += (f"; greedy outputs identical to the target's on "
                f"{metrics.get('greedy_identical_examples', '?')}/"
                f"{metrics['num_examples']} examples (lenience keeps guesses "
                "that are not the target's argmax)")
    return words
  if metrics.get("greedy_outputs_identical") is None:
    tests = decode_modes.of_metrics(metrics).exactness_tests
    words = (f"; outputs are samples (T={temp:g}), so they are not compared "
             "token by token with the target's: speculative decoding samples "
             f"the target's distribution exactly (chi-square tests in {tests})")
    if metrics.get("alpha_beta") is None:  # a tree run computes no β
      return words
    return (f"{words}, and alpha from acceptance counts "
            f"({metrics['alpha']:.2f}) and from Σ min(p, q) "
            f"({metrics['alpha_beta']:.2f}) estimate the same α")
  n = metrics["num_examples"]
  same = metrics.get("greedy_identical_examples",
                     n if metrics["greedy_outputs_identical"] else "?")
  words = f"; greedy outputs identical to the target's on {same}/{n} examples"
  if not metrics["greedy_outputs_identical"]:
    words += (" (NOT all: at T=0 they must be; see "
              "docs/design/exactness.md)")
  return words


def _beam_line(metrics: Dict[str, Any]) -> str:
  """DECODE='beam': speed, steps per call and identity of the beams."""
  speedup = metrics["speedup"]
  speed = (f"{speedup:.2f}x faster than" if speedup >= 1 else
           f"{1 / speedup:.2f}x slower ({speedup:.2f}x) than")
  n = metrics["num_examples"]
  same = metrics.get("greedy_identical_examples", "?")
  words = (f"speculative beam search (k={metrics.get('beam_size')}, "
           f"u={metrics.get('beam_width')}, {metrics.get('beam_rows')} rows, "
           f"α={metrics.get('beam_alpha')}): {speed} the target's own beam "
           "search (no theory line: Theorem 3.8 and c are for sampling one "
           f"sequence, not beams); {metrics['steps_per_target_call']:.2f} beam "
           "steps per target call, draft steps kept "
           f"{metrics['alpha']:.2f} of tried; top beams identical to the "
           f"target's on {same}/{n} examples")
  if not metrics.get("greedy_outputs_identical"):
    words += " (NOT all: they must be; docs/design/beyond_the_paper.md)"
  return words


def _walltime_lines(metrics: Dict[str, Any], temp: float) -> List[str]:
  mode, quality = decode_modes.of_metrics(metrics), _quality_words(metrics)
  if mode.target_alone:  # SPECULATION='off' (or 'auto' choosing it)
    decoder = ("the target's own beam search"
               if mode.beam else "the target alone")
    lines = [
        f"speculation off: {decoder} decoded all {metrics['num_examples']} "
        f"examples in {metrics['walltime_baseline_s']:.1f} s; nothing was "
        "drafted (speedup 1 by definition)"
    ]
  elif mode.beam:
    lines = [_beam_line(metrics)]
    if quality:  # both sides are top beams
      quality = quality.replace("(target alone)", "(target's beam search)")
  else:
    lines = [
        "speculative decoding: " +
        _speed_words(metrics["speedup"], theory_words(metrics)) +
        f"; {alpha_words(metrics['alpha'])}, "
        f"{metrics['tokens_per_target_call']:.2f} tokens per target call" +
        _exactness_words(metrics, temp), *_drafting_lines(metrics)
    ]
    if quality and temp > 0:
      quality += _noise_words(metrics)
  return lines + [f"quality: {quality or NO_REFERENCES}"]


def _infer_lines(metrics: Dict[str, Any]) -> List[str]:
  how = (f"speculatively ({metrics['decode_mode']})"
         if metrics.get("speculation") != decode_modes.SPECULATION_OFF else
         "by the target alone (speculation off)")
  lines = [
      f"inference: {metrics['num_examples']} examples decoded {how} in "
      f"{metrics['decode_s']:.1f} s "
      f"({metrics['tokens_per_second']:.0f} tokens/s, compilation "
      f"{metrics['compile_time_s']:.1f} s apart); "
      f"{alpha_words(metrics['alpha'])}, "
      f"{metrics['tokens_per_target_call']:.2f} tokens per target call; no "
      "baseline decode (MODE='walltime' measures the speedup)"
  ]
  if metrics.get("resumed_after_examples"):
    lines[0] += (f"; resumed: the first {metrics['resumed_after_examples']} "
                 "were decoded (and timed) by the interrupted run")
  for name, value in (metrics.get("quality") or {}).items():
    words = (", ".join(f"{k} {v:.2f}" for k, v in value.items()) if isinstance(
        value, dict) else f"{value:.2f}")
    lines.append(f"quality: {name.upper()} {words}")
  if not metrics.get("quality"):
    lines.append(f"quality: {NO_REFERENCES}")
  return lines


def _notes(metrics: Dict[str, Any]) -> List[str]:
  lines = []
  if metrics.get("random_weights"):
    lines.append(
        "random weights (TARGET_CHECKPOINT_PATH / DRAFT_CHECKPOINT_PATH not "
        "both set): alpha, speedup and quality are meaningless here; this "
        "run checks the workflow and exactness only.")
  requested = metrics.get("num_examples_requested")
  if requested and requested > metrics["num_examples"]:
    lines.append(f"note: NUM_EXAMPLES={requested}, but the data has only "
                 f"{metrics['num_examples']} examples.")
  if metrics.get("inputs_truncated"):
    lines.append(
        f"note: {metrics['inputs_truncated']} of {metrics['num_examples']} "
        "inputs were truncated to TASK_FEATURE_LENGTHS['inputs']="
        f"{metrics['inputs_length']} (longest: "
        f"{metrics['longest_input_tokens']} tokens).")
  return lines


def _auto_lines(metrics: Dict[str, Any]) -> List[str]:
  """The `auto:` lines: the first choice, then each switch."""
  record = metrics.get("auto")
  if not record:
    return []
  words = record["reason"]
  cached = [
      what for what, part in (("call prices", record.get("prices")),
                              ("pilots", record.get("pilot_cache")))
      if part and part.get("cached")
  ]
  if cached:
    words += f"; {' and '.join(cached)} from the cache"
  return [words] + [s["reason"] for s in record.get("switches") or []]


def summary_lines(metrics: Dict[str, Any],
                  args: arguments.RunArguments) -> List[str]:
  """What happened, in plain words, from the dict the run wrote."""
  temp = args.temperature
  gamma = (f"auto→{metrics.get('gamma', '?')}"
           if args.auto_gamma else str(args.gamma))
  search = (f"beam search k={args.decode_mode.size}" if args.decode_mode.beam
            else f"T={temp:g}{' (greedy)' if temp == 0 else ''}")
  head = (f"{metrics.get('task', 'run')}: target {args.target_name or '?'},"
          f" draft {metrics.get('draft_model') or args.draft_name or '?'}, " +
          (f"γ={gamma}, " if args.mode != "alpha" else "") + search + ", "
          f"{metrics['num_examples']} examples")
  out = args.output_dir
  if args.mode == "alpha":  # Corollary 3.6's α
    body = [
        f"alpha {metrics['alpha_beta']:.3f} ± "
        f"{metrics['alpha_beta_stderr']:.3f} (share of draft tokens the "
        "target would accept: Corollary 3.6's mean of Σ min(p, q) over "
        f"{metrics['num_positions']} positions of target samples)"
    ]
    files = [run_metrics.ALPHA_FILE]
  elif args.mode == "infer":
    body = _infer_lines(metrics)
    files = [run_metrics.PREDICTIONS_FILE, run_metrics.INFER_FILE]
  else:
    body = _walltime_lines(metrics, temp)
    files = [run_metrics.METRICS_FILE, run_metrics.PREDICTIONS_FILE]
  return [
      head, *_auto_lines(metrics), *body, *_notes(metrics),
      "results: " + ", ".join(os.path.join(out, f) for f in files) +
      " (docs/usage/outputs.md)"
  ]
