"""Every path and dotted name in backticks in README.md and docs/ names
something that exists (issue 57: pages pointed at moved files and at
attributes that never were; test_docs.py checks links and fenced commands).

Each inline code span (outside fenced blocks, and not the text of a link
to a URL, which names the page linked) is read by the first rule that fits:

* A command. `python -m X ...`: module X exists (a package by its
  `__main__`). `from X import Y`: the name X.Y. Any other span with a
  space (a shell line, a binding `run.gamma = %GAMMA`, a call with
  arguments `decoding.speculative_sample(target, draft, ...)`) is read by
  its name before the arguments, or else its first word (after `bash`).
* A path: it has a `/` or ends in a known file extension. `*`, `<N>`, `…`,
  `...` and a lone capital (`gin/models/X.gin`) match anything, `{a,b}`
  both; a suffix `:12`, `::test` (the test is defined) or `:Name` / `.Name`
  (the name resolves in the module) is allowed and checked. It must exist
  - from the repository's root, when its first part is an entry of the
    root (`tools/`, `gin/run.gin`, `README.md`, `.ci/run`);
  - beside a folder of that name, when its first part names a folder of
    the code or configs (`experiment/plan.py` in specdec_jax/,
    `models/target/` in gin/); a module may be named without `.py`;
  - somewhere in the repository, for a bare source file name (.py, .gin,
    .yaml, .sh, .cc: gin/ and configs/ are search paths, and pages name a
    module by its file: `ende_small.gin`, `loops.py`).
  Any other path is not the repository's and is not checked: absolute,
  home or hidden paths, a run's files (`OUTPUT_DIR/...`, a bare
  `metrics.json`), URLs, another project's files (`t5x/train.py`). So a
  page names a file that is not the repository's with its folder.
  `scope/Configurable.param` is a gin scope: the binding, as below.
* A dotted name `a.b.c` is resolved by importing and walking attributes
  (class attributes, dataclass fields, annotations and properties count;
  nothing below a field or property is checked), when its root is
  - `specdec_jax` or `tools`;
  - the last part of exactly one module of specdec_jax/ or tools/
    (`decoding`, `run_metrics`, `pairs`); a last part that several modules
    share (`config`, `data`, `common`) is ambiguous: the page writes more;
  - a capitalised name defined at the top of one module there
    (`T5Model.packed`);
  - a gin configurable of the package (`run.gamma`, `vocabulary.extra_ids`,
    also under a scope): when attributes do not resolve a two-part name,
    its second part must be one of the configurable's parameters.
  A root that is a top-level key of an output (a `RunMetrics` field such
  as `auto`, a device-check phase such as `physics`) starts a key path
  (`auto.calibration`), held by the outputs' own tests. A capitalised root
  defined nowhere fails, unless EXTERNAL lists it with its reason; any
  other root is someone else's (`jax.jit`), a variable or a key
  (`cache.length`, `greedy.all_identical`): not checked.
* A capitalised identifier alone (`T5Model`, `Loaded`) is a top-level name
  of a module there, Python's (`None`) or in EXTERNAL.
* Anything else is a value, a setting or a word: macros and gin bindings
  (`GAMMA=3`, `--gin.X=...`), flags, numbers, quoted strings, lower-case
  words (`alpha`): not checked.

History: CHANGELOG.md is not read (it names what each change removed or
renamed, in the names of the day). A dated page of docs/results/ is
checked like any page (its commands and data files must be today's, so
that what it measured can be run again), except that a page that says
"Module names on this page are as they were then" keeps the code's names
of its date: its dotted names, capitalised identifiers and paths of
Python modules of specdec_jax/ and tools/ are not checked
(docs/results/README.md says so).
"""
import ast
import builtins
import dataclasses
import fnmatch
import functools
import glob
import importlib
import importlib.util
import inspect
import pathlib
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
HISTORY_NOTE = "Module names on this page are as they were then"
# Names the docs use that are not the code's, and why the docs name them.
EXTERNAL = {
    # T5X's model class, whose decoding the T5X comparison reproduces.
    "EncoderDecoderModel",
    # absl's flag container, into which config/ parses its flags.
    "FlagValues",
}
EXTENSIONS = ("py", "gin", "yaml", "yml", "json", "jsonl", "md", "sh", "cc",
              "toml", "txt", "tsv", "csv", "png", "svg", "npz", "whl", "log",
              "model", "msgpack", "en", "de")  # Multi30k's text: train.de
