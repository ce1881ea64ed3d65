r"""Tables and figures from a directory of speculative-decoding runs.

Usage:

  python -m specdec_jax.report RESULTS_DIR [--output_dir DIR]
      [--example_run RUN] [--example_index N]

RESULTS_DIR holds one sub-directory per run / sweep point (nested directories
are searched too), each with a `metrics.json` (`run_metrics.RunMetrics`) and
optionally a `predictions.jsonl` (`reporting.loading.check_prediction`) and
an `alpha.json`. Written into DIR (default RESULTS_DIR/report):

* `table2.md`, `table2.csv`: the paper's Table 2 layout (TASK, M_q, TEMP,
  gamma, alpha, SPEED), plus Theorem 3.8's speedup and BLEU / ROUGE-L of the
  baseline and speculative outputs; the best draft per (task, target,
  temperature) is starred. Below it every run, with its drafter, lenience
  and §3.5's per-iteration-γ bound (`reporting.tables`).
* `table4.md`: measured vs theoretical speedup and tokens per target call
  (`analysis.theory_vs_measured`, Theorem 3.8 and Equation (1)).
* `speedup_vs_gamma.{png,svg}`, `alpha_by_draft.{png,svg}`
  (`reporting.figures`), `example_trace.{html,png}` (Figure 1 style,
  `reporting.trace`), `timeline.{png,svg}` (Figure 5 style, modeled from
  the example's accepted counts and the run's step times,
  `reporting.trace`), and for a sweep with tree runs at several
  TREE_WIDTH values `tokens_per_call_vs_tree_width.{png,svg}` (tokens per
  target call against k, `reporting.figures`). Figures whose data are
  absent are skipped with a log message.

The example comes from the most informative run (highest α, then
temperature 0, then highest speedup) and, in it, the example whose trace
fits the figure and shows accepted and rejected guesses
(`find_example`); `--example_run` / `--example_index` choose instead.

Bad input (missing / empty directory, a metrics.json that is not JSON or not
a `RunMetrics`, a malformed predictions.jsonl or alpha.json) stops the report
with a one-line error naming the file and exit code 2, before anything is
written. All outputs are rendered in memory first and then written
atomically (temporary file + os.replace).
"""
import logging
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import flags

from specdec_jax.config import flag_utils
from specdec_jax.core import environment
from specdec_jax.files import io_utils
from specdec_jax.metrics import run_metrics
from specdec_jax.reporting import figures
from specdec_jax.reporting import loading
from specdec_jax.reporting import tables
from specdec_jax.reporting import trace

logger = logging.getLogger(__name__)

# The report's public names, wherever they live.
METRICS_FILE = run_metrics.METRICS_FILE
ALPHA_FILE = run_metrics.ALPHA_FILE
PREDICTIONS_FILE = run_metrics.PREDICTIONS_FILE
ReportError = loading.ReportError
# One line and exit 2: a bad input file or folder, a bad SPECDEC_* variable.
BAD_INPUT = (ReportError, environment.BadEnvironment)
load_metrics = loading.load_metrics
load_results = loading.load_results
iter_predictions = loading.iter_predictions
quality = tables.quality
annotate_best = tables.annotate_best
render_table2 = tables.render_table2
render_table4 = tables.render_table4
render_speedup_vs_gamma = figures.render_speedup_vs_gamma
render_alpha_by_draft = figures.render_alpha_by_draft
render_tokens_per_call_vs_tree_width = (
    figures.render_tokens_per_call_vs_tree_width)
# Tokens per target call against k (a sweep over TREE_WIDTH).
TREE_FIGURE = "tokens_per_call_vs_tree_width"
trace_lines = trace.trace_lines
render_trace_html = trace.render_trace_html
render_trace_png = trace.render_trace_png
modeled_timeline = trace.modeled_timeline
example_timeline = trace.example_timeline
render_timeline = trace.render_timeline

