r"""The GPU's decode programs compiled on this host for an H200: no GPU.

JAX's CUDA plugin compiles for a GPU that a target config describes
(XLA's GpuTargetConfigProto; `H200` holds the figures seen on the device
machine) with no GPU or driver here (`scripts/gpu_aot.sh` installs it in
a virtual environment of its own: docs/usage/gpu.md). So what a GPU
session would first establish is known before it starts, from the
programs XLA:GPU and Triton compile (issue 56), per decode path ('xla',
'packed', 'fused'):

* `layers`: kernels per decoder layer and the step's fixed ones
  (`paths.layer_kernels`: the device check's count, T5-small-shaped);
* `sizes`: T5 v1.1 small/base/large/xxl-shaped decoders' one-token and
  (γ+1)-token calls, their kernels and Triton calls: Triton compiled every
  kernel of the 'fused' path for sm_90;
* `tiles`: the small decoder on 'fused' with each tile preset (those of
  `--presets`), and the registers ptxas spilled under each in the
  (γ+1)-token call and the one- and (γ+1)-token calls of the sizes of
  `--call_sizes` (the XXL target's);
* `option_sets`: each XLA:GPU option set of the device check, accepted or
  refused by this jaxlib, and the kernels under it;
* `loops`: per pair (the shipped one, T5-XXL with a T5-small draft) the
  kernels one iteration of the baseline and the speculative loop launches
  (`iteration_hlo.iteration_kernels`, the draft's steps as `nested`);
* `grids` (only when `--groups` names it: a compile per size and preset):
  per size and tile preset, the 'fused' one-token step's Triton
  calls (`kernel_grid.by_kernel`: programs and bytes per program) and the
  step `kernel_grid.predict_ms` gives; with `--device_check` (a device
  check's JSON), the model fitted to the steps it measured on 'fused'
  (`grids_fit`, under the check's tile preset);
* `barriers` (only when `--groups` names it): per preset of `--presets`
  with `Tiles.programs`, the small decoder's one-token and (γ+1)-token
  calls on 'fused' compiled with XLA's dump on, and in the PTX of each
  run of layers the loads issued between a stage's stores and the
  barrier after it (`ptx_barriers`: the next stage's weights under
  `Tiles.prefetch`, none without).

Counts only: nothing runs. Compile seconds are this host's.

  python -m tools.benchmarks.gpu_aot --output=benchmarks/issue56_gpu_aot.json
"""
import argparse
import functools
import importlib.util
import json
import os
import pathlib
import re
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp

from specdec_jax.config import gin_reader
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops
from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import T5Config
from specdec_jax.files import io_utils
from specdec_jax.terminal import console
from tools.benchmarks import common
from tools.benchmarks import iteration_hlo
from tools.benchmarks import kernel_grid
from tools.benchmarks import ptx_barriers
from tools.device_check import common as check_common
from tools.device_check import paths

SCHEMA = "tools.benchmarks.gpu_aot/1"
# The device machine's H200 as XLA's GpuTargetConfigProto (its sources in
# the file's comments).
H200 = (pathlib.Path(__file__).parent / "h200.txtpb").read_text()
GROUPS = ("layers", "sizes", "tiles", "option_sets", "loops", "grids",
          "barriers")
DEFAULT_GROUPS = GROUPS[:5]
SIZES = ("small", "base", "large", "xxl")
_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def gpu_device(target_config: str) -> Any:
  """The device of a deviceless one-GPU topology for `target_config`.

  Raises:
    RuntimeError: JAX's CUDA plugin is not installed, or did not register
      (JAX's backends were started before `main` set JAX_PLATFORMS:
      without a driver the plugin's version check fails), or XLA refused
      the target config.
  """
  if not any(
      importlib.util.find_spec(p.split(".")[0]) and importlib.util.find_spec(p)
      for p in _PLUGINS):
    raise RuntimeError(
        "compiling for a GPU here needs JAX's CUDA plugin: run "
        "scripts/gpu_aot.sh, which installs it in a virtual environment of "
        "its own (no GPU or driver needed; docs/usage/gpu.md).")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    desc = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                        target_config=target_config)
  except (NotImplementedError, RuntimeError, ValueError) as e:
    raise RuntimeError(
        f"JAX's CUDA plugin gave no GPU topology ({e}); run this command "
        "in a fresh process with JAX_PLATFORMS=cpu (no driver here).") from None
  return desc.devices[0]