SOURCE = ("py", "gin", "yaml", "sh", "cc")
# The code: its modules are what dotted names name.
PACKAGES = ("specdec_jax", "tools")
IDENT = r"[A-Za-z_]\w*"
DOTTED = re.compile(rf"{IDENT}(?:\.(?:\w+|\*|<[^>]*>))+")
CAPITALISED = re.compile(r"[A-Z]\w*[a-z]\w*")


# ---------------------------------------------------------------------------
# What the repository holds.
# ---------------------------------------------------------------------------
@functools.lru_cache(None)
def _ignored() -> Tuple[Tuple[bool, str], ...]:
  """.gitignore's patterns as (anchored at the root, name pattern), and
  .git."""
  lines = (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
  return tuple((line.startswith("/"), line.strip("/"))
               for line in map(str.strip, lines)
               if line and not line.startswith(("#", "!"))) + ((True, ".git"),)


def _tree(folder: pathlib.Path) -> Iterator[pathlib.Path]:
  at_root = folder == REPO
  for path in sorted(folder.iterdir()):
    if any(
        fnmatch.fnmatch(path.name, pattern) and (at_root or not anchored)
        for anchored, pattern in _ignored()):
      continue
    if path.is_dir() and not path.is_symlink():
      yield from _tree(path)
    elif path.is_file():
      yield path


@functools.lru_cache(None)
def _files() -> Tuple[pathlib.Path, ...]:
  """The repository's files: all but what .gitignore leaves out (virtual
  environments, caches, run outputs)."""
  return tuple(_tree(REPO))


def _parts(path: pathlib.Path) -> Tuple[str, ...]:
  return path.relative_to(REPO).parts


@functools.lru_cache(None)
def _roots() -> Set[str]:
  """The entries of the repository's root (`tools`, `README.md`, `.ci`)."""
  return {_parts(f)[0] for f in _files()}


@functools.lru_cache(None)
def _folders() -> Dict[str, List[pathlib.Path]]:
  """Folder name -> the folders holding a folder of that name, in the code
  and configs (not benchmarks/ or pretrained/, whose run names would make
  other projects' paths read as ours)."""
  out: Dict[str, Set[pathlib.Path]] = {}
  for file in _files():
    if _parts(file)[0] in (*PACKAGES, "gin", "configs"):
      for folder in file.relative_to(REPO).parents:
        if len(folder.parts) > 1:
          out.setdefault(folder.name, set()).add(REPO / folder.parent)
  return {name: sorted(holders) for name, holders in out.items()}


@functools.lru_cache(None)
def _modules() -> Dict[str, pathlib.Path]:
  """Dotted module name -> its file, for specdec_jax/ and tools/."""
  out = {}
  for file in _files():
    parts = list(_parts(file))
    if parts[0] in PACKAGES and file.suffix == ".py":
      parts[-1] = file.stem
      if parts[-1] == "__init__":
        parts.pop()
      if parts[-1] != "__main__":
        out[".".join(parts)] = file
  return out


@functools.lru_cache(None)
def _short_modules() -> Dict[str, List[str]]:
  out: Dict[str, List[str]] = {}
  for name in _modules():
    out.setdefault(name.rpartition(".")[2], []).append(name)
  return out


def _top_level_names(tree: ast.Module) -> Iterator[str]:
  for node in tree.body:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
      yield node.name
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      yield from (t.id for t in targets if isinstance(t, ast.Name))


def _gin_names(tree: ast.Module) -> Iterator[Tuple[str, str]]:
  """(gin name, Python name) of each `gin.configurable` in a module: as a
  decorator (`@gin.configurable("run")`) or a call on a name."""
  for node in tree.body:
    for deco in getattr(node, "decorator_list", []):
      func = deco.func if isinstance(deco, ast.Call) else deco
      if isinstance(func, ast.Attribute) and func.attr == "configurable":
        args = deco.args if isinstance(deco, ast.Call) else []
        named = [a.value for a in args if isinstance(a, ast.Constant)]
        yield (named or [node.name])[0], node.name
    call = node.value if isinstance(node, ast.Expr) else None
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and
        call.func.attr == "configurable" and call.args and
        isinstance(call.args[0], ast.Name)):
      yield call.args[0].id, call.args[0].id