Run = Dict[str, Any]
Example = Dict[str, Any]


def _check_predictions(runs: List[Run]) -> None:
  """Reads every run's predictions.jsonl once: a malformed one stops the
  report (ReportError naming the file and line), whether or not its run
  supplies the example."""
  for run in runs:
    path = run.get("predictions_path")
    if path:
      for _ in iter_predictions(path):
        pass


def _chosen_examples(runs: List[Run], results_dir: str,
                     example_run: Optional[str], example_index: Optional[int]):
  """((run, example) of the trace, (run, example) of the timeline); either
  example may be None. Their predictions.jsonl files are read and checked
  here, before anything is rendered, so a malformed one fails fast."""
  if example_run is not None and example_run not in {
      r["run_name"] for r in runs
  }:
    raise ReportError(f"{results_dir}: no run named {example_run!r}")
  trace_pair = find_example(runs, lambda ex, run: bool(ex.get("trace")),
                            example_run, example_index,
                            rank=trace_informativeness)
  timeline_pair = find_example(
      runs, lambda ex, run: bool(example_timeline(ex, run)), example_run,
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
  artifacts: Dict[str, bytes] = {}
  table2_md, table2_csv = render_table2(runs)
  artifacts["table2.md"] = table2_md.encode("utf-8")
  artifacts["table2.csv"] = table2_csv.encode("utf-8")
  artifacts["table4.md"] = render_table4(runs).encode("utf-8")
  for name, render in (("speedup_vs_gamma", render_speedup_vs_gamma),
                       ("alpha_by_draft", render_alpha_by_draft)):
    fig = render(runs)
    for fmt in ("png", "svg"):
      artifacts[f"{name}.{fmt}"] = figures.figure_bytes(fig, fmt)
  if figures.has_several_tree_widths(runs):
    fig = figures.render_tokens_per_call_vs_tree_width(runs)
    for fmt in ("png", "svg"):
      artifacts[f"{TREE_FIGURE}.{fmt}"] = figures.figure_bytes(fig, fmt)
  else:
    logger.info(
        "skipping %s: no tree runs (ACCEPTANCE='tree') at two or "
        "more TREE_WIDTH values", TREE_FIGURE)
  where = f" in run {example_run}" if example_run else ""
  trace_run, trace_ex = trace_pair
  if trace_ex is None:
    logger.info("skipping example_trace: no %s with a non-empty 'trace'%s",
                PREDICTIONS_FILE, where)
  else:
    logger.info("example_trace: run %s, example %s", trace_run["run_name"],
                trace_ex.get("index"))
    artifacts["example_trace.html"] = render_trace_html(
        trace_ex, trace_run).encode("utf-8")
    artifacts["example_trace.png"] = figures.figure_bytes(
        render_trace_png(trace_ex, trace_run), "png")
  tl_run, tl_ex = timeline_pair
  if tl_ex is None:
    logger.info(
        "skipping timeline: no %s with 'accepted_counts' next to a "
        "metrics.json with draft_step_s and target_step_s (or an "
        "older 'timeline')%s", PREDICTIONS_FILE, where)
  else:
    logger.info("timeline: run %s, example %s", tl_run["run_name"],
                tl_ex.get("index"))
    fig = render_timeline(tl_ex, tl_run)
    for fmt in ("png", "svg"):
      artifacts[f"timeline.{fmt}"] = figures.figure_bytes(fig, fmt)
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
  """Renders all tables and figures for `results_dir` into `output_dir`.

  Everything is rendered in memory first; files are written (atomically)
  only if loading and rendering succeeded.

  Args:
    results_dir: directory of runs (see `load_results`).
    output_dir: destination, default `results_dir/report`.
    example_run: run name (relative directory) whose predictions.jsonl
      provides the example trace / timeline; default: the most informative
      run with one (highest α, then T = 0, then highest speedup).
    example_index: the example's "index"; default: the most informative
      trace of that run (fits the figure, accepted and rejected guesses).

  Returns:
    {file name: written path}, e.g. {"table2.md": ".../table2.md", ...}.

  Raises:
    ReportError: bad input (message names the file); nothing is written.
  """
  if output_dir is None:
    output_dir = os.path.join(results_dir, "report")
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ReportError(f"{output_dir}: output path exists and is not a "
                      "directory")
  runs = load_results(results_dir, exclude=output_dir)
  logger.info("loaded %d runs from %s", len(runs), results_dir)
  _check_predictions(runs)
  trace_pair, timeline_pair = _chosen_examples(runs, results_dir, example_run,
                                               example_index)
  return _write(_render(runs, trace_pair, timeline_pair, example_run),
                output_dir)


PROGRAM = "python -m specdec_jax.report"
_DESCRIPTION = (
    "Tables (Table 2/4 style) and figures (speedup vs gamma, alpha per draft, "
    "Figure-1 trace, Figure-5 timeline) from a directory of "
    "speculative-decoding runs.")


def define_flags():
  """A new absl FlagValues holding the report's flags (`flag_utils`)."""
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


def _log_to_stderr():
  """Progress lines as 'report: ...' on stderr; returns the handler."""
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter("report: %(message)s"))
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False
  return handler


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point: ``RESULTS_DIR [--output_dir DIR] [--example_run RUN]
  [--example_index N]``; returns the exit status (2 on bad input)."""
  fv = define_flags()
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
  except flag_utils.ConfigError as e:
    print(f"report: error: {e}", file=sys.stderr)
    return 2
  handler = _log_to_stderr()
  try:
    written = render_report(args[0], fv.output_dir, example_run=fv.example_run,
                            example_index=fv.example_index)
  except BAD_INPUT as e:
    print(f"report: error: {e}", file=sys.stderr)
    return 2
  finally:
    logger.removeHandler(handler)
    logger.propagate = True
  for path in written.values():
    print(path)
  return 0


# -- examples ------------------------------------------------------------------
# Which decoded example the report draws (Figure 1's trace, Figure 5's
# timeline): from the most informative run (highest α, then temperature 0,
# then highest speedup), the most informative example, unless the user
# chose (`--example_run`, `--example_index`).
def _run_informativeness(run: Mapping[str, Any]):
  """Sort key, best first: highest α, then T = 0, then highest speedup."""
  return (-run["alpha"], run["temperature"], -run["speedup"], run["run_name"])


def trace_informativeness(ex: Mapping[str, Any], max_lines: int = 16):
  """Sort key, best first, of an example's trace for Figure 1.

  A trace that fits the figure, that shows both accepted and rejected
  guesses and a fully accepted call, with many accepted tokens per call.
  """
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
  """The (run, example) to draw, or (None, None).

  Runs are searched best first (`_run_informativeness`); in the first run
  with a usable example (`has_data(example, run)`), the example with
  `example_index`, or else the best by `rank` (an example sort key; default:
  file order). `prefer`, a (run, example) pair, is taken when usable.

  The whole predictions.jsonl of a searched run is read and validated, so a
  malformed line anywhere in the file the example comes from is reported.
  """
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
        ex for ex in loading.iter_predictions(run["predictions_path"])
        if has_data(ex, run) and
        (example_index is None or ex.get("index") == example_index)
    ]
    if usable:
      return run, (min(usable, key=rank) if rank else usable[0])
  return None, None


def index_count(runs, example_run: Optional[str]) -> int:
  """How many examples the predictions of `runs` (or of `example_run`)
  hold at most: valid --example_index values are 0 to this - 1."""
  counts = [
      sum(1
          for _ in loading.iter_predictions(r["predictions_path"]))
      for r in runs
      if r["predictions_path"] and example_run in (None, r["run_name"])
  ]
  return max(counts, default=0)


if __name__ == "__main__":
  sys.exit(main())