# ptxas' warning (XLA logs it at INFO) when a kernel's registers spill.
_SPILL = re.compile(r"spilled to local memory in function '([\w.]+)', "
                    r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_INFO = re.compile(r"^I\d{4} ")


def _timed(fn: Callable[[], Any]) -> Dict[str, Any]:
  """`fn()`'s result (a dict) with its compile seconds and the kernels
  whose registers ptxas spilled (`spills`: function -> [store, load]
  bytes per thread), or its error: a program XLA or Triton refuses is a
  result, not a crash. XLA's INFO lines are kept off the terminal."""
  start, info = time.perf_counter(), []
  try:
    with console.filtered_stderr(lambda line: bool(_INFO.match(line)), info):
      out = fn()
  except Exception as e:  # pylint: disable=broad-except
    return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
  spills = {
      m.group(1): [int(m.group(2)), int(m.group(3))]
      for m in map(_SPILL.search, info)
      if m
  }
  return {
      **out, "spills": spills,
      "compile_s": round(time.perf_counter() - start, 2)
  }


def _small(f: argparse.Namespace) -> T5Config:
  return check_common.t5_size("small", tiny=f.small)


# The one-token loops' shapes (`paths.loop_hlo`) and the decode loops'
# length: the counts do not depend on them.
_LOOP = dict(input_length=16, cache_len=64, steps=2)
_LENGTH = 48


def _step(config: T5Config, path: str, device: Any,
          **loop: Any) -> Dict[str, Any]:
  """`paths.kernel_counts` of `config`'s call loop on `path` (`loop`:
  `paths.loop_hlo`'s `k` or `options`)."""
  return paths.kernel_counts(
      paths.loop_hlo(paths.abstract_model(config, path, device), device=device,
                     **_LOOP, **loop))


def layers(f: argparse.Namespace, device: Any) -> Dict[str, Any]:
  return paths.layer_kernels(_small(f), f.paths, device=device, **_LOOP)


def sizes(f: argparse.Namespace, device: Any) -> Dict[str, Any]:
  """Per size and path, the one-token and the (γ+1)-token call's loop."""
  out: Dict[str, Any] = {}
  for name in (("small",) if f.small else SIZES):
    config = check_common.t5_size(name, tiny=f.small)
    for path in f.paths:
      for k in (1, f.gamma + 1):
        out.setdefault(name, {}).setdefault(path, {})[f"k_{k}"] = _timed(
            lambda c=config, p=path, k=k: _step(c, p, device, k=k))
  return out


def tiles(f: argparse.Namespace, device: Any) -> Dict[str, Any]:
  """The small decoder on 'fused' with each tile preset, and the warps per
  program its Triton kernels were compiled with (the preset's: it was
  traced under it); `calls`: the registers ptxas spilled per preset in
  the (γ+1)-token call and, at the paper's sizes, the calls of the sizes
  of `--call_sizes` (the XXL target's)."""
  out = {}
  for name in f.presets:
    preset = gpu_tiles.TILE_PRESETS[name]

    def compiled(preset=preset):
      with gpu_tiles.tiles(preset):
        hlo = paths.loop_hlo(paths.abstract_model(_small(f), "fused", device),
                             device=device, **_LOOP)
      warps = sorted({int(w) for w in re.findall(r"num_warps = (\d+)", hlo)})
      return {**paths.kernel_counts(hlo), "num_warps": warps}

    out[name] = _timed(compiled)
    calls = [("small", f.gamma + 1)]
    if not f.small:
      calls += [(size, k) for size in f.call_sizes for k in (1, f.gamma + 1)]
    out[name]["calls"] = {}
    for size, k in calls:

      def call(preset=preset, size=size, k=k):
        with gpu_tiles.tiles(preset):
          return _step(check_common.t5_size(size, tiny=f.small), "fused",
                       device, k=k)

      result = _timed(call)
      out[name]["calls"][f"{size}/k_{k}"] = {
          key: result[key] for key in ("spills", "error") if key in result
      }
  return out


def option_sets(f: argparse.Namespace, device: Any) -> Dict[str, Any]:
  """The small decoder on each path under each XLA:GPU option set."""
  out: Dict[str, Any] = {}
  for path in f.paths:
    for name, options in gpu.GPU_OPTION_SETS.items():
      out.setdefault(path, {})[name] = _timed(
          lambda p=path, o=options: _step(_small(f), p, device, options=o))
  return out


def _pairs(f: argparse.Namespace) -> Dict[str, Dict[str, Any]]:
  shipped = {
      "target": gin_reader.read_t5_config("models/multi30k_target_38m.gin"),
      "draft": gin_reader.read_t5_config("models/multi30k_draft_1m.gin"),
      "gamma": 3,
  }
  if f.small:
    return {"shipped": shipped}
  return {
      "shipped": shipped,
      "t5_xxl_small": {
          "target": check_common.t5_size("xxl"),
          "draft": check_common.t5_size("small"),
          "gamma": 7,
      },
  }


def _loop_programs(pair: Dict[str, Any], path: str, device: Any,
                   length: int) -> Dict[str, Any]:
  """The pair's baseline and speculative loops (greedy), compiled."""
  target = paths.abstract_model(pair["target"], path, device)
  draft = decoding.ModelDrafter(
      paths.abstract_model(pair["draft"], path, device))
  place = lambda shape, dtype: paths.on_device(
      jax.ShapeDtypeStruct(shape, dtype), device)
  inputs, rng = place((1, 64), jnp.int32), place((2,), jnp.uint32)
  eos, greedy = place((), jnp.int32), sampling.Greedy()
  programs = {
      "baseline": (loops.temperature_loop, (target, inputs, rng, eos),
                   dict(max_decode_length=length, method=greedy)),
      "speculative": (loops.speculative_loop, (target, draft, inputs, rng, eos),
                      dict(gamma=pair["gamma"], max_decode_length=length,
                           method=greedy, statistics=True,
                           acceptance=decoding.ExactAcceptance())),
  }
  out = {}
  for name, (fn, args, kwargs) in programs.items():
    jitted = jax.jit(  # A fresh function: traced under the tiles in force.
        functools.partial(fn),
        static_argnames=tuple(k for k in kwargs if k != "acceptance"))
    out[name] = _timed(
        lambda j=jitted, a=args, k=kwargs: iteration_hlo.iteration_kernels(
            paths.compile_shapes(j, *a, device=device, **k).as_text()))
  return out


def loops_group(f: argparse.Namespace, device: Any) -> Dict[str, Any]:
  """Per pair and path, the kernels of an iteration of each loop; on
  'fused' also under each tile preset that runs small layers as one kernel
  or three (`Tiles.layer_bytes`, `fold_bytes`: 'fused@<preset>')."""
  out: Dict[str, Any] = {}
  layer_presets = {
      n: gpu_tiles.TILE_PRESETS[n]
      for n in f.presets
      if gpu_tiles.TILE_PRESETS[n].layer_bytes or
      gpu_tiles.TILE_PRESETS[n].fold_bytes
  } if "fused" in f.paths else {}
  for name, pair in _pairs(f).items():
    out[name] = {"gamma": pair["gamma"], "max_decode_length": _LENGTH}
    for path in f.paths:
      out[name][path] = _loop_programs(pair, path, device, _LENGTH)
    for preset, tiles_ in layer_presets.items():
      with gpu_tiles.tiles(tiles_):  # Traced inside: fresh jits.
        out[name][f"fused@{preset}"] = _loop_programs(pair, "fused", device,
                                                      _LENGTH)
  return out


def barriers(f: argparse.Namespace, device: Any) -> Dict[str, Any]:
  """Per preset with programs and call (k_1, k_<γ+1>): each run of layers'
  loads at its barriers (`ptx_barriers.dumped`), with the compile's
  spills and seconds."""
  out: Dict[str, Any] = {}
  for name in f.presets:
    preset = gpu_tiles.TILE_PRESETS[name]
    if not preset.programs:
      continue
    for k in (1, f.gamma + 1):
      with tempfile.TemporaryDirectory() as folder:
        with gpu_tiles.tiles(preset):
          result = _timed(lambda k=k, d=folder: _step(
              _small(f), "fused", device, k=k, options={"xla_dump_to": d}))
        if "error" not in result:
          try:
            loads = ptx_barriers.dumped(folder)
          except ValueError as e:
            result = {"error": str(e)}
          else:
            result = {
                "loads": loads,
                **{
                    key: result[key] for key in ("spills", "compile_s")
                }
            }
      out.setdefault(name, {})[f"k_{k}"] = result
  return out


_HLO_DTYPES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


def grids(f: argparse.Namespace, device: Any) -> Dict[str, Any]:
  """Per size and preset, the 'fused' one-token step's Triton calls by
  kernel, their bytes per program summed, and the model's step
  (`kernel_grid`, at the H200's fitted constants)."""
  out: Dict[str, Any] = {}
  for name in (("small",) if f.small else SIZES):
    for preset in f.presets:

      def step(name=name, preset=preset):
        config = check_common.t5_size(name, tiny=f.small)
        with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS[preset]):
          hlo = paths.loop_hlo(paths.abstract_model(config, "fused", device),
                               device=device, **_LOOP)
        calls = kernel_grid.triton_calls(
            hlo, gathered=(f"{_HLO_DTYPES[jnp.dtype(config.dtype).name]}"
                           f"[{config.vocab_size},{config.emb_dim}]",))
        return {
            "calls": calls,
            "by_kernel": kernel_grid.by_kernel(calls),
            "predicted_ms": kernel_grid.predict_ms(calls),
        }

      out.setdefault(name, {})[preset] = _timed(step)
  return out


