r"""Tables and figures from a directory of speculative-decoding runs.

Usage:

  python -m specdec_jax.report RESULTS_DIR [--output_dir DIR]
      [--example_run RUN] [--example_index N]

RESULTS_DIR holds one sub-directory per run / sweep point (nested directories
are searched too), each with a `metrics.json` and optionally a
`predictions.jsonl` (see `load_results` and `_check_prediction` for the
schemas). Written into DIR (default RESULTS_DIR/report):

* `table2.md`, `table2.csv`: the paper's Table 2 layout (TASK, M_q, TEMP,
  gamma, alpha, SPEED), plus Theorem 3.8's speedup and BLEU / ROUGE-L of the
  baseline and speculative outputs; the best draft per (task, target,
  temperature) is starred.
* `table4.md`: measured vs theoretical speedup and tokens per target call
  (`analysis.theory_vs_measured`, Theorem 3.8 and Equation (1)).
* `speedup_vs_gamma.{png,svg}`, `alpha_by_draft.{png,svg}`,
  `example_trace.{html,png}` (Figure 1 style), `timeline.{png,svg}` (Figure 5
  style). Figures whose data are absent are skipped with a log message.

The example trace comes from the most informative run (highest α, then
temperature 0, then highest speedup) and, in it, the example whose trace
fits the figure and shows accepted and rejected guesses; `--example_run` /
`--example_index` choose instead. Tokens that cannot be printed as they are
(control and format characters, lone combining marks, U+FFFD, glyphs the
figure's font lacks) are shown escaped (`\n`, `\u200b`), never as look-alikes.
The timeline is modeled, as `run` measures steps, not calls: each target call
of the example (`accepted_counts` in predictions.jsonl) is drawn after γ
draft steps, with the run's measured `draft_step_s` and `target_step_s`
(metrics.json); older predictions.jsonl files that carry a `timeline` are
drawn as they are.

Bad input (missing / empty directory, a metrics.json that is not JSON or lacks
the required keys, a malformed predictions.jsonl) stops the report with a
one-line error naming the file and exit code 2, before anything is written.
All outputs are rendered in memory first and then written atomically
(temporary file + os.replace).
"""
import collections
import csv
import html
import io
import json
import logging
import math
import os
import sys
import unicodedata
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from absl import flags
import numpy as np

from specdec_jax import analysis
from specdec_jax import flag_utils
from specdec_jax import io_utils

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
ALPHA_FILE = "alpha.json"  # Corollary 3.6 estimate from `run` in alpha mode
PREDICTIONS_FILE = "predictions.jsonl"

# Colours of Figure 1: accepted draft tokens, rejected draft tokens, and the
# token sampled from the target model (correction or bonus token).
ACCEPTED_COLOR = "#1a7f37"
REJECTED_COLOR = "#cf222e"
TARGET_COLOR = "#0969da"
PREFIX_COLOR = "#222222"

# Figures are rendered at this resolution (text metrics depend on it).
_DPI = 100

# T5 model sizes, smallest first, to order drafts as in the paper's tables.
_SIZE_ORDER = ("tiny", "mini", "small", "base", "large", "xl", "xxl")


class ReportError(Exception):
  """Bad input; the message names the offending file."""


# ----------------------------------------------------------------------------
# Loading and validation.
# ----------------------------------------------------------------------------

_STR = "non-empty string"
_INT = "integer >= 0"
_POS_INT = "integer >= 1"
_NONNEG = "number >= 0"
_POS = "number > 0"
_PROB = "number in [0, 1]"

REQUIRED_KEYS: Dict[str, str] = {
    "task": _STR,
    "target_model": _STR,
    "draft_model": _STR,
    "gamma": _POS_INT,
    "temperature": _NONNEG,
    "alpha": _PROB,
    "num_examples": _INT,
    "tokens_generated": _INT,
    "target_calls_baseline": _INT,
    "target_calls_speculative": _INT,
    "walltime_baseline_s": _NONNEG,
    "walltime_speculative_s": _NONNEG,
    "speedup": _POS,
    "cost_coefficient_c": _NONNEG,
    "theoretical_speedup": _POS,
}
OPTIONAL_KEYS: Dict[str, str] = {
    "alpha_beta": _PROB,
    "tokens_per_target_call": _NONNEG,
    "draft_step_s": _NONNEG,
    "target_step_s": _NONNEG,
}


def _is_number(v: Any) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool) and
          math.isfinite(v))


def _check_value(path: str, key: str, value: Any, kind: str) -> Any:
  """Returns the value normalized to its kind, or raises ReportError."""
  ok = False
  if kind == _STR:
    ok = isinstance(value, str) and bool(value)
  elif kind in (_INT, _POS_INT):
    if _is_number(value) and float(value).is_integer():
      value = int(value)
      ok = value >= (1 if kind == _POS_INT else 0)
  elif _is_number(value):
    value = float(value)
    ok = {
        _NONNEG: value >= 0,
        _POS: value > 0,
        _PROB: 0 <= value <= 1
    }[kind]
  if not ok:
    raise ReportError(f"{path}: key {key!r} must be a {kind}, got {value!r}")
  return value


def _check_quality(path: str, metrics: Dict[str, Any]) -> None:
  if "bleu" in metrics:
    bleu = metrics["bleu"]
    if not (isinstance(bleu, dict) and _is_number(bleu.get("baseline")) and
            _is_number(bleu.get("speculative"))):
      raise ReportError(
          f"{path}: key 'bleu' must be {{\"baseline\": number, "
          f"\"speculative\": number}}, got {bleu!r}")
  if "rouge" in metrics:
    rouge = metrics["rouge"]
    ok = isinstance(rouge, dict)
    for side in ("baseline", "speculative"):
      scores = rouge.get(side) if ok else None
      ok = ok and isinstance(scores, dict) and bool(scores) and all(
          _is_number(v) for v in scores.values())
    if not ok:
      raise ReportError(
          f"{path}: key 'rouge' must be {{\"baseline\": {{name: number}}, "
          f"\"speculative\": {{name: number}}}}, got {rouge!r}")


