"""`python -m tools.device_check`: the command line and the phases.

The parent process never imports JAX (it would take the GPU): it runs each
phase (`common.PHASES`) as a child process of this same module
(`--phase=NAME`) under the phase's time cap, kills a child that overruns
it, and merges the child's JSON (written after every step, so a killed
phase keeps what it measured) into OUT/device_check.json after every
phase. A phase gets min(its cap, what is left of the total); the last
takes what is left. Exit status: 0 when every phase ran and every check
held, 1 when a check failed or a phase did not finish, 2 on a bad setting
(one line, before anything is measured).

Before the first phase the parent reads the SPECDEC_* variables the
phases read (`compilation_cache.check_environment`: a bad value is one
line, exit 2, not a phase quietly taking its fallback, as
SPECDEC_JAX_KERNEL_ISA=avx9000 ran XLA's dot and the check said "all
checks hold"), then claims --out as every command claims its folder (`files.output_folder.claim`): a file or a path under
one is refused, one check at a time per folder (a second is refused,
naming the first), and a device_check.json of other settings (--small or
not, --phases) is replaced only with --overwrite.
"""
import argparse
import datetime
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence

from specdec_jax.core import environment
from specdec_jax.core.kernels import gpu
from specdec_jax.core.models import decode_paths
from specdec_jax.files import compilation_cache
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from tools.device_check import common
from tools.device_check import env

