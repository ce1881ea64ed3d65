"""docs/usage/reproduce_table2.md and gpu.md: what a researcher types to
reproduce the paper's Table 2 runs as written, and the numbers beside the
commands are the ones their sources hold.

Every command is checked as `run` itself would check it, without a model
(gin files, `--gin.X` macros that a binding reads, values, T5X's process
flags, the compile-only settings), device check commands by its own
argument parser; the page's twelve rows are the experiment files' (the
comments `tools.device_check.stats.paper_rows` reads) and each row's flags
select its γ and temperature; the compile-only estimates are
`benchmarks/tpu_compile_v4-8.json`'s; the GPU memory table is the model
files'.
"""
import importlib.util
import json
import re
import shlex

from absl import flags
import gin
import pytest

from specdec_jax import multihost
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.data import tasks
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_report
from specdec_jax.experiment import loading  # noqa: F401  # registers vocabulary
from specdec_jax.terminal import console
from tools.device_check import cli as device_check_cli
from tools.device_check import stats

from conftest import REPO
from docs_helpers import fenced
from docs_helpers import section

pytestmark = pytest.mark.usefixtures("clean_gin")
USAGE = REPO / "docs" / "usage"
TABLE2 = USAGE / "reproduce_table2.md"
PAGES = (TABLE2, USAGE / "gpu.md")


def _text(page) -> str:
  return page.read_text(encoding="utf-8")


_COMMAND = re.compile(r"(python|bash|scripts/)\S*\s")


def shell_commands(text: str) -> list:
  """Each command of the page as words: the lines of its plain fenced
  blocks that start a command (continuations joined, `#` comments
  dropped; a program's printed output is no command) and its inline code
  that starts with `python` or `bash`."""
  lines = []
  for block in fenced(text):
    lines += block.replace("\\\n", " ").splitlines()
  lines += re.findall(r"`((?:python|bash) [^`]*)`", text)
  return [
      shlex.split(line, comments=True)
      for line in lines
      if _COMMAND.match(line.strip() + " ")
  ]


def run_commands(page) -> list:
  """The page's `python -m specdec_jax.run ...` commands, flags only (the
  program named in prose, with no flags, is no command)."""
  return [
      w[3:]
      for w in shell_commands(_text(page))
      if w[:3] == ["python", "-m", "specdec_jax.run"] and len(w) > 3
  ]


def macros_read(gin_files) -> set:
  """The macros some binding of these files (and their includes) reads: a
  `--gin.X` that nothing reads would change nothing."""
  paths = gin_reader.search_paths()
  read = set()
  for name in gin_files:
    for statement, _ in gin_reader.gin_statements(name, paths):
      read |= gin_reader.macro_references(getattr(statement, "value", None))
  return read


def parsed_run(flag_words):
  """`run`'s own checks of a command line (no model, no file written):
  its absl flags exist, the gin files and every `--gin.X` macro pass the
  typo check, and the values make RunArguments (and the compile-only
  settings, with COMPILE_TOPOLOGY). Returns the RunArguments."""
  gin.clear_config()  # nothing of the previous command's
  gin_utils.define_gin_flags()
  multihost.define_flags()
  console.define_traceback_flag()
  files, bindings = [], []
  for word in flag_words:
    name, _, value = word[2:].partition("=")
    assert word.startswith("--"), word
    if name == "gin_file":
      files.append(value)
    elif name.startswith("gin."):
      bindings.append(f"{name[4:]}={value}")
    else:
      assert name in flags.FLAGS, f"run has no flag --{name}"
  for name in files:
    assert (REPO / "gin" / name).is_file(), name
  read = macros_read(files)
  for binding in bindings:
    assert binding.split("=")[0] in read, f"nothing reads --gin.{binding}"
  gin_utils.parse_gin(files, bindings, finalize=False, check_macros=True)
  args = arguments.run_arguments()
  if args.compile_topology is not None:
    compile_report.check_compile_settings(args, args.compile_topology)
  return args


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_run_command_is_one_run_accepts(page):
  commands = run_commands(page)
  assert len(commands) >= 2, page
  for words in commands:
    parsed_run(words)


def test_a_macro_nothing_reads_is_refused():
  with pytest.raises(AssertionError, match="nothing reads --gin.GAMA"):
    parsed_run(["--gin_file=ende_small.gin", "--gin.GAMA=3"])
  with pytest.raises(AssertionError, match="run has no flag --multiprocess"):
    parsed_run(["--gin_file=ende_small.gin", "--multiprocess"])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_program_named_exists_and_parses_its_flags(page):
  seen = 0
  for words in shell_commands(_text(page)):
    package = words[2].split(".")[0] if len(words) > 2 else ""
    if words[:2] == ["python", "-m"] and package in ("specdec_jax", "tools"):
      assert importlib.util.find_spec(words[2]), words
      seen += 1
    script = next((w for w in words[:2] if w.startswith("scripts/")), None)
    if script:
      assert (REPO / script).is_file(), words
      seen += 1
    program = script or (words[2] if words[1] == "-m" else "")
    if program in ("tools.device_check", "scripts/device_check.sh"):
      rest = words[words.index(program) + 1:]
      device_check_cli.parse_args(rest)  # SystemExit on a bad flag
  assert seen >= 3, page