@functools.lru_cache(None)
def _definitions() -> Tuple[Dict[str, List[str]], Dict[str, Tuple[str, str]]]:
  """(top-level name -> the modules defining it, gin name -> (module,
  Python name)), read from the source with `ast`, nothing imported."""
  names: Dict[str, List[str]] = {}
  gin: Dict[str, Tuple[str, str]] = {}
  for module, path in _modules().items():
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for name in _top_level_names(tree):
      names.setdefault(name, []).append(module)
    for gin_name, name in _gin_names(tree):
      gin[gin_name] = (module, name)
  return names, gin


@functools.lru_cache(None)
def _output_keys() -> Set[str]:
  """The top-level keys of metrics.json and device_check.json."""
  from specdec_jax.metrics import run_metrics
  from tools.device_check import common
  fields = {f.name for f in dataclasses.fields(run_metrics.RunMetrics)}
  return fields | set(common.PHASES)


# ---------------------------------------------------------------------------
# Names.
# ---------------------------------------------------------------------------
def _member(obj, name: str) -> Tuple[bool, bool]:
  """(whether `obj` has attribute `name`, whether its value can be walked
  further: not a field, an annotation or a property)."""
  for klass in inspect.getmro(obj) if inspect.isclass(obj) else ():
    if (name in getattr(klass, "__dataclass_fields__", {}) or
        name in klass.__dict__.get("__annotations__", {}) or
        isinstance(klass.__dict__.get(name), property)):
      return True, False
  return hasattr(obj, name), True


def _walk(obj, parts: List[str]) -> Optional[str]:
  """None if `parts` resolve as attributes from `obj`, else why not."""
  for part in parts:
    if part == "*" or part.startswith("<"):
      return None  # `T5Config.*`, `exactness.modes.<mode>`: any
    if inspect.ismodule(obj) and not hasattr(obj, part):
      try:  # a submodule that its package does not import
        importlib.import_module(f"{obj.__name__}.{part}")
      except ModuleNotFoundError:
        pass
    found, walkable = _member(obj, part)
    if not found:
      owner = getattr(obj, "__name__", type(obj).__name__)
      return f"{owner} has no attribute {part!r}"
    if not walkable:
      return None
    obj = getattr(obj, part)
  return None


def _gin_parameter(configurable: str, parameter: str) -> Optional[str]:
  module, name = _definitions()[1][configurable]
  obj = getattr(importlib.import_module(module), name)
  if dataclasses.is_dataclass(obj):
    allowed = {f.name for f in dataclasses.fields(obj)}
  else:
    allowed = set(inspect.signature(obj).parameters)
  if parameter in allowed or parameter == "*":
    return None
  return f"gin's {configurable} has no parameter {parameter!r}"


