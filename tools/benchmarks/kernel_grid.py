"""The GPU kernels' grids, and what a program's share of the bytes costs
(issue 56).

On the H200 (2026-11-29) the fused path's steps took 0.613 / 1.282 / 3.145
/ 11.103 ms at T5 v1.1 small / base / large / XXL shapes (tiles 'mma'),
slower than XLA's fusions. Their compiled programs say why: each Triton
call runs one program per head or per block of columns, 6-32 programs for
T5-small (6 for the attention kernels, each reading a head's 213 KB) on
132 multiprocessors, and a program reads at the rate its loads in flight
allow (Little's law: bytes in flight ÷ memory latency), not at the GPU's.
So a call costs its largest program's bytes over one program's rate, or
all its bytes over the GPU's rate if that is longer, plus a fixed cost:

  step ≈ Σ_calls max(bytes ÷ programs ÷ program_gbps, bytes ÷ chip_gbps)
         + calls × kernel_us

`fit` finds the two constants from measured steps whose calls are far
from the GPU's rate (it fits the first term alone); at the four sizes
above it gives about 8.6 GB/s a program and 2.9 µs a call, within 5% of
every step (the results page of 2026-11-29). The model says what a design
must change: more programs per call (up to the 132 multiprocessors'
worth), more bytes in flight per program, or fewer calls.

`triton_calls` reads the calls of a compiled program (`compiled.as_text()`
of XLA:GPU, as `tools.benchmarks.gpu_aot` compiles them here without a
GPU): the kernel's name, its grid's programs, the bytes of its operands
(a table it only gathers from, the token embedding that a layer's kernel
takes under `Tiles.fold_bytes` or `layer_bytes`, counts one row),
Triton's warps and stages.
"""
import re
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from specdec_jax.experiment import hlo_reads

# `fit` of the H200's fused steps of 2026-11-29
# (benchmarks/issue56_h200_2026-11-29_device_check.json, `paths.steps.
# fused`) against `triton_calls` of the same programs compiled here for
# an H200 (tiles 'mma').
H200_PROGRAM_GBPS = 8.6
H200_KERNEL_US = 2.9
# The copy rate (bytes read + written per second) the same check measured
# in its paths phase (`paths.settings.copy_gbps`).
H200_CHIP_GBPS = 3230.0

_CALL = "__gpu$xla.gpu.triton"
_SHAPE = re.compile(r"\b\w+\[[\d,]*\]")
_OPERANDS = re.compile(r"operand_layout_constraints=\{(.*?)\}, "
                       r"(?:output_to_operand_aliasing|api_version)")

# The kernel that reads the whole token embedding: the logits'.
_READS_TABLE = ("decode_rms_dense",)


def triton_calls(
    hlo: str, gathered: Sequence[str] = ()) -> List[Dict[str, Any]]:
  """Every Triton call of `hlo` (an XLA:GPU program's text), in program
  order: {'name', 'programs' (grid x·y·z), 'bytes' (its operands': weights,
  caches, activations, each read once at most; an operand of a shape in
  `gathered`, e.g. 'bf16[32128,512]', one row of it, but in the logits'
  kernel), 'num_warps', 'num_stages'}."""
  out = []
  for line in hlo.splitlines():
    if _CALL not in line:
      continue
    grid = [
        int(re.search(rf"grid_{axis} = (\d+)", line).group(1)) for axis in "xyz"
    ]
    operands = _OPERANDS.search(line)
    found = re.search(r'name = "([^"]+)"', line)
    name = found.group(1) if found else "?"
    nbytes = 0
    for shape in (_SHAPE.findall(operands.group(1)) if operands else ()):
      size = hlo_reads.array_bytes(shape)
      if shape in gathered and name not in _READS_TABLE:
        size //= int(shape.split("[")[1].split(",")[0])
      nbytes += size
    fields = {
        key: re.search(rf"{key} = (\w+)", line)
        for key in ("num_warps", "num_stages")
    }
    out.append({
        "name": name,
        "programs": grid[0] * grid[1] * grid[2],
        "bytes": nbytes,
        **{
            k: int(m.group(1)) if m else None for k, m in fields.items()
        }
    })
  return out


def by_kernel(calls: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
  """Calls grouped by name and programs ('decode_self_attention@6'):
  'calls', 'programs', 'bytes_per_program' (the calls' mean)."""
  out: Dict[str, Dict[str, Any]] = {}
  for c in calls:
    row = out.setdefault(f"{c['name']}@{c['programs']}", {
        "calls": 0,
        "programs": c["programs"],
        "bytes_per_program": 0.0
    })
    share = c["bytes"] / c["programs"]
    row["calls"] += 1
    row["bytes_per_program"] += (share -
                                 row["bytes_per_program"]) / row["calls"]
  return out


def _terms(calls: Sequence[Dict[str, Any]]) -> Tuple[float, int]:
  """(Σ bytes ÷ programs in GB, calls)."""
  return sum(c["bytes"] / c["programs"] for c in calls) / 1e9, len(calls)


def predict_ms(calls: Sequence[Dict[str, Any]],
               program_gbps: float = H200_PROGRAM_GBPS,
               kernel_us: float = H200_KERNEL_US,
               chip_gbps: float = H200_CHIP_GBPS) -> float:
  """The model's time (ms) of one step made of `calls`."""
  seconds = sum(
      max(c["bytes"] / c["programs"] / program_gbps, c["bytes"] / chip_gbps)
      for c in calls) / 1e9
  return (seconds + len(calls) * kernel_us * 1e-6) * 1e3


def fit(
    steps: Sequence[Tuple[Sequence[Dict[str, Any]], float]]) -> Dict[str, Any]:
  """Least squares of the model's two constants over `steps` ((a step's
  calls, its measured ms), at least two, not proportional; the GPU's rate
  left out): 'program_gbps', 'kernel_us', and per step 'predicted_ms'
  (with it) against 'measured_ms'.

  Raises:
    ValueError: fewer than two steps, or a fit that is not positive.
  """
  if len(steps) < 2:
    raise ValueError(f"fit: {len(steps)} steps; allowed: 2 or more.")
  x = np.array([_terms(calls) for calls, _ in steps], float)
  y = np.array([ms * 1e-3 for _, ms in steps], float)
  (inverse_rate, per_call), *_ = np.linalg.lstsq(x, y, rcond=None)
  if inverse_rate <= 0 or per_call < 0:
    raise ValueError(f"fit: {1 / inverse_rate:.3g} GB/s a program, "
                     f"{per_call * 1e6:.3g} µs a call; allowed: both > 0.")
  rate, kernel_us = 1 / inverse_rate, per_call * 1e6
  return {
      "program_gbps": float(rate),
      "kernel_us": float(kernel_us),
      "predicted_ms": [predict_ms(c, rate, kernel_us) for c, _ in steps],
      "measured_ms": [float(ms) for _, ms in steps],
  }
