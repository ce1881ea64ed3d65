r"""Tables and figures from a directory of speculative-decoding runs
(docs/usage/running.md):

  python -m specdec_jax.report RESULTS_DIR [--output_dir DIR]
      [--example_run RUN] [--example_index N]

Every folder under RESULTS_DIR with a metrics.json is a run (its files
checked; every layout of predictions.jsonl read in one set of names). It
writes Tables 2 and 4 (`reporting.tables`) and the figures there is data
for (`reporting.figures`; Figures 1 and 5: `reporting.trace`) into DIR
(default RESULTS_DIR/report), atomically; bad input stops it first with one
line naming the file (exit 2).
"""
import json
import logging
import os
import sys
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple)

from absl import flags

from specdec_jax.config import flag_utils
from specdec_jax.core import environment
from specdec_jax.experiment import decode_modes
from specdec_jax.files import io_utils
from specdec_jax.metrics import run_metrics
from specdec_jax.reporting import figures
from specdec_jax.reporting import tables
from specdec_jax.reporting import trace

logger = logging.getLogger(__name__)

# Tokens per target call against k (a sweep over TREE_WIDTH).
TREE_FIGURE = "tokens_per_call_vs_tree_width"

Run = Dict[str, Any]
Example = Dict[str, Any]


class ReportError(Exception):
  """Bad input; the message names the offending file."""


# One line and exit 2: a bad input file or folder, a bad SPECDEC_* variable.
BAD_INPUT = (ReportError, environment.BadEnvironment)


def _read_json(path: str) -> Any:
  """`path`'s JSON (`io_utils.read_text`: bounded, regular files only)."""
  try:
    return json.loads(io_utils.read_text(path))
  except json.JSONDecodeError as e:
    raise ReportError(f"{path}: not valid JSON ({e})") from None
  except UnicodeDecodeError as e:
    raise ReportError(f"{path}: not UTF-8 text ({e.reason})") from None
  except OSError as e:
    raise ReportError(f"{path}: cannot read ({e.strerror or e})") from None


def load_metrics(path: str) -> Dict[str, Any]:
  """One metrics.json, checked (`run_metrics.as_mapping`); ReportError:
  not JSON, or not a `RunMetrics`."""
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


def _folders(results_dir: str,
             exclude: Optional[str] = None) -> Iterator[Tuple[str, List[str]]]:
  """(folder, its file names) of `results_dir` and every folder under it,
  in name order, but hidden ones and `exclude` (the report's own)."""
  skip = os.path.realpath(exclude) if exclude else None
  for dirpath, dirnames, filenames in os.walk(results_dir):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and
                         os.path.realpath(os.path.join(dirpath, d)) != skip)
    yield dirpath, filenames


def _other_results(results_dir: str) -> str:
  """The other modes' result files under `results_dir`, counted in words
  ('' when none)."""
  counts = {run_metrics.INFER_FILE: 0}
  for _, filenames in _folders(results_dir):
    for name in counts:
      counts[name] += name in filenames
  return ", ".join(
      f"{n} {name} (MODE='{name.split('.')[0]}')" for name, n in counts.items()
      if n)


def load_alpha_runs(results_dir: str,
                    exclude: Optional[str] = None) -> List[Dict[str, Any]]:
  """Every MODE='alpha' run under `results_dir` but `exclude` (a folder
  with an alpha.json and no metrics.json), its alpha.json with
  `run_name`; ReportError: an invalid alpha.json."""
  alphas = []
  for dirpath, filenames in _folders(results_dir, exclude):
    if (run_metrics.ALPHA_FILE not in filenames or
        run_metrics.METRICS_FILE in filenames):
      continue
    path = os.path.join(dirpath, run_metrics.ALPHA_FILE)
    record = _read_json(path)
    if not (isinstance(record, dict) and all(
        run_metrics.is_number(record.get(k))
        for k in ("alpha_beta", "temperature", "num_positions", "num_examples"))
            and isinstance(record.get("task"), str) and
            isinstance(record.get("draft_model"), str)):
      raise ReportError(f"{path}: not an alpha.json written by "
                        "`specdec_jax.run` in alpha mode")
    rel = os.path.relpath(dirpath, results_dir)
    alphas.append(
        dict(
            record, run_name=os.path.basename(os.path.abspath(results_dir))
            if rel == "." else rel))
  return alphas


