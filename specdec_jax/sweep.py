r"""Runs a grid of experiments, resumably: one `run` per point.

  python -m specdec_jax.sweep --gin_file=ende_small.gin \
      --sweep=configs/gamma_temperature.yaml --results_dir=/tmp/sweep
  python -m specdec_jax.sweep --gin_file=local_tiny.gin \
      --sweep GAMMA=1,2,3 --sweep TEMPERATURE=0,1 --results_dir=/tmp/sweep
  python -m specdec_jax.sweep --sweep=configs/table2.yaml --results_dir=...

A sweep spec is `KEY=v1,v2,...` (repeatable; the grid is their product) or a
YAML file with a `grid:` mapping of KEY -> list (product) and/or a `points:`
list of KEY -> value mappings. KEY is a gin macro (GAMMA, TEMPERATURE, ...),
any full gin binding (`run.top_k`, `draft/T5Config.num_decoder_layers`), or
`gin_file`: the experiment file(s) of that point (e.g. `ende_base.gin`), so
one sweep can cover several drafts and tasks.

Before the first model is loaded, every point is checked as `run` checks
its arguments (gin macros, every value, the vocabulary against both models),
and RESULTS_DIR is created and probed: a bad value anywhere in the grid stops
the sweep with one line naming the point, and nothing is written. So do two
points that would share a folder (`check_points`: gin files `a/x.gin` and
`b/x.gin`), an OUTPUT_DIR key or binding (the sweep chooses the folders),
and a grid key listing one value twice (`TEMPERATURE: [1, 1.0]`); points
equal by value run once.

Each point writes `RESULTS_DIR/<point name>/metrics.json` (atomically, last)
and `predictions.jsonl`; a point whose metrics.json exists is skipped, so a
killed sweep re-run with the same arguments finishes the rest and loses
nothing. Models are loaded once per (gin files, model bindings) group, not
once per point. RESULTS_DIR may be a gs:// folder. On several hosts (the
same command on each, `multihost`) process 0 decides which points are done
and all hosts run the rest in the same order. `python -m specdec_jax.report RESULTS_DIR` turns the results
into the paper's tables and figures.
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

from specdec_jax import checkpoints
from specdec_jax import multihost
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.config import paths
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


# ---------------------------------------------------------------------------
# Specs -> points.
# ---------------------------------------------------------------------------
def _parse_value(text: str) -> Any:
  """A command-line grid value: YAML scalar rules (1 -> int, 0.5 -> float)."""
  return yaml.safe_load(text)


def parse_sweep_args(specs: Sequence[str]) -> List[Dict[str, Any]]:
  """Expands `--sweep` values (KEY=v1,v2 or YAML files) into points.

  Returns:
    A list of points, each a dict KEY -> value, in a stable order.
  """
  grid: Dict[str, List[Any]] = {}
  points: List[Dict[str, Any]] = []
  for spec in specs:
    if "=" in spec and not spec.endswith((".yaml", ".yml")):
      key, _, values = spec.partition("=")
      key = key.strip()
      items = [v.strip() for v in values.split(",") if v.strip()]
      if not key or not items:
        raise SweepError(f"--sweep={spec!r}: expected KEY=v1,v2,...")
      grid.setdefault(key, []).extend(_parse_value(v) for v in items)
    else:
      points.extend(load_sweep_file(spec))
  if grid:
    grid_points = _product(grid)
    # A command-line grid refines the points of a file (or stands alone).
    points = ([{
        **p,
        **g
    } for p in points for g in grid_points] if points else grid_points)
  if not points:
    raise SweepError("The sweep is empty: give --sweep=KEY=v1,v2 or a YAML "
                     "file with a non-empty 'grid' or 'points'.")
  return _dedupe(points)


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
  as `paths.resolve_path` reads it (here, else the repository's)."""
  path = paths.resolve_path(path)
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
    grid_points = _product(spec["grid"], f"{path}:")
    points = ([{
        **p,
        **g
    } for p in points for g in grid_points] if points else grid_points)
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


def _dedupe(points):
  """The points without repeats (equal by value: `_value_key`), in order."""
  seen, out = set(), []
  for p in points:
    key = _value_key(p)
    if key not in seen:
      seen.add(key)
      out.append(p)
  return out


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
  """Refuses what would make points share or leave their folders.

  The sweep chooses each point's folder, RESULTS_DIR/<point name>: an
  OUTPUT_DIR in a point or in a `--gin` binding would be replaced in
  silence, and two points with one name (gin files `a/x.gin` and `b/x.gin`,
  TASK 'a/b' and 'a_b') would share a folder, so that one of them never ran
  and a later sweep counted it as done.

  Raises:
    SweepError: naming the key or binding, or both points and their folder.
  """
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
  """A point's folder name must fit the filesystem's limit
  (`arguments.NAME_MAX` bytes): a longer one failed at that point, after
  sweep.json was written. SweepError naming the longest key."""
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


# ---------------------------------------------------------------------------
# Gin for one point.
# ---------------------------------------------------------------------------
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
  """Every sweep key must name a macro or binding the config knows.

  Macros (bare names, and those that `--gin.NAME=VALUE` defines) go through
  the check `run` uses (`gin_utils.check_macro_bindings`); full bindings
  (`run.top_k`) are checked by gin when each point is parsed
  (`validate_points`).
  """
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
  """Checks every point as `run` would, before any model is loaded.

  Each point's gin is parsed and its plan built (`RunPlan.build`: the run
  arguments, model configs, vocabulary against both models' vocab_size,
  n-gram corpus and memory, all checked); nothing is loaded.

  Raises:
    SweepError: naming the first bad point and what is wrong with it.
  """
  try:
    for point in points:
      name = point_name(point)
      files, bindings = point_gin(point, base_files)
      where = f"point {name} ({', '.join(bindings) or files})"
      gin.clear_config()
      try:
        gin_utils.parse_gin(files,
                            list(base_bindings) + bindings, search_paths,
                            finalize=False)
        RunPlan.build(
            arguments.run_arguments(
                overrides={"output_dir": os.path.join(results_dir, name)}),
            providers)
      except (ValueError, IOError, SyntaxError) as e:
        raise SweepError(f"{where}: {console.error_text(e)}") from None
  finally:
    gin.clear_config()


