"""Passes over each weight, read from a compiled program's HLO text (the
TPU compile check's "reads each weight once"; docs/usage/tpu.md). Imports
no gin: the device check's loop phase counts copies with it on the GPU image.
"""
import math
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


def array_bytes(shape: str) -> int:
  """Bytes of the arrays named in an HLO shape string: 'bf16[2,3]' -> 12;
  a tuple shape counts every element."""
  return sum(
      math.prod(int(d) for d in dims.split(",") if d) *
      _ITEMSIZE[dtype] for dtype, dims in _ARRAY.findall(shape))


def _entry_computation(hlo_text: str) -> List[str]:
  start = hlo_text.find("\nENTRY")
  if start < 0:
    raise ValueError("weight_reads: no ENTRY computation in the HLO text.")
  lines = []
  for line in hlo_text[start + 1:].split("\n")[1:]:
    if line.startswith("}"):
      break
    lines.append(line)
  return lines


def weight_reads(hlo_text: str, is_weight=None) -> Dict[str, object]:
  """Passes over each weight (op_name naming 'params', or `is_weight`) in
  a compiled call without loops: each use in the entry computation is one,
  a slice its share, the output tuple none (docs/usage/tpu.md). Returns
  {'weights', 'weight_bytes' (per device), 'bytes_read',
  'reads_per_weight_byte' (1.0: each read once), 'read_more_than_once',
  'unread' (op_names)}."""
  is_weight = is_weight or (lambda name: "params" in name)
  lines = _entry_computation(hlo_text)
  weights: Dict[str, tuple] = {}  # instruction name -> (op_name, bytes)
  for line in lines:
    m = _INSTRUCTION.match(line)
    if m and _PARAMETER.search(line):
      op_name = _OP_NAME.search(line)
      # HLO text escapes the quotes of pytree paths: [\'params\'].
      name = op_name and op_name.group(1).replace("\\'", "'")
      if name and is_weight(name):
        weights[m.group(1)] = (name, array_bytes(m.group(2)))
  reads = {name: 0.0 for name in weights}
  for line in lines:
    m = _INSTRUCTION.match(line)
    if not m or _PARAMETER.search(line) or m.group(3) == "tuple":
      continue
    _, shape, opcode, rest = m.groups()
    for operand in set(_OPERAND.findall(rest)) & weights.keys():
      size = weights[operand][1]
      reads[operand] += (_slice_share(shape, size)
                         if opcode in _SLICES else 1.0)
  weight_bytes = sum(b for _, b in weights.values())
  bytes_read = sum(reads[n] * weights[n][1] for n in weights)
  return {
      "weights": len(weights),
      "weight_bytes": int(weight_bytes),
      "bytes_read": float(bytes_read),
      "reads_per_weight_byte": ratio(bytes_read, weight_bytes),
      "read_more_than_once": sorted(
          weights[n][0] for n in weights if reads[n] > 1.0 + 1e-9),
      "unread": sorted(weights[n][0] for n in weights if reads[n] == 0.0),
  }


def _slice_share(shape: str, operand_bytes: int) -> float:
  # slice-start's shape is ((operand), slice, context): the slice is the
  # second array named.
  arrays = _ARRAY.findall(shape)
  if len(arrays) > 1 and shape.lstrip().startswith("(("):
    shape = "{}[{}]".format(*arrays[1])
  return array_bytes(shape) / operand_bytes if operand_bytes else 0.0


def ratio(a: float, b: float) -> Optional[float]:
  return a / b if b else None