def grids_fit(result: Dict[str, Any], device_check: str) -> Dict[str, Any]:
  """`kernel_grid.fit` of the 'fused' steps a device check measured
  (its JSON at `device_check`) against `result['grids']`' calls under the
  check's tile preset."""
  with open(device_check) as fh:
    check = json.load(fh)
  preset = check["settings"]["tiles"]
  measured = check["paths"]["steps"]["fused"]
  sizes_ = [
      n for n in SIZES if n in measured and
      "calls" in result["grids"].get(n, {}).get(preset, {})
  ]
  fitted = kernel_grid.fit([(result["grids"][n][preset]["calls"],
                             measured[n]["step_ms"]) for n in sizes_])
  return {
      "device_check": device_check,
      "tiles": preset,
      "sizes": sizes_,
      **fitted
  }


_RUN = {
    "layers": layers,
    "sizes": sizes,
    "tiles": tiles,
    "option_sets": option_sets,
    "loops": loops_group,
    "grids": grids,
    "barriers": barriers,
}


def summary(result: Dict[str, Any]) -> List[str]:
  """A line per path of the layer counts and per pair and path of the
  loops' iterations."""
  lines = []
  for path, c in result.get("layers", {}).items():
    lines.append(f"{path:7s} {c['per_decoder_layer']} kernels/decoder layer "
                 f"+ {c['fixed']} fixed per step (T5-small-shaped)")
  for name, t in result.get("tiles", {}).items():
    calls = sorted({**t.get("calls", {}), "small/k_1": t}.items())
    spilled = ", ".join(f"{call} {fn} {stores} B" for call, r in calls
                        for fn, (stores,
                                 _) in sorted(r.get("spills", {}).items()))
    refused = "".join(
        f"; {call} {r['error']}" for call, r in calls if "error" in r)
    lines.append(f"tiles {name}: " +
                 (f"spills {spilled}" if spilled else "no spills") + refused)
  for size, by_preset in result.get("grids", {}).items():
    for preset, g in by_preset.items():
      if "error" in g:
        lines.append(f"grids {size} {preset}: {g['error']}")
        continue
      fewest = min(r["programs"] for r in g["by_kernel"].values())
      lines.append(
          f"grids {size} {preset}: "
          f"{sum(r['calls'] for r in g['by_kernel'].values())} Triton calls, "
          f"{fewest} programs in the narrowest, model "
          f"{g['predicted_ms']:.3f} ms")
  fitted = result.get("grids_fit")
  if fitted:
    lines.append(
        f"grids fit ({fitted['tiles']}, {', '.join(fitted['sizes'])}): "
        f"{fitted['program_gbps']:.1f} GB/s a program, "
        f"{fitted['kernel_us']:.2f} µs a call; model/measured " + " ".join(
            f"{p / m:.2f}"
            for p, m in zip(fitted["predicted_ms"], fitted["measured_ms"])))
  for preset, by_call in result.get("barriers", {}).items():
    for call, r in by_call.items():
      counts = [c for runs in r.get("loads", {}).values() for c in runs]
      lines.append(f"barriers {preset} {call}: " +
                   (r["error"] if "error" in r else
                    f"{sum(c > 0 for c in counts)} of {len(counts)} with "
                    f"loads issued before them ({sum(counts)} loads)"))
  for pair, by_path in result.get("loops", {}).items():
    for path, loops_ in by_path.items():
      if not isinstance(loops_, dict) or "speculative" not in loops_:
        continue
      base, spec = loops_["baseline"], loops_["speculative"]
      if "error" in base or "error" in spec:
        lines.append(f"{pair} {path}: {base.get('error') or spec['error']}")
        continue
      draft = " + ".join(f"{n['body'] + n['condition']} per draft step"
                         for n in spec["nested"])
      branches = "".join(f"; a branch ({' or '.join(map(str, c))} kernels)"
                         for c in spec.get("conditionals", []))
      spilled = sorted({**base.get("spills", {}), **spec.get("spills", {})})
      lines.append(
          f"{pair} {path}: baseline {base['body'] + base['condition']} "
          f"kernels/iteration; speculative {spec['body'] + spec['condition']}"
          f" ({spec['outside_model_calls']} outside the model calls)"
          f"{' + ' + draft if draft else ''}{branches}{_once(base, spec)}"
          f"{'; spills in ' + ', '.join(spilled) if spilled else ''}")
  return lines


