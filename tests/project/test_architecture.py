"""The line between the core and the harness (docs/architecture.md).

The core lives under `specdec_jax/core/` and nowhere else (the layout shows
the line). The core (`protocols`, `sampling`, `acceptance`, `kernels`,
`models`, `drafters`, `decoding`) imports only itself, JAX/Flax/NumPy and the
standard library: never the harness (`experiment`, `run`, `timing`,
`analysis`, ...), gin or absl. Its packages import one another without a
cycle. The package imports nothing of the tools (`tools/`, not installed).
Read from the source with `ast`: nothing is imported, so a cycle that
import order would hide is still seen.
"""
import ast
import pathlib
import re
import sys
from typing import Dict, Iterator, Set, Tuple

from conftest import REPO
import pytest

PACKAGE = REPO / "specdec_jax"
CORE_DIR = PACKAGE / "core"
# The core's units: a package (directory) or a top-level module.
CORE = ("environment", "protocols", "structs", "carried_while", "sampling",
        "acceptance", "kernels", "models", "drafters", "decoding")
# Third-party packages of the harness.
FORBIDDEN_THIRD_PARTY = ("gin", "absl", "seqio", "tensorflow", "orbax",
                         "matplotlib")


def _unit_files(unit: str) -> Iterator[pathlib.Path]:
  module = CORE_DIR / f"{unit}.py"
  if module.exists():
    yield module
  else:
    yield from sorted((CORE_DIR / unit).rglob("*.py"))


def _core_files() -> Iterator[Tuple[str, pathlib.Path]]:
  for unit in CORE:
    for path in _unit_files(unit):
      yield unit, path


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _imports(source: str, module: str,
             is_package: bool) -> Iterator[Tuple[int, str]]:
  """(line, absolute module name) of every import in `source` (module
  `module`), those inside functions too; `from a import b` yields a.b as
  well as a."""
  package = module if is_package else module.rpartition(".")[0]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
      yield node.lineno, base
      for alias in node.names:
        yield node.lineno, f"{base}.{alias.name}"


def _file_imports(path: pathlib.Path) -> Iterator[Tuple[int, str]]:
  return _imports(path.read_text(), _module_name(path),
                  path.name == "__init__.py")


def _unit_of(module: str) -> str:
  """'specdec_jax.core.decoding.loops' -> 'decoding' (and the alias
  'specdec_jax.decoding.loops' too); 'specdec_jax.metrics.timing' -> 'metrics';
  '' outside the package."""
  parts = module.split(".")
  if parts[0] != "specdec_jax" or len(parts) < 2:
    return ""
  if parts[1] == "core":
    return parts[2] if len(parts) > 2 else "core"
  return parts[1]


def _is_package_member(unit: str) -> bool:
  return unit in CORE or any((folder / f"{unit}.py").exists() or
                             (folder / unit / "__init__.py").exists()
                             for folder in (PACKAGE, CORE_DIR))


def _violations(imports) -> Iterator[str]:
  """The forbidden ones among (line, module) imports of a core file."""
  for line, module in imports:
    unit = _unit_of(module)
    if (module.split(".")[0] in FORBIDDEN_THIRD_PARTY or
        (unit not in ('', 'core') and _is_package_member(unit) and
         unit not in CORE)):
      yield f"line {line}: {module}"


def _core_graph() -> Dict[str, Set[str]]:
  graph = {unit: set() for unit in CORE}
  for unit, path in _core_files():
    for _, module in _file_imports(path):
      other = _unit_of(module)
      if other in CORE and other != unit:
        graph[unit].add(other)
  return graph


def _find_cycle(graph: Dict[str, Set[str]]):
  """A list of nodes forming a cycle, or None."""
  state = {}

  def visit(node, trail):
    state[node] = "open"
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        return trail[trail.index(nxt):] + [node, nxt] if nxt in trail else (
            trail + [node, nxt])
      if nxt not in state:
        found = visit(nxt, trail + [node])
        if found:
          return found
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node, [])
      if found:
        return found
  return None


def test_every_core_unit_exists():
  for unit in CORE:
    assert list(_unit_files(unit)), unit


