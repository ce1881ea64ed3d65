"""A chain decode's target calls at another γ, replayed from one γ's
accepted counts, and what rows waiting for a batch's slowest cost at each
γ (`batch_factors`): SPECULATION='auto' at batch > 1 (docs/results/
2026-12-02-batch-factor-by-gamma.md).

At T = 0 a chain's calls are fixed by which positions of the target's
output the draft guesses right given the target's prefix (`matches`): a
call keeps the run of right guesses from where it starts, at most γ, and
the target adds one token. One γ's counts give every position but the
target's token after a call that kept all γ; those are counted as right.
On the shipped pair's 60 captions at batch 8 the factor replayed at γ 7
from γ 3's counts is 0.716 (measured 0.723). At T > 0 the replay is a
model: a row's hard positions stay hard, its lucky draws stay lucky. An
adaptive drafter's short call is no rejection: its counts do not replay.
"""
import math
from typing import Dict, List, Mapping, Sequence

import numpy as np

RIGHT, WRONG, UNSEEN = 1, 0, -1


def matches(accepted_counts: Sequence[int], gamma: int,
            length: int) -> np.ndarray:
  """[length] int8: per output position (EOS included), RIGHT where the
  draft's guess was kept, WRONG where it was rejected (the target's token
  went there), UNSEEN at the target's token after a call that kept all
  `gamma` guesses; from one row's `accepted_counts` [calls] at `gamma`."""
  out = []
  for kept in accepted_counts:
    out += [RIGHT] * int(kept) + [WRONG if kept < gamma else UNSEEN]
  if len(out) < length:
    raise ValueError(f"accepted_counts {list(accepted_counts)} at "
                     f"gamma={gamma} cover {len(out)} positions, fewer than "
                     f"the row's length {length}")
  # The last call may end the row inside its guesses (EOS kept).
  return np.asarray(out[:length], np.int8)


def calls_at(row_matches: np.ndarray, gamma: int) -> int:
  """The target calls a chain of `gamma` guesses makes over `row_matches`
  ([length], from `matches`; UNSEEN counted as RIGHT)."""
  if gamma < 1:
    raise ValueError(f"gamma={gamma}: must be at least 1")
  length, pos, calls = len(row_matches), 0, 0
  while pos < length:
    kept = 0
    while (kept < gamma and pos + kept < length and
           row_matches[pos + kept] != WRONG):
      kept += 1
    calls, pos = calls + 1, pos + kept + 1
  return calls


def calls_by_gamma(accepted_counts: Sequence[Sequence[int]],
                   lengths: Sequence[int], gamma: int,
                   gammas: Sequence[int]) -> Dict[int, List[int]]:
  """{γ: [N] target calls} of each of `gammas`, each row's replayed from
  its `accepted_counts` at `gamma` and its length (tokens, EOS included)."""
  if len(lengths) != len(accepted_counts):
    raise ValueError(f"lengths has {len(lengths)} rows, accepted_counts "
                     f"{len(accepted_counts)}: they must agree")
  rows = [matches(c, gamma, n) for c, n in zip(accepted_counts, lengths)]
  return {int(g): [calls_at(m, g) for m in rows] for g in gammas}


def expected_max(values: Sequence[int], batch_size: int) -> float:
  """E[the most of `batch_size` of `values` drawn without replacement]
  (all of them when there are fewer): a batch's loop iterations when its
  rows are any `batch_size` of these."""
  x = np.sort(np.asarray(values, np.float64))
  n, b = len(x), min(int(batch_size), len(x))
  if b < 1:
    raise ValueError(f"values has {n} rows and batch_size={batch_size}: "
                     "both must be at least 1")
  # P(max <= x_(i)) = C(i, b) / C(n, b), i = 0..n, in logs (a pilot of
  # 1000-row batches: C(2000, 1000) is no float).
  def log_comb(i: int) -> float:
    return (math.lgamma(i + 1) - math.lgamma(b + 1) -
            math.lgamma(i - b + 1) if i >= b else -math.inf)

  below = np.exp(np.asarray([log_comb(i) for i in range(n + 1)]) - log_comb(n))
  return float(x @ np.diff(below))


def batch_factors(accepted_counts: Sequence[Sequence[int]],
                  lengths: Sequence[int], gamma: int, gammas: Sequence[int],
                  batch_size: int) -> Dict[int, float]:
  """{γ: `overheads.batch_factor`} of each of `gammas` for batches of
  `batch_size` rows drawn from these [N] rows (their expected iterations,
  `expected_max`: a pilot's few batches would make a noisy maximum),
  replayed from the rows' `accepted_counts` at `gamma` and `lengths`
  (tokens, EOS included: the target alone's calls); {} without tokens."""
  calls = calls_by_gamma(accepted_counts, lengths, gamma, gammas)
  if not sum(lengths):
    return {}
  tokens = np.asarray(lengths, np.float64)
  waits_base = tokens.mean() / expected_max(tokens, batch_size)
  return {
      g: float(np.mean(c) / expected_max(c, batch_size) / waits_base)
      for g, c in calls.items()
  }


def monotone(factors: Mapping[int, float]) -> Dict[int, float]:
  """{γ: factor}: `factors` ({γ: `batch_factors`'}) at most 1 and
  non-increasing in γ (least-squares isotonic regression over the γ in
  order).

  Every measured run's factors fall with γ (60 and 200 captions, chains
  and trees), but a pilot's few rows replay noisily: a tree pilot's 16
  rows of the main job gave 0.97, 1.02 and 1.12 at γ 2, 3 and 4 where
  trees over all 60 measured 0.90, 0.85 and 0.80, and `auto` chose γ 4
  for it (0.83x measured; γ 3: 1.00x). The regression keeps a pilot's
  noise from ranking neighbouring γ: over every window of 16 to 48
  consecutive rows of both runs (γ 1 to 12) it moved no window's factors
  farther from all rows' (mean error 0.085 against 0.106 in 16 rows of 60,
  0.092 against 0.112 of 200, 0.038 both in 48 of 200).
  """
  gammas = sorted(factors)
  # Pool adjacent violators, by hand: scipy.optimize's import (321 modules,
  # a BLAS of its own) stays out of the run's process, where the main job
  # at batch 8 measured 1.02-1.05x with it against 1.04-1.08x without (4
  # interleaved pairs, host A, 2026-12-02).
  blocks: List[List[float]] = []  # [sum, count] of each pooled run
  for value in np.minimum([float(factors[g]) for g in gammas], 1.0):
    blocks.append([float(value), 1.0])
    while (len(blocks) > 1 and
           blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]):
      total, count = blocks.pop()
      blocks[-1][0] += total
      blocks[-1][1] += count
  fitted = [total / count for total, count in blocks for _ in range(int(count))]
  return dict(zip(gammas, fitted))
