r"""What waiting for a batch's slowest row would cost a run's speedup at
other batch sizes, from its predictions.jsonl (no model, no timing).

  python -m tools.benchmarks.batch_waits \
      --predictions=/tmp/specdec_jax/pretrained_multi30k/predictions.jsonl \
      --batch_sizes=1,2,4,8,16 --output=/tmp/batch_waits.json

A batch's loop runs until its last row ends. At T = 0 with identical
outputs a row's target calls do not depend on its batch, so a batch-1
run's rows give each batch size's loop iterations exactly
(`overheads.batched_iterations`, consecutive examples as the run batches
them) and `overheads.batch_factor`: the factor of metrics.json's
`efficiency_split` that batching alone sets, whatever the device. With
`--gammas=1,2,5,7` each row's calls are also replayed at those γ from its
accepted counts (`replay`), each with its table; with `--pilot_rows=16,48`
(and one batch size) also how far each n consecutive rows' factors are
from all rows', as `auto`'s pilots would replay them.
"""
import argparse
import json
import os
import sys
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from specdec_jax.metrics import overheads
from specdec_jax.metrics import replay
from specdec_jax.metrics import run_metrics
from tools.benchmarks import common


def row_calls(row: Dict[str, Any]) -> Tuple[int, int]:
  """(the output's tokens, EOS included: the target alone's calls; the
  speculative loop's target calls) of a predictions.jsonl row of a
  one-path run: each call's kept guesses and its own token, if any."""
  trace = row["aux"].get("trace")
  if trace is None:
    raise ValueError(f"example {row['aux'].get('index')}: no trace (a tree or "
                     "beams run): only one-path runs give each row's tokens")
  tokens = sum(
      t["num_accepted"] + (t["target_token"] is not None) for t in trace)
  return tokens, len(trace)


def read_run(predictions: str) -> Tuple[List[int], List[int]]:
  """([N] tokens, [N] target calls) of a T = 0 run whose outputs equal the
  target alone's (its metrics.json beside `predictions`).

  Raises:
    ValueError: no readable metrics.json, not such a run, or a row without
      a trace.
  """
  return rows_calls(read_rows(predictions)[1])


def rows_calls(rows: Sequence[Dict[str, Any]]) -> Tuple[List[int], List[int]]:
  """([N] tokens, [N] target calls) of predictions.jsonl rows (`row_calls`)."""
  pairs = [row_calls(row) for row in rows]
  return [t for t, _ in pairs], [c for _, c in pairs]


def row_counts(row: Dict[str, Any]) -> List[int]:
  """The guesses each target call of a predictions.jsonl row kept."""
  row_calls(row)  # a trace, or the error naming the example
  return [t["num_accepted"] for t in row["aux"]["trace"]]


def read_rows(
    predictions: str) -> Tuple[run_metrics.RunMetrics, List[Dict[str, Any]]]:
  """(the metrics.json beside `predictions`, of a T = 0 run whose outputs
  equal the target alone's, else ValueError; its predictions.jsonl rows)."""
  metrics_path = os.path.join(os.path.dirname(predictions),
                              run_metrics.METRICS_FILE)
  try:
    with open(metrics_path, encoding="utf-8") as f:
      metrics = run_metrics.load(f.read())
  except (OSError, run_metrics.MetricsError) as e:
    raise ValueError(f"--predictions={predictions}: its run's "
                     f"{metrics_path} does not read ({e})") from None
  if metrics.greedy_outputs_identical is not True:
    raise ValueError(
        f"--predictions={predictions}: its run is at T="
        f"{metrics.temperature} with greedy_outputs_identical="
        f"{metrics.greedy_outputs_identical}; a row's calls predict "
        "another batch size only at T = 0 with identical outputs")
  with open(predictions, encoding="utf-8") as f:
    return metrics, [json.loads(line) for line in f if line.strip()]


def replayed_tables(counts: Sequence[Sequence[int]], tokens: Sequence[int],
                    gamma: int, gammas: Sequence[int],
                    sizes: Sequence[int]) -> Dict[str, List[Dict[str, Any]]]:
  """{γ: `batch_table`} of each of `gammas`, each row's calls replayed from
  its `counts` at the run's `gamma` (`replay.calls_at`: exact where the
  run saw every position a γ's calls test)."""
  calls = replay.calls_by_gamma(counts, tokens, gamma, gammas)
  return {str(g): batch_table(tokens, c, sizes) for g, c in calls.items()}


def pilot_windows(counts: Sequence[Sequence[int]], tokens: Sequence[int],
                  gamma: int, gammas: Sequence[int], batch_size: int,
                  pilot_rows: Sequence[int]) -> List[Dict[str, Any]]:
  """Per pilot size n in `pilot_rows`: how far the factors that n
  consecutive rows replay (every window, starting a batch apart) are from
  all rows' (`replay.batch_factors` at each of `gammas`), as replayed and
  after `replay.monotone`: 'mean_error' and 'mean_error_monotone' (mean
  absolute difference over windows and γ) and 'windows_worse' (windows the
  fit moved farther)."""
  full = replay.batch_factors(counts, tokens, gamma, gammas, batch_size)
  out = []
  for n in pilot_rows:
    raw, fitted = [], []
    for start in range(0, len(tokens) - n + 1, batch_size):
      window = replay.batch_factors(counts[start:start + n],
                                    tokens[start:start + n], gamma, gammas,
                                    batch_size)
      for errors, factors in ((raw, window), (fitted, replay.monotone(window))):
        errors.append(np.mean([abs(factors[g] - full[g]) for g in full]))
    if raw:
      out.append({
          "rows": n,
          "windows": len(raw),
          "mean_error": float(np.mean(raw)),
          "mean_error_monotone": float(np.mean(fitted)),
          "windows_worse": int(
              np.sum(np.asarray(fitted) > np.asarray(raw) + 1e-12)),
      })
  return out