def resolve_name(name: str) -> Optional[str]:
  """None if dotted `name` resolves or is not the code's, else why not."""
  root, *rest = name.split(".")
  names, gin = _definitions()
  if root in _output_keys():
    return None  # a key path of metrics.json or device_check.json
  if root in PACKAGES:
    start = importlib.import_module(root)
  elif root in _short_modules():
    modules = _short_modules()[root]
    if len(modules) > 1:
      return f"{root} is ambiguous ({', '.join(sorted(modules))})"
    start = importlib.import_module(modules[0])
  elif root in names and CAPITALISED.fullmatch(root):
    if len(names[root]) > 1:
      return f"{root} is defined in {', '.join(names[root])}: name the module"
    start, rest = importlib.import_module(names[root][0]), [root, *rest]
  elif root in gin:
    return _gin_parameter(root, rest[0]) if len(rest) == 1 else None
  elif CAPITALISED.fullmatch(root) and root not in EXTERNAL:
    return f"{root} is defined nowhere in {' or '.join(PACKAGES)}"
  else:
    return None  # someone else's, a variable or a key
  why = _walk(start, rest)
  if why and root in gin and name.count(".") == 1:
    return _gin_parameter(root, name.split(".")[1])
  return why


def resolve_module(module: str, runnable: bool = True) -> Optional[str]:
  """None if `python -m module` finds it (`runnable`) or module exists,
  else why not."""
  try:
    spec = importlib.util.find_spec(module)
  except ModuleNotFoundError:
    spec = None
  if spec is None:
    return f"no module {module}"
  if (runnable and spec.submodule_search_locations is not None and
      importlib.util.find_spec(f"{module}.__main__") is None):
    return f"package {module} has no __main__"
  return None


# ---------------------------------------------------------------------------
# Paths.
# ---------------------------------------------------------------------------
def _patterns(path: str) -> List[str]:
  """Glob patterns for a path with placeholders and `{a,b}` alternatives."""
  path = re.sub(r"<[^>]*>|…|\.\.\.|(?<![\w.])[A-Z](?!\w)", "*", path)
  match = re.search(r"\{([^{}]*)\}", path)
  if not match:
    return [path]
  return [
      p for alt in match.group(1).split(",")
      for p in _patterns(path[:match.start()] + alt + path[match.end():])
  ]


def _glob(bases: List[pathlib.Path], path: str) -> List[pathlib.Path]:
  return [
      pathlib.Path(p)
      for base in bases
      for pattern in _patterns(path.rstrip("/"))
      for p in glob.glob(str(base / pattern))
  ]


def _locate(path: str) -> Tuple[Optional[List[pathlib.Path]], str]:
  """(the files or folders `path` names, None when it is not the
  repository's), its suffix (`:12`, `::test`, `:Name`, `.Name`)."""
  path, colon, suffix = path.partition(":")
  suffix = colon + suffix
  first = path.split("/")[0]
  if first in _roots():
    bases = [REPO]
  elif "/" in path and first in _folders():
    bases = _folders()[first]
  elif "/" not in path and path.rpartition(".")[2] in SOURCE:
    patterns = _patterns(path)
    return [
        f for f in _files() if any(
            fnmatch.fnmatch(f.name, p) for p in patterns)
    ], suffix
  else:
    return None, suffix
  found = _glob(bases, path)
  stem, dot, attribute = path.rpartition("/")[2].partition(".")
  if not found and attribute not in EXTENSIONS:  # `experiment/plan.RunPlan`
    found = _glob(bases, path[:len(path) - len(attribute) - len(dot)] + ".py")
    suffix = f".{attribute}{suffix}" if dot else suffix
  return found, suffix


def _check_suffix(files: List[pathlib.Path], suffix: str) -> Optional[str]:
  """`::test` is defined in the file; `:Name` / `.Name` resolves in it."""
  if not suffix or re.fullmatch(r":\d+(-\d+)?", suffix):
    return None
  if suffix.startswith("::"):
    name = suffix[2:]
    if any(re.search(rf"def {name}\b", f.read_text()) for f in files):
      return None
    return f"no test {name}"
  module = [m for m, f in _modules().items() if f == files[0]]
  if not module:
    return f"{files[0]} is not a module of {' or '.join(PACKAGES)}"
  return _walk(importlib.import_module(module[0]), suffix[1:].split("."))