def _once(base: Dict[str, Any], spec: Dict[str, Any]) -> str:
  """'; once a decode <baseline's> / <speculative's>' kernels around the
  loops (records from before 2026-11-30 have none: '')."""
  if "outside_loop" not in base or "outside_loop" not in spec:
    return ""
  return f"; once a decode {base['outside_loop']} / {spec['outside_loop']}"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--groups", default=",".join(DEFAULT_GROUPS),
                 help=f"comma-separated, of {', '.join(GROUPS)}")
  p.add_argument("--paths", default="xla,packed,fused",
                 help="decode paths, comma-separated, of xla, packed, fused")
  p.add_argument(
      "--presets", default=",".join(gpu_tiles.TILE_PRESETS),
      help="the tiles and loops groups' tile presets "
      "(kernels.gpu_tiles.TILE_PRESETS), comma-separated")
  p.add_argument(
      "--call_sizes", default="xxl",
      help="the tiles group's target calls' sizes, comma-separated, "
      f"of {', '.join(SIZES)} (not with --small)")
  p.add_argument("--gamma", type=int, default=7,
                 help="the sizes group's (γ+1)-token call")
  p.add_argument("--small", action="store_true",
                 help="tiny stand-in shapes and the shipped pair only (tests)")
  p.add_argument("--target_config", default=None,
                 help="a GpuTargetConfigProto text file (default: the H200)")
  p.add_argument("--output", default=None, help="write the result as JSON")
  p.add_argument(
      "--device_check", default=None,
      help="with the grids group: a device check's JSON whose 'fused' "
      "steps the kernels' model is fitted to")
  f = p.parse_args(argv)
  for name in ("groups", "paths", "presets", "call_sizes"):
    setattr(f, name, [x for x in getattr(f, name).split(",") if x])
  for flag, values, allowed in (("groups", f.groups, GROUPS),
                                ("paths", f.paths, ("xla", "packed", "fused")),
                                ("presets", f.presets,
                                 tuple(gpu_tiles.TILE_PRESETS)),
                                ("call_sizes", f.call_sizes, SIZES)):
    bad = [v for v in values if v not in allowed] or ([] if values else [""])
    if bad:
      raise common.flag_error(flag, ",".join(bad),
                              "comma-separated names of " + ", ".join(allowed))
  if f.gamma < 1:
    raise common.flag_error("gamma", f.gamma, "an integer >= 1")
  if f.device_check is not None and ("grids" not in f.groups or
                                     not os.path.isfile(f.device_check)):
    raise common.flag_error(
        "device_check", f.device_check,
        "an existing device check JSON, with the grids group")
  if f.target_config is not None and not os.path.isfile(f.target_config):
    raise common.flag_error("target_config", f.target_config,
                            "an existing GpuTargetConfigProto text file")
  return f