def batch_table(tokens: Sequence[int], calls: Sequence[int],
                batch_sizes: Sequence[int],
                by_length: bool = False) -> List[Dict[str, Any]]:
  """Per batch size: each loop's iterations and the batch factor; with
  `by_length` the rows batched shortest output first (the most any
  grouping by length could shorten the target alone's loop)."""
  if by_length:
    order = sorted(range(len(tokens)), key=lambda i: tokens[i])
    tokens, calls = [tokens[i] for i in order], [calls[i] for i in order]
  out = []
  for size in batch_sizes:
    base = overheads.batched_iterations(tokens, size)
    spec = overheads.batched_iterations(calls, size)
    out.append({
        "batch_size": size,
        "baseline_iterations": base,
        "speculative_iterations": spec,
        "batch_factor": overheads.batch_factor(sum(tokens), sum(calls), base,
                                               spec),
    })
  return out


def batch_sizes(text: str, flag: str = "batch_sizes") -> List[int]:
  """--batch_sizes' (or `flag`'s) value, checked."""
  try:
    sizes = [int(x) for x in text.split(",")]
  except ValueError:
    sizes = []
  if not sizes or min(sizes) < 1:
    raise common.flag_error(flag, text,
                            "comma-separated integers of at least 1")
  return sizes


def main(argv: Sequence[str]) -> Dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--predictions", required=True,
                      help="a T = 0 run's predictions.jsonl")
  parser.add_argument("--batch_sizes", default="1,2,4,8,16")
  parser.add_argument("--by_length", action="store_true",
                      help="batch the rows shortest output first")
  parser.add_argument("--gammas", default=None,
                      help="γ to replay the run's rows at, e.g. 1,2,5,7")
  parser.add_argument(
      "--pilot_rows", default=None,
      help="with --gammas and one batch size: how far n "
      "consecutive rows' factors are from all rows', e.g. "
      "16,24,48 (`auto`'s pilots)")
  parser.add_argument("--output", default=None, help="JSON file to write")
  args = parser.parse_args(argv)
  sizes = batch_sizes(args.batch_sizes)
  gammas = (batch_sizes(args.gammas, "gammas")
            if args.gammas is not None else [])
  if gammas and args.by_length:
    raise common.flag_error("gammas", args.gammas,
                            "not with --by_length (consecutive rows only)")
  pilot_rows = (batch_sizes(args.pilot_rows, "pilot_rows")
                if args.pilot_rows is not None else [])
  if pilot_rows and not (gammas and len(sizes) == 1):
    raise common.flag_error(
        "pilot_rows", args.pilot_rows,
        "with --gammas and a single --batch_sizes (the pilot's batches)")
  if not os.path.isfile(args.predictions):
    raise common.flag_error("predictions", args.predictions,
                            "a predictions.jsonl file")
  metrics, rows = read_rows(args.predictions)
  tokens, calls = rows_calls(rows)
  table = batch_table(tokens, calls, sizes, args.by_length)
  print(f"{len(tokens)} examples, {sum(tokens)} tokens, {sum(calls)} target "
        f"calls ({sum(tokens) / sum(calls):.2f} tokens a call)")
  for r in table:
    print(f"batch {r['batch_size']:3d}: iterations {r['baseline_iterations']}"
          f" (target alone) / {r['speculative_iterations']} (speculative): "
          f"batch factor {r['batch_factor']:.3f}")
  result = {
      "predictions": args.predictions,
      "by_length": args.by_length,
      "examples": len(tokens),
      "tokens": sum(tokens),
      "target_calls": sum(calls),
      "by_batch_size": table,
  }
  if gammas:
    gamma = metrics.gamma
    result["gamma"] = gamma
    counts = [row_counts(row) for row in rows]
    result["replayed_by_gamma"] = replayed_tables(counts, tokens, gamma, gammas,
                                                  sizes)
    for g, replayed in result["replayed_by_gamma"].items():
      print(f"γ {g} (replayed from γ {gamma}): " + ", ".join(
          f"batch {r['batch_size']} {r['batch_factor']:.3f}" for r in replayed))
    if pilot_rows:  # with --gammas and one batch size (checked above)
      result["pilot_windows"] = pilot_windows(counts, tokens, gamma, gammas,
                                              sizes[0], pilot_rows)
      for w in result["pilot_windows"]:
        print(f"pilots of {w['rows']} rows ({w['windows']} windows): factors "
              f"{w['mean_error']:.3f} from all rows', "
              f"{w['mean_error_monotone']:.3f} made monotone; "
              f"{w['windows_worse']} windows farther")
  common.write_result(args.output, result)
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
