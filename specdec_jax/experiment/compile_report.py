"""COMPILE_TOPOLOGY's figures (`compile_topology`): the topology
(`resolve`), the programs compiled (`compile_check`), compile.json (memory
against HBM, each call's bytes, FLOPs and weight reads, the `roofline` and
Theorem 3.8 at the paper's α) and its summary in plain words.
"""
import dataclasses
import math
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging

from specdec_jax.config import flag_utils
from specdec_jax.config import gin_reader
from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_check
from specdec_jax.experiment import hlo_reads
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import loading
from specdec_jax.files import io_utils
from specdec_jax.metrics import analysis
from specdec_jax.multihost import partitioning
from specdec_jax.terminal import console

ConfigError = flag_utils.ConfigError
COMPILE_FILE = "compile.json"
MACRO = "COMPILE_TOPOLOGY"
# "temperature 0 (gamma=7: paper alpha=0.75, 3.4x)" and "the
# temperature-1 row is gamma=7 (paper alpha=0.62, 2.6x)" (gin/ende_*.gin).
_PAPER = re.compile(r"temperature[ -](\d+(?:\.\d+)?)\D*?gamma=(\d+)\W+"
                    r"paper alpha=([\d.]+),\s*([\d.]+)x")


# -- TPU topologies ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's figures per chip (public Cloud TPU docs)."""
  generation: str
  hbm_bytes: int
  hbm_bytes_per_s: float
  peak_bf16_flops: float
  chip_config_name: str  # libtpu: 'megacore' (2 TensorCores as one device)
  cores_in_name: int  # TensorCores per chip that a Cloud TPU name counts
  ndims: int  # topology dimensions (3: a torus, 2: a mesh)


GIB = 2**30
CHIPS: Dict[str, Chip] = {
    "v4": Chip("v4", 32 * GIB, 1.2e12, 275e12, "megacore", 2, 3),
    "v5e": Chip("v5e", 16 * GIB, 819e9, 197e12, "default", 1, 2),
    "v5p": Chip("v5p", 95 * GIB, 2.765e12, 459e12, "megacore", 2, 3),
}
FIGURES_SOURCE = ("per chip, Cloud TPU documentation: v4 32 GiB HBM at 1.2 "
                  "TB/s, 275 TFLOP/s bf16; v5e 16 GiB at 819 GB/s, 197 "
                  "TFLOP/s; v5p 95 GiB at 2.765 TB/s, 459 TFLOP/s")
# Cloud TPU names -> chip grid (v4/v5p names count TensorCores, v5e chips).
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
  """A slice: its name as given, libtpu's name, the chip, chips per axis."""
  name: str
  topology_name: str
  chip: Chip
  grid: Tuple[int, ...]

  @property
  def num_chips(self) -> int:
    return math.prod(self.grid)

  def as_dict(self) -> Dict[str, Any]:
    return {
        "name": self.name,
        "topology_name": self.topology_name,
        "grid": list(self.grid),
        "chips": self.num_chips,
        "chip": dataclasses.asdict(self.chip),
        "figures_source": FIGURES_SOURCE
    }


def resolve(name: Any, macro: str = MACRO) -> Topology:
  """The `Topology` of a Cloud TPU name ('v4-8') or a topology name
  ('v4:2x2x1'); ValueError naming `macro`, the value and what is allowed."""
  raw = CLOUD_NAMES.get(name, name) if isinstance(name, str) else None
  match = _RAW.match(raw) if isinstance(raw, str) else None
  if match:
    chip = CHIPS[match.group(1)]
    grid = tuple(int(d) for d in match.group(2).split("x"))
    if len(grid) == chip.ndims and min(grid) >= 1:
      return Topology(name, raw, chip, grid)
  raise ValueError(
      f"{macro}={name!r}: unknown TPU topology; allowed: a Cloud TPU name "
      f"({', '.join(CLOUD_NAMES)}) or a topology name GENERATION:AxBxC with "
      f"GENERATION one of {', '.join(CHIPS)} (3 dimensions for v4/v5p, 2 "
      "for v5e; e.g. 'v4:2x2x1', 'v5e:2x4').")


def topology_devices(topology: Topology) -> List[Any]:
  """The topology's devices from libtpu (no TPU needed), one per chip (a
  v4/v5p chip's two TensorCores as one 'megacore' device, as Cloud TPU VMs
  run); RuntimeError without libtpu or when it refuses the topology."""
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


