r"""Runs a grid of experiments, resumably: one `run` per point
(docs/usage/running.md).

  python -m specdec_jax.sweep --gin_file=local_tiny.gin \
      --sweep GAMMA=1,2,3 --sweep TEMPERATURE=0,1 --results_dir=/tmp/sweep

A sweep spec is `KEY=v1,v2,...` (repeatable; the grid is their product) or a
YAML file with a `grid:` mapping of KEY -> list (product) and/or a `points:`
list of KEY -> value mappings. KEY is a gin macro (GAMMA, ...), a full gin
binding (`run.top_k`) or `gin_file`: the point's experiment file(s).

Every point is checked and RESULTS_DIR probed before the first model
loads. Each point writes RESULTS_DIR/<point name>/, metrics.json last; a
re-run skips finished points. Models load once per group of points; on
several hosts process 0 decides which points are done.
"""
import itertools
import json
import math
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import flags
from absl import logging
import gin
from gin import config_parser
import jax
import yaml

from specdec_jax.config import flag_utils
from specdec_jax import checkpoints
from specdec_jax import multihost
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.core import environment
from specdec_jax.experiment import arguments
from specdec_jax.experiment import runner
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.files import compilation_cache
from specdec_jax.files import io_utils
from specdec_jax.metrics import run_metrics
from specdec_jax.terminal import console

SWEEP_FILE = "sweep.json"
GIN_FILE_KEY = "gin_file"
# Bindings that change which models are loaded: points that differ in one of
# these are run in separate groups.
_MODEL_KEYS = re.compile(
    r"(CHECKPOINT_PATH|T5Config|_DTYPE$|^MESH_SHAPE$|^SEED$|mesh_shape)")


class SweepError(ValueError):
  """A bad sweep specification or results directory (printed, no traceback)."""


# -- Specs -> points -----------------------------------------------------------
def parse_sweep_args(specs: Sequence[str]) -> List[Dict[str, Any]]:
  """The points (dicts KEY -> value, in a stable order, without repeats)
  of `--sweep` values, KEY=v1,v2 or YAML files."""
  grid: Dict[str, List[Any]] = {}
  points: List[Dict[str, Any]] = []
  for spec in specs:
    if "=" in spec and not spec.endswith((".yaml", ".yml")):
      key, _, values = spec.partition("=")
      key = key.strip()
      items = [v.strip() for v in values.split(",") if v.strip()]
      if not key or not items:
        raise SweepError(f"--sweep={spec!r}: expected KEY=v1,v2,...")
      # YAML scalar rules: 1 -> int, 0.5 -> float.
      grid.setdefault(key, []).extend(yaml.safe_load(v) for v in items)
    else:
      points.extend(load_sweep_file(spec))
  if grid:  # a command-line grid refines the points of a file
    points = _refine(points, _product(grid))
  if not points:
    raise SweepError("The sweep is empty: give --sweep=KEY=v1,v2 or a YAML "
                     "file with a non-empty 'grid' or 'points'.")
  unique = {}  # equal by value (`_value_key`): run once
  for p in points:
    unique.setdefault(_value_key(p), p)
  return list(unique.values())


