r"""Soak test: does a long sweep's memory stay flat?

Runs one in-process sweep (`sweep.run_sweep`) of `--points` points of
local_tiny (a few examples each; γ and SEED vary, so every point compiles
its own decoders, as a real γ sweep does) and samples, after every point,
the process's resident memory (VmRSS) and its count of memory mappings
(/proc/self/maps). The latter is what ran out in the `vm.max_map_count`
crash of a long sweep (LLVM: "Cannot allocate memory" around the 25th
point, before `sweep` cleared JAX's caches after each point).

Both series must be flat: after `--warmup` points, every sample within
`--tolerance` (10%) of the first sample after warm-up. The JSON written to
--output holds every sample, the verdict per series and the settings.
Linux only (/proc). A benchmark-style script, not a timed unit test:

  nice -n 15 python -m tools.benchmarks.soak --output=/tmp/soak.json
  nice -n 15 python -m tools.benchmarks.soak --points=6 --warmup=2 \
      --output=/tmp/soak_small.json   # a quick check that it works
"""
import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

from specdec_jax.files import io_utils
from specdec_jax import sweep


def _status_kib(field: str) -> int:
  with open("/proc/self/status", encoding="utf-8") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"/proc/self/status has no {field}")


def sample() -> Dict[str, int]:
  """This process's resident memory (KiB) and memory mappings now."""
  with open("/proc/self/maps", encoding="utf-8") as f:
    mappings = sum(1 for _ in f)
  return {"rss_kib": _status_kib("VmRSS"), "map_count": mappings}


def points(count: int) -> List[Dict[str, Any]]:
  """`count` points: γ 1-5 crossed with seeds 0, 1, ..."""
  # Not itertools.product(itertools.count(), ...): product reads its
  # inputs whole first, and count() never ends (memory grew ~150 MB/s).
  return [{"GAMMA": 1 + i % 5, "SEED": i // 5} for i in range(count)]


def flatness(values: List[int], warmup: int,
             tolerance: float) -> Dict[str, Any]:
  """Whether every value after `warmup` is within `tolerance` of the first
  one after it (its relative spread, reported either way)."""
  tail = values[warmup:]
  if not tail:
    return {"flat": None, "reason": "no samples after warm-up"}
  base = tail[0]
  worst = max(abs(v - base) / base for v in tail)
  return {
      "flat": worst <= tolerance,
      "reference": base,
      "max_relative_change": worst,
      "final": tail[-1]
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--points", type=int, default=50)
  parser.add_argument("--examples", type=int, default=3,
                      help="NUM_EXAMPLES of each point")
  parser.add_argument("--warmup", type=int, default=5,
                      help="points before the series must be flat")
  parser.add_argument("--tolerance", type=float, default=0.10)
  parser.add_argument("--results_dir", default=None,
                      help="where the points go (default: a temp folder)")
  parser.add_argument("--output", required=True, help="JSON file to write")
  args = parser.parse_args(argv)
  if args.points < 1 or args.examples < 1:
    parser.error("--points and --examples must be >= 1")
  if not 0 <= args.warmup < args.points:
    parser.error(f"--warmup must be in [0, --points={args.points})")
  if not os.path.exists("/proc/self/maps"):
    parser.error("needs Linux's /proc (memory mappings)")

  results_dir = args.results_dir or tempfile.mkdtemp(prefix="soak_sweep.")
  samples = [dict(point="start", seconds=0.0, **sample())]
  start = time.perf_counter()

  def after_point(name):
    samples.append(
        dict(point=name, seconds=time.perf_counter() - start, **sample()))
    print(
        f"{len(samples) - 1}/{args.points} {name}: "
        f"rss {samples[-1]['rss_kib'] / 1024:.0f} MiB, "
        f"{samples[-1]['map_count']} mappings", flush=True)

  sweep.run_sweep(points(args.points), results_dir, ["local_tiny.gin"],
                  [f"NUM_EXAMPLES = {args.examples}"], after_point=after_point)
  per_point = samples[1:]
  verdict = {
      key: flatness([s[key] for s in per_point], args.warmup, args.tolerance)
      for key in ("rss_kib", "map_count")
  }
  record = {
      "settings": vars(args) | {
          "results_dir": results_dir
      },
      "samples": samples,
      "verdict": verdict,
      "flat": all(v["flat"] for v in verdict.values())
  }
  io_utils.write_json(args.output, record)
  print(json.dumps(verdict, indent=1))
  print(f"wrote {args.output}")
  return 0 if record["flat"] else 1


if __name__ == "__main__":
  sys.exit(main())