def paper_row(gin_files: Sequence[str], temperature: float,
              gamma: int) -> Optional[Dict[str, Any]]:
  """The paper's α and speedup at (temperature, γ) as the gin files'
  comments state them, or None."""
  for name in gin_files:
    path = gin_reader.find_gin_file(name)
    if path is None:
      continue
    with open(path) as f:
      comments = " ".join(line.strip().lstrip("#").strip()
                          for line in f
                          if line.strip().startswith("#"))
    for m in _PAPER.finditer(comments):
      if float(m.group(1)) == temperature and int(m.group(2)) == gamma:
        return {
            "temperature": temperature,
            "gamma": gamma,
            "alpha": float(m.group(3)),
            "speedup": float(m.group(4)),
            "source": os.path.basename(path)
        }
  return None


def check_compile_settings(args: arguments.RunArguments,
                           value: Any) -> Topology:
  """The topology, the settings checked (ConfigError); before libtpu."""
  try:
    topology = resolve(value, MACRO)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if not args.drafting.is_model_step:
    allowed = ", ".join(
        repr(k)
        for k, spec in drafter_registry.DRAFTERS.items()
        if spec.is_model_step)
    raise ConfigError(f"DRAFTER={args.drafting.name!r} with {MACRO}: allowed: "
                      f"{allowed} (a draft model).")
  if args.auto_gamma:
    raise ConfigError(f"GAMMA='auto' with {MACRO}: allowed: an integer "
                      "γ >= 1 (the programs are compiled for one γ).")
  data, model = args.mesh_shape
  if data * model > topology.num_chips:
    raise ConfigError(
        f"MESH_SHAPE={args.mesh_shape!r} needs {data * model} chips but "
        f"{MACRO}={value!r} has {topology.num_chips}: allowed: data * model "
        f"<= {topology.num_chips}.")
  return topology


def _times(call: Dict[str, Any], chip: Chip) -> Dict[str, Any]:
  """One call's roofline times: the larger of bytes / HBM bandwidth (XLA's,
  or its arguments') and FLOPs / peak."""
  compute_s = call["flops"] / chip.peak_bf16_flops
  memory_s = call["bytes_accessed"] / chip.hbm_bytes_per_s
  arguments_s = call["argument_bytes"] / chip.hbm_bytes_per_s
  return {
      "memory_s": memory_s,
      "arguments_s": arguments_s,
      "compute_s": compute_s,
      "seconds": max(memory_s, compute_s),
      "seconds_from_arguments": max(arguments_s, compute_s),
      "bound": "memory" if memory_s >= compute_s else "compute"
  }


def _pricing(times, key: str, gamma: int, paper) -> Dict[str, Any]:
  """c, the call cost and Theorem 3.8 from the `key` times."""
  step = times["target_step"][key]
  c = hlo_reads.ratio(times["draft_step"][key], step)
  call_cost = hlo_reads.ratio(times["verification"][key], step)
  out = {
      "cost_coefficient_c": c,
      "call_cost": call_cost,
      "theorem_3_8_speedup": None,
      "theorem_3_8_speedup_call_cost_1": None
  }
  if paper and c is not None:
    out["theorem_3_8_speedup"] = float(
        analysis.expected_speedup(paper["alpha"], gamma, c, call_cost))
    out["theorem_3_8_speedup_call_cost_1"] = float(
        analysis.expected_speedup(paper["alpha"], gamma, c))
  if "tree_call" in times:  # its cost in target steps
    out["tree_call_cost"] = hlo_reads.ratio(times["tree_call"][key], step)
  return out