def _refine(points: List[Dict[str, Any]],
            grid_points: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Every point with every grid point's values, or the grid alone."""
  return [{
      **p,
      **g
  } for p in points for g in grid_points] if points else grid_points


def _product(grid: Dict[str, List[Any]],
             where: str = "--sweep") -> List[Dict[str, Any]]:
  """The grid's points; `where` (the file, or --sweep) names it in errors."""
  for key, values in grid.items():
    if not isinstance(values, list) or not values:
      raise SweepError(f"grid key {key!r} must map to a non-empty list, got "
                       f"{values!r}.")
    seen = {}
    for i, value in enumerate(values):
      first = seen.setdefault(_value_key(value), i)
      if first != i:
        same = values[first]
        raise SweepError(
            f"{where} grid key {key!r} lists {value!r} twice ({same!r} and "
            f"{value!r} in {values!r}): the same point would run twice; "
            "allowed: distinct values (after parsing: 1 and 1.0 are one).")
  keys = list(grid)
  return [
      dict(zip(keys, combo))
      for combo in itertools.product(*(grid[k] for k in keys))
  ]


def load_sweep_file(path: str) -> List[Dict[str, Any]]:
  """Points of a YAML sweep file (see module docstring); a relative path
  as `io_utils.resolve_path` reads it (here, else the repository's)."""
  path = io_utils.resolve_path(path)
  if not os.path.exists(path):
    raise SweepError(f"sweep file {path!r} does not exist.")
  try:
    with open(path) as f:
      spec = yaml.safe_load(f)
  except yaml.YAMLError as e:
    raise SweepError(f"{path}: not valid YAML ({e}).") from None
  if not isinstance(spec, dict) or not set(spec) & {"grid", "points"}:
    raise SweepError(f"{path}: expected a mapping with 'grid' and/or "
                     "'points'.")
  unknown = set(spec) - {"grid", "points", "description"}
  if unknown:
    raise SweepError(f"{path}: unknown top-level keys {sorted(unknown)}; "
                     "allowed: grid, points, description.")
  points = []
  for i, point in enumerate(spec.get("points") or []):
    if not isinstance(point, dict) or not point:
      raise SweepError(f"{path}: points[{i}] must be a non-empty mapping.")
    points.append(dict(point))
  if spec.get("grid"):
    if not isinstance(spec["grid"], dict):
      raise SweepError(f"{path}: 'grid' must be a mapping KEY -> list.")
    points = _refine(points, _product(spec["grid"], f"{path}:"))
  if not points:
    raise SweepError(f"{path}: the sweep is empty.")
  return points


def _value_key(value: Any) -> Any:
  """A hashable key equal for values gin binds alike: 1 and 1.0 are one
  value, True is not 1, and lists and dicts compare item by item."""
  if isinstance(value, bool) or value is None:
    return ("const", value)
  if isinstance(value, (int, float)):
    return ("number", value)  # 1 == 1.0 and hash(1) == hash(1.0)
  if isinstance(value, str):
    return ("str", value)
  if isinstance(value, (list, tuple)):  # gin binds a list and a tuple apart
    return (type(value).__name__, tuple(_value_key(v) for v in value))
  if isinstance(value, dict):
    return ("map",
            frozenset((_value_key(k), _value_key(v)) for k, v in value.items()))
  return ("other", repr(value))


def point_name(point: Dict[str, Any]) -> str:
  """A stable, filesystem-safe folder name for a point."""
  parts = []
  for key in sorted(point, key=lambda k: (k != GIN_FILE_KEY, k)):
    value = point[key]
    if key == GIN_FILE_KEY:
      files = value if isinstance(value, list) else [value]
      parts.append("+".join(
          os.path.splitext(os.path.basename(f))[0] for f in files))
    else:
      parts.append(f"{key.split('.')[-1]}={value}")
  return re.sub(r"[^A-Za-z0-9=+._-]", "_", "__".join(parts))


def _is_output_dir(key: str) -> bool:
  """`OUTPUT_DIR` or a binding of `run.output_dir` (any scope)."""
  return key == "OUTPUT_DIR" or key.split("/")[-1] == "run.output_dir"


def check_points(points: Sequence[Dict[str, Any]], results_dir: str,
                 base_bindings: Sequence[str] = ()) -> None:
  """SweepError naming what would make points leave or share their folder,
  RESULTS_DIR/<point name>: an OUTPUT_DIR key or binding, two points of one
  name (gin files `a/x.gin` and `b/x.gin`), a name over the limit."""
  allowed = ("the sweep chooses each point's folder (--results_dir/<point "
             "name>) and would replace it; allowed: --results_dir to say "
             "where the points go")
  for point in points:
    for key in point:
      if _is_output_dir(key):
        raise SweepError(f"sweep key {key!r} (point {point!r}): {allowed}.")
  for text in base_bindings:
    try:
      statements = gin_utils.binding_statements(text)
    except ValueError:  # named by `check_keys`
      continue
    for st in statements:
      if (isinstance(st, config_parser.BindingStatement) and _is_output_dir(
          f"{st.selector}.{st.arg_name}" if st.arg_name else st.selector)):
        raise SweepError(f"{gin_utils.binding_flag(text)}: {allowed}.")
  by_name: Dict[str, int] = {}
  for i, point in enumerate(points):
    name = point_name(point)
    _check_name_length(point, name)
    first = by_name.setdefault(name, i)
    if first != i:
      other = points[first]
      raise SweepError(
          f"points {other!r} and {point!r} share the folder "
          f"{os.path.join(results_dir, name)!r} (point names keep only "
          "gin files' base names and replace characters other than "
          "A-Za-z0-9=+._- with '_'); allowed: points whose names differ "
          "(rename a gin file), or separate sweeps (--results_dir).")


def _check_name_length(point: Dict[str, Any], name: str) -> None:
  """SweepError naming the longest key when the point's folder name has
  more than `arguments.NAME_MAX` bytes."""
  size = len(name.encode("utf-8"))
  if size <= arguments.NAME_MAX:
    return
  key = max(point, key=lambda k: len(point_name({k: point[k]})))
  part = len(point_name({key: point[key]}))
  task = (f" (TASK: at most {arguments.TASK_MAX_BYTES} bytes)"
          if key == "TASK" else "")
  raise SweepError(
      f"sweep key {key!r} (point {name[:60]}...): the point's folder name "
      f"would have {size} bytes, {part} of them {key}'s, more than the "
      f"{arguments.NAME_MAX} a folder name may have; allowed: shorter "
      f"values{task}.")


# -- Gin for one point ---------------------------------------------------------
def _binding(key: str, value: Any) -> str:
  if isinstance(value, float) and math.isinf(value):
    # repr gives `inf`, which gin cannot parse; 1e999 is gin for infinity
    # (and is then rejected with the point named, like any bad value).
    return f"{key} = {'-' if value < 0 else ''}1e999"
  return f"{key} = {value!r}"


def point_gin(point: Dict[str, Any],
              base_files: Sequence[str]) -> Tuple[List[str], List[str]]:
  """(gin files, bindings) of a point."""
  files = list(base_files)
  if GIN_FILE_KEY in point:
    value = point[GIN_FILE_KEY]
    files += value if isinstance(value, list) else [value]
  bindings = [_binding(k, v) for k, v in point.items() if k != GIN_FILE_KEY]
  return files, bindings


def check_keys(points, base_files, base_bindings, search_paths) -> None:
  """SweepError unless every macro key (and `--gin.NAME=VALUE`) names a
  macro of the point's gin files (full bindings: `validate_points`)."""
  paths = gin_reader.search_paths(search_paths)
  checked = set()
  for point in points:
    files, _ = point_gin(point, base_files)
    macro_keys = tuple(
        sorted(k for k in point if k != GIN_FILE_KEY and "." not in k))
    if (tuple(files), macro_keys) in checked:
      continue
    checked.add((tuple(files), macro_keys))
    try:
      known = gin_reader.gin_file_macros(files, paths)
      gin_utils.check_macro_bindings(base_bindings, known)
    except ValueError as e:
      raise SweepError(f"gin files {files}: {e}") from None
    for key in macro_keys:
      if key not in known:
        raise SweepError(f"--sweep key {key!r} (gin files {files}): " +
                         gin_utils.unknown_macro_message(key, sorted(known)))


def validate_points(points, results_dir: str, base_files, base_bindings,
                    search_paths,
                    providers: Optional[Providers] = None) -> None:
  """Builds every point's plan as `run` would (`RunPlan.build` checks
  every value, nothing is loaded); SweepError naming the first bad point."""
  try:
    for point in points:
      files, bindings = point_gin(point, base_files)
      where = f"point {point_name(point)} ({', '.join(bindings) or files})"
      try:
        _plan(point, results_dir, base_files, base_bindings, search_paths,
              providers)
      except (ValueError, IOError, SyntaxError) as e:
        raise SweepError(f"{where}: {console.error_text(e)}") from None
  finally:
    gin.clear_config()


# -- Running -------------------------------------------------------------------
def _plan(point, results_dir: str, base_files, base_bindings, search_paths,
          providers: Optional[Providers]) -> RunPlan:
  """The point's plan, from its gin parsed afresh."""
  files, bindings = point_gin(point, base_files)
  gin.clear_config()
  gin_utils.parse_gin(files,
                      list(base_bindings) + bindings, search_paths,
                      finalize=False)
  return RunPlan.build(
      arguments.run_arguments(overrides={
          "output_dir": os.path.join(results_dir, point_name(point))
      }), providers)


def _model_group(point: Dict[str, Any]) -> str:
  key = {
      k: v
      for k, v in point.items()
      if k == GIN_FILE_KEY or _MODEL_KEYS.search(k)
  }
  return json.dumps(key, sort_keys=True, default=str)


def is_done(point_dir: str) -> bool:
  """Whether the point wrote a readable metrics.json (MODE='infer':
  infer.json; 'alpha': alpha.json), last and atomically; its keys are the
  report's to check."""
  for name in (run_metrics.METRICS_FILE, run_metrics.INFER_FILE,
               run_metrics.ALPHA_FILE):
    try:
      json.loads(io_utils.read_text(os.path.join(point_dir, name)))
      return True
    except (OSError, ValueError):
      continue
  return False


def _reportable(results_dir: str, points) -> bool:
  """Whether a point wrote the report's input: metrics.json, or alpha.json
  (its Table 3)."""
  return any(
      io_utils.isfile(os.path.join(results_dir, point_name(p), name))
      for p in points
      for name in (run_metrics.METRICS_FILE, run_metrics.ALPHA_FILE))


def _check_results_dir(results_dir: str, points, base_files,
                       base_bindings) -> Dict[str, Any]:
  """SweepError unless results_dir is empty or the same sweep's (no
  clobbering); the manifest's gin files and bindings."""
  manifest = os.path.join(results_dir, SWEEP_FILE)
  record = {"gin_files": list(base_files), "gin_bindings": list(base_bindings)}
  if io_utils.isfile(manifest):
    try:
      old = json.loads(io_utils.read_text(manifest))
    except (OSError, ValueError):
      raise SweepError(f"{manifest} is corrupt or not a sweep manifest; "
                       "choose another --results_dir.") from None
    if not isinstance(old, dict):
      diff = f"its {SWEEP_FILE} holds {old!r}"
    else:
      diff = "; ".join(f"{k}: {old.get(k)!r} in its {SWEEP_FILE}, {v!r} now"
                       for k, v in record.items()
                       if old.get(k) != v)
    if diff:
      raise SweepError(f"{results_dir} holds a different sweep ({diff}); "
                       "choose another --results_dir.")
  elif io_utils.isdir(results_dir) and io_utils.listdir(results_dir):
    raise SweepError(f"{results_dir} is not empty and is not a sweep's "
                     "results dir; choose another --results_dir.")
  return record


def run_sweep(points: List[Dict[str, Any]], results_dir: str,
              base_files: Sequence[str] = (), base_bindings: Sequence[str] = (),
              search_paths: Sequence[str] = (),
              after_point: Optional[Callable[[str], None]] = None,
              providers: Optional[Providers] = None) -> List[str]:
  """Runs every unfinished point, all validated and results_dir probed
  first; the point folders. `after_point(name)` runs after each point run
  (`tools.benchmarks.soak`); `providers` as `run.run`'s."""
  check_points(points, results_dir, base_bindings)
  check_keys(points, base_files, base_bindings, search_paths)
  validate_points(points, results_dir, base_files, base_bindings, search_paths,
                  providers)
  names = [point_name(p) for p in points]

  def start() -> List[int]:
    record = _check_results_dir(results_dir, points, base_files, base_bindings)
    try:
      io_utils.probe_writable_dir(results_dir)
    except ValueError as e:
      raise SweepError(f"--results_dir={results_dir!r}: {e}") from None
    io_utils.write_json(
        os.path.join(results_dir, SWEEP_FILE), {
            **record, "points": [{
                "name": n,
                "bindings": p
            } for n, p in zip(names, points)]
        })
    return [
        i for i, n in enumerate(names)
        if not is_done(os.path.join(results_dir, n))
    ]

  todo = multihost.run_on_first("sweep_todo", start)
  # Points sharing models run back to back, so each pair loads once.
  groups = {}
  for i in range(len(points)):
    groups.setdefault(_model_group(points[i]), len(groups))
  todo.sort(key=lambda i: groups[_model_group(points[i])])
  logging.info("Sweep: %d points, %d already done, %d to run.", len(points),
               len(points) - len(todo), len(todo))
  models: Dict[str, Any] = {}
  start = time.perf_counter()
  for done_count, i in enumerate(todo):
    point, name = points[i], names[i]
    group = _model_group(point)
    plan = _plan(point, results_dir, base_files, base_bindings, search_paths,
                 providers)
    _, kept = runner.execute(plan, models=models.get(group))
    models = {group: kept}  # keep one group in memory
    # Kept, each point's compiled code piles up until LLVM fails with
    # "Cannot allocate memory" (vm.max_map_count) around the 25th point.
    jax.clear_caches()
    elapsed = time.perf_counter() - start
    remaining = elapsed / (done_count + 1) * (len(todo) - done_count - 1)
    logging.info("[%d/%d] %s done; %.0fs elapsed, ~%.0fs left",
                 len(points) - len(todo) + done_count + 1, len(points), name,
                 elapsed, remaining)
    if after_point is not None:
      after_point(name)
  gin.clear_config()
  return [os.path.join(results_dir, n) for n in names]


def main(argv: Sequence[str], providers: Optional[Providers] = None) -> None:
  if len(argv) > 1:
    raise SweepError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  if not f.results_dir:
    raise SweepError("--results_dir is required.")
  points = parse_sweep_args(f.sweep)
  # Typos fail in a second, before TensorFlow's import.
  check_points(points, f.results_dir, f.gin_bindings)
  check_keys(points, f.gin_file, f.gin_bindings, f.gin_search_paths)
  try:  # several hosts: T5X's flags, or a Cloud TPU VM (`multihost`)
    multihost.initialize_from_flags()
  except ValueError as e:
    raise SweepError(str(e)) from None
  with multihost.failures_end_every_process(
      "sweep",
      (SweepError, flag_utils.ConfigError, environment.BadEnvironment)):
    console.setup()
    compilation_cache.enable()  # a re-run compiles nothing
    run_sweep(points, f.results_dir, f.gin_file, f.gin_bindings,
              f.gin_search_paths, providers=providers)
    if multihost.is_first():
      print(f"Sweep finished: {len(points)} points in {f.results_dir}." +
            (f"\nReport: python -m specdec_jax.report {f.results_dir}"
             if _reportable(f.results_dir, points) else ""))


def cli(argv: Optional[Sequence[str]] = None,
        providers: Optional[Providers] = None) -> int:
  """Entry point: errors in the spec print one line and exit 2."""
  gin_utils.define_gin_flags()
  multihost.define_flags()
  if "sweep" not in flags.FLAGS:
    flags.DEFINE_multi_string("sweep", [], "KEY=v1,v2,... or a YAML file.")
    flags.DEFINE_string("results_dir", None, "Where the points' folders go.")
  console.define_traceback_flag()
  return console.run_cli(
      "sweep", lambda: gin_utils.run_main(lambda a: main(a, providers), argv),
      (SweepError, flag_utils.ConfigError, checkpoints.CheckpointError,
       environment.BadEnvironment))


if __name__ == "__main__":
  console.exit_process(cli())