@pytest.mark.parametrize("unit", CORE)
def test_core_imports_nothing_of_the_harness(unit):
  found = [
      f"{path.relative_to(REPO)} {v}" for path in _unit_files(unit)
      for v in _violations(_file_imports(path))
  ]
  assert not found, "\n".join(found)


def test_the_check_sees_a_forbidden_import():
  # The checker itself: the harness imported absolutely, relatively, and
  # gin inside a function are all reported; the core and JAX are not.
  source = ("import jax\n"
            "from specdec_jax import sampling\n"
            "from specdec_jax.core.protocols import Target\n"
            "from specdec_jax.metrics import timing\n"
            "def f():\n  import gin\n"
            "from ...experiment import drafter_registry\n")
  found = sorted(
      _violations(_imports(source, "specdec_jax.core.decoding.bad", False)))
  assert found == [
      "line 4: specdec_jax.metrics", "line 4: specdec_jax.metrics.timing",
      "line 6: gin", "line 7: specdec_jax.experiment",
      "line 7: specdec_jax.experiment.drafter_registry"
  ], found


def test_no_import_cycle_between_core_units():
  graph = _core_graph()
  assert _find_cycle(graph) is None, _find_cycle(graph)
  # The protocols are the bottom of the core: they import no other unit.
  assert graph["protocols"] == set()


def test_cycle_finder_finds_a_cycle():
  assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
  assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


# The package's root: the commands and the Python facade; everything else
# sits in a package named for what it holds (docs/architecture.md).
ROOT_MODULES = {
    "__init__", "run", "sweep", "train", "report", "certify", "pairs"
}


def _module_graph() -> Dict[str, Set[str]]:
  """Every specdec_jax module -> the modules it imports (inside functions
  too). A submodule importing its own package's facade is no edge: the
  package imports its submodules, not the reverse."""
  files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
  graph: Dict[str, Set[str]] = {m: set() for m in files}
  for module, path in files.items():
    for _, name in _file_imports(path):
      while name and name not in files:
        name = name.rpartition(".")[0]
      if name and name != module and not module.startswith(name + "."):
        graph[module].add(name)
  return graph


def test_no_import_cycle_in_the_package():
  """No two modules import each other, directly or around a loop (a lazy
  import inside a function once hid one in the gin plumbing)."""
  graph = _module_graph()
  assert len(graph) > 50
  assert "specdec_jax.config.gin_reader" in graph[
      "specdec_jax.config.gin_utils"]
  assert _find_cycle(graph) is None, _find_cycle(graph)


def test_the_package_imports_no_tool():
  """`tools/` is not installed (pyproject's packages.find): a module of the
  package that imported it would fail on a user's machine. Tools import
  the package, never the reverse (issue 57: certify imported the device
  check's chi-square)."""
  found = [
      f"{path.relative_to(REPO)}:{line}: {module}"
      for path in sorted(PACKAGE.rglob("*.py"))
      for line, module in _file_imports(path)
      if module.split(".")[0] == "tools"
  ]
  assert not found, "\n".join(found)
  installed = re.search(
      r"\[tool\.setuptools\.packages\.find\]\n(?:#.*\n)*"
      r"include = (.*)\n", (REPO / "pyproject.toml").read_text())
  assert installed and "tools" not in installed.group(1)


def test_the_root_holds_only_the_commands():
  root = {p.stem for p in PACKAGE.glob("*.py")}
  assert root == ROOT_MODULES, sorted(root ^ ROOT_MODULES)


def test_the_core_is_its_own_folder():
  """specdec_jax/core/ holds the core's units and nothing else, and none of
  them is left at the package's top level: the layout shows the line."""
  inside = {
      p.stem
      for p in CORE_DIR.iterdir()
      if p.suffix == ".py" or (p / "__init__.py").exists()
  } - {"__init__"}
  assert inside == set(CORE)
  for unit in CORE:
    assert not (PACKAGE / f"{unit}.py").exists(), unit
    assert not (PACKAGE / unit).exists(), unit


