r"""The same `run` command in two checkouts, alternated: before vs after.

Each round runs the command once in every checkout, each in a fresh
process, in rotated order (so that neither always runs first on a shared
machine), and records the process's wall time (imports, loading,
compilation or the compilation cache, decoding, step costs, writing) and
metrics.json's walltimes and speedup (compilation excluded). A warm-up
round first (not recorded) fills each checkout's caches, as a user's
second run would find them.

  python -m tools.benchmarks.revisions --before=/path/to/old/checkout \
      --after=. --rounds=3 --output=benchmarks/issue36_before_after.json \
      -- --gin_file=pretrained_multi30k.gin
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from specdec_jax.files import io_utils
from tools.benchmarks import common

KEYS = ("speedup", "walltime_baseline_s", "walltime_speculative_s",
        "compile_time_s", "alpha", "tokens_per_target_call",
        "greedy_identical_examples", "cost_coefficient_c",
        "theoretical_speedup_measured_call_cost", "iteration_overhead",
        "baseline_overhead")


def run_once(checkout: str, args, out: str) -> dict:
  """One fresh `python -m specdec_jax.run` in `checkout`; its record."""
  env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
  start = time.perf_counter()
  proc = subprocess.run([
      sys.executable, "-m", "specdec_jax.run", *args,
      f"--gin.OUTPUT_DIR='{out}'", "--gin.OVERWRITE=True"
  ], cwd=checkout, env=env, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if proc.returncode != 0:
    raise SystemExit(
        f"{checkout}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
  with open(os.path.join(out, "metrics.json")) as f:
    metrics = json.load(f)
  with open(os.path.join(out, "predictions.jsonl"), "rb") as f:
    predictions = f.read()
  return {
      "process_wall_s": wall,
      **{
          k: metrics.get(k) for k in KEYS
      }, "predictions_bytes": len(predictions),
      "predictions_sha256": hashlib.sha256(predictions).hexdigest()
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--before", required=True)
  parser.add_argument("--after", required=True)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--output", required=True)
  parser.add_argument("run_args", nargs="+")
  a = parser.parse_args()
  if a.rounds < 1:
    parser.error(f"--rounds must be >= 1, got {a.rounds}")
  for name in ("before", "after"):
    if not os.path.isdir(os.path.join(getattr(a, name), "specdec_jax")):
      parser.error(f"--{name}={getattr(a, name)!r} is not a checkout")
  checkouts = {"before": a.before, "after": a.after}
  host = common.host()
  with tempfile.TemporaryDirectory() as tmp:
    records = {name: [] for name in checkouts}
    for r in range(-1, a.rounds):  # round -1: the warm-up
      names = list(checkouts)[r % 2:] + list(checkouts)[:r % 2]
      for name in names:
        rec = run_once(checkouts[name], a.run_args, os.path.join(tmp, name))
        if r >= 0:
          records[name].append(rec)
        print(
            f"round {r}: {name}: {rec['process_wall_s']:.1f} s wall, "
            f"speedup {rec['speedup']:.2f}x", flush=True)
  same = len({rec["predictions_sha256"] for v in records.values() for rec in v
             }) == 1
  summary = {
      name: {
          k: statistics.median(rec[k]
                               for rec in recs)
          for k in ("process_wall_s", "speedup", "walltime_baseline_s",
                    "walltime_speculative_s")
      } for name, recs in records.items()
  }
  result = {
      "command": ["python", "-m", "specdec_jax.run", *a.run_args],
      "checkouts": checkouts,
      "host": host,
      "load_average_after": list(os.getloadavg()),
      "rounds": records,
      "medians": summary,
      "predictions_identical": same,
      "note": ("process_wall_s: a fresh process, warm caches (a warm-up "
               "round ran first); walltimes exclude compilation"),
  }
  io_utils.write_json(a.output, result)
  print(
      json.dumps({
          "medians": summary,
          "predictions_identical": same
      }, indent=1))


if __name__ == "__main__":
  main()
