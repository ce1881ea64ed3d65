"""The barriers of a run of decoder layers over many programs
(`gpu_tiles.Tiles.programs`) as ptxas is given them: in each
`decode_layers` kernel of a PTX file that XLA wrote for a GPU, the global
loads a program issues between the last store of a stage and its arrival
at the barrier after it: the next stage's weights, loaded while the
program waits (`Tiles.prefetch`), or none.

Read from the text in program order: each barrier is an arrival (an
acquire-release atomic add at the GPU's scope) and a spin that reads the
counter with the same add, in that order (`_gpu_grid.Stages`).
"""
import os
import re
from typing import Dict, List

# A global load (scalar or vector), or Triton's asynchronous copy of one.
_LOAD = re.compile(r"\b(ld\.global|cp\.async\.cg\.shared\.global)")
_STORE = re.compile(r"\bst\.global")
_ADD = re.compile(r"\batom\.global\.gpu\.acq_rel\.add")
_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(")
KERNEL = "decode_layers"


def loads_at_barriers(body: str) -> List[int]:
  """Per barrier of one kernel's PTX `body`, in program order: the global
  loads between the last global store before its arrival and the arrival.

  Raises:
    ValueError: the atomic adds do not pair into arrivals and spins.
  """
  counts: List[int] = []
  since, adds = 0, 0
  for line in body.splitlines():
    if _STORE.search(line):
      since = 0
    elif _ADD.search(line):
      if adds % 2 == 0:  # An arrival; the odd ones are its spin's reads.
        counts.append(since)
      adds += 1
      since = 0
    elif _LOAD.search(line):
      since += 1
  if adds % 2:
    raise ValueError(f"{adds} acquire-release adds: not pairs of an arrival "
                     "and a spin")
  return counts


def kernels(ptx: str) -> Dict[str, str]:
  """Each `.entry` of `ptx` named from `KERNEL` -> its text (to the next
  entry)."""
  starts = list(_ENTRY.finditer(ptx))
  out = {}
  for m, after in zip(starts, starts[1:] + [None]):
    if m.group(1).startswith(KERNEL):
      out[m.group(1)] = ptx[m.start():after.start() if after else len(ptx)]
  return out


def dumped(folder: str) -> Dict[str, List[int]]:
  """`loads_at_barriers` of every `decode_layers` kernel with barriers in
  the PTX files of an XLA dump folder (`xla_dump_to`), by file and kernel
  name.

  Raises:
    ValueError: the folder holds no PTX file. JAX 0.10's XLA writes a
      deviceless GPU compile's PTX there; 0.11's writes none (with
      `xla_gpu_dump_llvmir` too), and "no barriers" would be a false
      reading.
  """
  names = sorted(n for n in os.listdir(folder) if n.endswith(".ptx"))
  if not names:
    raise ValueError("no PTX in XLA's dump: this XLA (JAX 0.11 and later) "
                     "writes none; JAX 0.10's does")
  out = {}
  for name in names:
    with open(os.path.join(folder, name)) as f:
      ptx = f.read()
    for kernel, body in kernels(ptx).items():
      counts = loads_at_barriers(body)
      if counts:
        out[f"{name}:{kernel}"] = counts
  return out