def resolve_path(path: str) -> Optional[str]:
  """None if `path` exists or is not the repository's, else why not."""
  scope = re.fullmatch(rf"\w+/({IDENT})((?:\.[\w*]+)?)", path)
  if (scope and scope.group(1) in _definitions()[1] and
      scope.group(2)[1:] not in EXTENSIONS):
    return resolve_name(scope.group(1) + scope.group(2))  # a gin scope
  files, suffix = _locate(path)
  if files is None:
    return None
  if not files:
    return "no such file"
  return _check_suffix(files, suffix)


def _is_module_path(path: str) -> bool:
  """A path of a Python module of specdec_jax/ or tools/ (a .py file, or
  a module's name without it) or a bare .py file's name: what
  HISTORY_NOTE's pages keep as it was."""
  path = path.partition(":")[0].rstrip("/")
  stem, dot, extension = path.rpartition("/")[2].partition(".")
  if dot and extension != "py":
    return False
  first = path.split("/")[0]
  holders = [REPO] if first in _roots() else _folders().get(first, [])
  return "/" not in path or any(
      _parts(holder / first)[0] in PACKAGES for holder in holders)


# ---------------------------------------------------------------------------
# The pages.
# ---------------------------------------------------------------------------
def spans(text: str) -> Iterator[Tuple[int, str]]:
  """(line, text) of every inline code span outside fenced blocks and
  links to URLs."""
  blank = lambda m: "\n" * m.group().count("\n")
  text = re.sub(r"^[ \t]*```.*?^[ \t]*```", blank, text, flags=re.M | re.S)
  text = re.sub(r"\[[^\]]*\]\([a-z]+:[^)]*\)", blank, text)
  for match in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.S):
    if "\n\n" not in match.group(2):
      line = text.count("\n", 0, match.start()) + 1
      yield line, " ".join(match.group(2).split())


def _is_path(word: str) -> bool:
  if re.match(r"[a-z][\w+.-]*:", word) and not re.match(r"\w+\.\w+:", word):
    return False  # a URL's scheme (`gs:`), a label (`auto:`)
  extension = rf"\.({'|'.join(EXTENSIONS)})(:\S*)?$"
  return "/" in word or re.search(extension, word) is not None


def check_span(span: str, history: bool = False) -> Optional[str]:
  """Why `span` names nothing, or None if it holds or is not checked;
  `history`: on a page with HISTORY_NOTE."""
  module = re.match(r"python3? -m ([\w.]+)(…|<)?", span)
  if module and module.group(2):  # `python -m tools.…`: the package
    return resolve_module(module.group(1).rstrip("."), runnable=False)
  if module:
    return resolve_module(module.group(1))
  imported = re.fullmatch(r"from ([\w.]+) import (\w+)", span)
  span = ".".join(imported.groups()) if imported else span
  span = re.sub(r"^(bash|sh) ", "", span)
  call = re.match(rf"({IDENT}(?:\.{IDENT})*)\(.*\)$", span)
  word = call.group(1) if call else span.split(" ")[0]
  if re.match(r"[/~$.]", word) and word.split("/")[0] not in _roots():
    return None  # absolute, home, a variable's, hidden, an extension
  if "=" in word or "://" in word:
    return None  # a setting, a URL
  if _is_path(word):
    return None if history and _is_module_path(word) else resolve_path(word)
  if history:
    return None
  if DOTTED.fullmatch(word):
    return resolve_name(word)
  alone = call or " " not in span  # not a sentence's first word
  if (alone and CAPITALISED.fullmatch(word) and
      word not in _definitions()[0] and word not in EXTERNAL and
      word not in dir(builtins)):
    return f"{word} is defined nowhere in {' or '.join(PACKAGES)}"
  return None


def failures(page: pathlib.Path) -> List[str]:
  text = page.read_text(encoding="utf-8")
  history = (page.parent.name == "results" and page.name != "README.md" and
             HISTORY_NOTE in " ".join(text.split()))
  out = []
  for line, span in spans(text):
    why = check_span(span, history)
    if why:
      out.append(f"{page.relative_to(REPO)}:{line}: `{span}`: {why}")
  return out