def _read_json(path: str) -> Any:
  try:
    with open(path, "r", encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ReportError(f"{path}: not valid JSON ({e})") from None
  except UnicodeDecodeError as e:
    raise ReportError(f"{path}: not UTF-8 text ({e.reason})") from None
  except OSError as e:
    raise ReportError(f"{path}: cannot read ({e.strerror})") from None


def load_metrics(path: str) -> Dict[str, Any]:
  """Reads and validates one metrics.json; raises ReportError if bad."""
  data = _read_json(path)
  if not isinstance(data, dict):
    raise ReportError(
        f"{path}: not a speculative-decoding metrics file (expected a JSON "
        f"object, got {type(data).__name__})")
  missing = [k for k in REQUIRED_KEYS if k not in data]
  if missing:
    raise ReportError(
        f"{path}: not a speculative-decoding metrics file (missing required "
        f"keys: {', '.join(missing)})")
  metrics = dict(data)
  for key, kind in REQUIRED_KEYS.items():
    metrics[key] = _check_value(path, key, data[key], kind)
  for key, kind in OPTIONAL_KEYS.items():
    if data.get(key) is not None:
      metrics[key] = _check_value(path, key, data[key], kind)
  if "synthetic" in data and not isinstance(data["synthetic"], bool):
    raise ReportError(
        f"{path}: key 'synthetic' must be true or false, got "
        f"{data['synthetic']!r}")
  _check_quality(path, metrics)
  return metrics


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
  runs = []
  for dirpath, dirnames, filenames in os.walk(results_dir, onerror=None):
    dirnames[:] = sorted(
        d for d in dirnames if not d.startswith(".") and
        os.path.realpath(os.path.join(dirpath, d)) != skip)
    if METRICS_FILE not in filenames:
      continue
    metrics = load_metrics(os.path.join(dirpath, METRICS_FILE))
    rel = os.path.relpath(dirpath, results_dir)
    metrics["run_name"] = os.path.basename(
        os.path.abspath(results_dir)) if rel == "." else rel
    metrics["run_dir"] = dirpath
    pred = os.path.join(dirpath, PREDICTIONS_FILE)
    metrics["predictions_path"] = pred if os.path.isfile(pred) else None
    if ALPHA_FILE in filenames:  # `run` in alpha mode, same settings
      alpha_path = os.path.join(dirpath, ALPHA_FILE)
      sampled = _read_json(alpha_path)
      if not isinstance(sampled, dict) or not _is_number(
          sampled.get("alpha_beta")):
        raise ReportError(f"{alpha_path}: not an alpha.json written by "
                          "`specdec_jax.run` in alpha mode")
      metrics["alpha_sampled"] = float(sampled["alpha_beta"])
      metrics["alpha_sampled_stderr"] = sampled.get("alpha_beta_stderr")
    runs.append(metrics)
  if not runs:
    raise ReportError(
        f"{results_dir}: no run directories with a {METRICS_FILE} found")
  runs.sort(key=lambda m: m["run_name"])
  return runs


def _check_prediction(path: str, lineno: int, ex: Any) -> Dict[str, Any]:
  """Validates one predictions.jsonl record (the fields the report uses).

  Schema: {"index", "input", "reference", "baseline", "speculative",
  "accepted_counts": [int per target call], "trace": [{"draft_tokens":
  [str], "num_accepted": int, "target_token": str or null}] (one per target
  call), "timeline": optional, older runs only [{"kind": "draft" |
  "target", "start_s", "end_s"}]}.
  """
  where = f"{path}:{lineno}"
  if not isinstance(ex, dict):
    raise ReportError(f"{where}: expected a JSON object per line, got "
                      f"{type(ex).__name__}")
  counts = ex.get("accepted_counts")
  if counts is not None and not (isinstance(counts, list) and all(
      isinstance(n, int) and not isinstance(n, bool) and n >= 0
      for n in counts)):
    raise ReportError(f"{where}: 'accepted_counts' must be a list of "
                      f"integers >= 0, got {counts!r}")
  trace = ex.get("trace")
  if trace is not None:
    if not isinstance(trace, list):
      raise ReportError(f"{where}: 'trace' must be a list")
    for i, step in enumerate(trace):
      ok = (isinstance(step, dict) and
            isinstance(step.get("draft_tokens"), list) and
            all(isinstance(t, str) for t in step["draft_tokens"]) and
            isinstance(step.get("num_accepted"), int) and
            not isinstance(step.get("num_accepted"), bool) and
            0 <= step["num_accepted"] <= len(step["draft_tokens"]) and
            (step.get("target_token") is None or
             isinstance(step.get("target_token"), str)))
      if not ok:
        raise ReportError(
            f"{where}: trace[{i}] must be {{\"draft_tokens\": [str], "
            "\"num_accepted\": int in [0, len(draft_tokens)], "
            f"\"target_token\": str}}, got {step!r}")
  timeline = ex.get("timeline")
  if timeline is not None:
    if not isinstance(timeline, list):
      raise ReportError(f"{where}: 'timeline' must be a list")
    for i, ev in enumerate(timeline):
      ok = (isinstance(ev, dict) and ev.get("kind") in ("draft", "target") and
            _is_number(ev.get("start_s")) and _is_number(ev.get("end_s")) and
            ev["end_s"] >= ev["start_s"])
      if not ok:
        raise ReportError(
            f"{where}: timeline[{i}] must be {{\"kind\": \"draft\"|\"target\","
            f" \"start_s\": number, \"end_s\": number >= start_s}}, got {ev!r}")
  return ex


def iter_predictions(path: str) -> Iterator[Dict[str, Any]]:
  """Yields validated predictions.jsonl records (raises ReportError)."""
  try:
    with open(path, "r", encoding="utf-8") as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          ex = json.loads(line)
        except json.JSONDecodeError as e:
          raise ReportError(f"{path}:{lineno}: not valid JSON ({e})") from None
        yield _check_prediction(path, lineno, ex)
  except UnicodeDecodeError as e:
    raise ReportError(f"{path}: not UTF-8 text ({e.reason})") from None
  except OSError as e:
    raise ReportError(f"{path}: cannot read ({e.strerror})") from None


# ----------------------------------------------------------------------------
# Tables.
# ----------------------------------------------------------------------------


def _size_key(name: str) -> Tuple[int, str]:
  low = name.lower()
  for i, size in sorted(enumerate(_SIZE_ORDER), key=lambda t: -len(t[1])):
    if low == size or low.endswith(("-" + size, "_" + size, "." + size)):
      return (i, low)
  return (len(_SIZE_ORDER), low)


def _row_sort_key(m: Mapping[str, Any]):
  return (m["task"], m["target_model"], m["temperature"],
          _size_key(m["draft_model"]), m["gamma"], m["run_name"])


def quality(m: Mapping[str, Any]) -> Optional[Tuple[str, float, float]]:
  """(metric name, baseline, speculative) or None if the run has none."""
  if "bleu" in m:
    return ("BLEU", float(m["bleu"]["baseline"]),
            float(m["bleu"]["speculative"]))
  if "rouge" in m:
    base, spec = m["rouge"]["baseline"], m["rouge"]["speculative"]
    for key in ("rougeLsum", "rougeL"):
      if key in base and key in spec:
        return ("ROUGE-L", float(base[key]), float(spec[key]))
    key = sorted(set(base) & set(spec))[0] if set(base) & set(spec) else None
    if key is not None:
      return (key, float(base[key]), float(spec[key]))
  return None


def _measured_tokens_per_call(m: Mapping[str, Any]) -> Optional[float]:
  if m.get("tokens_per_target_call") is not None:
    return float(m["tokens_per_target_call"])
  if m["target_calls_speculative"] > 0:
    return m["tokens_generated"] / m["target_calls_speculative"]
  return None


def annotate_best(runs: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Sorted copies of the runs with `best_gamma_for_draft` and `starred`.

  Within each (task, target_model, temperature) group, `best_gamma_for_draft`
  marks each draft's highest-speedup run and `starred` the single run with
  the highest speedup (the best draft, at its best gamma; ties go to the
  first in table order).
  """
  rows = [dict(m) for m in sorted(runs, key=_row_sort_key)]
  groups = collections.OrderedDict()
  for r in rows:
    groups.setdefault((r["task"], r["target_model"], r["temperature"]),
                      []).append(r)
  for group in groups.values():
    best_of_draft = {}
    for r in group:
      r["best_gamma_for_draft"] = False
      r["starred"] = False
      b = best_of_draft.get(r["draft_model"])
      if b is None or r["speedup"] > b["speedup"]:
        best_of_draft[r["draft_model"]] = r
    for b in best_of_draft.values():
      b["best_gamma_for_draft"] = True
    best = None
    for r in group:
      if best is None or r["speedup"] > best["speedup"]:
        best = r
    best["starred"] = True
  return rows


def _fmt_temp(t: float) -> str:
  return f"{t:g}"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def _table2_md_rows(rows, multi_target: bool) -> List[List[str]]:
  out = []
  for r in rows:
    q = quality(r)
    draft = r["draft_model"] + (" ⋆" if r["starred"] else "")
    if r.get("synthetic"):
      draft += " †"
    cells = [r["task"]]
    if multi_target:
      cells.append(r["target_model"])
    cells += [
        draft, _fmt_temp(r["temperature"]), str(r["gamma"]),
        f"{r['alpha']:.2f}", f"{r['speedup']:.2f}X",
        f"{r['theoretical_speedup']:.2f}X",
    ]
    cells += ([q[0], f"{q[1]:.2f}", f"{q[2]:.2f}"] if q else ["–"] * 3)
    out.append(cells)
  return out


def render_table2(runs: Sequence[Dict[str, Any]]) -> Tuple[str, str]:
  """Returns (table2.md, table2.csv) texts."""
  rows = annotate_best(runs)
  multi_target = len({r["target_model"] for r in rows}) > 1
  header = ["TASK"] + (["M_p"] if multi_target else []) + [
      "M_q", "TEMP", "γ", "α", "SPEED", "THEORY (Thm 3.8)", "METRIC",
      "BASELINE", "SPECULATIVE"
  ]
  targets = ", ".join(sorted({r["target_model"] for r in rows}))
  md = [
      "# Table 2: speculative decoding speedup",
      "",
      f"Target model(s) M_p: {targets}. One row per (task, M_q, TEMP) at the "
      "draft's best measured γ; ⋆ marks the best draft per (task, M_p, TEMP) "
      "(highest SPEED). SPEED is the measured walltime improvement over "
      "standard decoding; THEORY is Theorem 3.8 at the run's α and c. METRIC "
      "compares baseline and speculative outputs (BLEU or ROUGE-Lsum).",
      "",
      _md_table(header,
                _table2_md_rows([r for r in rows if r["best_gamma_for_draft"]],
                                multi_target)),
      "## All sweep points",
      "",
      _md_table(header, _table2_md_rows(rows, multi_target)),
  ]
  if any(r.get("synthetic") for r in rows):
    md += ["† synthetic run (not real model measurements).", ""]

  fields = [
      "task", "target_model", "draft_model", "temperature", "gamma", "alpha",
      "alpha_beta", "alpha_sampled", "speedup", "theoretical_speedup", "cost_coefficient_c",
      "quality_metric", "quality_baseline", "quality_speculative",
      "best_gamma_for_draft", "starred", "synthetic", "run_name"
  ]
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(fields)
  for r in rows:
    q = quality(r) or ("", "", "")
    rec = dict(r, quality_metric=q[0], quality_baseline=q[1],
               quality_speculative=q[2], synthetic=bool(r.get("synthetic")))
    writer.writerow([
        "" if rec.get(f) is None else
        (int(rec[f]) if isinstance(rec[f], bool) else rec[f]) for f in fields
    ])
  return "\n".join(md), buf.getvalue()


def render_table4(runs: Sequence[Dict[str, Any]]) -> str:
  """Returns table4.md: measured vs theoretical (Theorem 3.8, Eq. (1))."""
  rows = sorted(runs, key=_row_sort_key)
  points = []
  for r in rows:
    p = dict(r)
    p["tokens_per_target_call"] = _measured_tokens_per_call(r)
    points.append(p)
  compared = analysis.theory_vs_measured(points)
  table = []
  notes = []
  for orig, r in zip(rows, compared):
    tpc = r.get("tokens_per_target_call")
    table.append([
        r["task"], r["draft_model"] + (" †" if r.get("synthetic") else ""),
        _fmt_temp(r["temperature"]), str(r["gamma"]), f"{r['alpha']:.3f}",
        f"{r['cost_coefficient_c']:.3f}",
        "–" if tpc is None else f"{tpc:.2f}",
        f"{r['expected_tokens_per_call']:.2f}",
        f"{r['speedup']:.2f}X", f"{r['theoretical_speedup']:.2f}X",
        f"{r['speedup_ratio']:.2f}"
    ])
    recomputed = r["theoretical_speedup"]
    recorded = orig["theoretical_speedup"]
    if abs(recorded - recomputed) > 1e-2 * recomputed:
      notes.append(f"- {r['run_name']}: metrics.json records theoretical "
                   f"speedup {recorded:.3f}, but its α, γ, c give "
                   f"{recomputed:.3f}.")
  header = [
      "TASK", "M_q", "TEMP", "γ", "α", "c", "TOKENS/CALL", "E[TOKENS/CALL]",
      "SPEED", "THEORY", "SPEED/THEORY"
  ]
  md = [
      "# Table 4: measured vs theoretical",
      "",
      "TOKENS/CALL: measured tokens per speculative target-model call; "
      "E[TOKENS/CALL]: Equation (1), (1 − α^(γ+1)) / (1 − α). SPEED: measured "
      "walltime improvement; THEORY: Theorem 3.8, (1 − α^(γ+1)) / ((1 − α)"
      "(γc + 1)), recomputed from each run's α, γ and c.",
      "",
      _md_table(header, table),
  ]
  if notes:
    md += ["Inconsistencies:", ""] + notes + [""]
  if any(r.get("synthetic") for r in rows):
    md += ["† synthetic run (not real model measurements).", ""]
  return "\n".join(md)


# ----------------------------------------------------------------------------
# Figures (matplotlib's object API with the Agg canvas; no pyplot state).
# ----------------------------------------------------------------------------


def _new_figure(width: float, height: float):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, height), dpi=_DPI)
  FigureCanvasAgg(fig)
  return fig


def _figure_bytes(fig, fmt: str) -> bytes:
  buf = io.BytesIO()
  kwargs = {"metadata": {"Date": None}} if fmt == "svg" else {}
  fig.savefig(buf, format=fmt, bbox_inches="tight", **kwargs)
  return buf.getvalue()


def _series(runs):
  """Groups runs into (task, target, draft, temperature) series."""
  series = collections.OrderedDict()
  for r in sorted(runs, key=_row_sort_key):
    series.setdefault(
        (r["task"], r["target_model"], r["draft_model"], r["temperature"]),
        []).append(r)
  return series


def _draft_colors(runs) -> Dict[str, Any]:
  import matplotlib
  drafts = sorted({r["draft_model"] for r in runs}, key=_size_key)
  cmap = matplotlib.colormaps["tab10"]
  return {d: cmap(i % 10) for i, d in enumerate(drafts)}


def render_speedup_vs_gamma(runs: Sequence[Dict[str, Any]]):
  """Measured speedup per gamma with Theorem 3.8 curves (one panel per task).

  Each (draft, temperature) series is drawn with its measured points and the
  curve of Theorem 3.8 at the series' mean measured alpha and c; the curve's
  integer optimum (Figure 3) is marked with an open triangle. Colour is the
  draft; temperature is both the marker shape of the measured points and
  the line style of the curve, so T = 0 and T = 1 points of one draft are
  told apart; the legend sits below the axes, off the data.
  """
  from matplotlib.ticker import MaxNLocator
  series = _series(runs)
  panels = sorted({(k[0], k[1]) for k in series})
  colors = _draft_colors(runs)
  temps = sorted({k[3] for k in series})
  styles = ["-", "--", ":", "-."]
  markers = ["o", "s", "D", "P", "X", "v"]
  fig = _new_figure(5.2 * len(panels), 4.2)
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, (task, target) in zip(axes, panels):
    keys = [k for k in series if (k[0], k[1]) == (task, target)]
    fits = {}
    for k in keys:
      alpha = float(np.mean([r["alpha"] for r in series[k]]))
      c = float(np.mean([r["cost_coefficient_c"] for r in series[k]]))
      fits[k] = (alpha, c, analysis.optimal_gamma(alpha, c, max_gamma=64))
    gmax = max(max(r["gamma"] for r in series[k]) for k in keys)
    gplot = min(max(gmax + 2, 8, max(f[2] for f in fits.values()) + 1), 32)
    grid = np.linspace(1, gplot, 200)
    for k in keys:
      pts = sorted(series[k], key=lambda r: r["gamma"])
      draft, temp = k[2], k[3]
      color = colors[draft]
      style = styles[temps.index(temp) % len(styles)]
      alpha, c, g_opt = fits[k]
      ax.plot(grid, analysis.expected_speedup(alpha, grid, c), style,
              color=color, lw=1.3, alpha=0.8,
              label=f"Thm 3.8: {draft}, T={_fmt_temp(temp)} "
              f"(α={alpha:.2f}, c={c:.3f})")
      if g_opt <= gplot:
          ax.plot([g_opt], [analysis.expected_speedup(alpha, g_opt, c)], "^",
                color=color, ms=7, mfc="none")
      marker = markers[temps.index(temp) % len(markers)]
      ax.plot([r["gamma"] for r in pts], [r["speedup"] for r in pts],
              marker, color=color, ms=6.5, mec="black", mew=0.6,
              ls="none", label=f"measured: {draft}, T={_fmt_temp(temp)}")
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("γ (draft tokens per target call)")
    ax.set_ylabel("walltime speedup (×)")
    ax.set_title(f"{task}: M_p = {target}")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14),
              ncol=2, frameon=False)
  fig.suptitle("Speedup vs γ: measured (markers, one shape per temperature) "
               "and Theorem 3.8 (lines, △ = optimal γ)", fontsize=10)
  return fig


def render_alpha_by_draft(runs: Sequence[Dict[str, Any]]):
  """Bar chart of alpha per (task, draft) and temperature.

  Bars are the mean acceptance-count alpha over the sweep points (error bars:
  their range); diamonds are the Corollary 3.6 estimates (alpha_beta) when
  present. Each bar's value is written above its error bar and diamond,
  and the legend above all bars, so no label covers a mark.
  """
  series = _series(runs)
  groups = sorted({(k[0], k[1], k[2]) for k in series},
                  key=lambda g: (g[0], g[1], _size_key(g[2])))
  temps = sorted({k[3] for k in series})
  multi_target = len({g[1] for g in groups}) > 1
  import matplotlib
  cmap = matplotlib.colormaps["Blues"]
  width = 0.8 / len(temps)
  fig = _new_figure(max(4.5, 1.3 * len(groups) * max(1, len(temps) / 2) + 2),
                    3.8)
  ax = fig.subplots()
  beta_labelled = False
  temp_labelled = set()
  for j, temp in enumerate(temps):
    color = cmap(0.45 + 0.5 * j / max(1, len(temps) - 1))
    for i, (task, target, draft) in enumerate(groups):
      pts = series.get((task, target, draft, temp))
      if not pts:
        continue
      alphas = [r["alpha"] for r in pts]
      x = i - 0.4 + width * (j + 0.5)
      mean = float(np.mean(alphas))
      yerr = [[mean - min(alphas)], [max(alphas) - mean]]
      ax.bar(x, mean, width * 0.92, color=color, edgecolor="black", lw=0.5,
             yerr=yerr if len(alphas) > 1 else None, capsize=3,
             label=None if temp in temp_labelled else f"T={_fmt_temp(temp)}")
      temp_labelled.add(temp)
      betas = [r["alpha_beta"] for r in pts if r.get("alpha_beta") is not None]
      top = max(alphas) if len(alphas) > 1 else mean  # the error bar's cap
      if betas:
        ax.plot([x], [np.mean(betas)], "D", color="black", ms=4,
                label=None if beta_labelled else "Σ min(p, q) (Cor. 3.6)")
        beta_labelled = True
        top = max(top, float(np.mean(betas)) + 0.015)  # the diamond's top
      ax.text(x, top + 0.025, f"{mean:.2f}", ha="center", va="bottom",
              fontsize=8)
  ax.set_xticks(range(len(groups)))
  ax.set_xticklabels([
      f"{task}\n{draft}" + (f" → {target}" if multi_target else "")
      for task, target, draft in groups
  ])
  # Bars and labels end below 1.1; the legend lives in the band above.
  ax.set_ylim(0, 1.3)
  ax.set_yticks(np.linspace(0, 1, 6))
  ax.set_ylabel("α (acceptance rate)")
  ax.set_title("α per draft model M_q and temperature")
  ax.grid(axis="y", alpha=0.3)
  ax.legend(fontsize=8, loc="upper center", ncol=len(temps) + 1)
  return fig


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def _escape_char(ch: str) -> str:
  code = ord(ch)
  if code < 0x100:
    return f"\\x{code:02x}"
  return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _piece(token: Optional[str]) -> str:
  """Display form of a decoded piece (SentencePiece '▁' becomes a space).

  Characters that would print as nothing or as something else are escaped
  (a backslash itself is doubled, so an escape is never ambiguous): control
  and format characters (newline, tab, zero-width space), spaces other than
  ' ' (no-break space), unassigned and private-use code points, the
  replacement character U+FFFD (an undecodable byte), and a combining mark
  that starts a piece (it would sit on the previous piece's last letter).
  """
  if token is None:
    return ""
  out = []
  for i, ch in enumerate(token.replace("▁", " ")):
    if ch in _NAMED_ESCAPES:
      out.append(_NAMED_ESCAPES[ch])
    elif ch != " " and (not ch.isprintable() or ch == "\ufffd" or (
        i == 0 and unicodedata.category(ch).startswith("M"))):
      out.append(_escape_char(ch))
    else:
      out.append(ch)
  return "".join(out)


_FONT_FAMILY = "DejaVu Sans Mono"


def _font_has_glyph_fn(family: str = _FONT_FAMILY):
  """A predicate: does the trace figure's font have a glyph for a char?"""
  from matplotlib import font_manager
  from matplotlib import ft2font
  path = font_manager.findfont(font_manager.FontProperties(family=family),
                               fallback_to_default=True)
  charmap = ft2font.FT2Font(path).get_charmap()
  return lambda ch: ord(ch) in charmap


def _escape_missing_glyphs(text: str, has_glyph) -> str:
  """Escapes characters the font would draw as empty boxes."""
  return "".join(ch if ch in " …" or has_glyph(ch) else _escape_char(ch)
                 for ch in text)


def trace_lines(trace: Sequence[Mapping[str, Any]]
               ) -> List[Tuple[str, List[str], List[str], str]]:
  """(prefix, accepted, rejected, target) display strings per target call."""
  out = []
  prefix = ""
  for step in trace:
    drafts = [_piece(t) for t in step["draft_tokens"]]
    n = step["num_accepted"]
    target = _piece(step.get("target_token"))
    out.append((prefix, drafts[:n], drafts[n:], target))
    prefix += "".join(drafts[:n]) + target
  return out


def render_trace_html(example: Mapping[str, Any], run: Mapping[str, Any]) -> str:
  """Figure-1-style HTML of one example's speculative decoding trace."""
  esc = html.escape
  lines = []
  for i, (prefix, acc, rej, tgt) in enumerate(trace_lines(example["trace"])):
    parts = [f'<span class="n">{i + 1}</span>',
             f'<span class="prefix">{esc(prefix)}</span>']
    parts += [f'<span class="acc">{esc(t)}</span>' for t in acc]
    parts += [f'<del class="rej">{esc(t)}</del>' for t in rej]
    if tgt:
      parts.append(f'<span class="tgt">{esc(tgt)}</span>')
    lines.append('<div class="line">' + "".join(parts) + "</div>")
  info = (f"task {run['task']}, M_p = {run['target_model']}, M_q = "
          f"{run['draft_model']}, γ = {run['gamma']}, T = "
          f"{_fmt_temp(run['temperature'])}; run {run['run_name']}, example "
          f"{example.get('index', '?')}")
  fields = []
  for key in ("input", "reference", "baseline", "speculative"):
    if isinstance(example.get(key), str):
      fields.append(f"<dt>{key}</dt><dd>{esc(example[key])}</dd>")
  return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Speculative decoding trace</title>
<style>
body {{ font-family: sans-serif; max-width: 60em; margin: 2em auto; }}
.trace {{ font-family: monospace; font-size: 15px; line-height: 1.6; }}
.line {{ white-space: pre-wrap; border-bottom: 1px solid #eee; }}
.n {{ color: #999; display: inline-block; width: 2.5em; }}
.prefix {{ color: {PREFIX_COLOR}; }}
.acc {{ color: {ACCEPTED_COLOR}; font-weight: bold; }}
.rej {{ color: {REJECTED_COLOR}; text-decoration: line-through; }}
.tgt {{ color: {TARGET_COLOR}; font-weight: bold; }}
dt {{ font-weight: bold; }}
</style></head><body>
<h1>Speculative decoding trace (Figure 1 style)</h1>
<p>{esc(info)}</p>
<p>One line per target-model call: <span class="acc">accepted draft tokens</span>,
<del class="rej">rejected draft tokens</del>, and the
<span class="tgt">token sampled from the target model</span>
(correction after a rejection, or the extra token when all γ were accepted).</p>
<div class="trace">
{chr(10).join(lines)}
</div>
<dl>{"".join(fields)}</dl>
</body></html>
"""


def render_trace_png(example: Mapping[str, Any], run: Mapping[str, Any],
                     max_lines: int = 16, prefix_chars: int = 40,
                     width_chars: int = 96):
  """Figure-1-style raster of a trace (monospace, wraps long lines)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fontsize = 10.0
  family = _FONT_FAMILY
  # Glyph advances are hinted at the output resolution, so measure there.
  probe = Figure(dpi=_DPI)
  canvas = FigureCanvasAgg(probe)
  t = probe.text(0, 0, "M" * 100, family=family, size=fontsize, weight="bold")
  char_w = (t.get_window_extent(canvas.get_renderer()).width / 100 * 72 /
            _DPI)  # points per character
  line_h = fontsize * 1.55
  label_chars = 5

  lines = trace_lines(example["trace"])
  has_glyph = _font_has_glyph_fn(family)

  def esc(text):
    return _escape_missing_glyphs(text, has_glyph)

  shown = [(esc(prefix), [esc(t) for t in acc], [esc(t) for t in rej],
            esc(tgt)) for prefix, acc, rej, tgt in lines[:max_lines]]
  # Lay out (row, col, text, color, struck) segments.
  segs = []
  row = 0
  for i, (prefix, acc, rej, tgt) in enumerate(shown):
    col = label_chars
    segs.append((row, 0, f"{i + 1:>3}", "#999999", False))
    if len(prefix) > prefix_chars:
      prefix = "…" + prefix[-(prefix_chars - 1):]
    pieces = [(prefix, PREFIX_COLOR, False)]
    pieces += [(t, ACCEPTED_COLOR, False) for t in acc]
    pieces += [(t, REJECTED_COLOR, True) for t in rej]
    if tgt:
      pieces.append((tgt, TARGET_COLOR, False))
    for text, color, struck in pieces:
      if not text:
        continue
      if col + len(text) > width_chars and col > label_chars:
        row += 1
        col = label_chars
      segs.append((row, col, text, color, struck))
      col += len(text)
    row += 1
  n_rows = row + (1 if len(lines) > max_lines else 0)

  header_h = 3 * line_h
  width_pt = (width_chars + 2) * char_w
  height_pt = header_h + n_rows * line_h + line_h
  fig = _new_figure(width_pt / 72, height_pt / 72)
  ax = fig.add_axes([0, 0, 1, 1])
  ax.set_xlim(0, width_pt)
  ax.set_ylim(height_pt, 0)
  ax.axis("off")
  x0 = char_w
  title = (f"{run['task']}: M_p={run['target_model']}, M_q="
           f"{run['draft_model']}, γ={run['gamma']}, T="
           f"{_fmt_temp(run['temperature'])} (example "
           f"{example.get('index', '?')})")
  ax.text(x0, line_h, title, family=family, size=fontsize, va="center",
          parse_math=False)
  legend = [("accepted", ACCEPTED_COLOR, False), ("rejected", REJECTED_COLOR,
                                                  True),
            ("target sample", TARGET_COLOR, False)]
  col = 0
  for text, color, struck in legend:
    x = x0 + col * char_w
    ax.text(x, 2 * line_h, text, family=family, size=fontsize, color=color,
            va="center", parse_math=False,
            weight="normal" if struck else "bold")
    if struck:
      ax.plot([x, x + len(text) * char_w], [2 * line_h] * 2, color=color,
              lw=1.2)
    col += len(text) + 3
  for row, col, text, color, struck in segs:
    y = header_h + (row + 0.5) * line_h
    x = x0 + col * char_w
    bold = color in (ACCEPTED_COLOR, TARGET_COLOR)
    ax.text(x, y, text, family=family, size=fontsize, color=color,
            va="center", ha="left", parse_math=False,
            weight="bold" if bold else "normal")
    if struck:
      lead = len(text) - len(text.lstrip())
      body = len(text.strip())
      if body:
        ax.plot([x + lead * char_w, x + (lead + body) * char_w], [y, y],
                color=color, lw=1.2)
  if len(lines) > max_lines:
    ax.text(x0, header_h + (n_rows - 0.5) * line_h,
            f"… {len(lines) - max_lines} more target calls (see "
            "example_trace.html)", family=family, size=fontsize,
            color="#999999", va="center", parse_math=False)
  return fig


def modeled_timeline(accepted_counts: Sequence[int], gamma: int,
                     draft_step_s: float, target_step_s: float
                     ) -> List[Dict[str, Any]]:
  """A Figure-5-style call timeline from measured step costs.

  The decode loop is one compiled program, so calls are not timed one by
  one: each iteration is drawn as γ draft steps of `draft_step_s` then one
  target call of `target_step_s` (the paper's cost model, Theorem 3.8).
  """
  events, t = [], 0.0
  for _ in accepted_counts:
    for _ in range(gamma):
      events.append({"kind": "draft", "start_s": t, "end_s": t + draft_step_s})
      t += draft_step_s
    events.append({"kind": "target", "start_s": t,
                   "end_s": t + target_step_s})
    t += target_step_s
  return events


def example_timeline(example: Mapping[str, Any],
                     run: Mapping[str, Any]) -> Optional[List[Dict[str, Any]]]:
  """The example's timeline: recorded (older runs) or modeled; None if
  neither is possible."""
  if example.get("timeline"):
    return example["timeline"]
  counts = example.get("accepted_counts")
  if (counts and run.get("draft_step_s") is not None and
      run.get("target_step_s") is not None):
    return modeled_timeline(counts, run["gamma"], run["draft_step_s"],
                            run["target_step_s"])
  return None


def render_timeline(example: Mapping[str, Any], run: Mapping[str, Any]):
  """Figure-5-style timeline: draft and target calls of one example."""
  events = example_timeline(example, run)
  t0 = min(ev["start_s"] for ev in events)
  fig = _new_figure(9, 2.4)
  ax = fig.subplots()
  lanes = {"draft": (1, ACCEPTED_COLOR, f"M_q ({run['draft_model']})"),
           "target": (0, TARGET_COLOR, f"M_p ({run['target_model']})")}
  for kind, (y, color, _) in lanes.items():
    bars = [((ev["start_s"] - t0) * 1e3, (ev["end_s"] - ev["start_s"]) * 1e3)
            for ev in events if ev["kind"] == kind]
    if bars:
      ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=color,
                     edgecolors="white", linewidth=0.5, alpha=0.85)
  targets = [ev for ev in events if ev["kind"] == "target"]
  counts = example.get("accepted_counts")
  if not (isinstance(counts, list) and len(counts) == len(targets)):
    trace = example.get("trace") or []
    counts = ([s["num_accepted"] for s in trace]
              if len(trace) == len(targets) else None)
  if counts:
    for ev, n in zip(targets, counts):
      mid = ((ev["start_s"] + ev["end_s"]) / 2 - t0) * 1e3
      ax.text(mid, 0, f"+{n + 1}", ha="center", va="center", fontsize=7,
              color="white", weight="bold")
  end = max(ev["end_s"] for ev in events) - t0
  ax.set_yticks([0, 1])
  ax.set_yticklabels([lanes["target"][2], lanes["draft"][2]])
  ax.set_ylim(-0.7, 1.7)
  ax.set_xlim(0, end * 1e3 * 1.01 if end > 0 else 1)
  ax.set_xlabel("time (ms)" if example.get("timeline") else
                "time (ms), modeled: γ draft steps then one target call per "
                "iteration, at the run's measured step times")
  n_tokens = sum(n + 1 for n in counts) if counts else None
  ax.set_title(
      f"Speculative decoding timeline ({run['task']}, γ={run['gamma']}, "
      f"example {example.get('index', '?')}): {len(targets)} target calls"
      + (f", {n_tokens} tokens (labels: tokens per call)" if n_tokens else ""),
      fontsize=9)
  ax.grid(axis="x", alpha=0.3)
  return fig


def _run_informativeness(run: Mapping[str, Any]):
  """Sort key, best first: highest α, then T = 0, then highest speedup."""
  return (-run["alpha"], run["temperature"], -run["speedup"], run["run_name"])


def _trace_informativeness(ex: Mapping[str, Any], max_lines: int = 16):
  """Sort key, best first, of an example's trace for Figure 1.

  A trace that fits the figure, that shows both accepted and rejected
  guesses and a fully accepted call, with many accepted tokens per call.
  """
  trace = ex["trace"]
  accepted = [s["num_accepted"] for s in trace]
  proposed = [len(s["draft_tokens"]) for s in trace]
  mixed = any(accepted) and any(a < p for a, p in zip(accepted, proposed))
  full = any(a == p > 0 for a, p in zip(accepted, proposed))
  return (len(trace) > max_lines, not mixed, not full,
          -sum(accepted) / len(trace), ex.get("index", 0))


def _find_example(runs, has_data, example_run: Optional[str],
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
    usable = [ex for ex in iter_predictions(run["predictions_path"])
              if has_data(ex, run) and (example_index is None or
                                        ex.get("index") == example_index)]
    if usable:
      return run, (min(usable, key=rank) if rank else usable[0])
  return None, None


# ----------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------


def render_report(results_dir: str,
                  output_dir: Optional[str] = None,
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
  if example_run is not None and example_run not in {
      r["run_name"] for r in runs}:
    raise ReportError(f"{results_dir}: no run named {example_run!r}")

  # Find (and validate) the example before rendering anything, so that a
  # malformed predictions.jsonl fails fast.
  trace_run, trace_ex = _find_example(
      runs, lambda ex, run: bool(ex.get("trace")), example_run,
      example_index, rank=_trace_informativeness)
  tl_run, tl_ex = _find_example(
      runs, lambda ex, run: bool(example_timeline(ex, run)), example_run,
      example_index,
      prefer=(trace_run, trace_ex) if trace_ex is not None else None)

  artifacts: Dict[str, bytes] = {}
  table2_md, table2_csv = render_table2(runs)
  artifacts["table2.md"] = table2_md.encode("utf-8")
  artifacts["table2.csv"] = table2_csv.encode("utf-8")
  artifacts["table4.md"] = render_table4(runs).encode("utf-8")

  for name, render in (("speedup_vs_gamma", render_speedup_vs_gamma),
                       ("alpha_by_draft", render_alpha_by_draft)):
    fig = render(runs)
    for fmt in ("png", "svg"):
      artifacts[f"{name}.{fmt}"] = _figure_bytes(fig, fmt)

  if trace_ex is None:
    logger.info("skipping example_trace: no %s with a non-empty 'trace'%s",
                PREDICTIONS_FILE,
                f" in run {example_run}" if example_run else "")
  else:
    logger.info("example_trace: run %s, example %s", trace_run["run_name"],
                trace_ex.get("index"))
    artifacts["example_trace.html"] = render_trace_html(
        trace_ex, trace_run).encode("utf-8")
    artifacts["example_trace.png"] = _figure_bytes(
        render_trace_png(trace_ex, trace_run), "png")

  if tl_ex is None:
    logger.info("skipping timeline: no %s with 'accepted_counts' next to a "
                "metrics.json with draft_step_s and target_step_s (or an "
                "older 'timeline')%s", PREDICTIONS_FILE,
                f" in run {example_run}" if example_run else "")
  else:
    logger.info("timeline: run %s, example %s", tl_run["run_name"],
                tl_ex.get("index"))
    fig = render_timeline(tl_ex, tl_run)
    for fmt in ("png", "svg"):
      artifacts[f"timeline.{fmt}"] = _figure_bytes(fig, fmt)

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


PROGRAM = "python -m specdec_jax.report"
_DESCRIPTION = (
    "Tables (Table 2/4 style) and figures (speedup vs gamma, alpha per draft, "
    "Figure-1 trace, Figure-5 timeline) from a directory of "
    "speculative-decoding runs.")


def define_flags():
  """A new absl FlagValues holding the report's flags (`flag_utils`)."""
  fv = flag_utils.new_flag_values()
  flags.DEFINE_string("output_dir", None, "where to write the report "
                      "(default: RESULTS_DIR/report)", flag_values=fv)
  flags.DEFINE_string("example_run", None, "run (relative directory) to take "
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
    args = flag_utils.parse_flag_values(
        fv, PROGRAM, sys.argv[1:] if argv is None else argv)
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
    written = render_report(args[0], fv.output_dir,
                            example_run=fv.example_run,
                            example_index=fv.example_index)
  except ReportError as e:
    print(f"report: error: {e}", file=sys.stderr)
    return 2
  finally:
    logger.removeHandler(handler)
    logger.propagate = True
  for path in written.values():
    print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
