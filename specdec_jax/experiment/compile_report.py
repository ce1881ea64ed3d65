"""COMPILE_TOPOLOGY's figures: compile.json and the summary in plain words.

`compile_topology(args, value, gin_files)` checks the settings (no libtpu
needed for that), compiles the run's programs for the topology
(`compile_check`), and writes OUTPUT_DIR/compile.json (atomically):

* memory per device: parameters, KV caches, the biggest program's total
  (arguments + outputs - aliased + temporaries) against the chip's HBM, and
  whether it fits; when it does not, the smallest MESH_SHAPE that does;
* per call (target step, verification, draft step; ACCEPTANCE='tree': the
  tree call over 1 + k·γ nodes too): bytes accessed and FLOPs from XLA's
  cost analysis, bytes accessed / parameter bytes, and how many times each
  weight is read (`hlo_reads`);
* collectives per target step, and every custom call in any program;
* the roofline (`roofline`): each call's time as max(bytes / HBM
  bandwidth, FLOPs / peak), c and the call cost from them, and Theorem 3.8's
  speedup at the paper's α for this gin file's Table 2 row (from the gin
  file's comments, `paper_row`) beside the paper's measured speedup.
"""
import math
import os
import re
from typing import Any, Dict, List, Optional, Sequence

from absl import logging

from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_check
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import loading
from specdec_jax.experiment import tpu_topologies
from specdec_jax.files import io_utils
from specdec_jax.metrics import analysis
from specdec_jax.multihost import partitioning
from specdec_jax.terminal import console

ConfigError = gin_utils.ConfigError
COMPILE_FILE = "compile.json"
MACRO = "COMPILE_TOPOLOGY"
# "temperature 0 (gamma=7: paper alpha=0.75, 3.4x)" and "the
# temperature-1 row is gamma=7 (paper alpha=0.62, 2.6x)" (gin/ende_*.gin).
_PAPER = re.compile(r"temperature[ -](\d+(?:\.\d+)?)\D*?gamma=(\d+)\W+"
                    r"paper alpha=([\d.]+),\s*([\d.]+)x")


def paper_row(gin_files: Sequence[str], temperature: float,
              gamma: int) -> Optional[Dict[str, Any]]:
  """The paper's α and measured speedup for (temperature, γ), as the gin
  files' comments state them; None when none states this row."""
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
                           value: Any) -> tpu_topologies.Topology:
  """The topology, and the settings compile mode supports; before libtpu.

  Raises:
    ConfigError: naming the macro, the value and what is allowed.
  """
  try:
    topology = tpu_topologies.resolve(value, MACRO)
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


def _ratio(a: float, b: float) -> Optional[float]:
  return a / b if b else None


def _times(call: Dict[str, Any], chip: tpu_topologies.Chip) -> Dict[str, Any]:
  """One call's roofline times: bytes / HBM bandwidth (XLA's bytes
  accessed, and the call's argument bytes: what it must read at least
  once), FLOPs / peak; each time is the larger of its bytes and FLOPs."""
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
  c = _ratio(times["draft_step"][key], step)
  call_cost = _ratio(times["verification"][key], step)
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
  return out


