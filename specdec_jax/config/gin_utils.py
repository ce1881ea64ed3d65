"""Gin plumbing shared by the entry points (T5X style).

Flags: `--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin_search_paths` (comma-separated), and `--gin.NAME=VALUE` for
`--gin_bindings='NAME=VALUE'`. The repository's `gin/` folder is always on
the search path (`--gin_file=ende_small.gin`). `parse_gin` refuses macros
that nothing reads (`check_macro_bindings`) before gin parses anything. Gin files read
beside a live configuration (a model's `T5Config`) are `gin_reader`.
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

from specdec_jax.config import gin_reader

# `gin_utils.ConfigError` is what `run` and `sweep` catch.
from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig

# The core never imports gin: the model config is made configurable here,
# in place and under its own name, so gin files bind `T5Config.*`.
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


class _DropGinLookupNoise(std_logging.Filter):
  """Drops gin's per-folder lookup lines for a bare file name.

  gin tries every search path in turn, and for each it also asks its
  Python-package reader, which logs `system_path_file_exists:NAME` and an
  ERROR `Path not found: NAME` for every folder that lacks the file. Those
  are not errors; a file found nowhere is reported by `parse_gin` itself.
  """

  def filter(self, record):
    return not (record.pathname.endswith(
        os.path.join("gin", "resource_reader.py")) and
                str(record.msg).startswith(
                    ("Path not found", "system_path_file_exists")))


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str],
              extra_search_paths: Sequence[str] = (), finalize: bool = True,
              check_macros: bool = False) -> None:
  """Parses gin files and bindings with the search paths set up.

  A missing file raises ValueError naming it and the folders searched. With
  `check_macros`, a binding that defines a macro the files neither define
  nor use raises ConfigError first (see `check_macro_bindings`). gin's
  lookup lines for bare file names are not logged.
  """
  paths = gin_reader.search_paths(extra_search_paths)
  for path in paths:
    gin.add_config_file_search_path(path)
  for name in gin_files:
    if gin_reader.find_in(name, paths) is None:
      raise ConfigError(
          f"--gin_file={name!r} {gin_reader.not_a_gin_file(name, paths)}")
  if check_macros:
    check_macro_bindings(gin_bindings,
                         gin_reader.gin_file_macros(gin_files, paths))
  # Always: a macro that files or bindings define and nothing reads is a
  # typo (`GAMA = 3` in a file; `--gin.NUM_STEP=3`), silently ignored by gin.
  check_unused_macros(gin_files, gin_bindings, paths)
  quiet = _DropGinLookupNoise()
  root = std_logging.getLogger()
  root.addFilter(quiet)
  try:
    gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                        finalize_config=finalize)
  finally:
    root.removeFilter(quiet)


def gin_files_flag() -> List[str]:
  """The --gin_file values, in order."""
  return list(flags.FLAGS.gin_file)


def parse_from_flags(finalize: bool = True, check_macros: bool = True) -> None:
  """Parses --gin_file/--gin_bindings; unknown macros raise ConfigError."""
  f = flags.FLAGS
  parse_gin(f.gin_file, f.gin_bindings, f.gin_search_paths, finalize,
            check_macros=check_macros)


def run_main(main, argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run(main)` with `--gin.X=Y` shorthand support; a bad flag
  is a ConfigError (one line, exit 2), not absl's "FATAL Flags parsing
  error" and exit 1."""
  from absl import app  # pylint: disable=g-import-not-at-top
  argv = rewrite_gin_args(sys.argv if argv is None else argv)
  app.run(main, argv=argv, flags_parser=_parse_flags)


