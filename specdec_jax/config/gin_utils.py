"""Gin and absl-flag plumbing shared by the entry points (T5X style):
`--gin_file`, `--gin_bindings`, `--gin_search_paths`, `--gin.NAME=VALUE`;
macros nothing reads are refused before gin parses; `report` parses into a
`FlagValues` of its own (`flag_utils.new_flag_values`). A bad value is a
`flag_utils.ConfigError`: one line, exit 2.
"""
import dataclasses
import logging as std_logging
import os
import re
import sys
import tokenize
from typing import Any, Dict, List, Optional, Sequence, Set

from absl import flags
import gin
from gin import config_parser

from specdec_jax.config import flag_utils
from specdec_jax.config import gin_reader
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig

# The core never imports gin: its configs are made configurable here.
gin.configurable(T5Config)
gin.configurable(FeatureDrafterConfig)


def define_gin_flags() -> None:
  """Defines the T5X-style gin flags (idempotent)."""
  if "gin_file" in flags.FLAGS:
    return
  flags.DEFINE_multi_string(
      "gin_file", [], "Gin files to parse, in order; "
      "bare names are looked up on the search path.")
  flags.DEFINE_multi_string(
      "gin_bindings", [], "Individual gin bindings, "
      "applied after the files.")
  flags.DEFINE_list(
      "gin_search_paths", [], "Extra folders searched for gin "
      "files (the package's gin/ folder is always searched).")


def rewrite_gin_args(argv: Sequence[str]) -> List[str]:
  """Turns `--gin.NAME=VALUE` into `--gin_bindings=NAME=VALUE` (as T5X)."""
  out = []
  for arg in argv:
    if arg.startswith("--gin."):
      name_value = arg[len("--gin."):]
      if "=" not in name_value:
        raise ValueError(f"{arg!r}: expected --gin.NAME=VALUE.")
      out.append(f"--gin_bindings={name_value}")
    else:
      out.append(arg)
  return out


def _not_gin_lookup_noise(record: std_logging.LogRecord) -> bool:
  """False for gin's lines (one an ERROR) for every search folder that
  lacks a bare file name; a file found nowhere is reported by `parse_gin`."""
  return not (record.pathname.endswith(os.path.join(
      "gin", "resource_reader.py")) and str(record.msg).startswith(
          ("Path not found", "system_path_file_exists")))


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str],
              extra_search_paths: Sequence[str] = (), finalize: bool = True,
              check_macros: bool = False) -> None:
  """Parses gin files and bindings with the search paths set up, after the
  checks that raise flag_utils.ConfigError (missing file, macros nothing
  reads)."""
  paths = gin_reader.search_paths(extra_search_paths)
  for path in paths:
    gin.add_config_file_search_path(path)
  for name in gin_files:
    if gin_reader.find_in(name, paths) is None:
      raise flag_utils.ConfigError(
          f"--gin_file={name!r} {gin_reader.not_a_gin_file(name, paths)}")
  if check_macros:
    check_macro_bindings(gin_bindings,
                         gin_reader.gin_file_macros(gin_files, paths))
  check_unused_macros(gin_files, gin_bindings, paths)
  std_logging.getLogger().addFilter(_not_gin_lookup_noise)
  try:
    gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                        finalize_config=finalize)
  finally:
    std_logging.getLogger().removeFilter(_not_gin_lookup_noise)


def gin_files_flag() -> List[str]:
  """The --gin_file values, in order."""
  return list(flags.FLAGS.gin_file)


def parse_from_flags(finalize: bool = True, check_macros: bool = True) -> None:
  """Parses --gin_file/--gin_bindings; unknown macros raise
  flag_utils.ConfigError."""
  f = flags.FLAGS
  parse_gin(f.gin_file, f.gin_bindings, f.gin_search_paths, finalize,
            check_macros=check_macros)