# ---------------------------------------------------------------------------
# Running.
# ---------------------------------------------------------------------------
def _model_group(point: Dict[str, Any]) -> str:
  key = {
      k: v
      for k, v in point.items()
      if k == GIN_FILE_KEY or _MODEL_KEYS.search(k)
  }
  return json.dumps(key, sort_keys=True, default=str)


def is_done(point_dir: str) -> bool:
  """A finished point has a readable metrics.json (or alpha.json in α mode),
  written last and atomically by the run. Its keys are not checked here
  (the report checks them, `run_metrics.RunMetrics`): a results file that
  is there is never decoded again."""
  for name in (run_metrics.METRICS_FILE, run_metrics.ALPHA_FILE):
    try:
      json.loads(io_utils.read_text(os.path.join(point_dir, name)))
      return True
    except (OSError, ValueError):
      continue
  return False


def _manifest_diff(old: Any, new: Dict[str, Any]) -> str:
  """Which of gin_files / gin_bindings differ, as 'KEY: old -> new'."""
  if not isinstance(old, dict):
    return f"its {SWEEP_FILE} holds {old!r}"
  return "; ".join(f"{k}: {old.get(k)!r} in its {SWEEP_FILE}, {v!r} now"
                   for k, v in new.items()
                   if old.get(k) != v)


def _check_results_dir(results_dir: str, points, base_files,
                       base_bindings) -> None:
  """A results dir may only be reused by the same sweep (no clobbering)."""
  manifest = os.path.join(results_dir, SWEEP_FILE)
  record = {"gin_files": list(base_files), "gin_bindings": list(base_bindings)}
  if io_utils.isfile(manifest):
    try:
      old = json.loads(io_utils.read_text(manifest))
    except (OSError, ValueError):
      raise SweepError(f"{manifest} is corrupt or not a sweep manifest; "
                       "choose another --results_dir.") from None
    if not isinstance(old, dict) or {k: old.get(k) for k in record} != record:
      raise SweepError(
          f"{results_dir} holds a different sweep ({_manifest_diff(old, record)}"
          "); choose another --results_dir.")
  elif io_utils.isdir(results_dir) and io_utils.listdir(results_dir):
    raise SweepError(f"{results_dir} is not empty and is not a sweep's "
                     "results dir; choose another --results_dir.")


def run_sweep(points: List[Dict[str, Any]], results_dir: str,
              base_files: Sequence[str] = (), base_bindings: Sequence[str] = (),
              search_paths: Sequence[str] = (),
              after_point: Optional[Callable[[str], None]] = None,
              providers: Optional[Providers] = None) -> List[str]:
  """Runs every unfinished point; returns the point folders, in order.

  `after_point(name)` is called after each point that ran (the soak test,
  `tools.benchmarks.soak`, samples the process's memory there); `providers`
  as `run.run`'s.

  Every point is validated and results_dir probed before the first model
  load; a SweepError then leaves results_dir as it was. On several hosts
  process 0 checks results_dir and decides which points are done; every
  process runs the same points in the same order (`multihost`).
  """
  check_points(points, results_dir, base_bindings)
  check_keys(points, base_files, base_bindings, search_paths)
  validate_points(points, results_dir, base_files, base_bindings, search_paths,
                  providers)
  names = [point_name(p) for p in points]

  def start() -> List[int]:
    _check_results_dir(results_dir, points, base_files, base_bindings)
    try:
      io_utils.probe_writable_dir(results_dir)
    except ValueError as e:
      raise SweepError(f"--results_dir={results_dir!r}: {e}") from None
    io_utils.write_json(
        os.path.join(results_dir, SWEEP_FILE), {
            "gin_files": list(base_files),
            "gin_bindings": list(base_bindings),
            "points": [{
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
    files, bindings = point_gin(point, base_files)
    gin.clear_config()
    gin_utils.parse_gin(files,
                        list(base_bindings) + bindings, search_paths,
                        finalize=False)
    group = _model_group(point)
    plan = RunPlan.build(
        arguments.run_arguments(
            overrides={"output_dir": os.path.join(results_dir, name)}),
        providers)
    _, kept = runner.execute(plan, models=models.get(group))
    models = {group: kept}  # keep one group in memory
    # Each point compiles its own decoders; kept, their code mappings pile
    # up until LLVM fails with "Cannot allocate memory" (vm.max_map_count)
    # around the 25th point of a sweep.
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
      "sweep", (SweepError, gin_utils.ConfigError, environment.BadEnvironment)):
    console.setup()
    compilation_cache.enable()  # a re-run compiles nothing
    run_sweep(points, f.results_dir, f.gin_file, f.gin_bindings,
              f.gin_search_paths, providers=providers)
    if multihost.is_first():
      print(f"Sweep finished: {len(points)} points in {f.results_dir}.\n"
            f"Report: python -m specdec_jax.report {f.results_dir}")


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
      (SweepError, gin_utils.ConfigError, checkpoints.CheckpointError,
       environment.BadEnvironment))


if __name__ == "__main__":
  console.exit_process(cli())
