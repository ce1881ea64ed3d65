"""Cloud TPU names, their topologies and the chip figures the roofline uses.

The one place that knows what a `v4-8` is: `resolve(name)` turns a Cloud
TPU accelerator name (`v4-8`, `v5e-8`, `v5p-8`, ...) or a raw topology name
(`v4:2x2x1`, `v5e:2x4`, `v5p:2x2x2`) into a `Topology`, checked against the
tables below without libtpu; `devices(topology)` then asks libtpu
(`jax.experimental.topologies`, no TPU attached) for its devices.

One device per chip: v4 and v5p chips have two TensorCores, which JAX
drives as one "megacore" device (libtpu's `chip_config_name='megacore'`;
without it libtpu returns two devices per chip, which is not how Cloud TPU
VMs run). A Cloud TPU v4/v5p name counts TensorCores (v4-8 = 4 chips), a
v5e name counts chips (v5e-8 = 8 chips).

Chip figures (per chip, public Cloud TPU documentation): HBM capacity, HBM
bandwidth and peak bfloat16 FLOP/s.
"""
import dataclasses
import math
import re
from typing import Any, Dict, List, Tuple


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip generation's figures (per chip)."""
  generation: str  # 'v4', 'v5e', 'v5p'
  hbm_bytes: int
  hbm_bytes_per_s: float
  peak_bf16_flops: float
  chip_config_name: str  # libtpu: 'megacore' (2 TensorCores as one device)
  cores_in_name: int  # TensorCores per chip that a Cloud TPU name counts
  ndims: int  # topology dimensions (3: a torus, 2: a mesh)

  def as_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


GIB = 2**30
CHIPS: Dict[str, Chip] = {
    "v4": Chip("v4", 32 * GIB, 1.2e12, 275e12, "megacore", 2, 3),
    "v5e": Chip("v5e", 16 * GIB, 819e9, 197e12, "default", 1, 2),
    "v5p": Chip("v5p", 95 * GIB, 2.765e12, 459e12, "megacore", 2, 3),
}
FIGURES_SOURCE = ("per chip, Cloud TPU documentation: v4 32 GiB HBM at 1.2 "
                  "TB/s, 275 TFLOP/s bf16; v5e 16 GiB at 819 GB/s, 197 "
                  "TFLOP/s; v5p 95 GiB at 2.765 TB/s, 459 TFLOP/s")

# Cloud TPU accelerator names -> chip grid (one slice, one host per 4 or 8
# chips; only the grid matters for ahead-of-time compilation).
CLOUD_NAMES: Dict[str, str] = {
    "v4-8": "v4:2x2x1",
    "v4-16": "v4:2x2x2",
    "v4-32": "v4:2x2x4",
    "v4-64": "v4:2x4x4",
    "v4-128": "v4:4x4x4",
    "v5e-1": "v5e:1x1",
    "v5e-4": "v5e:2x2",
    "v5e-8": "v5e:2x4",
    "v5e-16": "v5e:4x4",
    "v5e-32": "v5e:4x8",
    "v5p-8": "v5p:2x2x1",
    "v5p-16": "v5p:2x2x2",
    "v5p-32": "v5p:2x2x4",
}
_RAW = re.compile(r"^(v4|v5e|v5p):(\d+(?:x\d+)*)$")


@dataclasses.dataclass(frozen=True)
class Topology:
  """A slice to compile for: its name as given, libtpu's name, the chip."""
  name: str  # as the user gave it ('v4-8' or 'v4:2x2x1')
  topology_name: str  # libtpu's ('v4:2x2x1')
  chip: Chip
  grid: Tuple[int, ...]  # chips per dimension

  @property
  def num_chips(self) -> int:
    return math.prod(self.grid)

  def as_dict(self) -> Dict[str, Any]:
    return {
        "name": self.name,
        "topology_name": self.topology_name,
        "grid": list(self.grid),
        "chips": self.num_chips,
        "chip": self.chip.as_dict(),
        "figures_source": FIGURES_SOURCE
    }


def allowed_words() -> str:
  """What `resolve` accepts, for error messages."""
  return (f"a Cloud TPU name ({', '.join(CLOUD_NAMES)}) or a topology name "
          f"GENERATION:AxBxC with GENERATION one of {', '.join(CHIPS)} "
          "(3 dimensions for v4/v5p, 2 for v5e; e.g. 'v4:2x2x1', "
          "'v5e:2x4')")


def resolve(name: Any, macro: str = "COMPILE_TOPOLOGY") -> Topology:
  """The `Topology` for a Cloud TPU name or a raw topology name.

  Raises:
    ValueError: naming `macro`, the value and what is allowed.
  """
  raw = CLOUD_NAMES.get(name, name) if isinstance(name, str) else None
  match = _RAW.match(raw) if isinstance(raw, str) else None
  if match:
    chip = CHIPS[match.group(1)]
    grid = tuple(int(d) for d in match.group(2).split("x"))
    if len(grid) == chip.ndims and min(grid) >= 1:
      return Topology(name, raw, chip, grid)
  raise ValueError(f"{macro}={name!r}: unknown TPU topology; allowed: "
                   f"{allowed_words()}.")


def devices(topology: Topology) -> List[Any]:
  """The topology's devices, one per chip, from libtpu (no TPU needed).

  Raises:
    RuntimeError: libtpu is not installed (with the command that installs
      it), or it refused the topology.
  """
  try:
    import libtpu  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise RuntimeError(
        "compiling for a TPU topology needs libtpu, which is not installed: "
        "pip install -e '.[tpu]' (jax[tpu] at the installed jax version; "
        "no TPU needed).") from None
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=topology.topology_name,
        chip_config_name=topology.chip.chip_config_name)
  # libtpu raises its own error type.
  except Exception as e:  # pylint: disable=broad-except
    hint = (" (another process has libtpu open; processes that only "
            "compile may share it with ALLOW_MULTIPLE_LIBTPU_LOAD=1)"
            if "lockfile" in str(e) else "")
    raise RuntimeError(f"libtpu refused topology "
                       f"{topology.topology_name!r}: {e}{hint}") from None
  found = list(desc.devices)
  if len(found) != topology.num_chips:
    raise RuntimeError(
        f"libtpu gave {len(found)} devices for {topology.topology_name!r} "
        f"({topology.num_chips} chips expected, one device per chip).")
  return found