def _body(argv: Optional[Sequence[str]]) -> None:
  f = parse_args(argv)
  config = H200
  if f.target_config:
    with open(f.target_config) as fh:
      config = fh.read()
  with console.filtered_stderr(lambda line: bool(_INFO.match(line))):
    device = gpu_device(config)
  result: Dict[str, Any] = {
      "schema": SCHEMA,
      "jax": jax.__version__,
      "device": str(device.device_kind),
      "target_config": f.target_config or "built-in H200",
      "paths": f.paths,
      "presets": f.presets,
      "call_sizes": [] if f.small else f.call_sizes,
      "small": f.small,
      "host": common.host(),
  }
  if "loops" in f.groups:
    _pairs(f)  # Its gin files read (gin-config) before any compile.
  for group in f.groups:
    start = time.perf_counter()
    with console.filtered_stderr(lambda line: bool(_INFO.match(line))):
      result[group] = _RUN[group](f, device)
    print(f"{group}: compiled in {time.perf_counter() - start:.0f} s",
          flush=True)
    if f.output:  # A later group's crash keeps this one's (minutes).
      io_utils.write_json(f.output, result)
  if f.device_check:
    result["grids_fit"] = grids_fit(result, f.device_check)
  for by_preset in result.get("grids", {}).values():
    for g in by_preset.values():  # `by_kernel` has them (and a file 1/10).
      g.pop("calls", None)
  result["summary"] = summary(result)
  print("\n".join(result["summary"]))
  common.write_result(f.output, result)
  print(json.dumps({"summary": result["summary"]}))