def roofline(calls: Dict[str, Any], chip: tpu_topologies.Chip, gamma: int,
             paper: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """Each call's time at the chip's bandwidth and peak, c, the call cost
  and Theorem 3.8 at the paper's α: from XLA's bytes accessed (top level),
  and from the calls' argument bytes (`from_arguments`).

  XLA:TPU's bytes accessed is not HBM traffic: it counts each fusion's
  operands and outputs, prefetch copies included (two chained matmuls
  count 3x their weights), so it overstates a step; argument bytes
  (weights + KV cache, each read once) understate nothing a step must read.
  """
  times = {
      name: _times(calls[name], chip)
      for name in ("target_step", "verification", "draft_step", "tree_call")
      if name in calls
  }
  out = {
      "calls": times,
      **_pricing(times, "seconds", gamma, paper), "from_arguments": _pricing(
          times, "seconds_from_arguments", gamma, paper)
  }
  if "tree_call" in times:  # its cost in target steps
    for key, record in (("seconds", out), ("seconds_from_arguments",
                                           out["from_arguments"])):
      record["tree_call_cost"] = _ratio(times["tree_call"][key],
                                        times["target_step"][key])
  return out


def _per_call(calls: Dict[str, Any]) -> None:
  """Adds XLA's bytes accessed / the call's argument bytes (per device) to
  each call: above 1 where XLA counts on-chip prefetch copies too
  (`hlo_reads`), so the weight reads are counted from the HLO apart."""
  for record in calls.values():
    record["bytes_per_argument_byte"] = _ratio(record["bytes_accessed"],
                                               record["argument_bytes"])


def smallest_fitting_mesh(num_chips: int, mesh_shape: Sequence[int], hbm: int,
                          total_bytes) -> Optional[List[int]]:
  """The first (data, model), model axis growing from MESH_SHAPE's, whose
  `total_bytes((data, model))` per device fits `hbm`; None if none does on
  `num_chips` chips. The parameters shard over 'model' only, so 'data'
  stays as given."""
  data, model = mesh_shape
  for m in range(model + 1, num_chips // data + 1):
    if (num_chips // data) % m == 0 and total_bytes((data, m)) <= hbm:
      return [data, m]
  return None


def compile_topology(args: arguments.RunArguments, value: Any,
                     gin_files: Sequence[str]) -> Dict[str, Any]:
  """Compiles the run's programs for the topology; writes compile.json.

  libtpu's start-up lines about the TPU VM it is not on are kept off the
  console and saved in OUTPUT_DIR/libtpu.log, named in one line
  (`console.captured_libtpu_noise`); progress lines say what compiles, and for how long.
  """
  noise: List[str] = console.startup_noise()
  with console.captured_libtpu_noise(noise):
    record = _compile_topology(args, value, gin_files)
  console.save_noise(noise, args.output_dir)
  return record


def _compiled(compile_all, what: str) -> Dict[str, Any]:
  """`compile_all()` as one progress phase, then one line of every
  program's own seconds (they compile side by side)."""
  with console.phase(f"{MACRO}: compiling {what} (XLA:TPU, several "
                     "programs side by side; minutes for T5-XXL)"):
    compiled = compile_all()
  seconds = {
      name: rec["compile_seconds"] for group in ("programs", "calls")
      for name, rec in compiled.get(group, {}).items()
      if isinstance(rec, dict) and rec.get("compile_seconds") is not None
  }
  logging.info(
      "%s: compiled %d programs: %s", MACRO, len(seconds),
      ", ".join(f"{k} {v:.1f} s"
                for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])))
  return compiled


def _compile_topology(args: arguments.RunArguments, value: Any,
                      gin_files: Sequence[str]) -> Dict[str, Any]:
  """`compile_topology`'s work."""
  topology = check_compile_settings(args, value)
  try:
    devices = tpu_topologies.devices(topology)
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
  # The run's own rule (issue 42: this used to read LENIENCE alone and
  # compiled Algorithm 1 for ACCEPTANCE='block').
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
  """DECODE='beam' (`mode`, the run's): the beam programs' sizes (None:
  sampling)."""
  if not mode.beam:
    return None
  return compile_check.BeamShapes(beam_size=mode.size, width=mode.draft_width(),
                                  rows=mode.num_rows(args.gamma),
                                  alpha=float(mode.alpha))


def _beam_record(args, mode) -> Dict[str, Any]:
  """compile.json's settings of a beam run ({} for sampling)."""
  beam = beam_shapes(args, mode)
  if beam is None:
    return {}
  return {
      "decode": mode.decode,
      "beam_size": beam.beam_size,
      "beam_width": beam.width,
      "beam_rows": beam.rows,
      "beam_alpha": beam.alpha
  }


def _record(args, mode, value, topology, devices, target_config, draft_config,
            compiled, gin_files) -> Dict[str, Any]:
  """compile.json's dict."""
  calls, programs = compiled["calls"], compiled["programs"]
  params, caches = compiled["params"], compiled["kv_cache"]
  _per_call(calls)
  hbm = topology.chip.hbm_bytes
  peak = max(p["total_bytes"] for p in programs.values())
  custom = sorted({
      c for r in list(calls.values()) + list(programs.values())
      for c in r["custom_calls"]
  })
  collectives = dict(calls["target_step"]["collectives"])
  collectives["total"] = sum(collectives.values())
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
          **_beam_record(args, mode), "acceptance": mode.acceptance,
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


def _collective_words(collectives: Dict[str, int]) -> str:
  parts = [f"{n} {k}" for k, n in collectives.items() if k != "total" and n]
  return ", ".join(parts) if parts else "none"


def _beam_words(settings: Dict[str, Any]) -> str:
  """The beam programs compiled, and why Theorem 3.8 is not priced."""
  return (f"DECODE='beam' (k={settings['beam_size']}, "
          f"u={settings['beam_width']}, R={settings['beam_rows']}): the "
          f"calls above are over B·k, B·R and B·u rows; the baseline is the "
          "target's beam search and the speculative program speculative beam "
          "search; no Theorem 3.8 line (it models sampling one sequence).")


def _weight_read_lines(record: Dict[str, Any]) -> List[str]:
  """Each call's weight reads, FLOPs and XLA's bytes, a line each."""
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
  lines.append(f"Collectives per target step: "
               f"{_collective_words(record['collectives_per_target_step'])}"
               ".")
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
