"""A sweep's compilation time, from an empty compilation cache (issue 44).

Runs `python -m specdec_jax.sweep` once in a subprocess with its own empty
cache folder (`SPECDEC_JAX_CACHE`; the CPU kernel is built there first,
untimed), then reads each point's `metrics.json`
(`compile_time_s`: compiling and warming both decoders per input width) and
the whole command's walltime. Prints a table and writes JSON.

  python -m tools.benchmarks.sweep_compile \\
      --out=/tmp/compile.json -- --sweep=configs/x.yaml --gin.NUM_EXAMPLES=10

Everything after `--` goes to the sweep (a fresh `--results_dir` is
added). `--source=DIR` runs the package found in DIR (another revision's
checkout) instead of this one.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence


def point_records(results_dir: str) -> List[Dict[str, Any]]:
  """[{point, compile_time_s, gamma, temperature}] from a sweep's folders."""
  records = []
  for path in sorted(glob.glob(os.path.join(results_dir, "*", "metrics.json"))):
    with open(path, encoding="utf-8") as f:
      metrics = json.load(f)
    records.append({
        "point": os.path.basename(os.path.dirname(path)),
        "compile_time_s": metrics.get("compile_time_s"),
        "gamma": metrics.get("gamma"),
        "temperature": metrics.get("temperature"),
    })
  return records


def measure(sweep_args: Sequence[str],
            source: Optional[str] = None) -> Dict[str, Any]:
  """One sweep from empty caches: its points' compile times and walltime."""
  work = tempfile.mkdtemp(prefix="sweep-compile-")
  results = os.path.join(work, "results")
  env = dict(os.environ, SPECDEC_JAX_CACHE=os.path.join(work, "cache"))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if source:
    env["PYTHONPATH"] = os.path.abspath(source)
  command = [
      sys.executable, "-m", "specdec_jax.sweep", f"--results_dir={results}",
      *sweep_args
  ]
  # The CPU kernel is built first, untimed: a user's machine has it.
  subprocess.run([sys.executable, "-m", "specdec_jax.core.kernels"], check=True,
                 env=env, cwd=source or os.getcwd(), stdout=subprocess.DEVNULL)
  load = os.getloadavg()[0]
  start = time.perf_counter()
  subprocess.run(command, check=True, env=env, cwd=source or os.getcwd())
  walltime = time.perf_counter() - start
  points = point_records(results)
  return {
      "command": command,
      "source": os.path.abspath(source) if source else None,
      "load_average_before": load,
      "walltime_s": round(walltime, 1),
      "compile_time_s": round(sum(p["compile_time_s"] or 0.0 for p in points),
                              1),
      "points": points,
  }


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  argv = list(sys.argv[1:] if argv is None else argv)
  sweep_args = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="JSON file to write.")
  parser.add_argument("--source", default=None,
                      help="A checkout whose specdec_jax to run.")
  args = parser.parse_args(own)
  if not sweep_args:
    parser.error("give the sweep's arguments after --")
  result = measure(sweep_args, args.source)
  for p in result["points"]:
    print(f"{p['point']}: compile {p['compile_time_s']} s")
  print(f"total compile {result['compile_time_s']} s, sweep walltime "
        f"{result['walltime_s']} s (load average before "
        f"{result['load_average_before']:.2f})")
  tmp = args.out + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, args.out)
  return result


if __name__ == "__main__":
  main()
