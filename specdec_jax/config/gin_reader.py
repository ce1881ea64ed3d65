"""Gin files read without gin's global configuration, by gin's own parser.

Only what gin has no public API for is written here: a second
configuration (a file read beside a live one, e.g. a distillation teacher's
model file: includes, last macro definitions and scopes resolved as gin's
`get_bindings` does, `read_t5_config`); files written for T5X
(``network.T5Config.x``), which gin cannot parse without t5x; messages
naming the file and line; and listing macros and scopes before gin parses
(`gin_file_macros`, `t5_config_scopes`), so that ``--gin.GAMA=3`` fails first.
"""
import dataclasses
import difflib
import os
import tokenize
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from specdec_jax.files import io_utils
from specdec_jax.core.models.config import json_fields
from specdec_jax.core.models.config import T5Config


def search_paths(extra: Sequence[str] = ()) -> List[str]:
  """Where gin files are looked up: the current directory, `extra`, then
  the repository's gin/ folder."""
  return [os.getcwd(), *extra, str(io_utils.GIN_DIR)]


def macro_references(value: Any) -> Set[str]:
  """Names of the `%MACRO`s inside a parsed value."""
  if isinstance(value, _Macro):
    return {value.name}
  if isinstance(value, dict):
    return set().union(*map(macro_references, value.keys()),
                       *map(macro_references, value.values()))
  if isinstance(value, (list, tuple, set)):
    return set().union(*map(macro_references, value))
  return set()


def gin_file_macros(gin_files: Sequence[str],
                    search_paths_: Optional[Sequence[str]] = None) -> Set[str]:
  """The macros that gin files (and their includes) define or use."""
  paths = search_paths_or_default(search_paths_)
  names: Set[str] = set()
  for path in gin_files:
    for st, _ in gin_statements(path, paths):
      if isinstance(st, _gin_parser().BindingStatement):
        if not st.arg_name:
          names.add(st.selector)
        names |= macro_references(st.value)
  return names


def closest_names(name: str, known: Sequence[str], n: int = 3) -> List[str]:
  """The known names closest to `name` (difflib; case-insensitive)."""
  by_upper = {k.upper(): k for k in known}
  return [
      by_upper[k] for k in difflib.get_close_matches(name.upper(), list(
          by_upper), n=n, cutoff=0.6)
  ]


_MAX_INCLUDE_DEPTH = 20


@dataclasses.dataclass(frozen=True)
class _Macro:
  """`%NAME` in a value; resolved once every file has been read."""
  name: str


@dataclasses.dataclass(frozen=True)
class _Reference:
  """`@name` or `@name()` in a value; never resolved (no configurables run)."""
  name: str
  evaluate: bool


def _gin_parser():
  """gin's parser, imported only where a gin file is read (the device
  check's GPU image has no gin, and reads model_config.json here).

  Raises:
    ImportError: gin-config is not installed (from the repository's root,
      `import gin` then finds its `gin/` folder, and fails obscurely).
  """
  try:
    from gin import config_parser  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError("reading a gin file needs gin-config, not installed "
                      "here: pip install gin-config (the project's "
                      "dependency; the repository's gin/ folder is not "
                      "it)") from None
  return config_parser


class ParserDelegate:
  """Keeps macros and references as placeholders instead of looking them up
  (gin's `config_parser.ParserDelegate`, duck-typed)."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Reference(scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return _Macro(macro_name)


class _UnresolvedValue(ValueError):
  """A value that needs gin's global state: a reference or an unknown macro."""


# (binding scope, T5Config field, raw value, "file:line").
_Binding = Tuple[str, str, Any, str]


def _candidates(path: str, folders: Sequence[str]) -> List[str]:
  """Where gin looks for `path`: itself if absolute, else in each folder."""
  if os.path.isabs(path):
    return [path]
  return [os.path.join(p, path) for p in folders]


def find_in(path: str, folders: Sequence[str]) -> Optional[str]:
  """The first existing candidate for `path` (`_candidates`), or None."""
  return next((c for c in _candidates(path, folders) if os.path.isfile(c)),
              None)


_GIN_FILES_ALLOWED = ("allowed: a gin file (a regular text file of bindings), "
                      "by path or by name on the search path, e.g. "
                      "pretrained_multi30k.gin or local_tiny.gin")


