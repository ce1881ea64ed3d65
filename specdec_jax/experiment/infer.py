"""MODE='infer': decode a dataset speculatively, as T5X's `infer.py` does.

No baseline decode, no pricing: the run's speculative decoder (its decode
mode, γ, temperature, ...) over every example, compiled once per input
width, then each batch decoded with progress and an ETA, its rows written
to predictions.jsonl as it finishes (`inputs`, `prediction`, `targets`
when the data has references, and the row's target calls), and infer.json
at the end: counts, walltime, α and tokens per target call, BLEU / ROUGE
against the references. The same seed and settings give the rows of a
MODE='walltime' run's `speculative` column (the same rng per batch).
SPECULATION='auto' may change its choice between batches (`auto_switch`:
the target alone's seconds estimated from the priced target step).
"""
import functools
import os
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.data import tasks
from specdec_jax.experiment import auto_mode
from specdec_jax.experiment import auto_switch
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import predictions
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.metrics import analysis
from specdec_jax.metrics import quality as quality_lib
from specdec_jax.metrics import run_metrics
from specdec_jax.terminal import console


def compile_speculative(plan: DecodePlan, feed: multihost.Feeder) -> float:
  """Compiles and runs the speculative decoder once per input width; the
  seconds."""
  t0 = time.perf_counter()
  widths = feed.first_of_each_width()
  logging.info("Compiling the speculative decoder for input widths %s",
               [feed.batch_width(b) for b in widths])
  console.numbered([
      (f"the speculative decoder, input width {feed.batch_width(b)}",
       functools.partial(_compile_width, plan, feed, b)) for b in widths
  ])
  return time.perf_counter() - t0


def _compile_width(plan: DecodePlan, feed: multihost.Feeder, b: int) -> None:
  """Compiles (or reads from the cache) and runs the decoder on batch b."""
  jax.block_until_ready(plan.speculative(feed.batch(b), plan.rng))


def _eta(done: int, total: int, seconds: float) -> str:
  """'ETA 12 s' from the batches done so far."""
  if not done:
    return "ETA ?"
  return f"ETA {seconds / done * (total - done):.0f} s"


def run_infer(plan: DecodePlan, feed: multihost.Feeder,
              examples: Sequence[Dict[str, Any]], data_info: Dict[str, Any],
              on_result: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
  """MODE='infer' end to end; `on_result(record)` before anything is
  written. Returns infer.json's dict."""
  compile_s = compile_speculative(plan, feed)
  out = plan.args.output_dir
  writer = predictions.PredictionsWriter(out, multihost.is_first())
  texts: List[str] = []
  tokens = calls = 0
  histogram = np.zeros(plan.args.gamma + 1, np.int64)
  decode_s = trials = 0.0
  current = plan  # SPECULATION='auto': the choice of the batches before
  try:
    for i, (batch, keep) in enumerate(feed.batches()):
      console.raise_if_terminated()
      result, seconds = plan.plan.providers.clock(
          current.speculative, batch, jax.random.fold_in(plan.rng, i))
      decode_s += seconds
      result = multihost.to_host(result)
      rows = np.asarray(result.tokens)[keep]
      row_calls = np.asarray(result.target_calls)[keep]
      tokens += int(np.sum(rows != 0))
      calls += int(np.sum(row_calls))
      counts = np.asarray(result.accepted_histogram)[keep].sum(0)
      histogram = auto_switch.padded_sum(histogram, counts)
      if not decode_modes.mode_of(current.args).target_alone:
        trials += auto_switch.acceptance_trials(counts, counts.size - 1)
      start = len(texts)
      texts += tasks.decode_tokens(plan.vocab, rows)
      writer.add([
          _row(start + j, examples[start + j], texts[start + j],
               int(row_calls[j])) for j in range(len(rows))
      ])
      logging.info("infer: batch %d/%d, %d examples, %.1f s, %s", i + 1,
                   feed.num_batches, len(texts), decode_s,
                   _eta(i + 1, feed.num_batches, decode_s))
      if plan.online is not None:  # the next batch's choice
        current = plan.online.after_batch(i, None, seconds, result, keep, feed)
  except KeyboardInterrupt:
    writer.close()
    raise KeyboardInterrupt(f"kept {writer.kept()}; {run_metrics.INFER_FILE} "
                            "was not written") from None
  record = infer_record(plan, examples, texts, tokens, calls,
                        (histogram, trials), decode_s, compile_s, data_info)
  on_result(record)

  multihost.run_on_first(
      "write",
      lambda: predictions.publish(writer, len(
          examples), os.path.join(out, run_metrics.INFER_FILE), record))
  return record


def _row(index: int, example: Dict[str, Any], text: str,
         target_calls: int) -> Dict[str, Any]:
  """One predictions.jsonl row in T5X's form (`inputs`, `prediction`,
  `targets` when there is a reference)."""
  row = {"index": index, "inputs": example["input"], "prediction": text}
  if example.get("reference") is not None:
    row["targets"] = example["reference"]
  row["target_calls"] = target_calls
  return row


def infer_record(plan: DecodePlan, examples: Sequence[Dict[str, Any]],
                 texts: List[str], tokens: int, calls: int,
                 acceptance: Tuple[np.ndarray, float], decode_s: float,
                 compile_s: float, data_info: Dict[str, Any]) -> Dict[str, Any]:
  """infer.json's dict: what was decoded, how fast, how well.

  `acceptance`: (the calls by kept guesses, as wide as the largest γ; the
  acceptance trials of the speculative batches, each at its own γ). A run
  that switched choices (SPECULATION='auto') pools α over its speculative
  batches and records the last speculative choice's settings, γ the
  largest (`auto_switch.outcome`).
  """
  args, auto, switch_compile_s = auto_switch.outcome(plan)
  mode = decode_modes.mode_of(args)
  histogram, trials = acceptance
  alpha = (analysis.alpha_from_acceptance_counts(histogram, args.gamma)
           if not auto_switch.switched(auto) else
           float(np.arange(histogram.size) @ histogram) / max(trials, 1.0))
  references = [e.get("reference") for e in examples]
  quality = None
  if all(r is not None for r in references):
    quality = quality_lib.quality_metrics(plan.task_kind, texts, references)
  return {
      "mode": "infer",
      "task": args.label,
      "target_model": args.target_name,
      "draft_model": args.drafting.label(args.draft_name) + mode.label(args),
      "decode_mode": mode.name,
      "gamma": args.gamma,
      "temperature": args.temperature,
      "num_examples": len(examples),
      "tokens_generated": tokens,
      "target_calls": calls,
      "tokens_per_target_call": tokens / max(calls, 1),
      "alpha": alpha,
      "decode_s": decode_s,
      "compile_time_s": compile_s + switch_compile_s,
      "tokens_per_second": tokens / max(decode_s, 1e-9),
      "quality": quality,
      **data_info,
      "settings": plan.settings,
      **auto_mode.metrics_keys(args, auto),  # SPECULATION off / auto
  }
