r"""SPECULATION='auto' beside the fixed settings of the same sweep (issue 45).

Reads a results folder of `configs/auto_table2_multi30k.yaml` (any sweep
whose points share (draft, T, DECODE, BATCH_SIZE) groups with one
SPECULATION='auto' point each) and, per group, puts `auto` beside the best
fixed setting:

* `auto / best fixed`: the auto run's speedup over the best fixed point's,
  each measured against its own baseline in its own run (walltimes,
  compilation excluded);
* `with choosing`: the same, with the seconds `auto` spent choosing (its
  pricing and pilots, `auto.choice_s`) added to its decode;
* `auto / target alone`: the target alone's walltime (the group's fixed
  points' baselines, median) over auto's decode plus choosing; the issue's
  bar is 0.98 on rows where no fixed setting pays;
* the prediction beside the measurement (`auto.choice.predicted_speedup`).

  python -m specdec_jax.sweep --sweep=configs/auto_table2_multi30k.yaml \
      --results_dir=/tmp/specdec_jax/auto_table2
  python -m tools.benchmarks.auto_table2 /tmp/specdec_jax/auto_table2 \
      --output=benchmarks/auto_table2_multi30k.json
"""
import argparse
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specdec_jax.files import io_utils
from specdec_jax.metrics import run_metrics
from specdec_jax import report

# The bars (issue 45).
MIN_VS_BEST_FIXED = 0.95
MIN_VS_TARGET_ALONE = 0.98


def group_key(metrics: Dict[str, Any]) -> Tuple[Any, ...]:
  """(draft, T, DECODE, BATCH_SIZE): the points `auto` is compared among."""
  run = metrics["settings"]["run"]
  return (run.get("draft_name"), float(run["temperature"]),
          run.get("decode", "sample"), int(run["batch_size"]))


def is_auto(metrics: Dict[str, Any]) -> bool:
  """Whether SPECULATION='auto' ran the point (its `auto` record)."""
  return isinstance(metrics.get("auto"), dict)


def _choice_seconds(auto: Dict[str, Any]) -> float:
  return float(auto.get("choice_s") or 0.0)


def compare_group(fixed: Sequence[Dict[str, Any]],
                  auto: Dict[str, Any]) -> Dict[str, Any]:
  """One group's row: `auto` against its fixed points.

  Args:
    fixed: the group's SPECULATION='on' points' metrics (at least one).
    auto: the group's SPECULATION='auto' point's metrics.
  """
  best = max(fixed, key=lambda m: m["speedup"])
  target_alone_s = statistics.median(m["walltime_baseline_s"] for m in fixed)
  record = auto["auto"]
  choosing_s = _choice_seconds(record)
  decode_s = auto["walltime_speculative_s"]
  chose_alone = auto.get("speculation") == "off"
  # When auto ran the target alone, its own speedup is 1 by definition and
  # its seconds are the baseline's: compare with the fixed points' baseline.
  own_base = target_alone_s if chose_alone else auto["walltime_baseline_s"]
  choice = record.get("choice") or {}
  row = {
      "draft": group_key(auto)[0],
      "temperature": group_key(auto)[1],
      "decode": group_key(auto)[2],
      "batch_size": group_key(auto)[3],
      "num_examples": auto["num_examples"],
      "auto_choice": choice.get("label") or record.get("reason"),
      "auto_speedup": own_base / decode_s,
      "auto_speedup_with_choosing": own_base / (decode_s + choosing_s),
      "choosing_s": choosing_s,
      "choosing_share_of_decode": choosing_s / decode_s,
      "predicted_speedup": choice.get("predicted_speedup"),
      "best_fixed": {
          "gamma": best["gamma"],
          "speedup": best["speedup"]
      },
      "fixed_speedups": {
          str(m["gamma"]): m["speedup"] for m in fixed
      },
      "target_alone_s": target_alone_s,
      "auto_vs_target_alone": target_alone_s / (decode_s + choosing_s),
      "greedy_outputs_identical": auto.get("greedy_outputs_identical"),
  }
  row["auto_vs_best_fixed"] = row["auto_speedup"] / best["speedup"]
  row["auto_vs_best_fixed_with_choosing"] = (row["auto_speedup_with_choosing"] /
                                             best["speedup"])
  if row["predicted_speedup"] and not chose_alone:
    row["prediction_error"] = (row["predicted_speedup"] / row["auto_speedup"] -
                               1)
  pays = best["speedup"] > 1
  row["bar"] = MIN_VS_BEST_FIXED if pays else MIN_VS_TARGET_ALONE
  row["meets_bar"] = bool((row["auto_vs_best_fixed_with_choosing"] if pays else
                           row["auto_vs_target_alone"]) >= row["bar"])
  return row


def compare(results: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """A row per group that has an auto point and a fixed one, in order of
  first appearance.

  Raises:
    ValueError: a group with two auto points.
  """
  groups: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
  for metrics in results:
    g = groups.setdefault(group_key(metrics), {"fixed": [], "auto": None})
    if is_auto(metrics):
      if g["auto"] is not None:
        raise ValueError(f"two SPECULATION='auto' points in group "
                         f"{group_key(metrics)}")
      g["auto"] = metrics
    else:
      g["fixed"].append(metrics)
  return [
      compare_group(g["fixed"], g["auto"])
      for g in groups.values()
      if g["auto"] is not None and g["fixed"]
  ]


def markdown(rows: Sequence[Dict[str, Any]]) -> str:
  """The rows as a Markdown table."""
  out = [
      "| draft | T | decode | batch | auto chose | auto | with choosing | "
      "choosing | best fixed | auto / best | auto / target alone | "
      "predicted | bar met |", "|" + "---|" * 13
  ]
  for r in rows:
    pred = r["predicted_speedup"]
    out.append(
        f"| {r['draft']} | {r['temperature']:g} | {r['decode']} | "
        f"{r['batch_size']} | {r['auto_choice']} | {r['auto_speedup']:.2f}× "
        f"| {r['auto_speedup_with_choosing']:.2f}× | {r['choosing_s']:.1f} s "
        f"({100 * r['choosing_share_of_decode']:.1f}%) | "
        f"γ={r['best_fixed']['gamma']} {r['best_fixed']['speedup']:.2f}× | "
        f"{r['auto_vs_best_fixed_with_choosing']:.2f} | "
        f"{r['auto_vs_target_alone']:.2f} | "
        f"{'–' if pred is None else f'{pred:.2f}×'} | "
        f"{'yes' if r['meets_bar'] else 'no'} (≥{r['bar']}) |")
  return "\n".join(out)


def load_runs(results_dir: str) -> List[Dict[str, Any]]:
  """Every metrics.json under `results_dir`, checked (`report.load_metrics`),
  in sorted path order; beam, target-alone and switched runs included (the
  report's tables leave them out)."""
  found = []
  for dirpath, dirnames, filenames in os.walk(results_dir):
    dirnames.sort()
    if run_metrics.METRICS_FILE in filenames:
      found.append(
          report.load_metrics(os.path.join(dirpath, run_metrics.METRICS_FILE)))
  return found


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("results_dir")
  parser.add_argument("--output", help="JSON file for the rows")
  a = parser.parse_args(argv)
  results = load_runs(a.results_dir)
  rows = compare(results)
  if not rows:
    print(
        f"{a.results_dir}: no group with a SPECULATION='auto' point and a "
        "fixed one", file=sys.stderr)
    return 1
  print(markdown(rows))
  if a.output:
    io_utils.write_json(a.output, {"rows": rows})
  return 0


if __name__ == "__main__":
  sys.exit(main())