def load_results(results_dir: str,
                 exclude: Optional[str] = None) -> List[Dict[str, Any]]:
  """Every run (a folder with a metrics.json `left_out` keeps) under
  `results_dir` but `exclude`, by `run_name` (its relative folder), with
  `run_dir`, `predictions_path` (or None) and alpha.json's `alpha_sampled`;
  ReportError: a missing or empty folder, an invalid file."""
  if not os.path.exists(results_dir):
    raise ReportError(f"{results_dir}: results directory does not exist")
  if not os.path.isdir(results_dir):
    raise ReportError(f"{results_dir}: not a directory")
  runs, beams, unpriced = [], 0, 0
  for dirpath, filenames in _folders(results_dir, exclude):
    if run_metrics.METRICS_FILE not in filenames:
      continue
    metrics = load_metrics(os.path.join(dirpath, run_metrics.METRICS_FILE))
    why = left_out(metrics)
    if why:
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
    other = _other_results(results_dir)
    raise ReportError(
        f"{results_dir}: no run directories with a "
        f"{run_metrics.METRICS_FILE} found" +
        (f"; {other}, which have no speedup to tabulate "
         "(MODE='walltime' writes metrics.json, 'alpha' alpha.json: "
         "Table 3)" if other else ""))
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
  """ReportError unless `value` is None or a list of `is_entry` entries."""
  if value is None:
    return
  if not isinstance(value, list):
    raise ReportError(f"{where}: '{key}' must be a list")
  for i, entry in enumerate(value):
    if not is_entry(entry):
      raise ReportError(f"{where}: {key}[{i}] must be {expected}, got "
                        f"{entry!r}")


def _flat(where: str, ex: Dict[str, Any]) -> Dict[str, Any]:
  """A predictions.jsonl row of any layout in `check_prediction`'s names."""
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
  """A predictions.jsonl row of any layout (docs/usage/outputs.md), checked,
  as {"index", "input", "reference", "baseline", "speculative",
  "target_calls", "accepted_counts", "trace", older runs' "timeline"}."""
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
  """predictions.jsonl's rows, checked (`check_prediction`)."""
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


def _chosen_examples(runs: List[Run], results_dir: str,
                     example_run: Optional[str], example_index: Optional[int]):
  """The (run, example) pairs of the trace and the timeline."""
  if example_run is not None and example_run not in {
      r["run_name"] for r in runs
  }:
    raise ReportError(f"{results_dir}: no run named {example_run!r}")
  trace_pair = find_example(runs, lambda ex, run: bool(ex.get("trace")),
                            example_run, example_index,
                            rank=trace_informativeness)
  timeline_pair = find_example(
      runs, lambda ex, run: bool(trace.example_timeline(ex, run)), example_run,
      example_index, prefer=trace_pair if trace_pair[1] is not None else None)
  if example_index is not None and trace_pair[1] is None:
    count = index_count(runs, example_run)
    if not 0 <= example_index < count:  # not "no trace": no such example
      where = results_dir + (f" (run {example_run!r})" if example_run else "")
      allowed = (f"allowed: 0 to {count - 1}"
                 if count else "it has no predictions.jsonl")
      raise ReportError(f"--example_index={example_index}: no such example "
                        f"in {where}; {allowed}.")
  return trace_pair, timeline_pair


