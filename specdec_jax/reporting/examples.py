"""Which decoded example the report draws (Figure 1's trace, Figure 5's
timeline): from the most informative run (highest α, then temperature 0,
then highest speedup), the most informative example, unless the user
chose (`--example_run`, `--example_index`).
"""
from typing import Any, Mapping, Optional

from specdec_jax.reporting import loading


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
