"""The device check's arithmetic: the two-sample test and Table 2's rows.

NumPy only (SciPy for the chi-square tail), no JAX: the unit tests run it
alone.

* `two_sample_chisquare`: are two sets of generated sequences draws of one
  distribution? The check compares speculative samples with the target
  alone's (must pass) and with a deliberately wrong target's (must fail:
  the test has the power to see a 10% temperature error).
* `paper_rows`: the paper's Table 2 rows (α, γ and measured speedup of each
  task, draft and temperature) as the experiment files' comments state
  them (`gin/ende_*.gin`, `gin/cnndm_*.gin`, read as text: no gin).
* `theorem_rows`: Theorem 3.8 at each row's α and γ with the c measured
  for its draft, beside the paper's measured speedup.
"""
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from specdec_jax.metrics import analysis
from specdec_jax.config import paths

# "temperature 0 (gamma=7: paper alpha=0.75, 3.4x)" and "the temperature-1
# row is gamma=7 (paper alpha=0.62, 2.6x)" (gin/ende_small.gin's comments).
_ROW = re.compile(r"temperature[ -](\d+(?:\.\d+)?)\D*?gamma=(\d+)\W+"
                  r"paper alpha=([\d.]+),\s*([\d.]+)x")
_TASKS = {"ende": "EnDe", "cnndm": "CNNDM"}
_DRAFTS = ("small", "base", "large")


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


def paper_rows(gin_dir: Optional[str] = None) -> List[Dict[str, Any]]:
  """The paper's Table 2 rows, from the experiment files' comments.

  Returns:
    One dict per (task, draft, temperature): task ('EnDe', 'CNNDM'),
    draft ('small', 'base', 'large'), temperature, gamma, alpha, speedup
    (the paper's measured walltime improvement) and source (the file).
  """
  gin_dir = gin_dir or str(paths.GIN_DIR)
  rows = []
  for task in _TASKS:
    for draft in _DRAFTS:
      path = os.path.join(gin_dir, f"{task}_{draft}.gin")
      with open(path, encoding="utf-8") as f:
        comments = " ".join(line.strip().lstrip("#").strip()
                            for line in f
                            if line.strip().startswith("#"))
      for m in _ROW.finditer(comments):
        rows.append({
            "task": _TASKS[task],
            "draft": draft,
            "temperature": float(m.group(1)),
            "gamma": int(m.group(2)),
            "alpha": float(m.group(3)),
            "speedup": float(m.group(4)),
            "source": os.path.basename(path)
        })
  return rows


def theorem_rows(
    rows: Sequence[Mapping[str, Any]], c_by_draft: Mapping[str, float],
    call_cost_by_k: Optional[Mapping[int,
                                     float]] = None) -> List[Dict[str, Any]]:
  """Theorem 3.8 for each Table 2 row with the measured c of its draft.

  Args:
    rows: `paper_rows`.
    c_by_draft: draft size -> c (draft step / target step) measured here.
    call_cost_by_k: K -> the K-token target call in target steps, measured
      here; when it holds γ+1, the row also gets Theorem 3.8 with that
      call cost in place of 1 (`analysis.expected_speedup(call_cost=)`).

  Returns:
    The rows plus c, theorem_3_8, theorem_3_8_with_call_cost (or None) and
    paper_over_theorem (the paper's speedup / Theorem 3.8's); rows whose
    draft was not measured get None.
  """
  out = []
  for row in rows:
    c = c_by_draft.get(row["draft"])
    new = dict(row, c=c, theorem_3_8=None, theorem_3_8_with_call_cost=None,
               paper_over_theorem=None)
    if c is not None:
      theory = float(analysis.expected_speedup(row["alpha"], row["gamma"], c))
      new["theorem_3_8"] = theory
      new["paper_over_theorem"] = row["speedup"] / theory
      cost = (call_cost_by_k or {}).get(row["gamma"] + 1)
      if cost is not None:
        new["theorem_3_8_with_call_cost"] = float(
            analysis.expected_speedup(row["alpha"], row["gamma"], c,
                                      call_cost=cost))
    out.append(new)
  return out


def median_ratio(numerator: Sequence[float],
                 denominator: Sequence[float]) -> float:
  """The median over rounds of numerator[r] / denominator[r]."""
  n, d = np.asarray(numerator, float), np.asarray(denominator, float)
  if n.shape != d.shape or n.size == 0:
    raise ValueError(f"two equal non-empty series needed, got {n.shape} and "
                     f"{d.shape}.")
  return float(np.median(n / d))
