"""Size limits that keep the code readable (docs/architecture.md).

No module of the package or of the tools (`tools/`) is over 600 lines and
no function over 80 (docstring included): past that, a file holds more
than one idea.
Read from the source with `ast`; nothing is imported.
"""
import ast
import pathlib
import textwrap
from typing import Iterator, Tuple

from conftest import REPO

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
ROOTS = ("specdec_jax", "tools")


def _python_files() -> Iterator[pathlib.Path]:
  for root in ROOTS:
    yield from sorted((REPO / root).rglob("*.py"))


def _oversized(source: str, name: str) -> Iterator[Tuple[str, int]]:
  """(what, lines) for the module and each function over its limit."""
  lines = source.count("\n")
  if lines > MAX_MODULE_LINES:
    yield name, lines
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      length = node.end_lineno - node.lineno + 1
      if length > MAX_FUNCTION_LINES:
        yield f"{name}:{node.lineno} {node.name}", length


def test_the_check_sees_a_long_function_and_a_long_module():
  body = "\n".join(f"  x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
  source = f"def long():\n{body}\n" + "\n" * MAX_MODULE_LINES
  found = dict(_oversized(source, "m.py"))
  assert found["m.py:1 long"] == MAX_FUNCTION_LINES + 1
  assert found["m.py"] > MAX_MODULE_LINES
  short = textwrap.dedent("""
      def short():
        return 1
      """)
  assert not list(_oversized(short, "s.py"))


def test_no_module_or_function_over_its_limit():
  files = list(_python_files())
  assert len(files) > 50  # the walk found the package
  found = [
      f"{what}: {lines} lines" for path in files for what, lines in _oversized(
          path.read_text(), str(path.relative_to(REPO)))
  ]
  assert not found, (
      f"over {MAX_MODULE_LINES} lines per module or {MAX_FUNCTION_LINES} "
      "per function (split by idea):\n" + "\n".join(found))