def _row_cells(text: str) -> list:
  """The cells of the twelve rows' table, one list per row."""
  body = section(text, "## The twelve rows")
  rows = [
      l for l in body.splitlines()
      if l.startswith("| EnDe") or l.startswith("| CNNDM")
  ]
  return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_the_twelve_rows_are_the_experiment_files():
  expected = {(r["task"], r["draft"], r["temperature"], r["gamma"], r["alpha"],
               r["speedup"]) for r in stats.paper_rows()}
  cells = _row_cells(_text(TABLE2))
  page = {(c[0], c[1], float(c[2]), int(c[3]), float(c[4]),
           float(c[5].rstrip("×"))) for c in cells}
  assert len(cells) == 12 and page == expected


def test_each_rows_flags_select_its_settings():
  for cells in _row_cells(_text(TABLE2)):
    words = shlex.split(cells[6].strip("`"))
    assert words[0] == f"--gin_file={cells[0].lower()}_{cells[1]}.gin"
    args = parsed_run(words)
    assert (args.temperature, args.gamma) == (float(cells[2]),
                                              int(cells[3])), cells


def _compile_table():
  with open(REPO / "benchmarks" / "tpu_compile_v4-8.json") as f:
    return json.load(f)["files"]


def test_v4_predictions_in_the_rows_are_the_compile_records():
  records = _compile_table()
  for cells in _row_cells(_text(TABLE2)):
    name = f"{cells[0].lower()}_{cells[1]}.gin"
    roof = records[name]["compile"]["roofline"]["from_arguments"]
    predicted = f"{roof['theorem_3_8_speedup']:.2f}×"
    # The T = 1 rows were not compiled.
    assert cells[9] == (predicted if cells[2] == "0" else "–"), cells


def test_h200_packed_column_is_the_device_checks_best_pairs():
  """The 'H200, `packed`' column: per row the device check's best pair of
  paths (2026-11-29), Theorem 3.8 over the fastest target alone."""
  check = json.loads((REPO / "benchmarks" /
                      "issue56_h200_2026-11-29_device_check.json").read_text())
  best = {
      (r["task"], r["draft"], r["temperature"], r["gamma"]): r
      for r in check["paths"]["table2_pairs"]["best"]
  }
  rows = _row_cells(_text(TABLE2))
  assert len(rows) == len(best) == 12
  for cells in rows:
    r = best[(cells[0], cells[1], float(cells[2]), int(cells[3]))]
    assert r["pair"] == "packed+packed", r
    assert cells[8] == f"{r['against_fastest_target']:.2f}×", cells


def test_estimates_per_file_are_the_compile_records():
  body = section(_text(TABLE2), "## Estimates per row (compile-only)")
  lines = [l for l in body.splitlines() if l.startswith("| ")]
  cells = [[x.strip() for x in l.strip("|").split("|")] for l in lines]
  rows = {c[0]: c for c in cells if c[0].endswith(".gin")}
  records = _compile_table()
  assert sorted(rows) == sorted(records)
  for name, cells in rows.items():
    record = records[name]["compile"]
    mem, roof = record["memory_per_device"], record["roofline"]
    calls, args = roof["calls"], roof["from_arguments"]
    step = (calls["target_step"]["seconds"] * 1e3,
            calls["target_step"]["seconds_from_arguments"] * 1e3)
    draft = (calls["draft_step"]["seconds"] * 1e3,
             calls["draft_step"]["seconds_from_arguments"] * 1e3)
    steps = 100 * record["settings"]["max_decode_length"]  # NUM_EXAMPLES
    assert cells[1:] == [
        f"{sum(mem['parameter_bytes'].values()) / 1e9:.2f} / "
        f"{mem['peak_bytes'] / 1e9:.2f}",
        f"{step[0]:.2f} / {step[1]:.2f}",
        f"{draft[0]:.3f} / {draft[1]:.3f}",
        f"{roof['cost_coefficient_c']:.3f} / {args['cost_coefficient_c']:.3f}",
        f"{roof['theorem_3_8_speedup']:.2f}× / "
        f"{args['theorem_3_8_speedup']:.2f}×",
        f"{steps * step[0] / 1e3:.0f} / {steps * step[1] / 1e3:.0f} s",
    ], name
  assert arguments.RunArguments.__dataclass_fields__[
      "num_examples"].default == 100


def test_data_preparation_names_the_tasks_tfds_builds():
  text = _text(TABLE2)
  built = [(tasks.WMT_ENDE_TFDS_NAME, tasks.WMT_ENDE_TFDS_VERSION),
           (tasks.CNN_DM_TFDS_NAME, tasks.CNN_DM_TFDS_VERSION)]
  for name, version in built:
    assert f"tfds.builder('{name}:{version}').download_and_prepare()" in text


def test_gpu_memory_table_is_the_model_files():
  body = section(_text(USAGE / "gpu.md"), "## One GPU")
  for size in ("xxl", "large", "base", "small"):
    config = gin_reader.read_t5_config(f"models/t5_1_1_{size}.gin")
    label = "XXL" if size == "xxl" else size
    row = next(l for l in body.splitlines() if f"T5 v1.1 {label} (" in l)
    params, weights = (c.strip() for c in row.strip("|").split("|")[1:3])
    millions = config.num_params / 1e6
    assert params == (f"{millions:,.0f} M"), row
    gb = 2 * config.num_params / 1e9  # bfloat16
    assert weights == (f"{gb:.1f} GB" if gb >= 10 else f"{gb:.2f} GB"), row
    assert str(config.dtype.__name__) == "bfloat16"
