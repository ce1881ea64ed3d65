"""A Table-2-style page of a results folder's DECODE='beam' runs.

`report` leaves beam runs out (its tables are Theorem 3.8's, which models
sampling one sequence). This reads every metrics.json under the folder
whose `decode` is 'beam' and writes one Markdown row per run: k, u, R, γ,
BLEU of the target's beam search and of speculative beam search, the
walltime speedup, beam steps per target call, draft steps kept of tried,
and on how many examples the top beams are identical (all, or the run is
wrong). A greedy run in the same folder (DECODE='sample', T=0) adds the
greedy BLEU beside it.

  python -m tools.beam_table /tmp/beam_multi30k [--output beam.md]
"""
import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from specdec_jax.experiment import decode_modes
from specdec_jax.files import io_utils

HEADER = ("| run | k | u | R | γ | BLEU beam (target) | BLEU beam "
          "(speculative) | speedup | steps / call | kept / tried | "
          "identical |")


def load_runs(results_dir: str) -> List[Dict[str, Any]]:
  """Every metrics.json under `results_dir`, with its folder as `run`."""
  runs = []
  for dirpath, _, filenames in sorted(os.walk(results_dir)):
    if "metrics.json" in filenames:
      metrics = json.loads(
          io_utils.read_text(os.path.join(dirpath, "metrics.json")))
      metrics["run"] = os.path.relpath(dirpath, results_dir)
      runs.append(metrics)
  return runs


def _bleu(m: Dict[str, Any], side: str) -> str:
  bleu = m.get("bleu") or {}
  return "–" if side not in bleu else f"{bleu[side]:.2f}"


def beam_row(m: Dict[str, Any]) -> str:
  """One beam run's Markdown row."""
  cells = [
      m["run"],
      str(m["beam_size"]),
      str(m["beam_width"]),
      str(m["beam_rows"]),
      str(m["gamma"]),
      _bleu(m, "baseline"),
      _bleu(m, "speculative"),
      f"{m['speedup']:.2f}X",
      f"{m['steps_per_target_call']:.2f}",
      f"{m['alpha']:.2f}",
      f"{m['greedy_identical_examples']}/{m['num_examples']}",
  ]
  return "| " + " | ".join(cells) + " |"


def greedy_bleu(runs: Sequence[Dict[str, Any]]) -> Optional[float]:
  """The target-alone BLEU of a greedy sampled run in the folder, if any."""
  for m in runs:
    if (not decode_modes.of_metrics(m).beam and m.get("temperature") == 0 and
        m.get("bleu")):
      return float(m["bleu"]["baseline"])
  return None


def render(runs: Sequence[Dict[str, Any]]) -> str:
  """The page: the beam runs' table, and greedy BLEU when there is one."""
  beams = [m for m in runs if decode_modes.of_metrics(m).beam]
  if not beams:
    raise ValueError("no DECODE='beam' run (metrics.json with "
                     "\"decode\": \"beam\") in the folder")
  lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
  lines += [beam_row(m) for m in beams]
  greedy = greedy_bleu(runs)
  if greedy is not None:
    lines += ["", f"Greedy BLEU (the target alone, T=0): {greedy:.2f}."]
  lines += [
      "", "steps / call: beam-search steps per speculative target call; "
      "kept / tried: the draft's beam steps the target's search followed; "
      "identical: examples whose top beams equal the target's own beam "
      "search (must be all)."
  ]
  return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("results_dir")
  parser.add_argument("--output", default=None, help="write here too")
  args = parser.parse_args(argv)
  try:
    page = render(load_runs(args.results_dir))
  except (OSError, ValueError, KeyError) as e:
    print(f"beam_table: error: {args.results_dir}: {e}", file=sys.stderr)
    return 2
  print(page, end="")
  if args.output:
    with open(args.output, "w", encoding="utf-8") as f:
      f.write(page)
  return 0


if __name__ == "__main__":
  sys.exit(main())
