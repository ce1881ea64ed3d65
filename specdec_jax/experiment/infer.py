"""MODE='infer': decode a dataset speculatively, as T5X's `infer.py` does.

No baseline decode, no pricing: the run's speculative decoder (its decode
mode, γ, temperature, ...) over every example, compiled once per input
width, then each batch decoded with progress and an ETA, its rows written
to predictions.jsonl as it finishes (T5X's rows, as MODE='walltime'
writes them: `predictions.row`), and infer.json at the end: counts,
walltime, α and tokens per target call, BLEU / ROUGE against the
references. The same seed and settings give the rows of a
MODE='walltime' run's `speculative` column (the same rng per batch:
`batches.batches`). SPECULATION='auto' may change its choice between
batches (`plan.online`: the target alone's seconds estimated from the
priced target step).
"""
import os
from typing import Any, Callable, Dict, List, Sequence

from absl import logging
import numpy as np

from specdec_jax import multihost
from specdec_jax.data import tasks
from specdec_jax.experiment import batches as batches_lib
from specdec_jax.experiment import predictions
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.metrics import quality as quality_lib
from specdec_jax.metrics import run_metrics


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
  compile_s = batches_lib.compile_widths(feed,
                                         [("speculative", plan.speculative)],
                                         plan.rng)
  out = plan.args.output_dir
  writer = predictions.PredictionsWriter(out, multihost.is_first())
  texts: List[str] = []
  tally = batches_lib.Tally()
  current = plan  # SPECULATION='auto': the choice of the batches before
  try:
    for batch in batches_lib.batches(feed, plan.rng):
      result, seconds = batch.decode(current.speculative, plan.providers.clock)
      tally.add(result, batch.keep, current.mode, seconds)
      rows = np.asarray(result.tokens)[batch.keep]
      row_calls = np.asarray(result.target_calls)[batch.keep]
      start = len(texts)
      texts += tasks.decode_tokens(plan.vocab, rows)
      writer.add([
          predictions.row(start + j, examples[start + j], texts[start + j],
                          int(row_calls[j])) for j in range(len(rows))
      ])
      decode_s = sum(tally.seconds)
      logging.info("infer: batch %d/%d, %d examples, %.1f s, %s",
                   batch.index + 1, feed.num_batches, len(texts), decode_s,
                   _eta(batch.index + 1, feed.num_batches, decode_s))
      if plan.online is not None:  # the next batch's choice
        current = plan.online.after_batch(batch, None, seconds, result, feed)
  except KeyboardInterrupt:
    writer.close()
    raise KeyboardInterrupt(f"kept {writer.kept()}; {run_metrics.INFER_FILE} "
                            "was not written") from None
  record = infer_record(plan, examples, texts, tally, compile_s, data_info)
  on_result(record)

  multihost.run_on_first(
      "write",
      lambda: predictions.publish(writer, len(
          examples), os.path.join(out, run_metrics.INFER_FILE), record))
  return record


def infer_record(plan: DecodePlan, examples: Sequence[Dict[str, Any]],
                 texts: List[str], tally: batches_lib.Tally, compile_s: float,
                 data_info: Dict[str, Any]) -> Dict[str, Any]:
  """infer.json's dict: what was decoded, how fast, how well.

  `tally`: the speculative decoder's counts (α: metrics.json's, kept
  guesses over the acceptance trials whose context reached the output,
  `Tally.alpha`: the walltime run of the same settings and seed records
  the same α). A run that switched choices (SPECULATION='auto') records the
  last speculative choice's settings, γ the largest (`online`).
  """
  ended, auto, switch_compile_s = (plan.online.outcome() if plan.online else
                                   (plan, None, 0.0))
  args = ended.args
  references = [e.get("reference") for e in examples]
  quality = None
  if all(r is not None for r in references):
    quality = quality_lib.quality_metrics(plan.task_kind, texts, references)
  decode_s = sum(tally.seconds)
  return {
      "mode": "infer",
      "task": args.label,
      "target_model": args.target_name,
      "draft_model":
          (args.drafting.label(args.draft_name) + ended.mode.label(args)),
      "decode_mode": ended.mode.name,
      "gamma": args.gamma,
      "temperature": args.temperature,
      "num_examples": len(examples),
      "tokens_generated": tally.tokens,
      "target_calls": tally.calls,
      "tokens_per_target_call": tally.tokens / max(tally.calls, 1),
      "alpha": tally.alpha,
      "decode_s": decode_s,
      "compile_time_s": compile_s + switch_compile_s,
      "tokens_per_second": tally.tokens / max(decode_s, 1e-9),
      "quality": quality,
      **data_info,
      "settings": plan.settings,
      **run_metrics.speculation_keys(args.speculation, auto),
  }
