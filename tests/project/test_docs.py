"""README.md and docs/: the generated pages are the generator's output, every
relative link resolves, and the commands shown are the ones that run (the
install lines are .ci/run's, the Python API block executes, every other
command names modules, scripts, gin files, macros and flags that exist; the
main job runs in tests/e2e/test_docs_e2e.py)."""
import importlib.util
import json
import os
import pathlib
import re
import shlex

import numpy as np
import pytest

from specdec_jax.config import gin_reader
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_report
from tools import generate_docs

from conftest import REPO
from docs_helpers import fenced
from docs_helpers import readme
from docs_helpers import section

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


# ---------------------------------------------------------------------------
# Generated pages.
# ---------------------------------------------------------------------------
def test_generated_pages_are_the_generators_output(tmp_path):
  written = generate_docs.write_pages(str(tmp_path))
  assert sorted(pathlib.Path(p).name for p in written) == [
      "macros.md", "outputs.md", "reproduce_table2.md", "running.md", "tpu.md"
  ]
  for path in written:
    name = pathlib.Path(path).name
    committed = (DOCS / "usage" / name).read_text(encoding="utf-8")
    assert committed == pathlib.Path(path).read_text(encoding="utf-8"), (
        f"docs/usage/{name} is not what tools/generate_docs.py writes: "
        "run `python -m tools.generate_docs` and commit the result.")


def test_figures_quoted_from_results_are_generated_from_them(tmp_path):
  """Issue 58: running.md's main-job α / BLEU / identity and the example
  compile output of tpu.md and reproduce_table2.md are filled from
  committed results (they had drifted: α 0.87, 103.81 MB); a changed result
  makes the committed page stale (the test above then fails)."""
  usage = DOCS / "usage"
  running = (usage / "running.md").read_text(encoding="utf-8")
  main = json.loads((REPO / generate_docs.MAIN_JOB).read_text())
  assert (f"alpha {main['alpha']:.2f} (kept guesses / acceptance trials), "
          f"BLEU {main['bleu']['speculative']:.2f}, greedy outputs identical "
          f"to the target's on {main['greedy_identical_examples']}/"
          f"{main['num_examples']} examples") in running
  assert "α 0.87" not in running
  lines = compile_report.compile_summary_lines(
      json.loads((REPO / generate_docs.TPU_EXAMPLE).read_text()))
  assert "KV caches 108.00 MB" in lines[1]
  tpu = (usage / "tpu.md").read_text(encoding="utf-8")
  assert "```\n" + "\n".join(lines) + "\n```" in tpu
  reproduce = (usage / "reproduce_table2.md").read_text(encoding="utf-8")
  assert "\n".join(lines[:2] + ["..."] + lines[-4:-1]) in reproduce
  # Another result, another page; no markers, a named error.
  other = tmp_path / "metrics.json"
  other.write_text(json.dumps(dict(main, alpha=0.5)))
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(generate_docs, "MAIN_JOB", str(other))
    filled = generate_docs.fill("running.md", running)
  assert filled != running and "alpha 0.50 (kept guesses" in filled
  with pytest.raises(generate_docs.DocsError,
                     match="running.md: no '<!-- generated: main_job -->'"):
    generate_docs.fill("running.md", "α 0.87")


def test_macros_page_covers_every_run_argument():
  rows = generate_docs.macro_rows()
  bound = {binding for _, _, binding, _ in rows}
  assert {f"run.{f}" for f in arguments.MACROS} <= bound  # and components':
  assert {"TreeMode.width", "decode_mode.acceptance", "drafter.name"} <= bound
  by_macro = {macro: (default, meaning) for macro, default, _, meaning in rows}
  assert by_macro["GAMMA"][0] == "5" and "'auto'" in by_macro["GAMMA"][1]
  assert by_macro["SPM_MODEL_PATH"][1]  # vocabulary.* macros too
  assert all(meaning for _, _, _, meaning in rows)


def test_generator_names_what_is_missing(monkeypatch, tmp_path):

  class Undocumented:
    """A configurable.

    Attributes:
      output_dir: documented.
    """

  monkeypatch.setitem(generate_docs.DOCUMENTED, "run",
                      (Undocumented, "Attributes"))
  with pytest.raises(generate_docs.DocsError,
                     match=r"run.gamma \(%GAMMA\) has no docstring entry"):
    generate_docs.macro_rows()
  assert generate_docs.main(["--out", str(tmp_path)]) == 1
  assert not list(tmp_path.iterdir())  # nothing half-written


def test_docstring_entries_join_continuations_and_groups():

  class Documented:
    """Summary.

    Args:
      a, b: first
        continued.
      c / d: second.

    Returns:
      nothing.
    """

  assert generate_docs.docstring_entries(Documented, "Args") == {
      "a": "first continued.",
      "b": "first continued.",
      "c": "second.",
      "d": "second."
  }


# ---------------------------------------------------------------------------
# Links.
# ---------------------------------------------------------------------------
def test_every_relative_link_points_at_an_existing_file():
  assert (REPO / "README.md") in PAGES and len(PAGES) > 10
  broken = []
  for page in PAGES:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+:", target) or target.startswith("#"):
        continue  # a URL, or an anchor on the same page
      path = (page.parent / target.split("#")[0]).resolve()
      if not path.exists():
        broken.append(f"{page.relative_to(REPO)}: {target}")
  assert not broken, broken