def _render(runs: List[Run], trace_pair: Tuple[Run, Optional[Example]],
            timeline_pair: Tuple[Run, Optional[Example]],
            example_run: Optional[str]) -> Dict[str, bytes]:
  """{file name: contents} of every table and figure there is data for."""
  table2_md, table2_csv = tables.render_table2(runs)
  artifacts = {
      "table2.md": table2_md.encode("utf-8"),
      "table2.csv": table2_csv.encode("utf-8"),
      "table4.md": tables.render_table4(runs).encode("utf-8")
  }

  def add(name, fig, fmts=("png", "svg")):
    for fmt in fmts:
      artifacts[f"{name}.{fmt}"] = figures.figure_bytes(fig, fmt)

  add("speedup_vs_gamma", figures.render_speedup_vs_gamma(runs))
  add("alpha_by_draft", figures.render_alpha_by_draft(runs))
  if figures.has_several_tree_widths(runs):
    add(TREE_FIGURE, figures.render_tokens_per_call_vs_tree_width(runs))
  else:
    logger.info(
        "skipping %s: no tree runs (ACCEPTANCE='tree') at two or "
        "more TREE_WIDTH values", TREE_FIGURE)
  where = f" in run {example_run}" if example_run else ""
  trace_run, trace_ex = trace_pair
  if trace_ex is None:
    logger.info("skipping example_trace: no %s with a non-empty 'trace'%s",
                run_metrics.PREDICTIONS_FILE, where)
  else:
    logger.info("example_trace: run %s, example %s", trace_run["run_name"],
                trace_ex.get("index"))
    artifacts["example_trace.html"] = trace.render_trace_html(
        trace_ex, trace_run).encode("utf-8")
    add("example_trace", trace.render_trace_png(trace_ex, trace_run), ("png",))
  tl_run, tl_ex = timeline_pair
  if tl_ex is None:
    logger.info(
        "skipping timeline: no %s with 'accepted_counts' next to a "
        "metrics.json with draft_step_s and target_step_s (or an "
        "older 'timeline')%s", run_metrics.PREDICTIONS_FILE, where)
  else:
    logger.info("timeline: run %s, example %s", tl_run["run_name"],
                tl_ex.get("index"))
    add("timeline", trace.render_timeline(tl_ex, tl_run))
  return artifacts


def _write(artifacts: Dict[str, bytes], output_dir: str) -> Dict[str, str]:
  """Writes every file atomically; {file name: path}."""
  try:
    os.makedirs(output_dir, exist_ok=True)
    written = {}
    for name, data in artifacts.items():
      path = os.path.join(output_dir, name)
      io_utils.atomic_write(path, data)
      written[name] = path
  except OSError as e:
    raise ReportError(
        f"{e.filename or output_dir}: cannot write ({e.strerror})") from None
  logger.info("wrote %d files to %s", len(written), output_dir)
  return written


def render_report(results_dir: str, output_dir: Optional[str] = None,
                  example_run: Optional[str] = None,
                  example_index: Optional[int] = None) -> Dict[str, str]:
  """{file name: path} of every table and figure of `results_dir`, written
  into `output_dir` (default results_dir/report) once all are rendered;
  example_run (a run's folder) and example_index choose the drawn example
  (default: `find_example`'s). ReportError: bad input, nothing written."""
  if output_dir is None:
    output_dir = os.path.join(results_dir, "report")
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ReportError(f"{output_dir}: output path exists and is not a "
                      "directory")
  alphas = load_alpha_runs(results_dir, exclude=output_dir)
  if alphas and not _has_metrics(results_dir, output_dir):
    logger.info("loaded %d MODE='alpha' runs from %s: Table 3 only",
                len(alphas), results_dir)
    return _write({"table3.md": tables.render_table3(alphas).encode("utf-8")},
                  output_dir)
  runs = load_results(results_dir, exclude=output_dir)
  logger.info("loaded %d runs from %s", len(runs), results_dir)
  for run in runs:  # a malformed predictions.jsonl stops it, drawn or not
    if run["predictions_path"]:
      for _ in iter_predictions(run["predictions_path"]):
        pass
  trace_pair, timeline_pair = _chosen_examples(runs, results_dir, example_run,
                                               example_index)
  artifacts = _render(runs, trace_pair, timeline_pair, example_run)
  if alphas:
    artifacts["table3.md"] = tables.render_table3(alphas).encode("utf-8")
  return _write(artifacts, output_dir)


def _has_metrics(results_dir: str, exclude: str) -> bool:
  """Whether any folder under `results_dir` but `exclude` holds a
  metrics.json."""
  return any(run_metrics.METRICS_FILE in filenames
             for _, filenames in _folders(results_dir, exclude))


