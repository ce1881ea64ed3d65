"""Reading a results folder: every run's metrics.json (`RunMetrics`), the
alpha.json beside it, and predictions.jsonl records (T5X's layout, which
`run` writes, and the older ones, read into one set of names).

Each check raises `ReportError` naming the file (and line), so the report
stops with one line before anything is written.
"""
import json
import logging
import os
from typing import Any, Callable, Dict, Iterator, List, Optional

from specdec_jax.files import io_utils
from specdec_jax.metrics import run_metrics
from specdec_jax.experiment import decode_modes


class ReportError(Exception):
  """Bad input; the message names the offending file."""


def _read_json(path: str) -> Any:
  """`path`'s JSON; a regular file of bounded size (`io_utils.read_text`:
  a FIFO or a link to /dev/zero is refused, never read)."""
  try:
    return json.loads(io_utils.read_text(path))
  except json.JSONDecodeError as e:
    raise ReportError(f"{path}: not valid JSON ({e})") from None
  except UnicodeDecodeError as e:
    raise ReportError(f"{path}: not UTF-8 text ({e.reason})") from None
  except OSError as e:
    raise ReportError(f"{path}: cannot read ({e.strerror or e})") from None


def load_metrics(path: str) -> Dict[str, Any]:
  """Reads and checks one metrics.json (`run_metrics.RunMetrics`).

  Returns:
    The file's object with every `RunMetrics` key checked and normalized,
    and the keys older files lack filled with their defaults (keys it does
    not know are kept as they are).

  Raises:
    ReportError: not JSON, or not a `RunMetrics` (names the key).
  """
  data = _read_json(path)
  try:
    metrics = run_metrics.RunMetrics.from_dict(data)
  except run_metrics.MetricsError as e:
    raise ReportError(f"{path}: {e}") from None
  return run_metrics.as_mapping(metrics, data)


def left_out(metrics: Dict[str, Any]) -> Optional[str]:
  """Why a run has no single c and Theorem 3.8 for the tables, or None."""
  mode = decode_modes.of_metrics(metrics)
  if mode.beam:
    return ("a DECODE='beam' run (Theorem 3.8 models sampling one sequence; "
            "tabulate beams with `python -m tools.beam_table`)")
  if mode.target_alone:
    return "a SPECULATION='off' run (the target alone: nothing drafted, no c)"
  if metrics.get("call_cost_priced") is False:
    return ("a PRICE_CALL_COST=False run (no c, no Theorem 3.8; re-run it "
            "with PRICE_CALL_COST=True)")
  if run_metrics.switched(metrics.get("auto")):
    return ("a SPECULATION='auto' run that switched decode modes between "
            "batches (its auto.segments has each setting's numbers)")
  return None


def load_results(results_dir: str,
                 exclude: Optional[str] = None) -> List[Dict[str, Any]]:
  """Loads every run under `results_dir` (one metrics.json per directory).

  Args:
    results_dir: directory searched recursively for `metrics.json`.
    exclude: a directory to skip (the report's own output directory).

  Returns:
    The validated metrics dicts, sorted by run name, each with three added
    keys: `run_name` (directory relative to results_dir), `run_dir` and
    `predictions_path` (None when the run has no predictions.jsonl).

  Raises:
    ReportError: missing / empty directory or an invalid metrics.json.
  """
  if not os.path.exists(results_dir):
    raise ReportError(f"{results_dir}: results directory does not exist")
  if not os.path.isdir(results_dir):
    raise ReportError(f"{results_dir}: not a directory")
  skip = os.path.realpath(exclude) if exclude else None
  runs, beams, unpriced = [], 0, 0
  for dirpath, dirnames, filenames in os.walk(results_dir, onerror=None):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and
                         os.path.realpath(os.path.join(dirpath, d)) != skip)
    if run_metrics.METRICS_FILE not in filenames:
      continue
    metrics = load_metrics(os.path.join(dirpath, run_metrics.METRICS_FILE))
    why = left_out(metrics)
    if why:
      # Each table here prints c and Theorem 3.8: runs without one setting
      # of them are left out, said so.
      logging.warning(
          "%s: %s, left out of the report; read its "
          "metrics.json directly", dirpath, why)
      beams += decode_modes.of_metrics(metrics).beam
      unpriced += metrics.get("call_cost_priced") is False
      continue
    rel = os.path.relpath(dirpath, results_dir)
    metrics["run_name"] = os.path.basename(
        os.path.abspath(results_dir)) if rel == "." else rel
    metrics["run_dir"] = dirpath
    pred = os.path.join(dirpath, run_metrics.PREDICTIONS_FILE)
    metrics["predictions_path"] = pred if os.path.isfile(pred) else None
    # `run` in alpha mode, with the same settings.
    if run_metrics.ALPHA_FILE in filenames:
      alpha_path = os.path.join(dirpath, run_metrics.ALPHA_FILE)
      sampled = _read_json(alpha_path)
      if not isinstance(sampled, dict) or not run_metrics.is_number(
          sampled.get("alpha_beta")):
        raise ReportError(f"{alpha_path}: not an alpha.json written by "
                          "`specdec_jax.run` in alpha mode")
      metrics["alpha_sampled"] = float(sampled["alpha_beta"])
      metrics["alpha_sampled_stderr"] = sampled.get("alpha_beta_stderr")
    runs.append(metrics)
  if not runs and beams:
    raise ReportError(
        f"{results_dir}: only DECODE='beam' runs ({beams}), which the "
        "report leaves out (its tables are Theorem 3.8's); tabulate them "
        "with `python -m tools.beam_table`")
  if not runs and unpriced:
    raise ReportError(
        f"{results_dir}: only PRICE_CALL_COST=False runs ({unpriced}), which "
        "the report leaves out (its tables need c and Theorem 3.8)")
  if not runs:
    raise ReportError(f"{results_dir}: no run directories with a "
                      f"{run_metrics.METRICS_FILE} found")
  runs.sort(key=lambda m: m["run_name"])
  return runs


