"""Exactness, measured: greedy identity and the two-sample distribution test.

The one place the project compares a speculative decoder's output with the
target alone's (`certify`, the device check, the benchmarks):

* `greedy_identity` (or `GreedyIdentity`, batch by batch): at T = 0 the two
  decoders' tokens must be equal, example for example; every mismatch is
  listed with its first differing position.
* `two_sample_chisquare`: are two sets of generated sequences draws of one
  distribution?
* `distribution_test`: at T > 0, the speculative decoder's draws against the
  target alone's (must pass) and against a deliberately wrong target's
  (must fail: the test's power to see an error of that size).

NumPy only (SciPy for the chi-square tail), no JAX and no gin: the device
check runs it where gin is not installed, and its tests compile nothing.
"""
from typing import Any, Callable, Dict, List, Union

import numpy as np

Record = Dict[str, Any]


class GreedyIdentity:
  """Greedy identity counted batch by batch.

  `add` each batch's target-alone and speculative tokens ([B, ...], the
  rows are examples); `record()` is `greedy_identity`'s dict over every
  example added, indexed in the order they were added.
  """

  def __init__(self):
    self.examples = 0
    self.mismatches: List[Dict[str, int]] = []

  def add(self, base: Any, spec: Any) -> None:
    """Compares one batch: `base` [B, ...] and `spec` of the same shape.

    Raises:
      ValueError: the shapes differ, or an array has no example axis.
    """
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
  """The target alone's tokens `base` [N, ...] against the speculative
  decoder's `spec`, example by example.

  Returns:
    {'examples': N, 'identical': the examples equal in every token,
    'mismatches': [{'index': the example, 'position': its first differing
    token (in the flattened example when it has more than one axis, e.g.
    beams × length)}]}.
  """
  tally = GreedyIdentity()
  tally.add(base, spec)
  return tally.record()


def two_sample_chisquare(a: Any, b: Any,
                         min_expected: float = 5.0) -> Dict[str, float]:
  """Chi-square test of homogeneity of two samples of token sequences.

  Each distinct row is a cell of a 2 x cells contingency table; cells whose
  expected count under the null (one distribution) is below
  `min_expected` in either sample are pooled into one cell.

  Args:
    a: [N, T] integer sequences (one per row).
    b: [M, T] integer sequences of the same length T.
    min_expected: the smallest expected count a cell keeps alone.

  Returns:
    {'statistic', 'dof', 'p_value', 'cells'}; p_value 1.0 when fewer than
    two cells remain.
  """
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
  """The speculative decoder's draws against the target alone's, and the
  test's power against a deliberately wrong target's.

  Args:
    draws: [M, L] the speculative decoder's first L tokens, M draws.
    target_draws: [M', L] the target alone's.
    wrong_draws: [M'', L] a deliberately wrong target's (e.g. at 0.9 × the
      temperature), or a function drawing them, called only when the power
      check runs.
    significance: p below this fails a test; the power check must fail.
    fail_fast: a failed test skips the power check.

  Returns:
    {'test': `two_sample_chisquare` against the target, 'passed': its p >=
    significance, 'power_check': against the wrong target (None when
    skipped), 'power_ok': its p < significance (None when skipped)}, plus
    'skipped': ['power_check'] when it was.
  """
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
