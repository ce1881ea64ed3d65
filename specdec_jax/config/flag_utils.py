"""absl flags for entry points that parse into a FlagValues of their own.

`run`, `sweep` and `train` define their flags on absl's global FLAGS and run
under `absl.app` (`gin_utils`). The report instead parses into a new
`flags.FlagValues` on every call and returns its exit status, so that its
`main` can run many times in one process (tests) and next to other entry
points' flags (the tools parse with argparse). Either way a bad value is a
`ConfigError`: the entry point prints its message as one line and exits 2.
"""
from typing import List, Sequence

from absl import flags


class ConfigError(ValueError):
  """A bad value the user typed (a flag, a gin macro or binding).

  Entry points print its message as one line (no traceback) and exit 2.
  """


def new_flag_values() -> flags.FlagValues:
  """An empty FlagValues with --help/-h (see the module docstring)."""
  fv = flags.FlagValues()
  flags.DEFINE_boolean("help", False, "show this help and exit", short_name="h",
                       flag_values=fv)
  return fv


def parse_flag_values(fv: flags.FlagValues, program: str,
                      argv: Sequence[str]) -> List[str]:
  """Parses argv (without the program name) into `fv`.

  Returns:
    The positional arguments.

  Raises:
    ConfigError: an unknown flag or a value absl cannot parse (absl's
      message names the flag and the value).
  """
  try:
    return fv([program, *argv])[1:]
  except flags.Error as e:
    raise ConfigError(str(e)) from None


def flags_help(fv: flags.FlagValues, usage: str, description: str) -> str:
  """--help's text: usage line, description, then every flag."""
  return f"usage: {usage}\n\n{description}\n\n{fv.get_help()}"
