"""Where a decoder step's device time goes (issue 56): each kernel's time on
the device, from JAX's profiler.

The H200 run of 2026-11-29 timed a T5-small-shaped step at 0.613 ms on
'fused' (55 kernels a step, compiled) and 0.497 ms on 'packed' (188): about
11 µs a fused kernel against 2.6 µs a packed one, and the XXL step on
'fused' at 36% of its memory floor. A wall-clock time cannot say whether
the kernels themselves are slow (too few programs for the GPU's 132
multiprocessors, dependent loads) or the step is made of the gaps between
them (launches, host round trips); the device's own timeline can. Per
step: the kernels the device ran, their summed time, the time it was busy
(the union of the kernels' intervals: streams may overlap) and, against
the step's wall time, the share it idled; and the kernels that took the
most, by name.

Only a device plane ('/device:GPU:0', its 'Stream …' lines: CUPTI's
kernel and copy records) is read: on a CPU there is none, and the record
says so.
"""
import collections
import glob
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, NamedTuple, Sequence

import jax

# How many kernels `summarize` lists by name (the rest summed).
TOP = 12
# An idle gap longer than this is not a launch's (~1-2 µs on an H200,
# 2026-11-30) but a wait on the host: a while loop's condition or a
# conditional's branch index read back, a program's dispatch.
LONG_GAP_US = 5.0


class Kernel(NamedTuple):
  """One device activity: a kernel, a copy or a memset."""
  name: str
  start_ns: float
  duration_ns: float


# Lines a device plane may hold that restate its streams' time.
_DERIVED = ("XLA Ops", "XLA Modules", "Steps", "Framework Ops",
            "Framework Name Scope", "Source code", "Launch Stats")


def device_kernels(profile: Any) -> List[Kernel]:
  """The activities on the device planes' stream lines of `profile` (a
  `jax.profiler.ProfileData`), in start order. The derived lines a device
  plane may also hold ('XLA Ops', 'XLA Modules', 'Steps', ...) restate the
  same time, so only 'Stream' lines count; a plane whose lines are named
  otherwise counts every line but those."""
  out = []
  for plane in profile.planes:
    if not plane.name.startswith("/device:") or "CUSTOM" in plane.name:
      continue
    lines = [line for line in plane.lines if line.name.startswith("Stream")]
    if not lines:
      lines = [line for line in plane.lines if line.name not in _DERIVED]
    for line in lines:
      out.extend(
          Kernel(e.name, float(e.start_ns), float(e.duration_ns))
          for e in line.events)
  return sorted(out, key=lambda k: k.start_ns)


def busy_ns(kernels: Sequence[Kernel]) -> float:
  """The time at least one of `kernels` ran (their intervals' union): from
  the first start to the last end, less the idle gaps."""
  if not kernels:
    return 0.0
  first = min(k.start_ns for k in kernels)
  last = max(k.start_ns + k.duration_ns for k in kernels)
  return last - first - sum(idle_gaps_ns(kernels))


def idle_gaps_ns(kernels: Sequence[Kernel]) -> List[float]:
  """The idle intervals between `kernels`' busy ones (their union's
  holes), in time order."""
  out, end = [], None
  for k in sorted(kernels, key=lambda k: k.start_ns):
    if end is not None and k.start_ns > end:
      out.append(k.start_ns - end)
    stop = k.start_ns + k.duration_ns
    end = stop if end is None else max(end, stop)
  return out


def summarize(kernels: Sequence[Kernel], steps: int,
              wall_s: float) -> Dict[str, Any]:
  """Per step of `steps` traced in `wall_s` seconds (host wall clock):
  'kernels' (activities), 'kernel_us' (their summed time), 'busy_us',
  'wall_us', 'idle_share' (1 − busy ÷ wall: launches, gaps, host round
  trips), 'mean_kernel_us', 'long_gaps' and 'long_gap_us' (the idle
  gaps over `LONG_GAP_US` µs between the first kernel and the last: the
  host's waits), 'top': the `TOP` names with the most time,
  each {'name', 'per_step', 'us_per_step', 'mean_us'}, and 'rest_us' the
  others' time per step."""
  if not kernels:
    return {"kernels": 0, "note": "no device activity in the trace"}
  by_name: Dict[str, List[float]] = collections.defaultdict(list)
  for k in kernels:
    by_name[k.name].append(k.duration_ns)
  ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
  total_ns = sum(k.duration_ns for k in kernels)
  long_gaps = [g for g in idle_gaps_ns(kernels) if g > LONG_GAP_US * 1e3]
  wall_us = wall_s * 1e6 / steps
  busy_us = busy_ns(kernels) / 1e3 / steps
  top = [{
      "name": name,
      "per_step": len(times) / steps,
      "us_per_step": sum(times) / 1e3 / steps,
      "mean_us": sum(times) / 1e3 / len(times),
  } for name, times in ranked[:TOP]]
  return {
      "kernels": len(kernels) / steps,
      "kernel_us": total_ns / 1e3 / steps,
      "busy_us": busy_us,
      "wall_us": wall_us,
      "idle_share": max(0.0, 1.0 - busy_us / wall_us),
      "mean_kernel_us": total_ns / 1e3 / len(kernels),
      "long_gaps": len(long_gaps) / steps,
      "long_gap_us": sum(long_gaps) / 1e3 / steps,
      "long_gap_over_us": LONG_GAP_US,
      "top": top,
      "rest_us": sum(sum(t) for _, t in ranked[TOP:]) / 1e3 / steps,
  }


def profile(fn: Callable[[int], Any], calls: int,
            steps_per_call: int) -> Dict[str, Any]:
  """`summarize` of `calls` runs of `fn(round)` (compiled already: one
  warm call first, untraced), each `steps_per_call` steps, traced by
  JAX's profiler into a temporary folder."""
  if calls < 1 or steps_per_call < 1:
    raise ValueError(f"calls {calls}, steps_per_call {steps_per_call}: "
                     "allowed: integers >= 1.")
  jax.block_until_ready(fn(0))
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder):
      start = time.perf_counter()
      for r in range(calls):
        jax.block_until_ready(fn(r))
      wall_s = time.perf_counter() - start
    files = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if not files:
      return {"kernels": 0, "note": "the profiler wrote no trace"}
    data = jax.profiler.ProfileData.from_file(files[0])
    return summarize(device_kernels(data), calls * steps_per_call, wall_s)
