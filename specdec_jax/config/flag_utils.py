"""absl flags for entry points that parse into a FlagValues of their own
(`report`, many times in one process), and `ConfigError`, the bad value a
user typed: entry points print its message as one line and exit 2. Imports
neither gin nor seqio (the device check's tools use it on the GPU image).
"""
from typing import List, Sequence

from absl import flags


class ConfigError(ValueError):
  """A bad value the user typed (a flag, a gin macro or binding)."""


def new_flag_values() -> flags.FlagValues:
  """An empty FlagValues with --help/-h."""
  fv = flags.FlagValues()
  flags.DEFINE_boolean("help", False, "show this help and exit", short_name="h",
                       flag_values=fv)
  return fv


def parse_flag_values(fv: flags.FlagValues, program: str,
                      argv: Sequence[str]) -> List[str]:
  """Parses argv (without the program name) into `fv`; returns the
  positional arguments. Raises ConfigError (naming the flag and value)."""
  try:
    return fv([program, *argv])[1:]
  except flags.Error as e:
    raise ConfigError(str(e)) from None


def flags_help(fv: flags.FlagValues, usage: str, description: str) -> str:
  """--help's text: usage line, description, then every flag."""
  return f"usage: {usage}\n\n{description}\n\n{fv.get_help()}"
