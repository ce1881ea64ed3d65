"""How many times a compiled call reads each weight, from its HLO text.

XLA's cost analysis ("bytes accessed") is no proof that a step reads its
weights once: on TPU the compiler prefetches weights into on-chip memory
(`copy-start`/`slice-start` into another memory space, `S(n)` in the
layout), and the analysis counts the prefetch's read, its write and the
consumer's read of the copy, so a step that reads each weight once from
HBM shows 2-4x its argument bytes. The compiled program's structure says
more: in the entry computation of a call without loops, every use of a
parameter is one pass over it (or over the slice it takes).

`weight_reads` counts those passes for the parameters that are model
weights (their `op_name` metadata names `params`): a use by a slice counts
the slice's share of the parameter, a use by the output tuple (a buffer
passed through, aliased) counts nothing, any other use (fusion, dot,
copy, copy-start, ...) counts one whole read. So it is an upper bound on
HBM reads: a fusion that gathers one embedding row still counts the table
(XLA:CPU fuses that gather into each of its consumers: two or three
"reads" of a table of which one row is read).
"""
import re
from typing import Dict, List, Optional

_ITEMSIZE = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "bf16": 2,
    "f16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8
}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([0-9,]*)\]")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_PARAMETER = re.compile(r"\sparameter\(\d+\)")
_OPERAND = re.compile(r"%[\w.\-]+")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
# Uses that read only part of their operand: the share is output / operand.
_SLICES = ("slice", "slice-start", "dynamic-slice")
# Uses that read nothing: the buffer is handed on (aliased output).
_PASS_THROUGH = ("tuple",)


def array_bytes(shape: str) -> int:
  """Bytes of the arrays named in an HLO shape string: 'bf16[2,3]' -> 12;
  a tuple shape counts every element."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * _ITEMSIZE[dtype]
  return total


def entry_computation(hlo_text: str) -> List[str]:
  """The instruction lines of the ENTRY computation."""
  start = hlo_text.find("\nENTRY")
  if start < 0:
    raise ValueError("weight_reads: no ENTRY computation in the HLO text.")
  body = hlo_text[start + 1:].split("\n")
  lines = []
  for line in body[1:]:
    if line.startswith("}"):
      break
    lines.append(line)
  return lines


def _slice_share(shape: str, operand_bytes: int) -> float:
  # slice-start's shape is ((operand), slice, context): the slice is the
  # second array named.
  arrays = _ARRAY.findall(shape)
  if len(arrays) > 1 and shape.lstrip().startswith("(("):
    shape = "{}[{}]".format(*arrays[1])
  return array_bytes(shape) / operand_bytes if operand_bytes else 0.0


def weight_reads(hlo_text: str, is_weight=None) -> Dict[str, object]:
  """Passes over each weight in one compiled call (see the module doc).

  Args:
    hlo_text: `compiled.as_text()` of a call whose entry computation has no
      loop over the weights (a decode step or a verification call).
    is_weight: op_name -> bool; default: names containing 'params'.

  Returns:
    {'weights': number of weight parameters, 'weight_bytes': their bytes
    (per device), 'bytes_read': the bytes the uses pass over,
    'reads_per_weight_byte': bytes_read / weight_bytes (1.0: each weight
    read once), 'read_more_than_once': op_names of weights read more than
    once, 'unread': op_names of weights not read}.
  """
  is_weight = is_weight or (lambda name: "params" in name)
  lines = entry_computation(hlo_text)
  weights: Dict[str, tuple] = {}  # instruction name -> (op_name, bytes)
  for line in lines:
    m = _INSTRUCTION.match(line)
    if m and _PARAMETER.search(line):
      op_name = _OP_NAME.search(line)
      if op_name and is_weight(op_name.group(1).replace("\\'", "'")):
        # HLO text escapes the quotes of pytree paths: ['params'] -> [\'params\'].
        name = op_name.group(1).replace("\\'", "'")
        weights[m.group(1)] = (name, array_bytes(m.group(2)))
  reads = {name: 0.0 for name in weights}
  for line in lines:
    m = _INSTRUCTION.match(line)
    if not m or _PARAMETER.search(line):
      continue
    _, shape, opcode, rest = m.groups()
    for operand in set(_OPERAND.findall(rest)) & weights.keys():
      if opcode in _PASS_THROUGH:
        continue
      size = weights[operand][1]
      reads[operand] += (_slice_share(shape, size)
                         if opcode in _SLICES else 1.0)
  weight_bytes = sum(b for _, b in weights.values())
  bytes_read = sum(reads[n] * weights[n][1] for n in weights)
  return {
      "weights": len(weights),
      "weight_bytes": int(weight_bytes),
      "bytes_read": float(bytes_read),
      "reads_per_weight_byte": _ratio(bytes_read, weight_bytes),
      "read_more_than_once": sorted(
          weights[n][0] for n in weights if reads[n] > 1.0 + 1e-9),
      "unread": sorted(weights[n][0] for n in weights if reads[n] == 0.0),
  }


def _ratio(a: float, b: float) -> Optional[float]:
  return a / b if b else None
