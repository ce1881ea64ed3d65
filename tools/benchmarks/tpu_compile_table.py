"""Every experiment gin file compiled for a Cloud TPU slice: one table.

  python -m tools.benchmarks.tpu_compile_table [--topology v4-8] [--mesh_shape 1,4]

Runs `python -m specdec_jax.run --gin.COMPILE_TOPOLOGY=...` (compile only,
no TPU; needs libtpu: pip install -e '.[tpu]') on each of the paper's
experiment files (EnDe and CNN/DM x small/base/large drafts), one process
per file, and prints a Markdown table: whether the programs fit the chip's
HBM, memory per device, bytes a target step reads per parameter byte,
collectives per target step, c and the call cost from the roofline, and
Theorem 3.8's speedup at the paper's α beside the paper's measured speedup.
A file that fails or runs past --timeout is a row saying why. Writes
benchmarks/tpu_compile_<topology>.json and .md (atomically).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from specdec_jax.files.io_utils import REPO_DIR
from specdec_jax.files import io_utils

REPO = str(REPO_DIR)
FILES = ("ende_small.gin", "ende_base.gin", "ende_large.gin", "cnndm_small.gin",
         "cnndm_base.gin", "cnndm_large.gin")
# c, call cost and the prediction: from XLA's bytes accessed / from the
# calls' argument bytes (`compile_report.roofline`).
HEADER = ("| file | draft | γ | fits | per device: params / peak / HBM (GB) "
          "| weight reads / step | XLA bytes / argument bytes "
          "| collectives / step | c | call cost "
          "| predicted at paper α | paper | compile s |")


def compile_one(gin_file, topology, mesh_shape, out_dir, timeout):
  """(compile.json's dict or None, error words or None, seconds)."""
  cmd = [
      sys.executable, "-m", "specdec_jax.run", f"--gin_file={gin_file}",
      f"--gin.COMPILE_TOPOLOGY='{topology}'",
      f"--gin.MESH_SHAPE=({mesh_shape[0]}, {mesh_shape[1]})",
      f"--gin.OUTPUT_DIR='{out_dir}'"
  ]
  start = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return None, f"did not finish in {timeout} s", timeout
  seconds = time.perf_counter() - start
  if proc.returncode != 0:
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    return None, (lines[-1] if lines else f"exit {proc.returncode}"), seconds
  with open(os.path.join(out_dir, "compile.json")) as f:
    return json.load(f), None, seconds


def row(gin_file, record, error):
  """One Markdown row."""
  if record is None:
    return f"| {gin_file} | | | failed: {error} | | | | | | | | | |"
  mem, roof, paper = (record["memory_per_device"], record["roofline"],
                      record["paper"])
  params = sum(mem["parameter_bytes"].values())
  fits = "yes" if mem["fits"] else (
      f"no (fits at {mem['smallest_fitting_mesh_shape']})")
  step = record["calls"]["target_step"]
  # Records written before the weight-read count have "n/a" there.
  reads = step.get("weight_reads", {}).get("reads_per_weight_byte")
  per_arg = step["bytes_accessed"] / step["argument_bytes"]
  args = roof["from_arguments"]
  predicted = (f"{roof['theorem_3_8_speedup']:.2f}x / "
               f"{args['theorem_3_8_speedup']:.2f}x (α {paper['alpha']})"
               if paper else "n/a")
  seconds = sum(r["compile_seconds"] for r in list(record["calls"].values()) +
                list(record["programs"].values()))
  return (f"| {gin_file} | {record['settings']['draft']['name']} | "
          f"{record['settings']['gamma']} | {fits} | "
          f"{params / 1e9:.2f} / {mem['peak_bytes'] / 1e9:.2f} / "
          f"{mem['hbm_bytes'] / 1e9:.1f} | "
          f"{'n/a' if reads is None else f'{reads:.2f}'} | "
          f"{per_arg:.2f} | "
          f"{record['collectives_per_target_step']['total']} | "
          f"{roof['cost_coefficient_c']:.3f} / "
          f"{args['cost_coefficient_c']:.3f} | {roof['call_cost']:.2f} / "
          f"{args['call_cost']:.2f} | "
          f"{predicted} | {paper['speedup'] if paper else 'n/a'}x | "
          f"{seconds:.0f} |")


def render(out: str) -> int:
  """Rewrites the .md table beside `out` from its JSON."""
  with open(out) as f:
    data = json.load(f)
  rows = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
  rows += [
      row(name, r["compile"], r["error"]) for name, r in data["files"].items()
  ]
  io_utils.atomic_write(
      os.path.splitext(out)[0] + ".md",
      f"{data['command']}\n\n" + "\n".join(rows) + "\n")
  print("\n".join(rows))
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topology", default="v4-8")
  parser.add_argument("--mesh_shape", default="1,4",
                      help="data,model (default 1,4)")
  parser.add_argument("--files", default=",".join(FILES))
  parser.add_argument("--timeout", type=int, default=3600,
                      help="seconds per file")
  parser.add_argument("--render", action="store_true",
                      help="only rewrite the .md from the JSON (no compiling)")
  parser.add_argument(
      "--out", default=None, help="JSON path (default benchmarks/"
      "tpu_compile_<topology>.json; .md beside it)")
  a = parser.parse_args(argv)
  mesh_shape = tuple(int(x) for x in a.mesh_shape.split(","))
  out = a.out or os.path.join(REPO, "benchmarks",
                              f"tpu_compile_{a.topology}.json")
  command = ("python -m tools.benchmarks.tpu_compile_table "
             f"--topology {a.topology} --mesh_shape {a.mesh_shape}")
  rows, records = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)], {}
  if a.render:
    return render(out)

  def write():  # after every file: a long table is never lost
    io_utils.write_json(
        out, {
            "command": command,
            "topology": a.topology,
            "mesh_shape": list(mesh_shape),
            "files": records
        })
    io_utils.atomic_write(
        os.path.splitext(out)[0] + ".md",
        f"{command}\n\n" + "\n".join(rows) + "\n")

  with tempfile.TemporaryDirectory() as work:
    for gin_file in a.files.split(","):
      record, error, seconds = compile_one(gin_file, a.topology, mesh_shape,
                                           os.path.join(work, gin_file),
                                           a.timeout)
      records[gin_file] = {
          "compile": record,
          "error": error,
          "wall_seconds": round(seconds, 1)
      }
      rows.append(row(gin_file, record, error))
      print(rows[-1], flush=True)
      write()
  table = "\n".join(rows)
  print(f"\n{command}\n\n{table}")
  return 0 if all(r["compile"] for r in records.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
