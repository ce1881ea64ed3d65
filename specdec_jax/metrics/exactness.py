"""Exactness, measured, the one place the project compares a speculative
decoder's output with the target alone's (`certify`, the device check, the
benchmarks): greedy identity at T = 0 and, at T > 0, a two-sample chi-square
test with a power check. NumPy and SciPy only (no JAX, no gin): the device
check runs it where gin is not installed.
"""
from typing import Any, Callable, Dict, List, Union

import numpy as np

Record = Dict[str, Any]


class GreedyIdentity:
  """Greedy identity counted batch by batch: `add` each batch's tokens,
  `record()` is `greedy_identity`'s dict over every example added."""

  def __init__(self):
    self.examples = 0
    self.mismatches: List[Dict[str, int]] = []

  def add(self, base: Any, spec: Any) -> None:
    """Compares `base` [B, ...] with `spec`; ValueError unless one shape
    with an example axis."""
    base, spec = np.asarray(base), np.asarray(spec)
    if base.shape != spec.shape or base.ndim < 1:
      raise ValueError(
          f"greedy identity compares two token arrays of one shape [B, ...], "
          f"got {base.shape} and {spec.shape}.")
    differ = (base != spec).reshape(len(base), -1)
    for row in np.flatnonzero(differ.any(axis=1)):
      self.mismatches.append({
          "index": self.examples + int(row),
          "position": int(np.argmax(differ[row]))
      })
    self.examples += len(base)

  def record(self) -> Record:
    """{'examples', 'identical', 'mismatches': [{'index', 'position'}]}."""
    return {
        "examples": self.examples,
        "identical": self.examples - len(self.mismatches),
        "mismatches": list(self.mismatches),
    }


def greedy_identity(base: Any, spec: Any) -> Record:
  """`base` [N, ...] (the target alone's tokens) against `spec`: {'examples':
  N, 'identical': examples equal in every token, 'mismatches': [{'index',
  'position': the flattened example's first differing token}]}."""
  tally = GreedyIdentity()
  tally.add(base, spec)
  return tally.record()


def two_sample_chisquare(a: Any, b: Any,
                         min_expected: float = 5.0) -> Dict[str, float]:
  """Chi-square homogeneity test of rows a [N, T], b [M, T] (cells expected
  below `min_expected` pooled): {'statistic', 'dof', 'p_value', 'cells'}."""
  a, b = np.asarray(a), np.asarray(b)
  if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
    raise ValueError(f"two samples [N, T] and [M, T] needed, got {a.shape} "
                     f"and {b.shape}.")
  _, cell = np.unique(np.concatenate([a, b]), axis=0, return_inverse=True)
  cell = cell.reshape(-1)
  n_cells = int(cell.max()) + 1
  counts = np.stack([
      np.bincount(cell[:len(a)], minlength=n_cells),
      np.bincount(cell[len(a):], minlength=n_cells)
  ]).astype(np.float64)
  share = np.array([len(a), len(b)], np.float64) / (len(a) + len(b))
  expected = share[:, None] * counts.sum(axis=0)[None, :]
  sparse = expected.min(axis=0) < min_expected
  if sparse.any():
    counts = np.concatenate(
        [counts[:, ~sparse], counts[:, sparse].sum(axis=1, keepdims=True)],
        axis=1)
    expected = share[:, None] * counts.sum(axis=0)[None, :]
    if expected[:, -1].min() == 0.0:  # No sparse row at all after all.
      counts, expected = counts[:, :-1], expected[:, :-1]
  dof = counts.shape[1] - 1
  if dof < 1:
    return {"statistic": 0.0, "dof": 0, "p_value": 1.0, "cells": 1}
  statistic = float(np.sum((counts - expected)**2 / expected))
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return {
      "statistic": statistic,
      "dof": int(dof),
      "p_value": float(stats.chi2.sf(statistic, dof)),
      "cells": int(counts.shape[1])
  }


def distribution_test(draws: Any, target_draws: Any,
                      wrong_draws: Union[Any, Callable[[], Any]], *,
                      significance: float, fail_fast: bool = False) -> Record:
  """{'test', 'passed', 'power_check', 'power_ok'}: the speculative draws
  [M, L] against the target alone's (passed: p >= significance) and a wrong
  target's (`wrong_draws` or a function drawing them: power_ok: p below);
  with `fail_fast`, a failed test skips the power check ('skipped')."""
  if not 0.0 < significance < 1.0:
    raise ValueError(f"significance={significance!r}: allowed: a number in "
                     "(0, 1).")
  test = two_sample_chisquare(draws, target_draws)
  record: Record = {"test": test, "passed": test["p_value"] >= significance}
  if fail_fast and not record["passed"]:
    return dict(record, power_check=None, power_ok=None,
                skipped=["power_check"])
  wrong = wrong_draws() if callable(wrong_draws) else wrong_draws
  power = two_sample_chisquare(draws, wrong)
  ok = power["p_value"] < significance
  return dict(record, power_check=power, power_ok=ok)