def not_a_gin_file(path: str, folders: Sequence[str]) -> str:
  """Why `path` names no gin file (`find_in` found none): what the
  first thing of that name is (a directory, a device), or not found."""
  for candidate in _candidates(path, folders):
    if os.path.isdir(candidate):
      return (f"is a directory ({candidate}), not a gin file; "
              f"{_GIN_FILES_ALLOWED}.")
    if os.path.exists(candidate):
      kind = io_utils.file_kind(os.stat(candidate).st_mode)
      if os.path.realpath(candidate) == os.devnull:
        kind += " that reads as empty"
      return (f"is not a regular file ({candidate}: {kind}); "
              f"{_GIN_FILES_ALLOWED}.")
  return f"not found in the gin search path {list(folders)}."


def find_gin_file(
    path: str, extra_search_paths: Sequence[str] = ()) -> Optional[str]:
  """Where `--gin_file=path` is read from (`search_paths`), or None."""
  return find_in(path, search_paths(extra_search_paths))


def gin_statements(path: str, search_paths: Sequence[str]):
  """Yields (statement, "file:line") of a gin file, includes expanded in
  place; ValueError: a missing file or include, bad syntax, a cycle."""

  def parse(file_path, depth):
    if depth > _MAX_INCLUDE_DEPTH:
      raise ValueError(f"{path}: include depth > {_MAX_INCLUDE_DEPTH} "
                       "(include cycle?).")
    full = find_in(file_path, search_paths)
    if full is None:
      raise ValueError(
          f"gin file {file_path!r} {not_a_gin_file(file_path, search_paths)}")
    try:
      with open(full, "r", encoding="utf-8") as f:
        text = f.read()
      statements = list(_gin_parser().ConfigParser(text, ParserDelegate()))
    # An unclosed bracket is tokenize's TokenError.
    except (OSError, SyntaxError, tokenize.TokenError) as e:
      raise ValueError(f"{full}: {e}") from None
    except UnicodeDecodeError as e:  # a binary file given as --gin_file
      raise ValueError(f"{full}: not a gin file: not UTF-8 text ({e.reason} "
                       f"at byte {e.start}).") from None
    for st in statements:
      if isinstance(st, _gin_parser().IncludeStatement):
        yield from parse(st.filename, depth + 1)
      else:
        yield st, f"{full}:{st.location.line_num}"

  yield from parse(path, 0)


def _read_statements(
    path: str,
    search_paths: Sequence[str]) -> Tuple[List[_Binding], Dict[str, Any]]:
  """The T5Config bindings of a gin file and its includes, in file order,
  and its macros at their last definition, as in gin."""
  bindings: List[_Binding] = []
  macros: Dict[str, Any] = {}
  for st, where in gin_statements(path, search_paths):
    if isinstance(st, _gin_parser().BindingStatement):
      if not st.arg_name:  # A macro definition: `NAME = value`.
        macros[st.selector] = st.value
      # `T5Config` or a module-qualified `network.T5Config` (T5X).
      elif st.selector.rsplit(".", 1)[-1] == "T5Config":
        bindings.append((st.scope, st.arg_name, st.value, where))
  return bindings, macros