PROGRAM = "device_check"
RESULT_FILE = "device_check.json"
SCHEMA = "tools.device_check/2"
_GRACE_S = 10.0  # A child's own deadline ends this much before its cap.
_MIN_PHASE_S = 15.0  # A phase with less than this left is skipped.


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog=f"python -m tools.{PROGRAM}",
      description="Checks and measures the project on this machine's "
      "accelerator (docs/usage/gpu.md; running it: "
      "docs/contributing/device_check.md).")
  p.add_argument("--small", action="store_true",
                 help="the same phases at tiny shapes (a CPU, < 1 min)")
  p.add_argument(
      "--out", default=os.environ.get("OUT") or "/tmp/specdec_jax/device_check",
      help="folder for device_check.json (default: $OUT)")
  p.add_argument("--phases", default=",".join(common.PHASES),
                 help="comma-separated subset of " + ",".join(common.PHASES))
  p.add_argument(
      "--path", default=None, help="the decode path every phase decodes on: "
      f"{', '.join(decode_paths.DECODE_PATHS)} (default: 'fused' on one GPU, "
      "else the backend's; the paths phase compares them all)")
  p.add_argument(
      "--tiles", default=None,
      help="the GPU kernels' tile preset every phase decodes with: "
      f"{', '.join(gpu.TILE_PRESETS)} (default: '{common.CHECKED_TILES}', "
      "the tensor-core candidate; the paths phase times several)")
  p.add_argument(
      "--paths_groups", default=None,
      help="the paths phase's groups, a comma-separated subset of "
      f"{','.join(common.PATHS_GROUPS)} (default: "
      f"{','.join(common.FULL.paths_groups)}; --small: all)")
  p.add_argument(
      "--total_s", type=float, default=None,
      help="the whole check's time budget in seconds (default: "
      "the mode's)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace a device_check.json of other settings in --out")
  p.add_argument("--preflight", action="store_true",
                 help="no JAX: whether the working tree fits a device run")
  p.add_argument("--carry", default="",
                 help="with --preflight: comma-separated carried paths")
  # Internal: one phase, in a child process.
  p.add_argument("--phase", default=None, help=argparse.SUPPRESS)
  p.add_argument("--phase_json", default=None, help=argparse.SUPPRESS)
  p.add_argument("--cap_s", type=float, default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  args.phases = _subset(p, "phases", args.phases, common.PHASES)
  if args.path is not None and args.path not in decode_paths.DECODE_PATHS:
    p.error(f"--path={args.path!r}: allowed: "
            f"{', '.join(decode_paths.DECODE_PATHS)}.")
  if args.tiles is not None and args.tiles not in gpu.TILE_PRESETS:
    p.error(f"--tiles={args.tiles!r}: allowed: "
            f"{', '.join(gpu.TILE_PRESETS)}.")
  if args.paths_groups is not None:
    args.paths_groups = ",".join(
        _subset(p, "paths_groups", args.paths_groups, common.PATHS_GROUPS))
  if args.total_s is not None and not (math.isfinite(args.total_s) and
                                       args.total_s > 0):
    p.error(f"--total_s={args.total_s!r}: allowed: a finite number of "
            "seconds > 0.")
  return args


def _subset(p: argparse.ArgumentParser, flag: str, value: str,
            allowed: Sequence[str]) -> List[str]:
  """--flag's comma-separated names, in `allowed`'s order; a name not in
  it, or none, is the parser's error (exit 2)."""
  names = [x.strip() for x in value.split(",") if x.strip()]
  if not names or any(x not in allowed for x in names):
    p.error(f"--{flag}={value!r}: allowed: a comma-separated subset of "
            f"{','.join(allowed)}.")
  return [x for x in allowed if x in names]


# ---------------------------------------------------------------------------
# A child: one phase.
# ---------------------------------------------------------------------------
def run_phase(name: str, mode: str, json_path: str, cap_s: float,
              path: Optional[str] = None, tiles: Optional[str] = None,
              paths_groups: Optional[str] = None) -> int:
  """Runs phase `name` in this process, decoding on `path` (None: the
  backend's) with the GPU kernels' tile preset `tiles` (None:
  `common.CHECKED_TILES`), the paths phase measuring `paths_groups`
  (comma-separated; None: the mode's); returns its exit status."""
  settings = common.settings_for(
      mode, path,
      tuple(paths_groups.split(",")) if paths_groups else None)
  if mode == "small":  # Reruns on a CPU compile nothing (as `run` does).
    compilation_cache.enable()
  record = common.Recorder(json_path)
  deadline = common.Deadline(max(cap_s - _GRACE_S, 1.0))
  module = importlib.import_module(f"tools.device_check.{_MODULES[name]}")
  try:
    with gpu.tiles(gpu.TILE_PRESETS[tiles or common.CHECKED_TILES]):
      ok = module.run(settings, record, deadline)
  except Exception as e:  # pylint: disable=broad-except
    line = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    record.set("error", line)
    if isinstance(e, (common.SettingsError, environment.BadEnvironment)):
      print(f"{PROGRAM}: error: {e}", file=sys.stderr, flush=True)
      return 2
    traceback.print_exc()
    return 3
  record.set("ok", bool(ok))
  return 0 if ok else 1


_MODULES = {
    "env": "env",
    "exactness": "exactness",
    "pretrained": "pretrained_pair",
    "paths": "paths",
    "loop": "loop",
    "physics": "physics"
}
_STATUS = {0: "ok", 1: "check failed", 2: "bad setting", 3: "crashed"}


# ---------------------------------------------------------------------------
# The parent: every phase, each in a child under its cap.
# ---------------------------------------------------------------------------
def _child(name: str, mode: str, cap_s: float,
           decode_path: Optional[str] = None, tiles: Optional[str] = None,
           paths_groups: Optional[str] = None) -> Dict[str, Any]:
  """Runs one phase in a child process; returns its record and status."""
  fd, path = tempfile.mkstemp(prefix=f"device_check_{name}_", suffix=".json")
  os.close(fd)
  os.unlink(path)
  cmd = [
      sys.executable, "-m", f"tools.{PROGRAM}", "--phase", name, "--phase_json",
      path, "--cap_s",
      str(cap_s)
  ] + (["--small"] if mode == "small" else [])
  cmd += ["--path", decode_path] if decode_path else []
  cmd += ["--tiles", tiles] if tiles else []
  cmd += ["--paths_groups", paths_groups] if paths_groups else []
  start = time.perf_counter()
  try:
    code: Optional[int] = subprocess.run(cmd, check=False, timeout=cap_s,
                                         cwd=io_utils.REPO_DIR).returncode
    status = _STATUS.get(code, f"exit {code}")
  except subprocess.TimeoutExpired:
    code, status = None, "timed out"
  data: Dict[str, Any] = {}
  if os.path.exists(path):
    data = json.loads(io_utils.read_text(path))
    os.unlink(path)
  return {
      "record": data,
      "status": {
          "status": status,
          "exit_code": code,
          "cap_s": cap_s,
          "seconds": time.perf_counter() - start,
          "error": data.get("error")
      }
  }


def _caps(settings: common.Settings, phases: List[str],
          total_s: float) -> Dict[str, float]:
  """Nominal caps; the last phase's is the total."""
  caps = {p: min(settings.caps_s[p], total_s) for p in phases}
  caps[phases[-1]] = total_s
  return caps


def orchestrate(args: argparse.Namespace) -> int:
  """Runs the phases; writes OUT/device_check.json after each."""
  mode = "small" if args.small else "full"
  settings = common.settings_for(mode)
  total_s = args.total_s or settings.total_s
  path = os.path.join(args.out, RESULT_FILE)
  report: Dict[str, Any] = {
      "schema": SCHEMA,
      "mode": mode,
      "settings": settings_record(args),
      "argv": sys.argv[1:],
      "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "total_s": total_s,
      "phases": {}
  }
  io_utils.write_json(path, report)
  caps, begin = _caps(settings, args.phases, total_s), time.perf_counter()
  for name in args.phases:
    cap = min(caps[name], total_s - (time.perf_counter() - begin))
    need = common.MIN_PHASE_S.get(name, _MIN_PHASE_S)
    if cap < need:
      report["phases"][name] = {"status": "skipped (time)", "cap_s": cap}
      common.log(f"phase {name}: skipped, {cap:.0f} s left (it needs "
                 f"{need:.0f} s)")
      continue
    common.log(f"phase {name}: start (cap {cap:.0f} s)")
    done = _child(name, mode, cap, args.path, args.tiles, args.paths_groups)
    report[name], report["phases"][name] = done["record"], done["status"]
    if name == "loop":
      report["loop"]["main_job"] = main_job_against_theorem(report)
    report["verdicts"] = verdicts(report)
    io_utils.write_json(path, report)
    common.log(f"phase {name}: {done['status']['status']} in "
               f"{done['status']['seconds']:.1f} s")
    if done["status"]["exit_code"] == 2:
      break  # A bad setting: nothing else would mean anything.
  report["seconds"] = time.perf_counter() - begin
  report["verdicts"] = verdicts(report)
  io_utils.write_json(path, report)
  print(format_summary(report))
  print(f"wrote {path}")
  if any(s.get("exit_code") == 2 for s in report["phases"].values()):
    return 2
  return 0 if report["verdicts"]["all_ok"] else 1


def settings_record(args: argparse.Namespace) -> Dict[str, Any]:
  """What makes a check's results what they are (the overwrite rule): the
  mode, the phases, the decode path and the tile preset, not the time
  budget."""
  return {
      "mode": "small" if args.small else "full",
      "phases": args.phases,
      "path": args.path,
      "tiles": args.tiles or common.CHECKED_TILES,
      "paths_groups": args.paths_groups
  }


def claim_out(args: argparse.Namespace) -> output_folder.Claim:
  """The environment checked, then --out claimed (the module docstring).

  Raises:
    BadEnvironment, FolderError: one line each (exit 2).
  """
  compilation_cache.check_environment()
  return output_folder.claim(args.out, settings_record(args), [RESULT_FILE],
                             name="--out", program=PROGRAM,
                             overwrite=args.overwrite,
                             overwrite_flag="--overwrite")


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  if args.preflight:
    return env.main([c for c in args.carry.split(",") if c])
  if args.phase:
    return run_phase(args.phase, "small" if args.small else "full",
                     args.phase_json, args.cap_s or 60.0, args.path, args.tiles,
                     args.paths_groups)
  try:
    held = claim_out(args)
  except (environment.BadEnvironment, output_folder.FolderError) as e:
    print(f"{PROGRAM}: error: {e}", file=sys.stderr, flush=True)
    return 2
  with held:
    return orchestrate(args)


# -- summary -------------------------------------------------------------------
# The check's verdicts and its last lines (what the run's output shows).
#
# `verdicts` reads the merged report (`cli.orchestrate`'s device_check.json)
# into a few booleans and numbers; `format_summary` prints them as a short
# table, the part of the log that the device tool's reply always carries.
def _get(report: Dict[str, Any], *keys: str) -> Any:
  node: Any = report
  for key in keys:
    if not isinstance(node, dict) or key not in node:
      return None
    node = node[key]
  return node


def _identity(report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
  """The pair's identity counts: at 'highest' precision if it was needed."""
  same = _get(report, "pretrained", "identity")
  if not same:
    return None
  return same.get("highest_precision") or same.get("default_precision")


def verdicts(report: Dict[str, Any]) -> Dict[str, Any]:
  """Booleans (None: not measured) and the headline numbers."""
  out: Dict[str, Any] = {
      "gpu_aware": _get(report, "env", "gpu_awareness", "ok"),
      "exactness_all_modes": _get(report, "exactness", "all_ok"),
  }
  for mode, entry in (_get(report, "exactness", "modes") or {}).items():
    out[f"exactness_{mode}"] = entry.get("ok")
  same = _identity(report)
  out["pretrained_identical"] = _get(report, "pretrained", "identity",
                                     "all_identical")
  out["pretrained_identical_count"] = (f"{same['identical']}/{same['examples']}"
                                       if same else None)
  out["main_job_speedup"] = _get(report, "pretrained", "main_job", "speedup")
  out["physics_complete"] = _get(report, "physics", "ok")
  out["paths_complete"] = _get(report, "paths", "ok")
  out["loop_complete"] = _get(report, "loop", "ok")
  statuses = [p.get("status") for p in report.get("phases", {}).values()]
  out["phases_ok"] = bool(statuses) and all(s == "ok" for s in statuses)
  # A phase that ran but did not finish is not ok (phases_ok); a check of
  # a phase not run is None and not counted.
  out["all_ok"] = all(v is not False for v in out.values())
  return out


def main_job_against_theorem(report: Dict[str, Any]) -> Dict[str, Any]:
  """The ratio issue 56 quotes (0.6 on an H200: 1.30x against 2.18x): the
  pretrained phase's main-job speedup ÷ its Theorem 3.8 at the measured α
  and c, without and with the measured call cost (the loop phase's record,
  `loop.main_job`); {'skipped': why} when it was not measured."""
  job = _get(report, "pretrained", "main_job") or {}
  if not isinstance(job.get("speedup"), (int, float)):
    return {"skipped": "no main job measured (the pretrained phase)"}
  return {
      "speedup": job["speedup"],
      "theorem_3_8": job["theorem_3_8"],
      "theorem_3_8_with_call_cost": job["theorem_3_8_with_call_cost"],
      "over_theorem": job["speedup"] / job["theorem_3_8"],
      "over_theorem_with_call_cost": job["speedup"] /
                                     job["theorem_3_8_with_call_cost"],
  }


def _num(x: Any, fmt: str = "{:.3g}") -> str:
  return "-" if x is None else fmt.format(x)


def _exactness_lines(report: Dict[str, Any]) -> List[str]:
  lines = []
  argmax = _get(report, "exactness", "argmax_kernel")
  if argmax:
    agree = argmax.get("by_vocab") or {}
    lines.append("  argmax kernel: " + (", ".join(
        f"V {v} {r['agree']}/{r['rows']} rows as jnp.argmax"
        for v, r in agree.items()) or f"error ({argmax.get('error')})"))
  for mode, e in (_get(report, "exactness", "modes") or {}).items():
    if "skipped" in e:
      lines.append(f"  {mode:6s} skipped ({e['skipped']})")
      continue
    g = e["greedy"].get("highest_precision") or e["greedy"]["default_precision"]
    text = f"  {mode:6s} {'ok' if e['ok'] else 'FAILED'}: greedy "
    text += f"{g['identical']}/{g['examples']} identical"
    if "highest_precision" in e["greedy"]:
      text += " (at 'highest' precision only)"
    d = e.get("distribution")
    if d:
      text += (f"; chi-square p {_num(d['test']['p_value'])} vs "
               f"target, {_num(d['power_check']['p_value'])} vs "
               "wrong target")
    lines.append(text)
  return lines


def _physics_lines(report: Dict[str, Any]) -> List[str]:
  p = report.get("physics") or {}
  steps = p.get("steps") or {}
  lines = []
  if "c" in steps:  # Else the group failed: its error is in the phase line.
    c = ", ".join(f"{d} {v:.3f}" for d, v in steps["c"].items())
    lines.append(f"  target step {steps['target_step_ms']:.3f} ms "
                 f"({steps['target_effective_gbps']:.0f} GB/s of decoder "
                 f"weights); c: {c}")
  ratio = _get(p, "call_cost_by_k", "ratio")
  if ratio:
    lines.append("  K-token call in steps: " +
                 " ".join(f"{k}:{v:.2f}" for k, v in ratio.items()))
  tree = _get(p, "tree_call_cost", "by_width")
  if tree:
    lines.append("  tree call in steps: " +
                 " ".join(f"k={k} ({t['nodes']} nodes):{t['steps']:.2f}"
                          for k, t in tree.items()))
  beam = p.get("beam_call_cost") or {}
  if "beam_steps" in beam:
    lines.append(f"  speculative-beam call: {beam['beam_steps']:.2f} beam "
                 f"steps (beam {beam['beam_size']}, γ {beam['gamma']})")
  for row in p.get("table2") or []:
    lines.append(
        f"  Table 2 {row['task']:5s} {row['draft']:5s} T={row['temperature']:g}"
        f" γ={row['gamma']} α={row['alpha']:.2f}: paper {row['speedup']:.1f}x,"
        f" Theorem 3.8 {_num(row['theorem_3_8'], '{:.2f}')}x "
        f"(with call cost {_num(row['theorem_3_8_with_call_cost'], '{:.2f}')}"
        "x)")
  return lines


def _paths_lines(report: Dict[str, Any]) -> List[str]:
  """Per decode path: each model's step, its memory-floor share and c,
  the target's verification call in steps; kernels a decoder layer; per
  Table 2 row the best (target, draft) pair of paths; the option sets and
  tiles against the default; the main job at each batch size."""
  p = report.get("paths") or {}
  lines = []
  for path, models in (p.get("steps") or {}).items():
    if not isinstance(models, dict):
      continue
    kernels = _get(p, "kernels", path, "per_decoder_layer")
    lines.append(
        f"  {path:7s} kernels/layer {_num(kernels, '{}')}: " + ", ".join(
            f"{name} {m['step_ms']:.3f} ms ({m['floor_share']:.0%} of floor" +
            (f", c {m['c']:.3f})" if "c" in m else ")")
            for name, m in models.items()))
    target = next((m for m in models.values() if "call_cost" in m), None)
    if target:
      lines.append(f"  {path:7s} target's {target['call_k']}-token call: "
                   f"{target['call_cost']:.2f} steps")
  for row in _get(p, "table2_pairs", "best") or []:
    if row["task"] != "EnDe":  # Issue 56's rows (every row: the JSON).
      continue
    lines.append(
        f"  best pair {row['task']:5s} {row['draft']:5s} "
        f"T={row['temperature']:g} γ={row['gamma']}: {row['pair']} (target+"
        f"draft path) Theorem 3.8 {row['against_fastest_target']:.2f}x over "
        f"the fastest target alone, {row['of_paper']:.2f} of the paper's "
        f"{row['paper']:.1f}x")
  identical = _get(p, "tiles", "rows_identical") or {}
  if identical:
    lines.append("  tiles: a token's logits the same bits in one-token "
                 "calls and in one call: " +
                 ", ".join(f"{n} {_identical_word(r)} (k {r.get('k', '?')})"
                           for n, r in identical.items()))
  for name, r in (p.get("profile") or {}).items():
    if isinstance(r, dict):
      lines.append(_profile_line(name, r))
  for group in ("option_sets", "tiles"):
    ratios = _get(p, group, "vs_reference") or {}
    if ratios:
      lines.append(f"  {group}: " + " ".join(
          f"{k} {v:.2f}"
          for k, v in sorted(ratios.items(), key=lambda x: x[1])))
  for path, by_batch in (_get(report, "pretrained", "main_job_by_path") or
                         {}).items():
    lines.append(f"  main job on {path}: " +
                 ", ".join(_main_job_word(b, r) for b, r in by_batch.items()))
  options = _get(report, "pretrained", "main_job_by_options") or {}
  for name, r in options.items():
    if name != "current" and isinstance(r, dict) and "vs_current" in r:
      lines.append(_options_line(name, r, options.get("current") or {}))
  for preset, r in (_get(report, "pretrained", "main_job_by_tiles") or
                    {}).items():
    if "skipped" in r:
      lines.append(f"  main job on fused, tiles {preset}: skipped "
                   f"({r['skipped']})")
      continue
    same = (r.get("identity") or {}).get("default_precision") or {}
    lines.append(f"  main job on fused, tiles {preset}: identity "
                 f"{same.get('identical', '?')}/{same.get('examples', '?')}, " +
                 ", ".join(
                     _main_job_word(b, m) for b, m in r.items() if b.isdigit()))
  return lines


def _options_line(name: str, r: Dict[str, Any], current: Dict[str, Any]) -> str:
  """A main job under an XLA:GPU option set against the library's own."""
  same = r.get("identity") or {}
  vs = r["vs_current"]
  return (f"  main job, options {name}: identity {same.get('identical', '?')}/"
          f"{same.get('examples', '?')}, {_main_job_word('1', r)} "
          f"(current's {_num(current.get('speedup'), '{:.2f}')}x); "
          f"baseline {vs['baseline']:.2f}x, speculative "
          f"{vs['speculative']:.2f}x as fast as under the current options")


def _main_job_word(batch: str, r: Dict[str, Any]) -> str:
  """'batch 1 1.90x (α 0.70)': a main job's speedup and, where measured,
  its α (under tiles whose kernel takes the draft's argmax, the check that
  it fed the argmax: identity holds whatever it fed)."""
  if "skipped" in r:
    return f"batch {batch} skipped ({r['skipped']})"
  alpha = r.get("alpha")
  return (f"batch {batch} {_num(r.get('speedup'), '{:.2f}')}x" +
          ("" if alpha is None else f" (α {alpha:.2f})"))


def _profile_line(name: str, r: Dict[str, Any]) -> str:
  """A step's device profile (`kernel_profile.summarize`) in one line: its
  kernels, busy and wall µs, idle share and the three costliest kernels."""
  if not r.get("kernels"):
    return f"  profile {name}: {r.get('note') or r.get('error') or '?'}"
  top = ", ".join(f"{t['name'][:40]} {t['per_step']:.0f}x{t['mean_us']:.1f}"
                  for t in r["top"][:3])
  return (f"  profile {name}: {r['kernels']:.0f} kernels a step, busy "
          f"{r['busy_us']:.1f} of {r['wall_us']:.1f} µs ({r['idle_share']:.0%}"
          f" idle), mean kernel {r['mean_kernel_us']:.1f} µs; top µs: {top}")


def _identical_word(r: Dict[str, Any]) -> str:
  """'yes', 'NO', or the error a preset's rows check ended in."""
  if "identical" not in r:
    return f"error ({r.get('error', '?')})"
  return "yes" if r["identical"] else "NO"


def _loop_lines(report: Dict[str, Any]) -> List[str]:
  """Per path: an iteration part by part, its seconds in no model call,
  its kernels in no model call, the marginal speedup against Theorem 3.8;
  then the main job's ratio."""
  p = report.get("loop") or {}
  lines = []
  kernels = p.get("kernels") or {}
  for path, r in (p.get("split") or {}).items():
    if not isinstance(r, dict) or "iteration_split_s" not in r:
      continue
    parts = r["iteration_split_s"]
    k = kernels.get(path) or {}
    lines.append(
        f"  loop on {path}: iteration "
        f"{1e3 * r['speculative_per_iteration_s']:.3f} ms = propose "
        f"{1e3 * parts['draft_propose']:.3f} + verify "
        f"{1e3 * parts['verification_call']:.3f} + bookkeeping "
        f"{1e3 * parts['bookkeeping']:.3f} + while "
        f"{1e3 * parts['while_loop']:.3f}; not in model calls "
        f"{1e3 * r['not_in_model_calls_s']:.3f} ms "
        f"({r['not_in_model_calls_share']:.0%}), "
        f"{_num(k.get('outside_model_calls'), '{}')} kernels "
        f"(condition {_num(k.get('condition'), '{}')}); marginal "
        f"{r['marginal_speedup']:.2f}x = {r['marginal_over_theorem']:.2f} of "
        f"Theorem 3.8 ({r['theorem_3_8_at_measured']:.2f}x)")
  job = p.get("main_job") or {}
  if "over_theorem" in job:
    lines.append(f"  main job {job['speedup']:.2f}x = "
                 f"{job['over_theorem']:.2f} of Theorem 3.8 "
                 f"({job['theorem_3_8']:.2f}x), "
                 f"{job['over_theorem_with_call_cost']:.2f} with the call cost")
  return lines


def format_summary(report: Dict[str, Any]) -> str:
  """The report's last lines: phases, verdicts, headline numbers."""
  machine = _get(report, "env", "machine") or {}
  lines = [
      f"device_check ({report.get('mode')}) on "
      f"{machine.get('device_kind', '?')}, jax "
      f"{_get(machine, 'versions', 'jax') or '?'}, tiles "
      f"{_get(report, 'settings', 'tiles') or '?'}"
  ]
  for name, status in report.get("phases", {}).items():
    extra = f": {status['error']}" if status.get("error") else ""
    lines.append(f"phase {name:10s} {status.get('status')} "
                 f"({_num(status.get('seconds'), '{:.1f}')} s){extra}")
  lines += _exactness_lines(report)
  v = report.get("verdicts") or verdicts(report)
  job = _get(report, "pretrained", "main_job") or {}
  if v.get("pretrained_identical_count"):
    lines.append(
        f"shipped pair: greedy identical {v['pretrained_identical_count']}; "
        f"main job speedup {_num(job.get('speedup'), '{:.2f}')}x (Theorem 3.8"
        f" {_num(job.get('theorem_3_8'), '{:.2f}')}x), α "
        f"{_num(job.get('alpha'), '{:.3f}')}, c {_num(job.get('c'))}")
  lines += _paths_lines(report)
  lines += _loop_lines(report)
  lines += _physics_lines(report)
  lines.append(f"all checks hold: {v.get('all_ok')}")
  return "\n".join(lines)