def roofline(calls: Dict[str, Any], chip: Chip, gamma: int,
             paper: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """Each call's time, c, the call cost and Theorem 3.8 at the paper's α,
  from XLA's bytes accessed (which overstates a step: prefetch copies) and
  from the calls' argument bytes (`from_arguments`)."""
  times = {
      name: _times(calls[name], chip)
      for name in ("target_step", "verification", "draft_step", "tree_call")
      if name in calls
  }
  return {
      "calls": times,
      **_pricing(times, "seconds", gamma, paper), "from_arguments": _pricing(
          times, "seconds_from_arguments", gamma, paper)
  }


def smallest_fitting_mesh(num_chips: int, mesh_shape: Sequence[int], hbm: int,
                          total_bytes) -> Optional[List[int]]:
  """The first (data, model), 'model' growing (the parameters shard over
  it), whose `total_bytes` per device fits `hbm`; None if none does."""
  data, model = mesh_shape
  for m in range(model + 1, num_chips // data + 1):
    if (num_chips // data) % m == 0 and total_bytes((data, m)) <= hbm:
      return [data, m]
  return None


def compile_topology(args: arguments.RunArguments, value: Any,
                     gin_files: Sequence[str]) -> Dict[str, Any]:
  """Compiles the run's programs for the topology; writes compile.json
  (libtpu's start-up lines go to OUTPUT_DIR/libtpu.log)."""
  noise: List[str] = console.startup_noise()
  with console.captured_libtpu_noise(noise):
    record = _compile_topology(args, value, gin_files)
  console.save_noise(noise, args.output_dir)
  return record


def _compiled(compile_all, what: str) -> Dict[str, Any]:
  """`compile_all()` as one progress phase, then each program's seconds."""
  with console.phase(f"{MACRO}: compiling {what} (XLA:TPU, several "
                     "programs side by side; minutes for T5-XXL)"):
    compiled = compile_all()
  seconds = {
      name: rec["compile_seconds"] for group in ("programs", "calls")
      for name, rec in compiled[group].items()
  }
  logging.info(
      "%s: compiled %d programs: %s", MACRO, len(seconds),
      ", ".join(f"{k} {v:.1f} s"
                for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])))
  return compiled


def _compile_topology(args: arguments.RunArguments, value: Any,
                      gin_files: Sequence[str]) -> Dict[str, Any]:
  topology = check_compile_settings(args, value)
  try:
    devices = topology_devices(topology)
  except RuntimeError as e:
    raise ConfigError(f"{MACRO}={value!r}: {e}") from None
  data, model = args.mesh_shape
  mesh = partitioning.make_mesh(data, model, devices=devices[:data * model])
  target_config = loading.model_config("target")
  draft_config = loading.model_config("draft")
  mode = decode_modes.mode_of(args)  # the run's, decided once here
  draws = decode_modes.tree_of(mode).without_replacement
  shapes = compile_check.Shapes(
      batch=args.batch_size, inputs=args.task_feature_lengths["inputs"],
      max_decode_length=args.max_decode_length, gamma=int(args.gamma),
      beam=beam_shapes(args, mode),
      tree_width=int(mode.width) if mode.branches else 0)
  acceptance = mode.acceptance_rule(args)

  def build_drafter(draft):
    return decoding.as_drafter(
        args.drafting.build(draft, None, target_config.vocab_size))

  compiled = _compiled(
      lambda: compile_check.compile_all(
          target_config, draft_config, mesh, shapes, build_drafter, args.method(
          ), acceptance, draws),
      f"the run's programs for {value} at MESH_SHAPE={args.mesh_shape}")
  record = _record(args, mode, value, topology, devices, target_config,
                   draft_config, compiled, gin_files)
  memory = record["memory_per_device"]
  if not memory["fits"]:

    def total_bytes(shape):  # the speculative program on that mesh
      other = partitioning.make_mesh(*shape, devices=devices[:math.prod(shape)])
      return compile_check.speculative_total(target_config, draft_config,
                                             other, shapes, build_drafter,
                                             args.method(), acceptance, draws)

    with console.phase(f"{MACRO}: it does not fit; compiling the "
                       "speculative program at other MESH_SHAPEs"):
      memory["smallest_fitting_mesh_shape"] = smallest_fitting_mesh(
          topology.num_chips, args.mesh_shape, memory["hbm_bytes"], total_bytes)
  io_utils.makedirs(args.output_dir)
  io_utils.write_json(os.path.join(args.output_dir, COMPILE_FILE), record)
  return record


def beam_shapes(args, mode) -> Optional[compile_check.BeamShapes]:
  """The beam programs' sizes (None: sampling)."""
  if not mode.beam:
    return None
  return compile_check.BeamShapes(beam_size=mode.size, width=mode.draft_width(),
                                  rows=mode.num_rows(args.gamma),
                                  alpha=float(mode.alpha))


def _record(args, mode, value, topology, devices, target_config, draft_config,
            compiled, gin_files) -> Dict[str, Any]:
  """compile.json's dict."""
  calls, programs = compiled["calls"], compiled["programs"]
  params, caches = compiled["params"], compiled["kv_cache"]
  for call in calls.values():  # above 1: XLA counts prefetch copies too
    call["bytes_per_argument_byte"] = hlo_reads.ratio(call["bytes_accessed"],
                                                      call["argument_bytes"])
  hbm = topology.chip.hbm_bytes
  peak = max(p["total_bytes"] for p in programs.values())
  custom = sorted({
      c for r in list(calls.values()) + list(programs.values())
      for c in r["custom_calls"]
  })
  collectives = dict(calls["target_step"]["collectives"])
  collectives["total"] = sum(collectives.values())
  beam = beam_shapes(args, mode)
  beam_settings = {} if beam is None else {
      "decode": mode.decode,
      "beam_size": beam.beam_size,
      "beam_width": beam.width,
      "beam_rows": beam.rows,
      "beam_alpha": beam.alpha
  }
  # Theorem 3.8 at the paper's α models sampling one sequence, not beams.
  paper = (None if mode.beam else paper_row(gin_files, float(args.temperature),
                                            int(args.gamma)))
  return {
      "compile_topology": value,
      "topology": {
          **topology.as_dict(), "device_kind": devices[0].device_kind,
          "devices": len(devices)
      },
      "mesh_shape": list(args.mesh_shape),
      "settings": {
          "gin_files": list(gin_files),
          "gamma": int(args.gamma),
          "temperature": args.temperature,
          "batch_size": args.batch_size,
          "inputs_length": args.task_feature_lengths["inputs"],
          "max_decode_length": args.max_decode_length,
          "target": _model_words(args.target_name, target_config),
          "draft": _model_words(args.draft_name, draft_config),
          **beam_settings, "acceptance": mode.acceptance,
          "tree_width": int(mode.width) if mode.branches else None
      },
      "memory_per_device": {
          "parameter_bytes": params,
          "kv_cache_bytes": caches,
          "program_total_bytes": {
              k: p["total_bytes"] for k, p in programs.items()
          },
          "program_temp_bytes": {
              k: p["temp_bytes"] for k, p in programs.items()
          },
          "peak_bytes": peak,
          "hbm_bytes": hbm,
          "fits": peak <= hbm,
          "smallest_fitting_mesh_shape": None if peak > hbm else list(
              args.mesh_shape)
      },
      "calls": calls,
      "programs": programs,
      "collectives_per_target_step": collectives,
      "custom_calls": custom,
      "cpu_kernel_in_programs": kernels.TARGET_NAME in custom,
      "roofline": roofline(calls, topology.chip, int(args.gamma), paper),
      "paper": paper,
  }


def _model_words(name: str, config) -> Dict[str, Any]:
  return {
      "name": name,
      "dtype": str(getattr(config.dtype, "__name__", config.dtype)),
      "num_params": config.num_params
  }


def _gb(n: float) -> str:
  """Bytes in GB (1e9), or MB below 1 GB."""
  return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"


def _beam_words(settings: Dict[str, Any]) -> str:
  return (f"DECODE='beam' (k={settings['beam_size']}, "
          f"u={settings['beam_width']}, R={settings['beam_rows']}): the "
          f"calls above are over B·k, B·R and B·u rows; the baseline is the "
          "target's beam search and the speculative program speculative beam "
          "search; no Theorem 3.8 line (it models sampling one sequence).")


def _weight_read_lines(record: Dict[str, Any]) -> List[str]:
  calls, lines = record["calls"], []
  named = [
      ("target_step", "A target step (K=1)", "its"),
      ("verification",
       f"A verification call (K=γ+1={record['settings']['gamma'] + 1})", "the"),
      ("draft_step", "A draft step", "its")
  ]
  if "tree_call" in calls:
    width = record["settings"]["tree_width"]
    named.append(("tree_call", "The tree call (N=1+k·γ="
                  f"{1 + width * record['settings']['gamma']} nodes, k="
                  f"{width}, tree mask)", "the"))
  for name, words, owner in named:
    r = calls[name]
    reads = r["weight_reads"]
    again = (f"; read more than once: {', '.join(reads['read_more_than_once'])}"
             if reads["read_more_than_once"] else "")
    lines.append(
        f"{words} reads {owner} {_gb(reads['weight_bytes'])} of weights "
        f"{reads['reads_per_weight_byte']:.2f} times per device (from the "
        f"HLO{again}), does {r['flops'] / 1e9:.1f} GFLOP; XLA counts "
        f"{_gb(r['bytes_accessed'])} accessed ({r['bytes_per_argument_byte']:.2f}x"
        " its arguments, on-chip prefetch copies included).")
  return lines


def compile_summary_lines(record: Dict[str, Any]) -> List[str]:
  """compile.json in plain words."""
  topo, mem = record["topology"], record["memory_per_device"]
  chip, roof, paper = topo["chip"], record["roofline"], record["paper"]
  params, caches = mem["parameter_bytes"], mem["kv_cache_bytes"]
  fits = ("fits"
          if mem["fits"] else "does NOT fit; smallest MESH_SHAPE that fits: "
          f"{mem['smallest_fitting_mesh_shape'] or 'none on this topology'}")
  mesh = tuple(record["mesh_shape"])
  lines = [
      f"Compiled for {record['compile_topology']} ({topo['topology_name']}: "
      f"{topo['chips']} {topo['device_kind']} chips, one device each) at "
      f"MESH_SHAPE={mesh}; nothing allocated, no checkpoint read.",
      f"Memory per device: parameters {_gb(params['target'])} (target) + "
      f"{_gb(params['draft'])} (draft), KV caches "
      f"{_gb(caches['target'])} + {_gb(caches['draft'])}; the speculative "
      f"program holds {_gb(mem['program_total_bytes']['speculative'])} at "
      f"most (temporaries {_gb(mem['program_temp_bytes']['speculative'])}),"
      f" the baseline {_gb(mem['program_total_bytes']['baseline'])}, of "
      f"{_gb(mem['hbm_bytes'])} HBM per chip: {fits}.",
  ]
  lines += _weight_read_lines(record)
  collectives = ", ".join(
      f"{n} {k}" for k, n in record["collectives_per_target_step"].items()
      if k != "total" and n)
  lines.append(f"Collectives per target step: {collectives or 'none'}.")
  t = {k: v["seconds"] * 1e3 for k, v in roof["calls"].items()}
  lines.append(
      f"Roofline from XLA's bytes accessed at "
      f"{chip['hbm_bytes_per_s'] / 1e12:.3g} TB/s and "
      f"{chip['peak_bf16_flops'] / 1e12:.0f} TFLOP/s per chip: target step "
      f"{t['target_step']:.2f} ms, verification {t['verification']:.2f} ms "
      f"(call cost {roof['call_cost']:.2f} steps), draft step "
      f"{t['draft_step']:.3f} ms (c = {roof['cost_coefficient_c']:.3f}).")
  args = roof["from_arguments"]
  a = {k: v["seconds_from_arguments"] * 1e3 for k, v in roof["calls"].items()}
  lines.append(
      f"From the bytes each call must read (its arguments): target step "
      f"{a['target_step']:.2f} ms, verification {a['verification']:.2f} ms "
      f"(call cost {args['call_cost']:.2f}), draft step "
      f"{a['draft_step']:.3f} ms (c = {args['cost_coefficient_c']:.3f}).")
  if "tree_call" in t:
    lines.append(f"The tree call: {t['tree_call']:.2f} ms from XLA's bytes "
                 f"({roof['tree_call_cost']:.2f} target steps), "
                 f"{a['tree_call']:.2f} ms from its arguments "
                 f"({args['tree_call_cost']:.2f}).")
  if decode_modes.of_metrics(record["settings"]).beam:
    lines.append(_beam_words(record["settings"]))
  elif paper:
    lines.append(f"Theorem 3.8 at the roofline's call cost and the paper's "
                 f"α = {paper['alpha']} (γ = {paper['gamma']}, T = "
                 f"{paper['temperature']:g}): "
                 f"{roof['theorem_3_8_speedup']:.2f}x from XLA's bytes, "
                 f"{args['theorem_3_8_speedup']:.2f}x from the arguments; "
                 f"the paper measured {paper['speedup']}x ({paper['source']}).")
  else:
    lines.append("No Table 2 row in the gin files' comments for this γ and "
                 "temperature: no paper α to price.")
  ours = ("the CPU matmul kernel IS in the programs"
          if record["cpu_kernel_in_programs"] else "none of ours")
  lines.append(f"Custom calls: {', '.join(record['custom_calls']) or 'none'}"
               f" ({ours}). Both decode programs compiled.")
  return lines