@pytest.mark.parametrize("unit", CORE)
def test_each_core_module_has_one_import_path(unit):
  """`specdec_jax.core.X` and nothing else: no alias (issue 43: an import
  hook gave every core module a second name that mypy, IDEs and readers
  could not see)."""
  import importlib  # pylint: disable=g-import-not-at-top

  import specdec_jax  # pylint: disable=g-import-not-at-top
  assert importlib.import_module(f"specdec_jax.core.{unit}")
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module(f"specdec_jax.{unit}")
  assert not hasattr(specdec_jax, unit)
  assert not any(type(f).__module__ == "specdec_jax" for f in sys.meta_path)


def test_the_harness_imports_the_core_by_its_own_path():
  """Code in this repository imports `specdec_jax.core.X`, never the alias
  kept for users (one spelling to grep for)."""
  found = []
  for root in (PACKAGE, REPO / "tools", REPO / "tests"):
    for path in sorted(root.rglob("*.py")):
      if path.name == "test_architecture.py" or path == PACKAGE / "__init__.py":
        continue
      for line, module in _file_imports(path):
        parts = module.split(".")
        if (len(parts) > 1 and parts[0] == "specdec_jax" and parts[1] in CORE):
          found.append(f"{path.relative_to(REPO)}:{line}: {module}")
  assert not found, "\n".join(found[:20])


MODE_NAMES = frozenset({"token", "block", "tree", "beam", "sample"})


def _mode_string_comparisons(source: str) -> Iterator[int]:
  """Lines comparing something to a decode mode's name (`== "tree"`,
  `in ("block", "tree")`)."""
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Compare):
      continue
    for side in [node.left, *node.comparators]:
      items = side.elts if isinstance(side, (ast.Tuple, ast.List,
                                             ast.Set)) else [side]
      if any(
          isinstance(i, ast.Constant) and i.value in MODE_NAMES for i in items):
        yield node.lineno


def test_no_mode_string_outside_the_registry():
  """A decode mode is an object of `experiment/decode_modes.py`: no other
  module compares ACCEPTANCE or DECODE to a mode's name (issue 43: 41
  copies had drifted; COMPILE_TOPOLOGY compiled the token rule for
  ACCEPTANCE='block')."""
  registry = PACKAGE / "experiment" / "decode_modes.py"
  found = [
      f"{path.relative_to(REPO)}:{line}" for root in (PACKAGE, REPO / "tools")
      for path in sorted(root.rglob("*.py")) if path != registry
      for line in _mode_string_comparisons(path.read_text())
  ]
  assert not found, "\n".join(found)


def test_the_mode_string_check_sees_a_comparison():
  assert list(
      _mode_string_comparisons('if a.acceptance == "tree": pass')) == [1]
  assert list(_mode_string_comparisons('x = a in ("block", "t")')) == [1]
  assert not list(_mode_string_comparisons('x = {"tree": 1}["tree"]'))


def _dataclass_registrations(source: str) -> Iterator[int]:
  """Lines declaring a pytree class as a JAX register_dataclass node
  (`flax.struct`, `jax.tree_util.register_dataclass`)."""
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Attribute) and (
        node.attr == "register_dataclass" or
        (node.attr == "struct" and isinstance(node.value, ast.Name) and
         node.value.id == "flax")):
      yield node.lineno
    elif isinstance(node, ast.ImportFrom) and (
        node.module == "flax.struct" or
        node.module == "flax" and any(a.name == "struct" for a in node.names)):
      yield node.lineno


def test_every_pytree_class_is_a_struct():
  """Pytree classes are `core.structs.dataclass` (a node type per class),
  never register_dataclass nodes: on JAX 0.10 jit ran one such class's
  program for another of the same fields (tests/core/test_structs.py)."""
  found = [
      f"{path.relative_to(REPO)}:{line}" for root in (PACKAGE, REPO / "tools",
                                                      TESTS)
      for path in sorted(root.rglob("*.py"))
      for line in _dataclass_registrations(path.read_text())
  ]
  assert not found, "\n".join(found)


def test_the_struct_check_sees_each_way_to_declare_one():
  source = ("import flax\n@flax.struct.dataclass\nclass A: pass\n"
            "from flax import struct\nfrom flax.struct import field\n"
            "jax.tree_util.register_dataclass(A, [], [])\n"
            "from specdec_jax.core import structs\n@structs.dataclass\n"
            "class B: pass\n")
  assert sorted(set(_dataclass_registrations(source))) == [2, 4, 5, 6]


