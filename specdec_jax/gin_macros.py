"""Which gin macros files and bindings define and read (`gin_utils`).

A macro defined and read by nothing is a typo gin accepts in silence:
`GAMA = 3` in an experiment file, `--gin.NUM_STEP=3` on `train`'s command
line. `check_unused_macros` refuses one, naming the file and line (or the
binding) and the closest macro that is read; `binding_statements` parses a
`--gin_bindings` string with a message that names what the user typed.
`gin_utils.parse_gin` calls both (`run`, `sweep` and `train`).
"""
import re
import tokenize
from typing import Dict, Optional, Sequence, Set

from gin import config_parser

from specdec_jax import gin_utils
from specdec_jax.flag_utils import ConfigError

# pylint: disable=protected-access  # gin_utils' parser helpers

# Macros that code reads with gin.query_parameter, "%NAME", rather than
# through a `%NAME` in a binding: none today (COMPILE_TOPOLOGY is bound to
# `run.compile_topology`). Add one here if code reads it so.
MACROS_READ_BY_CODE: frozenset = frozenset()


def binding_statements(text: str):
  """The statements of one `--gin_bindings` string.

  Raises:
    ConfigError: it does not parse; says how to quote a string (gin's own
      message shows an `<ast.Name object at 0x...>` for `GAMMA=x`).
  """
  try:
    return list(config_parser.ConfigParser(text, gin_utils._ParserDelegate()))
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
  paths = gin_utils._search_paths_or_default(search_paths_)
  defined: Dict[str, str] = {}
  used: Set[str] = set(MACROS_READ_BY_CODE)
  for path in gin_files:
    for st, where in gin_utils._gin_statements(path, paths):
      if isinstance(st, config_parser.BindingStatement):
        if not st.arg_name:
          defined.setdefault(st.selector, f"{where}: {st.selector} = ...")
        used |= gin_utils._macro_references(st.value)
  for text in gin_bindings:
    for st in binding_statements(text):
      if isinstance(st, config_parser.BindingStatement):
        if not st.arg_name:
          defined[st.selector] = binding_flag(text)
        used |= gin_utils._macro_references(st.value)
  for name, where in defined.items():
    if name not in used:
      close = gin_utils.closest_names(name, sorted(used))
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