def test_readme_is_short_and_indexes_every_docs_page():
  text = readme()
  assert len(text.splitlines()) <= 250
  index = section(text, "## Documentation")
  for page in sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("*/*.md")):
    if page.parent.name == "results" and page.name != "README.md":
      continue  # one dated page per result: indexed by results/README.md
    assert str(page.relative_to(REPO)) in index, page
  results = (DOCS / "results" / "README.md").read_text(encoding="utf-8")
  for page in sorted((DOCS / "results").glob("2*.md")):
    assert f"]({page.name})" in results, page


# ---------------------------------------------------------------------------
# Commands.
# ---------------------------------------------------------------------------
def test_install_and_test_commands_are_ci_runs():
  ci = [
      line.strip()
      for line in (REPO / ".ci" / "run").read_text().splitlines()
      if line.startswith("python ")
  ]
  text = readme()
  install = fenced(section(text, "## Install"))[0].splitlines()
  tests = fenced(section(text, "## Run the tests"))[0].splitlines()
  # CI also installs the tpu extra, as the README's TPU check says, so
  # that the ahead-of-time TPU compile tests run there.
  tpu = "python -m pip install -q -e '.[tpu]'"
  assert ci.count(tpu) == 1 and "pip install -e '.[tpu]'" in text
  ci.remove(tpu)
  # Both start from a fresh virtual environment (issue 42: CI had passed
  # on an older pytest that its machine kept).
  assert install[0].startswith("python -m venv ") and ci[0].startswith(
      "python -m venv ") and "activate" in install[0] + ci[0]
  assert install[1:] == ci[1:-1] and len(install) == 3
  # The whole suite, then the quick set: every test folder but tests/e2e/.
  assert tests[:1] == ci[-1:] == ["python -m pytest -q -n 2 tests"]
  assert len(tests) == 2, tests
  words = tests[1].split()
  assert words[:6] == ["python", "-m", "pytest", "-q", "-n", "2"], tests
  folders = {
      p.parent.relative_to(REPO).as_posix()
      for p in (REPO / "tests").glob("*/test_*.py")
  }
  assert "tests/e2e" in folders and len(folders) > 2
  assert sorted(words[6:]) == sorted(folders - {"tests/e2e"}), tests


def test_check_command_is_the_one_ci_runs_before_the_tests():
  ci = [
      line.strip()
      for line in (REPO / ".ci" / "run").read_text().splitlines()
      if line.strip() and not line.startswith("#")
  ]
  checks = [i for i, line in enumerate(ci) if "scripts/check.sh" in line]
  assert len(checks) == 1 and checks[0] < ci.index(
      "python -m pytest -q -n 2 tests")
  assert os.access(REPO / "scripts" / "check.sh", os.X_OK)
  assert "`scripts/check.sh`" in section(readme(), "## Run the tests")


def test_core_python_api_block_runs(capsys):
  """docs/extending.md's example of the core alone (random weights)."""
  text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
  code = fenced(section(text, "## The core alone"), "python")
  assert len(code) == 1 and len(code[0].splitlines()) <= 16
  namespace = {}
  exec(code[0], namespace)  # pylint: disable=exec-used
  out, base = namespace["out"], namespace["base"]
  assert out.tokens.shape == (1, 8)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  assert "tokens_per_target_call" in capsys.readouterr().out


def _commands(text: str) -> list:
  """The `python -m specdec_jax.X` / `python -m tools.X` command lines of a
  page: in fenced blocks (continuation lines joined) and inline code."""
  found = []
  for block in fenced(text):
    for line in block.replace("\\\n", " ").splitlines():
      line = line.strip()
      if line.startswith("python "):
        # Inside `gcloud ... --command="..."`: unescape, drop the last quote.
        line = line.replace('\\"', '"')
        found.append(line[:-1] if line.count('"') % 2 else line)
  found += re.findall(r"`(python (?:-m (?:specdec_jax|tools)|scripts/)[^`]*)`",
                      text)
  return [
      c for c in found
      if re.match(r"python (-m (specdec_jax|tools)|scripts/)", c)
  ]


def _flag_names_in_sources() -> str:
  """All Python source of the package and the tools (where flags are
  defined)."""
  return "\n".join(
      p.read_text(encoding="utf-8") for p in
      [*(REPO / "specdec_jax").rglob("*.py"), *(REPO / "tools").rglob("*.py")])


def test_every_command_shown_names_what_exists():
  sources = _flag_names_in_sources()
  checked = 0
  for page in PAGES:
    for command in _commands(page.read_text(encoding="utf-8")):
      where = f"{page.relative_to(REPO)}: {command}"
      words = shlex.split(
          command.replace("[", " ").replace("]", " "), comments=True)
      program = words[2] if words[1] == "-m" else words[1]
      if words[1] == "-m":
        assert importlib.util.find_spec(program), where
      else:
        assert (REPO / program).is_file(), where
      flags = [w[2:].split("=", 1) for w in words if w.startswith("--")]
      gin_files = [f[1] for f in flags if f[0] == "gin_file"]
      for name in gin_files:
        assert (REPO / "gin" / name).is_file(), where
      for w in words:
        value = w[len("--sweep="):] if w.startswith("--sweep=") else w
        if w.startswith("configs/") or (w.startswith("--sweep=") and
                                        "=" not in value):  # a YAML file
          assert (REPO / value).is_file(), where
        elif w.startswith("--sweep="):  # a grid: KEY=v1,v2 of a known macro
          assert value.split("=")[0] in gin_reader.gin_file_macros(
              gin_files or ["run.gin"]), where
      known = gin_reader.gin_file_macros(gin_files or ["run.gin"])
      for flag in flags:
        if flag[0].startswith("gin."):
          assert flag[0][4:] in known, where
        else:
          assert re.search(rf"[\"'](--)?{flag[0]}[\"']", sources), where
      checked += 1
  assert checked >= 30
