"""The device check's arithmetic: Table 2's rows and Theorem 3.8's table.

NumPy only, no JAX: the unit tests run it alone. (The exactness tests'
arithmetic, greedy identity and the two-sample chi-square, is the
package's: `specdec_jax.metrics.exactness`.)

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
from specdec_jax.files import io_utils

# "temperature 0 (gamma=7: paper alpha=0.75, 3.4x)" and "the temperature-1
# row is gamma=7 (paper alpha=0.62, 2.6x)" (gin/ende_small.gin's comments).
_ROW = re.compile(r"temperature[ -](\d+(?:\.\d+)?)\D*?gamma=(\d+)\W+"
                  r"paper alpha=([\d.]+),\s*([\d.]+)x")
_TASKS = {"ende": "EnDe", "cnndm": "CNNDM"}
_DRAFTS = ("small", "base", "large")


def paper_rows(gin_dir: Optional[str] = None) -> List[Dict[str, Any]]:
  """The paper's Table 2 rows, from the experiment files' comments.

  Returns:
    One dict per (task, draft, temperature): task ('EnDe', 'CNNDM'),
    draft ('small', 'base', 'large'), temperature, gamma, alpha, speedup
    (the paper's measured walltime improvement) and source (the file).
  """
  gin_dir = gin_dir or str(io_utils.GIN_DIR)
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
