"""The ops XLA compiled into a decode loop's iteration, part by part.

Reads the optimized HLO text of a compiled program (`compiled.as_text()`)
and counts, per while-loop body, its ops by kind and by the part of the
iteration they come from (the named scopes of `decoding.loops`), and its
copies with their bytes (`scripts/iteration_hlo.py`,
`tests/core/test_in_place_caches.py`).
"""
import collections
import re
from typing import Any, Dict, List

import numpy as np

# Source-op-name fragments -> the part of an iteration (first match wins).
# The loops' named scopes (`decoding.loops`); the rest: the copies, the
# loop's own bookkeeping (state updates, rng, the rollback), and ops XLA
# made without a source name (most are the model call's).
PARTS = (("/propose/", "draft propose"), ("/verify/", "target call"),
         ("/acceptance/", "acceptance"), ("/emit/", "emit"), ("/statistics/",
                                                              "statistics"))
_SKIP = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "bf16": 2, "s8": 1}


def _computations(hlo: str) -> Dict[str, List[str]]:
  comps, name = {}, None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if header:
      name = header.group(1)
      comps[name] = []
    elif name and line.startswith("  "):
      comps[name].append(line.strip())
  return comps


def _source(line: str, comps: Dict[str, List[str]]) -> str:
  """The JAX op name an HLO op came from (a fusion without one: the first
  one among its fused ops)."""
  source = re.search(r'op_name="([^"]*)"', line)
  if source:
    return source.group(1)
  called = re.search(r"calls=%?([\w.\-]+)", line)
  for inner in comps.get(called.group(1), []) if called else []:
    source = re.search(r'op_name="([^"]*)"', inner)
    if source:
      return source.group(1)
  return line.split("=", 1)[0].strip()


def _part(line: str, comps: Dict[str, List[str]]) -> str:
  if re.search(r"= \S+ copy\(", line):
    return "copies"
  text = _source(line, comps)
  if text.startswith("%"):  # no source op name: an op XLA made
    return "unnamed (XLA-made: dots, reductions, layouts)"
  return next((part for key, part in PARTS if key in text + "/"),
              "loop bookkeeping")


def _nested_loops(comps: Dict[str, List[str]], entry: str) -> List[str]:
  """While bodies, outermost first (depth-first from the entry)."""
  order = []
  for line in comps[entry]:
    body = re.search(r"\swhile\(.*?body=%?([\w.\-]+)", " " + line)
    if body:
      order.append(body.group(1))
      order.extend(_nested_loops(comps, body.group(1)))
  return order


def _bytes(shape: str) -> int:
  total = 0
  for dtype, dims in re.findall(r"\b(f32|s32|u32|pred|bf16|s8)\[([\d,]*)\]",
                                shape):
    total += int(np.prod([int(d) for d in dims.split(",") if d
                         ])) * _BYTES[dtype]
  return total


def loop_bodies(hlo: str) -> Dict[str, Dict[str, Any]]:
  """Per while body (outermost first, then the loops inside it, e.g. the
  draft's steps): ops by kind, by part, and copies."""
  comps = _computations(hlo)
  entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
  out = {}
  for body in _nested_loops(comps, entry):
    kinds, parts = collections.Counter(), collections.Counter()
    copy_bytes, copy_shapes = 0, collections.Counter()
    for line in comps[body]:
      m = re.match(r"(?:ROOT )?%?[\w.\-]+ = (.*?) ([\w\-]+)\(", line)
      if not m or m.group(2) in _SKIP:
        continue
      kinds[m.group(2)] += 1
      parts[_part(line, comps)] += 1
      if m.group(2) == "copy":
        copy_bytes += _bytes(m.group(1))
        copy_shapes[re.sub(r"\{.*", "", m.group(1))] += 1
    out[f"loop_{len(out)}"] = {
        "ops": sum(kinds.values()),
        "by_kind": dict(kinds.most_common()),
        "by_part": dict(parts.most_common()),
        "copies": kinds["copy"],
        "copy_bytes": copy_bytes,
        "copy_shapes": dict(copy_shapes),
    }
  return out