PROGRAM = "python -m specdec_jax.report"
_DESCRIPTION = (
    "Tables (Table 2/4 style; Table 3 of MODE='alpha' runs) and figures "
    "(speedup vs gamma, alpha per draft, Figure-1 trace, Figure-5 timeline) "
    "from a directory of speculative-decoding runs.")


def define_flags():
  """A new absl FlagValues holding the report's flags (`gin_utils`)."""
  fv = flag_utils.new_flag_values()
  flags.DEFINE_string(
      "output_dir", None, "where to write the report "
      "(default: RESULTS_DIR/report)", flag_values=fv)
  flags.DEFINE_string(
      "example_run", None, "run (relative directory) to take "
      "the example trace/timeline from", flag_values=fv)
  flags.DEFINE_integer("example_index", None,
                       "'index' of the example to render", flag_values=fv)
  return fv


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command; its exit status (2 on bad input)."""
  fv = define_flags()
  handler = None
  try:
    args = flag_utils.parse_flag_values(fv, PROGRAM,
                                        sys.argv[1:] if argv is None else argv)
    if fv.help:
      usage = f"{PROGRAM} RESULTS_DIR [--flag=value ...]"
      print(flag_utils.flags_help(fv, usage, _DESCRIPTION))
      return 0
    if len(args) != 1:
      raise flag_utils.ConfigError(
          f"expected one RESULTS_DIR, got {args} (allowed: a directory with "
          "one sub-directory per run, each holding metrics.json).")
    # Progress lines as 'report: ...' on stderr.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("report: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    written = render_report(args[0], fv.output_dir, example_run=fv.example_run,
                            example_index=fv.example_index)
  except (flag_utils.ConfigError,) + BAD_INPUT as e:
    print(f"report: error: {e}", file=sys.stderr)
    return 2
  finally:
    if handler:
      logger.removeHandler(handler)
      logger.propagate = True
  for path in written.values():
    print(path)
  return 0


# -- Which example the report draws (Figures 1 and 5) --------------------------
def _run_informativeness(run: Mapping[str, Any]):
  """Sort key, best first: highest α, then T = 0, then highest speedup."""
  return (-run["alpha"], run["temperature"], -run["speedup"], run["run_name"])


def trace_informativeness(ex: Mapping[str, Any], max_lines: int = 16):
  """Sort key, best first, of a trace for Figure 1: it fits, shows accepted
  and rejected guesses and a fully accepted call, many tokens per call."""
  trace = ex["trace"]
  accepted = [s["num_accepted"] for s in trace]
  proposed = [len(s["draft_tokens"]) for s in trace]
  mixed = any(accepted) and any(a < p for a, p in zip(accepted, proposed))
  full = any(a == p > 0 for a, p in zip(accepted, proposed))
  return (len(trace)
          > max_lines, not mixed, not full, -sum(accepted) / len(trace),
          ex.get("index", 0))


def find_example(runs, has_data, example_run: Optional[str],
                 example_index: Optional[int], prefer=None, rank=None):
  """The (run, example) to draw or (None, None): `prefer` if usable
  (`has_data`), else from the best run with one, the one with
  `example_index`, else the first by `rank` (a sort key) or in the file."""
  candidates = sorted((r for r in runs if r["predictions_path"]),
                      key=_run_informativeness)
  if example_run is not None:
    candidates = [r for r in candidates if r["run_name"] == example_run]
  if prefer is not None:
    run, ex = prefer
    if has_data(ex, run):
      return run, ex
  for run in candidates:
    usable = [
        ex for ex in iter_predictions(run["predictions_path"])
        if has_data(ex, run) and
        (example_index is None or ex.get("index") == example_index)
    ]
    if usable:
      return run, (min(usable, key=rank) if rank else usable[0])
  return None, None


def index_count(runs, example_run: Optional[str]) -> int:
  """The most examples a run's (`example_run`'s) predictions hold."""
  counts = [
      sum(1
          for _ in iter_predictions(r["predictions_path"]))
      for r in runs
      if r["predictions_path"] and example_run in (None, r["run_name"])
  ]
  return max(counts, default=0)


if __name__ == "__main__":
  sys.exit(main())