def _is_trace_step(step: Any) -> bool:
  """A predictions.jsonl trace entry: one target call's guesses."""
  return (isinstance(step, dict) and
          isinstance(step.get("draft_tokens"), list) and
          all(isinstance(t, str) for t in step["draft_tokens"]) and
          isinstance(step.get("num_accepted"), int) and
          not isinstance(step.get("num_accepted"), bool) and
          0 <= step["num_accepted"] <= len(step["draft_tokens"]) and
          (step.get("target_token") is None or
           isinstance(step.get("target_token"), str)))


def _is_timeline_event(ev: Any) -> bool:
  """An older run's timeline entry: one draft or target call's span."""
  return (isinstance(ev, dict) and ev.get("kind") in ("draft", "target") and
          run_metrics.is_number(ev.get("start_s")) and
          run_metrics.is_number(ev.get("end_s")) and
          ev["end_s"] >= ev["start_s"])


def _check_entries(where: str, key: str, value: Any,
                   is_entry: Callable[[Any], bool], expected: str) -> None:
  """Raises ReportError unless `value` is None or a list of entries that
  pass `is_entry` (`expected` describes one)."""
  if value is None:
    return
  if not isinstance(value, list):
    raise ReportError(f"{where}: '{key}' must be a list")
  for i, entry in enumerate(value):
    if not is_entry(entry):
      raise ReportError(f"{where}: {key}[{i}] must be {expected}, got "
                        f"{entry!r}")


def _flat(where: str, ex: Dict[str, Any]) -> Dict[str, Any]:
  """A predictions.jsonl row in the report's names (`check_prediction`),
  whichever layout wrote it."""
  inputs = ex.get("inputs")
  if isinstance(inputs, str):  # MODE='infer' before T5X's `inputs` object
    names = {
        "inputs": "input",
        "targets": "reference",
        "prediction": "speculative"
    }
    return {names.get(k, k): v for k, v in ex.items()}
  if inputs is None:  # MODE='walltime' before T5X's layout: the report's
    return ex
  if not (isinstance(inputs, dict) and
          all(isinstance(v, str) for v in inputs.values())):
    raise ReportError(f"{where}: 'inputs' must be an object of texts (T5X's "
                      f"*_pretokenized features), got {inputs!r}")
  if not isinstance(ex.get("prediction"), str):
    raise ReportError(f"{where}: 'prediction' must be a text, got "
                      f"{ex.get('prediction')!r}")
  aux = ex.get("aux", {})
  if not isinstance(aux, dict):
    raise ReportError(f"{where}: 'aux' must be an object, got {aux!r}")
  flat = {
      "input": inputs.get(run_metrics.INPUTS_FEATURE),
      "reference": inputs.get(run_metrics.TARGETS_FEATURE),
      "speculative": ex["prediction"],
      **aux
  }
  return {k: v for k, v in flat.items() if v is not None}


def check_prediction(path: str, lineno: int, ex: Any) -> Dict[str, Any]:
  """Validates one predictions.jsonl record (the fields the report uses)
  and returns it in the report's names.

  The rows `run` writes (T5X's layout, `experiment.predictions.row`):
  {"inputs": {"inputs_pretokenized", "targets_pretokenized"}, "prediction":
  the speculative text, "aux": {"index", "baseline" (walltime),
  "target_calls", "accepted_counts": [int per target call], "trace":
  [{"draft_tokens": [str], "num_accepted": int, "target_token": str or
  null}] (one per target call)}}. Returned as the report reads every
  layout: {"index", "input", "reference", "baseline", "speculative",
  "target_calls", "accepted_counts", "trace", and "timeline": older runs
  only [{"kind": "draft" | "target", "start_s", "end_s"}]}. Older rows are
  read too: MODE='walltime''s, already in those names, and MODE='infer''s
  ("inputs" a text, "prediction", "targets").
  """
  where = f"{path}:{lineno}"
  if not isinstance(ex, dict):
    raise ReportError(f"{where}: expected a JSON object per line, got "
                      f"{type(ex).__name__}")
  ex = _flat(where, ex)
  counts = ex.get("accepted_counts")
  if counts is not None and not (isinstance(counts, list) and all(
      isinstance(n, int) and not isinstance(n, bool) and n >= 0
      for n in counts)):
    raise ReportError(f"{where}: 'accepted_counts' must be a list of "
                      f"integers >= 0, got {counts!r}")
  _check_entries(
      where, "trace", ex.get("trace"), _is_trace_step,
      "{\"draft_tokens\": [str], \"num_accepted\": int in "
      "[0, len(draft_tokens)], \"target_token\": str}")
  _check_entries(
      where, "timeline", ex.get("timeline"), _is_timeline_event,
      "{\"kind\": \"draft\"|\"target\", \"start_s\": "
      "number, \"end_s\": number >= start_s}")
  return ex


def iter_predictions(path: str) -> Iterator[Dict[str, Any]]:
  """Yields validated predictions.jsonl records (raises ReportError); read
  line by line from a regular file (`io_utils.open_text`)."""
  try:
    with io_utils.open_text(path) as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          ex = json.loads(line)
        except json.JSONDecodeError as e:
          raise ReportError(f"{path}:{lineno}: not valid JSON ({e})") from None
        yield check_prediction(path, lineno, ex)
  except UnicodeDecodeError as e:
    raise ReportError(f"{path}: not UTF-8 text ({e.reason})") from None
  except OSError as e:
    raise ReportError(f"{path}: cannot read ({e.strerror or e})") from None
