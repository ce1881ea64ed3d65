r"""SPECULATION='auto''s predicted speedup beside the measured one (issue 45).

For each experiment (`--config`: gin files, then bindings, in one string)
it runs `run` with SPECULATION='auto' in MODE='walltime' and reads the
choice's predicted speedup (metrics.json's `auto.choice`) and the run's
measured speedup. When `auto` chose the target alone (measured 1 by
definition), it also runs the best speculative candidate with those
settings fixed (SPECULATION='on'), so that every row checks a prediction
against a walltime. Each row: the candidate, predicted and measured
speedup, the error (predicted / measured - 1), and the pilot's α and call
cost beside the run's measured ones.

  python -m tools.benchmarks.auto_prediction \
      --config "pretrained_multi30k.gin GAMMA='auto'" \
      --config "pretrained_multi30k.gin GAMMA='auto' TEMPERATURE=1.0" \
      --num_examples 60 --results_dir /tmp/specdec_jax/auto_prediction \
      --output /tmp/specdec_jax/auto_prediction.json

Walltimes: time on a quiet machine only (docs/results/README.md); the host,
its CPU and load average are recorded beside the rows.
"""
import argparse
import os
import platform
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin

from specdec_jax.files import compilation_cache
from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import price_cache
from tools.benchmarks import common


def parse_config(text: str) -> Tuple[List[str], List[str]]:
  """'a.gin b.gin NAME=VALUE ...' -> (gin files, bindings), split at
  whitespace (a binding holds none; gin's quotes are kept)."""
  words = text.split()
  files = [w for w in words if w.endswith(".gin")]
  bindings = [w for w in words if not w.endswith(".gin")]
  if not files:
    raise SystemExit(f"--config {text!r}: name at least one gin file")
  return files, bindings


def run_point(files: Sequence[str], bindings: Sequence[str], out: str,
              num_examples: int) -> Dict[str, Any]:
  """One walltime run; its metrics.json dict."""
  gin.clear_config()
  gin_utils.parse_gin(list(files), [
      *bindings, f"NUM_EXAMPLES = {int(num_examples)}", "MODE = 'walltime'",
      f"OUTPUT_DIR = '{out}'", "OVERWRITE = True"
  ], finalize=False)
  return run_lib.run()


def fixed_bindings(row: Dict[str, Any]) -> List[str]:
  """The bindings that run `row`'s candidate with SPECULATION='on'."""
  out = ["SPECULATION = 'on'", f"GAMMA = {int(row['gamma'])}"]
  if row["mode"] in decode_modes.SAMPLING:  # not speculative beams
    out += [
        f"ACCEPTANCE = '{row['mode']}'",
        f"TREE_WIDTH = {int(row['tree_width'] or 1)}"
    ]
  return out


def compare(config: str, row: Dict[str, Any], metrics: Dict[str, Any],
            chosen: bool) -> Dict[str, Any]:
  """One line of the table: `row`'s prediction against `metrics` (a run
  that switched between batches: against its first choice's segment)."""
  auto = metrics.get("auto")
  switched = bool(auto and auto.get("switches"))  # between batches
  measured = float(auto["segments"][0]["measured_speedup"]
                   if switched else metrics["speedup"])
  predicted = float(row["predicted_speedup"])
  return {
      "config": config,
      "candidate": row["label"],
      "chosen": chosen,
      "predicted_speedup": predicted,
      "measured_speedup": measured,
      "error": predicted / measured - 1.0,
      "pilot_alpha": row.get("alpha"),
      "measured_alpha": metrics.get("alpha"),
      "predicted_call_cost": row.get("call_cost"),
      "measured_call_cost": metrics.get("verification_cost_ratio"),
      "greedy_outputs_identical": metrics.get("greedy_outputs_identical"),
      "prices_cached": (metrics["auto"].get("prices") or {}).get("cached")
                       if metrics.get("auto") else None,
  }


def evaluate(config: str, results_dir: str, index: int,
             num_examples: int) -> Dict[str, Any]:
  """`config` with SPECULATION='auto', and the best speculative candidate
  fixed when it chose the target alone."""
  files, bindings = parse_config(config)
  out = os.path.join(results_dir, f"{index:02d}_auto")
  metrics = run_point(files, [*bindings, "SPECULATION = 'auto'"], out,
                      num_examples)
  auto = metrics["auto"]
  rows = auto["candidates"]
  if auto["choice"]["label"] != rows[0]["label"]:
    return compare(config, auto["choice"], metrics, chosen=True)
  if len(rows) < 2:
    return {"config": config, "candidate": rows[0]["label"], "chosen": True}
  best = max(rows[1:], key=lambda r: r["predicted_speedup"])
  check = run_point(files, [*bindings, *fixed_bindings(best)],
                    os.path.join(results_dir, f"{index:02d}_check"),
                    num_examples)
  return {
      **compare(config, best, check, chosen=False), "auto_choice": rows[0]
                                                                   ["label"]
  }


def table(rows: Sequence[Dict[str, Any]]) -> str:
  """The rows as Markdown."""
  lines = [
      "| config | candidate | chosen | predicted | measured | error |",
      "|---|---|---|---|---|---|"
  ]
  for r in rows:
    if "measured_speedup" not in r:
      lines.append(f"| {r['config']} | {r['candidate']} | yes | 1 | 1 | – |")
      continue
    lines.append(f"| {r['config']} | {r['candidate']} | "
                 f"{'yes' if r['chosen'] else 'no (checked)'} | "
                 f"{r['predicted_speedup']:.2f} | {r['measured_speedup']:.2f}"
                 f" | {100 * r['error']:+.0f}% |")
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
      "--config", action="append", required=True,
      help="gin files then bindings, one string per point "
      "(e.g. \"pretrained_multi30k.gin GAMMA='auto'\")")
  parser.add_argument("--num_examples", type=int, default=60)
  parser.add_argument("--results_dir",
                      default="/tmp/specdec_jax/auto_prediction")
  parser.add_argument("--output", default=None, help="JSON file to write")
  flags = parser.parse_args(argv)
  compilation_cache.enable()
  rows = [
      evaluate(config, flags.results_dir, i, flags.num_examples)
      for i, config in enumerate(flags.config)
  ]
  gin.clear_config()
  errors = [abs(r["error"]) for r in rows if "error" in r]
  record = {
      "host": platform.node(),
      "machine": price_cache.machine_fields(),
      "load_average": list(os.getloadavg()),
      "num_examples": flags.num_examples,
      "rows": rows,
      "max_abs_error": max(errors) if errors else None,
  }
  print(table(rows))
  if errors:
    print(f"largest |error|: {100 * max(errors):.0f}% over {len(errors)} rows")
  common.write_result(flags.output, record)
  return 0


if __name__ == "__main__":
  sys.exit(main())