@pytest.mark.parametrize("page", PAGES,
                         ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_path_and_name_in_backticks_exists(page):
  found = failures(page)
  assert not found, "\n" + "\n".join(found)


# ---------------------------------------------------------------------------
# The rules themselves, on names that exist and names that do not.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "span",
    [
        "specdec_jax/core/decoding/acceptance.py",  # issue 57's three
        "decoding.acceptance.Verdict",
        "decoding.acceptance.lenient_distribution",
        "scripts/benchmark_decode.py",
        "experiment/no_such_module.py",
        "gin/models/X.yml",
        "no_such_experiment.gin",
        "tests/project/test_doc_names.py::test_no_such_test",
        "specdec_jax/core/acceptance.py:NoSuchRule",
        "core/decoding/programs.NoSuchProgram",
        "python -m tools.no_such_tool",
        "python -m no_such_package.…",
        "python -m specdec_jax.core",  # a package without __main__
        "from specdec_jax.core import no_such_unit",
        "T5Config.no_such_field",
        "draft/T5Config.no_such_field",
        "vocabulary.no_such_parameter = 3",
        "NoSuchClass",
        "NoSuchClass.method",
        "config.gin_utils",  # three modules end in `config`
        "decoding.speculative_sample_typo(target, draft, inputs, rng)",
    ])
def test_a_name_that_does_not_exist_fails(span):
  assert check_span(span)


@pytest.mark.parametrize(
    "span",
    [
        "specdec_jax/core/acceptance.py",
        "decoding.Verdict",
        "acceptance.lenient_distribution",
        "specdec_jax.core.models.T5Config",
        "experiment/plan",
        "experiment/plan.py",
        "core/decoding/programs.LoopProgram",
        "specdec_jax/core/acceptance.py:ExactAcceptance",
        "specdec_jax/core/acceptance.py:12",
        "tests/project/test_doc_names.py::test_a_name_that_does_not_exist_fails",
        "ende_small.gin",
        "gin/models/X.gin",
        "gin/multi30k_38m_shared_{1m,4m}.gin",
        "models/target/t5_1_1_<size>.gin",
        "benchmarks/*.json",
        "python -m tools.device_check --preflight",
        "python -m specdec_jax.core.kernels",
        "python -m tools.benchmarks.…",
        "bash scripts/device_check.sh --small",
        "from specdec_jax.core import decoding",
        "T5Config.num_heads",  # a dataclass field
        "T5Config.*",
        "draft/T5Config.num_heads",  # under a gin scope
        "vocabulary.extra_ids",  # a gin configurable's parameter
        "decoding.speculative_sample(target, draft, inputs, rng, gamma=4)",
        "Verdict",
        "EncoderDecoderModel.predict_batch_with_aux",  # EXTERNAL
    ])
def test_a_name_that_exists_holds(span):
  assert check_span(span) is None


@pytest.mark.parametrize("span", [
    "/tmp/no_such.py", "~/.cache/no_such", "OUTPUT_DIR/no_such.json",
    "no_such_output.json", "t5x/no_such.py", "gs://bucket/no_such.gin",
    "GAMMA=3", "--gin.NO_SUCH=1", "auto.no_such_key", "physics.no_such_key",
    "jax.no_such", "cache.no_such", "no_such_word", "NO_SUCH_MACRO"
])
def test_what_is_not_the_codes_is_not_checked(span):
  assert check_span(span) is None


def test_a_dated_page_with_the_note_keeps_its_module_names_not_its_paths():
  for span in ("experiment/no_such_module", "decoding.no_such_name",
               "NoSuchClass", "specdec_jax/no_such.py"):
    assert check_span(span) and check_span(span, history=True) is None
  for span in ("scripts/no_such_script.py", "benchmarks/no_such.json",
               "python -m tools.no_such_tool", "gin/no_such.gin"):
    assert check_span(span, history=True)