# Read as JAX and XLA load, before `main` runs (`main` starts the command
# again with them, set over any value: importing JAX sets
# TF_CPP_MIN_LOG_LEVEL itself): only the CPU's backend starts (the GPU is a
# topology's: no CUDA client, no driver, no libtpu; with a GPU backend
# asked for and no driver, the plugin's version check fails and it does
# not register), and XLA's INFO lines, which carry ptxas' spill warnings
# (`_timed` keeps them off the terminal). `_STARTED` marks the second start.
ENVIRONMENT = {
    "JAX_PLATFORMS": "cpu",
    "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",
    "TF_CPP_MIN_LOG_LEVEL": "0",
}
_STARTED = "GPU_AOT_ENVIRONMENT_SET"


def main(argv: Optional[Sequence[str]] = None) -> int:
  if os.environ.get(_STARTED) != "1":
    args = list(sys.argv[1:] if argv is None else argv)
    os.execve(sys.executable,
              [sys.executable, "-m", "tools.benchmarks.gpu_aot", *args], {
                  **os.environ,
                  **ENVIRONMENT, _STARTED: "1"
              })
  return console.run_cli("gpu_aot", lambda: _body(argv),
                         (common.BenchmarkFlagError,),
                         (RuntimeError, ImportError))


if __name__ == "__main__":
  sys.exit(main())