def _parse_flags(argv: Sequence[str]) -> Sequence[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    raise ConfigError(str(e)) from None


# Macros that code reads with gin.query_parameter, "%NAME", rather than
# through a `%NAME` in a binding: none today (COMPILE_TOPOLOGY is bound to
# `run.compile_topology`). Add one here if code reads it so.
# -- gin macros ----------------------------------------------------------------
# Which gin macros files and bindings define and read.
#
# A macro defined and read by nothing is a typo gin accepts in silence:
# `GAMA = 3` in an experiment file, `--gin.NUM_STEP=3` on `train`'s command
# line. `check_unused_macros` refuses one, naming the file and line (or the
# binding) and the closest macro that is read; `binding_statements` parses a
# `--gin_bindings` string with a message that names what the user typed.
# `gin_utils.parse_gin` calls both (`run`, `sweep` and `train`);
# `check_macro_bindings` refuses a binding that defines a macro no gin file
# knows (`--gin.GAMA=3`).
MACROS_READ_BY_CODE: frozenset = frozenset()


def binding_statements(text: str):
  """The statements of one `--gin_bindings` string.

  Raises:
    ConfigError: it does not parse; says how to quote a string (gin's own
      message shows an `<ast.Name object at 0x...>` for `GAMMA=x`).
  """
  try:
    return list(config_parser.ConfigParser(text, gin_reader.ParserDelegate()))
  except (SyntaxError, tokenize.TokenError) as e:
    token = re.search(r"Failed to parse token '([^']*)'", str(e))
    why = (f"{token.group(1)!r} is not a gin value (a number, True/False, "
           "None, a quoted string, a list, tuple or dict of those, or "
           "%MACRO / @configurable; a string needs quotes, e.g. "
           "--gin.NAME=\"'text'\")"
           if token else _AST_REPR.sub("", str(e)).strip())
    raise ConfigError(f"{binding_flag(text)}: not a gin binding: {why}.") \
        from None


_AST_REPR = re.compile(r":?\s*<ast\.\w+ object at 0x[0-9a-f]+>")


def check_unused_macros(gin_files: Sequence[str], gin_bindings: Sequence[str],
                        search_paths_: Optional[Sequence[str]] = None) -> None:
  """Refuses a macro that a file or binding defines and nothing reads.

  gin accepts `GAMA = 3` in an experiment file or `--gin.NUM_STEP=3` and
  ignores it: the run goes on with the default. A macro is read when some
  file or binding uses `%NAME`, or code reads it (`MACROS_READ_BY_CODE`).

  Raises:
    ConfigError: naming the file and line (or the binding), the macro and
      the closest macro that is read.
  """
  paths = gin_reader.search_paths_or_default(search_paths_)
  defined: Dict[str, str] = {}
  used: Set[str] = set(MACROS_READ_BY_CODE)
  for path in gin_files:
    for st, where in gin_reader.gin_statements(path, paths):
      if isinstance(st, config_parser.BindingStatement):
        if not st.arg_name:
          defined.setdefault(st.selector, f"{where}: {st.selector} = ...")
        used |= gin_reader.macro_references(st.value)
  for text in gin_bindings:
    for st in binding_statements(text):
      if isinstance(st, config_parser.BindingStatement):
        if not st.arg_name:
          defined[st.selector] = binding_flag(text)
        used |= gin_reader.macro_references(st.value)
  for name, where in defined.items():
    if name not in used:
      close = gin_reader.closest_names(name, sorted(used))
      hint = (f"did you mean {' or '.join(close)}? " if close else "")
      raise ConfigError(
          f"{where}: macro {name!r} is defined but nothing reads it (no "
          f"%{name} in any gin file or binding), so it would be silently "
          f"ignored; {hint}macros read: {', '.join(sorted(used))}.")


def binding_flag(text: str) -> str:
  """How the user typed a binding: --gin.NAME=VALUE or --gin_bindings=."""
  text = text.strip()
  return (f"--gin.{text}"
          if not any(c.isspace() for c in text) else f"--gin_bindings={text!r}")


def unknown_macro_message(name: str, known: Sequence[str]) -> str:
  """'unknown gin macro X ...; closest known: ...; known macros: ...'."""
  close = gin_reader.closest_names(name, known)
  hint = (f"did you mean {' or '.join(close)}? " if close else "")
  return (f"unknown gin macro {name!r}: no gin file defines or uses it, so "
          f"it would be silently ignored; {hint}known macros: "
          f"{', '.join(sorted(known))}.")


def check_macro_bindings(gin_bindings: Sequence[str], known: Set[str]) -> None:
  """Rejects bindings that define a macro nothing knows.

  A binding `NAME = value` defines a gin macro. When no gin file defines or
  uses `%NAME` (and no other binding uses it), nothing reads it: a typo such
  as `--gin.GAMA=3` would run with the default γ. Full bindings
  (`run.gamma = 3`, `target/T5Config.emb_dim = 8`) are checked by gin itself.

  Args:
    gin_bindings: binding strings as given to `--gin_bindings` (or
      `--gin.NAME=VALUE`).
    known: macros the gin files define or use (`gin_file_macros`).

  Raises:
    ConfigError: naming the binding, the unknown macro and the closest known
      macros.
  """
  parsed = []
  used = set(known)
  for text in gin_bindings:
    for st in binding_statements(text):
      if isinstance(st, config_parser.BindingStatement):
        used |= gin_reader.macro_references(st.value)
        if not st.arg_name:
          parsed.append((text, st.selector))
  for text, name in parsed:
    if name not in used:
      raise ConfigError(f"{binding_flag(text)}: "
                        f"{unknown_macro_message(name, sorted(known))}")


# -- components' settings ------------------------------------------------------
# A component (a decode mode, a drafter spec) is a frozen dataclass whose
# settings are fields naming the macro gin/run.gin binds them to
# (`TreeMode.width = %TREE_WIDTH`); gin builds the one a run chooses and
# hands it in (`run.decode_mode = @decode_mode()`, or an experiment
# file's `@TreeMode()`). A setting is recorded under its macro's name in
# lower case (`tree_width`: the run argument it was).
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
  called with its other fields (the registry's 'bigram' is
  `NGramSpec(name='bigram', fixed_order=2)`)."""
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
  """The one rule of components' settings: gin binding a setting of a
  component the run did not choose (its macro in no `read`) away from its
  default would change nothing (a sweep over BEAM_SIZE that forgot
  DECODE='beam' would measure nothing), so it is refused.

  Args:
    registered: one family's components (the decode modes, or the drafter
      specs), each with its `choice` (macro, value) and `reads()` (macros).
    read: the macros the run's chosen components read.
    chosen: the run's `choice` in this family.

  Raises:
    ConfigError: naming the macro, its value, the run's choice and the
      choices that read it.
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
      raise ConfigError(
          f"{macro}={value!r} with {choice_words([chosen])}: only {owners} "
          f"read{'s' if '=' in owners else ''} it; allowed: {macro}="
          f"{f.default!r} (its default), or {owners}.")