def run_main(main, argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run(main)` with `--gin.X=Y` support; a bad flag is a
  flag_utils.ConfigError (one line, exit 2), not absl's "FATAL" and exit 1."""
  from absl import app  # pylint: disable=g-import-not-at-top
  argv = rewrite_gin_args(sys.argv if argv is None else argv)
  app.run(main, argv=argv, flags_parser=_parse_flags)


def _parse_flags(argv: Sequence[str]) -> Sequence[str]:
  return [
      argv[0], *flag_utils.parse_flag_values(flags.FLAGS, argv[0], argv[1:])
  ]


# -- gin macros ----------------------------------------------------------------
# A macro defined and read by nothing is a typo gin ignores in silence
# (`GAMA = 3` in a file, `--gin.NUM_STEP=3`). Macros read by code
# (gin.query_parameter) rather than by a `%NAME`: none today.
MACROS_READ_BY_CODE: frozenset = frozenset()


def binding_statements(text: str):
  """The statements of one `--gin_bindings` string; flag_utils.ConfigError
  when it does not parse, saying how to quote a string."""
  try:
    return list(config_parser.ConfigParser(text, gin_reader.ParserDelegate()))
  except (SyntaxError, tokenize.TokenError) as e:
    token = re.search(r"Failed to parse token '([^']*)'", str(e))
    why = (f"{token.group(1)!r} is not a gin value (a number, True/False, "
           "None, a quoted string, a list, tuple or dict of those, or "
           "%MACRO / @configurable; a string needs quotes, e.g. "
           "--gin.NAME=\"'text'\")"
           if token else _AST_REPR.sub("", str(e)).strip())
    raise flag_utils.ConfigError(
        f"{binding_flag(text)}: not a gin binding: {why}.") from None


_AST_REPR = re.compile(r":?\s*<ast\.\w+ object at 0x[0-9a-f]+>")


def check_unused_macros(gin_files: Sequence[str], gin_bindings: Sequence[str],
                        search_paths_: Optional[Sequence[str]] = None) -> None:
  """flag_utils.ConfigError for a macro a file or binding defines and
  nothing reads, naming where, the macro and the closest one read."""
  paths = gin_reader.search_paths_or_default(search_paths_)
  defined: Dict[str, str] = {}
  used: Set[str] = set(MACROS_READ_BY_CODE)
  for path in gin_files:
    for st, where in gin_reader.gin_statements(path, paths):
      if isinstance(st, config_parser.BindingStatement):
        if not st.arg_name:
          defined.setdefault(st.selector, f"{where}: {st.selector} = ...")
        used |= gin_reader.macro_references(st.value)
  in_bindings, used_in_bindings = _binding_macros(gin_bindings)
  defined.update({n: binding_flag(t) for n, t in in_bindings.items()})
  used |= used_in_bindings
  for name, where in defined.items():
    if name not in used:
      raise flag_utils.ConfigError(
          f"{where}: macro {name!r} is defined but nothing reads it (no "
          f"%{name} in any gin file or binding), so it would be silently "
          f"ignored; {_did_you_mean(name, sorted(used))}macros read: "
          f"{', '.join(sorted(used))}.")


def _binding_macros(gin_bindings: Sequence[str]):
  """({macro: the binding defining it}, {macros the bindings use})."""
  defined, used = {}, set()
  for text in gin_bindings:
    for st in binding_statements(text):
      if isinstance(st, config_parser.BindingStatement):
        if not st.arg_name:
          defined[st.selector] = text
        used |= gin_reader.macro_references(st.value)
  return defined, used


def _did_you_mean(name: str, known: Sequence[str]) -> str:
  close = gin_reader.closest_names(name, known)
  return f"did you mean {' or '.join(close)}? " if close else ""


def binding_flag(text: str) -> str:
  """How the user typed a binding: --gin.NAME=VALUE or --gin_bindings=."""
  text = text.strip()
  return (f"--gin.{text}"
          if not any(c.isspace() for c in text) else f"--gin_bindings={text!r}")


def unknown_macro_message(name: str, known: Sequence[str]) -> str:
  """'unknown gin macro X ...; closest known: ...; known macros: ...'."""
  return (f"unknown gin macro {name!r}: no gin file defines or uses it, so "
          f"it would be silently ignored; {_did_you_mean(name, known)}known "
          f"macros: {', '.join(sorted(known))}.")


def check_macro_bindings(gin_bindings: Sequence[str], known: Set[str]) -> None:
  """flag_utils.ConfigError for a binding `NAME = value` (`--gin.GAMA=3`)
  whose macro no file (`known`) or binding uses, naming it and the closest
  known."""
  defined, used = _binding_macros(gin_bindings)
  for name, text in defined.items():
    if name not in used | known:
      raise flag_utils.ConfigError(
          f"{binding_flag(text)}: "
          f"{unknown_macro_message(name, sorted(known))}")


# -- components' settings ------------------------------------------------------
# A component (a decode mode, a drafter spec) is a frozen dataclass whose
# settings are fields naming the macro gin/run.gin binds them to
# (`TreeMode.width = %TREE_WIDTH`); a setting is recorded under its macro's
# name in lower case (`tree_width`).
def setting(macro: str, default: Any) -> Any:
  """A component's setting and the gin macro that sets it."""
  return dataclasses.field(default=default, metadata={"macro": macro})


def settings(component: Any) -> Dict[str, Any]:
  """{macro in lower case: value} of a component's settings (of a class:
  their defaults)."""
  return {
      f.metadata["macro"].lower(): getattr(component, f.name)
      for f in dataclasses.fields(component)
      if "macro" in f.metadata
  }


def configured(component: Any) -> Any:
  """A registered component with its settings as gin binds them: its class
  called with its other fields."""
  return type(component)(**{
      f.name: getattr(component, f.name)
      for f in dataclasses.fields(component)
      if f.init and "macro" not in f.metadata
  })


def choice_words(choices: Sequence[Any]) -> str:
  """[('DRAFTER', 'model')] -> "DRAFTER='model'"; several: "DRAFTER
  'model' or 'ngram'"."""
  if len(choices) == 1:
    return f"{choices[0][0]}={choices[0][1]!r}"
  values = [repr(v) for _, v in choices]
  return f"{choices[0][0]} {', '.join(values[:-1])} or {values[-1]}"


def check_unread_settings(registered: Sequence[Any], read: Set[str],
                          chosen: Any) -> None:
  """Refuses a setting bound away from its default for a component the run
  did not choose (its macro in no `read`): it would change nothing (a
  BEAM_SIZE sweep without DECODE='beam').

  `registered`: one family's components, each with its `choice` (macro,
  value) and `reads()`; `read`: the macros the run's choices read;
  `chosen`: the run's `choice` in this family. flag_utils.ConfigError naming the
  macro, its value, the run's choice and the choices that read it.
  """
  for cls in dict.fromkeys(type(c) for c in registered):
    try:
      bound = gin.get_bindings(cls)
    except ValueError:  # not gin-configurable: nothing bound
      continue
    for f in dataclasses.fields(cls):
      macro, value = f.metadata.get("macro"), bound.get(f.name, f.default)
      if (macro is None or macro in read or
          (type(value) is type(f.default) and value == f.default)):
        continue
      owners = choice_words(
          [c.choice for c in registered if macro in c.reads()])
      raise flag_utils.ConfigError(
          f"{macro}={value!r} with {choice_words([chosen])}: only {owners} "
          f"read{'s' if '=' in owners else ''} it; allowed: {macro}="
          f"{f.default!r} (its default), or {owners}.")
