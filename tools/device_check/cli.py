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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specdec_jax.core import environment
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import decode_paths
from specdec_jax.files import compilation_cache
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from tools.device_check import common
from tools.device_check import summary
from tools.device_check import travel

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
      f"{', '.join(gpu_tiles.TILE_PRESETS)} (default: '{common.CHECKED_TILES}', "
      "the tensor-core candidate; the paths phase times several)")
  p.add_argument(
      "--paths_groups", default=None,
      help="the paths phase's groups, a comma-separated subset of "
      f"{','.join(common.PATHS_GROUPS)} (default: "
      f"{','.join(common.FULL.paths_groups)}; --small: all)")
  p.add_argument(
      "--tile_presets", default=None,
      help="the tile presets the paths phase's tiles group times (each "
      "model's step and the target's K-token call), a comma-separated "
      f"subset of {','.join(gpu_tiles.TILE_PRESETS)} (default: the mode's)")
  p.add_argument(
      "--pretrained_groups", default=None,
      help="what the pretrained phase measures after its identity and "
      "main job (each the record main_job_<group>), a comma-separated "
      f"subset of {','.join(common.PRETRAINED_GROUPS)} (default: all)")
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
  p.add_argument(
      "--aside", default=None, metavar="DIR",
      help="move what the check does not read (travel.ASIDE) to DIR, then "
      "--preflight")
  p.add_argument("--back", default=None, metavar="DIR",
                 help="move what --aside=DIR moved back into the checkout")
  # Internal: one phase, in a child process.
  p.add_argument("--phase", default=None, help=argparse.SUPPRESS)
  p.add_argument("--phase_json", default=None, help=argparse.SUPPRESS)
  p.add_argument("--cap_s", type=float, default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  args.phases = _subset(p, "phases", args.phases, common.PHASES)
  if args.path is not None and args.path not in decode_paths.DECODE_PATHS:
    p.error(f"--path={args.path!r}: allowed: "
            f"{', '.join(decode_paths.DECODE_PATHS)}.")
  if args.tiles is not None and args.tiles not in gpu_tiles.TILE_PRESETS:
    p.error(f"--tiles={args.tiles!r}: allowed: "
            f"{', '.join(gpu_tiles.TILE_PRESETS)}.")
  for flag, allowed in (("paths_groups", common.PATHS_GROUPS),
                        ("pretrained_groups", common.PRETRAINED_GROUPS),
                        ("tile_presets", tuple(gpu_tiles.TILE_PRESETS))):
    if getattr(args, flag) is not None:
      setattr(args, flag,
              ",".join(_subset(p, flag, getattr(args, flag), allowed)))
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
# The flags the parent hands each phase's child as it was given them.
_FORWARDED = ("path", "tiles", "paths_groups", "tile_presets",
              "pretrained_groups")


def _forwarded(args: argparse.Namespace) -> List[str]:
  """The `_FORWARDED` flags `args` sets, as a child's command line."""
  out: List[str] = []
  for name in _FORWARDED:
    if getattr(args, name):
      out += [f"--{name}", getattr(args, name)]
  return out


def _names(value: Optional[str]) -> Optional[Tuple[str, ...]]:
  """A parsed comma-separated flag's names (None: not given)."""
  return tuple(value.split(",")) if value else None


def run_phase(name: str, mode: str, json_path: str, cap_s: float,
              args: argparse.Namespace) -> int:
  """Runs phase `name` in this process, decoding on `args.path` (None:
  the backend's) with the GPU kernels' tile preset `args.tiles` (None:
  `common.CHECKED_TILES`), the paths and pretrained phases measuring the
  groups `args` names and the paths phase timing `args.tile_presets`
  (None: the mode's); returns its exit status."""
  settings = common.settings_for(mode, args.path, _names(args.paths_groups),
                                 _names(args.tile_presets),
                                 _names(args.pretrained_groups))
  if mode == "small":  # Reruns on a CPU compile nothing (as `run` does).
    compilation_cache.enable()
  record = common.Recorder(json_path)
  deadline = common.Deadline(max(cap_s - _GRACE_S, 1.0))
  module = importlib.import_module(f"tools.device_check.{_MODULES[name]}")
  try:
    with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS[args.tiles or
                                                common.CHECKED_TILES]):
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
           forwarded: Sequence[str] = ()) -> Dict[str, Any]:
  """Runs one phase in a child process, with the parent's `forwarded`
  flags (`_forwarded`); returns its record and status."""
  fd, path = tempfile.mkstemp(prefix=f"device_check_{name}_", suffix=".json")
  os.close(fd)
  os.unlink(path)
  cmd = [
      sys.executable, "-m", f"tools.{PROGRAM}", "--phase", name, "--phase_json",
      path, "--cap_s",
      str(cap_s)
  ] + (["--small"] if mode == "small" else []) + list(forwarded)
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
    done = _child(name, mode, cap, _forwarded(args))
    report[name], report["phases"][name] = done["record"], done["status"]
    if name == "loop":
      report["loop"]["main_job"] = summary.main_job_against_theorem(report)
    report["verdicts"] = summary.verdicts(report)
    io_utils.write_json(path, report)
    common.log(f"phase {name}: {done['status']['status']} in "
               f"{done['status']['seconds']:.1f} s")
    if done["status"]["exit_code"] == 2:
      break  # A bad setting: nothing else would mean anything.
  report["seconds"] = time.perf_counter() - begin
  report["verdicts"] = summary.verdicts(report)
  io_utils.write_json(path, report)
  print(summary.format_summary(report))
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
      "paths_groups": args.paths_groups,
      "tile_presets": args.tile_presets,
      "pretrained_groups": args.pretrained_groups
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
  if args.back:
    return travel.back(args.back)
  if args.aside:
    return travel.aside(args.aside)
  if args.preflight:
    return travel.main([c for c in args.carry.split(",") if c])
  if args.phase:
    return run_phase(args.phase, "small" if args.small else "full",
                     args.phase_json, args.cap_s or 60.0, args)
  try:
    held = claim_out(args)
  except (environment.BadEnvironment, output_folder.FolderError) as e:
    print(f"{PROGRAM}: error: {e}", file=sys.stderr, flush=True)
    return 2
  with held:
    return orchestrate(args)