def _imports_a_script_by_path(source: str) -> bool:
  """True when test code loads a file under scripts/ or tools/ as a
  module."""
  return bool(
      re.search(r"spec_from_file_location|runpy\.run_path|SourceFileLoader",
                source)) and ("scripts" in source or "tools" in source)


def test_no_test_imports_a_script_by_path():
  """Tests import modules (`tools.X`, `specdec_jax.X`), never a file by
  its path."""
  tests = pathlib.Path(__file__).resolve().parents[1]
  offenders = [
      p.name
      for p in sorted(tests.rglob("*.py"))
      if p.name != pathlib.Path(__file__).name and
      _imports_a_script_by_path(p.read_text(encoding="utf-8"))
  ]
  assert not offenders, offenders
  assert _imports_a_script_by_path(
      'importlib.util.spec_from_file_location(n, REPO / "scripts" / f)')


# The end-to-end tests (`slow`) live in tests/e2e/, and only there: the
# quick set is the other folders (README, "Run the tests").
TESTS = REPO / "tests"
E2E = TESTS / "e2e"


def _marks_slow(node: ast.AST) -> bool:
  """Whether `node` holds `pytest.mark.slow` (or `mark.slow`)."""
  return any(
      isinstance(n, ast.Attribute) and n.attr == "slow" and
      isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
      for n in ast.walk(node))


def _pytestmark_is_slow(body) -> bool:
  return any(
      isinstance(n, ast.Assign) and any(
          isinstance(t, ast.Name) and t.id == "pytestmark"
          for t in n.targets) and _marks_slow(n.value)
      for n in body)


def _slow_by_test(source: str) -> Dict[str, bool]:
  """Each test of a module (`test_x`, `TestY.test_z`) -> whether it is
  marked slow: by the module's `pytestmark`, its class's or its own
  decorators."""
  tree = ast.parse(source)
  module = _pytestmark_is_slow(tree.body)
  found = {}
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
      found[node.name] = module or any(
          _marks_slow(d) for d in node.decorator_list)
    elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
      cls = (module or _pytestmark_is_slow(node.body) or
             any(_marks_slow(d) for d in node.decorator_list))
      for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
          found[f"{node.name}.{item.name}"] = cls or any(
              _marks_slow(d) for d in item.decorator_list)
  return found


def test_the_slow_check_sees_each_way_to_mark_a_test():
  source = "\n".join([
      "import pytest", "pytestmark = pytest.mark.usefixtures('x')",
      "@pytest.mark.slow", "@pytest.mark.parametrize('a', [1])",
      "def test_a(a): pass", "def test_b(): pass", "def helper(): pass",
      "@pytest.mark.slow", "class TestC:", "  def test_d(self): pass",
      "class TestE:", "  @pytest.mark.slow", "  def test_f(self): pass",
      "  def test_g(self): pass"
  ])
  assert _slow_by_test(source) == {
      "test_a": True,
      "test_b": False,
      "TestC.test_d": True,
      "TestE.test_f": True,
      "TestE.test_g": False
  }
  module = "import pytest\npytestmark = [pytest.mark.slow]\ndef test_h(): pass"
  assert _slow_by_test(module) == {"test_h": True}


def test_slow_tests_live_in_e2e_and_only_there():
  """`pytest tests/e2e` is the end-to-end set and the other folders the
  quick one: a test in tests/e2e/ is marked slow (so `-m "not slow"` agrees)
  and no test elsewhere is."""
  files = sorted(TESTS.rglob("test_*.py"))
  assert len([p for p in files if p.parent == E2E]) > 10
  wrong = []
  for path in files:
    name = str(path.relative_to(REPO))
    for test, slow in _slow_by_test(path.read_text(encoding="utf-8")).items():
      if slow != (path.parent == E2E):
        wrong.append(f"{name}::{test}: " + (
            "marked slow outside tests/e2e/" if slow else "not marked slow"))
  assert not wrong, "\n".join(wrong)