def _resolve(value: Any, macros: Mapping[str, Any], where: str,
             seen: Tuple[str, ...] = ()) -> Any:
  """`value` with its macros replaced by their (final) values."""
  if isinstance(value, _Macro):
    if value.name not in macros:
      raise _UnresolvedValue(f"{where}: macro %{value.name} is not defined "
                             "in the model gin file(s).")
    if value.name in seen:
      raise ValueError(f"{where}: macro %{value.name} is defined in terms of "
                       "itself.")
    return _resolve(macros[value.name], macros, where, seen + (value.name,))
  if isinstance(value, _Reference):
    raise _UnresolvedValue(
        f"{where}: configurable reference @{value.name}"
        f"{'()' if value.evaluate else ''} is not supported for a T5Config "
        "field.")
  if isinstance(value, dict):
    return {k: _resolve(v, macros, where, seen) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(_resolve(v, macros, where, seen) for v in value)
  return value


def search_paths_or_default(folders: Optional[Sequence[str]]) -> List[str]:
  """`folders`, or by default `search_paths()`."""
  return search_paths() if folders is None else list(folders)


def t5_config_from_fields(fields: Mapping[str, Any], what: str) -> T5Config:
  """A T5Config of `fields` (others at their defaults; gin never applies);
  ValueError naming `what` for an unknown field or a rejected value."""
  known = {f.name: f for f in dataclasses.fields(T5Config)}
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise ValueError(f"{what}: unknown T5Config field(s) {unknown}.")
  # Every field explicit, so global `T5Config.*` gin bindings cannot leak in.
  full = {name: fields.get(name, f.default) for name, f in known.items()}
  try:
    return T5Config(**full)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{what}: invalid T5Config: {e}") from None


def t5_config_fields(config: T5Config) -> Dict[str, Any]:
  """JSON-ready fields of a T5Config (`t5_config_from_fields`' inverse);
  `encoder_width` left out when None, so older records compare equal."""
  return json_fields(config, omit_none=("encoder_width",))


def t5_config_scopes(path: str,
                     search_paths: Optional[Sequence[str]] = None) -> Set[str]:
  """The gin scopes that a model gin file binds T5Config under ('' unscoped;
  arguments and errors as `read_t5_config`)."""
  bindings, _ = _read_statements(path, search_paths_or_default(search_paths))
  return {scope for scope, _, _, _ in bindings}


def read_t5_config(path: str, scope: str = "",
                   search_paths: Optional[Sequence[str]] = None, *,
                   allow_unresolved_dtype: bool = False) -> T5Config:
  """The ``T5Config.*`` bindings of a model gin file, read under `scope` as
  gin would (``target/T5Config.x`` overrides enclosing scopes' and unscoped
  bindings; macros, includes, block form and ``network.T5Config``), without
  touching gin's global configuration; unbound fields keep the defaults.

  `path` and its includes are looked up in `search_paths` (default:
  `search_paths()`); with `allow_unresolved_dtype` a ``dtype`` that needs
  gin's global state keeps the default (the caller sets it).

  Raises:
    ValueError: a missing file or include, bad syntax, no T5Config binding
      under `scope` or unscoped, a value that needs gin's global state, or
      fields that T5Config rejects.
  """
  bindings, macros = _read_statements(path,
                                      search_paths_or_default(search_paths))
  parts = scope.split("/") if scope else []
  # The scopes that apply under `scope`, least specific first: '', 'a', 'a/b'.
  applicable = ["/".join(parts[:i]) for i in range(len(parts) + 1)]
  raw: Dict[str, Tuple[Any, str]] = {}
  for s in applicable:
    for binding_scope, name, value, where in bindings:
      if binding_scope == s:
        raw[name] = (value, where)
  if not raw:
    raise ValueError(f"{path}: binds no T5Config" +
                     (f" under the {scope}/ scope or" if scope else "") +
                     " unscoped.")
  fields = {}
  for name, (value, where) in raw.items():
    try:
      fields[name] = _resolve(value, macros, where)
    except _UnresolvedValue:
      if not (name == "dtype" and allow_unresolved_dtype):
        raise
  return t5_config_from_fields(fields, f"model gin file {path}")


# Scopes that the repository's model files bind T5Config under.
MODEL_ROLES = ("target", "draft")


def read_t5_config_for_role(path: os.PathLike,
                            role: str = "") -> Tuple[T5Config, str]:
  """(config, scope): `read_t5_config` under `role`, or under the other
  role's scope when the file binds only that one (a draft file given as
  the target); includes also looked up in the file's folder; a dtype the
  file cannot resolve keeps the default. ValueError as `read_t5_config`."""
  path = os.path.abspath(path)
  paths = search_paths([os.path.dirname(path)])
  scopes = t5_config_scopes(path, paths)
  scope = role
  if role not in scopes and "" not in scopes:
    others = [s for s in MODEL_ROLES if s in scopes]
    if len(others) > 1:
      raise ValueError(f"{path}: binds no T5Config" +
                       (f" under the {role}/ scope or" if role else "") +
                       " unscoped (it binds both target/ and draft/T5Config).")
    if others:
      scope = others[0]
  config = read_t5_config(path, scope, paths, allow_unresolved_dtype=True)
  return config, scope
