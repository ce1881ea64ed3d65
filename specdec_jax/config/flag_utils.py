"""absl flags for entry points that parse into a FlagValues of their own.

`run`, `sweep` and `train` define their flags on absl's global FLAGS and run
under `absl.app` (`gin_utils`). The benchmark and the report instead parse
into a new `flags.FlagValues` on every call and return their exit status, so
that their `main` can run many times in one process (tests) and next to
other entry points' flags. Either way a bad value is a `ConfigError`: the
entry point prints its message as one line and exits 2.

Benchmarks that run under `absl.app` (`benchmarking.loop_overhead`,
`tree`, `timing_noise`) define their flags on the global FLAGS only when
their command runs (`run_absl_command`), not on import: the library imports
them side by side, and their flags share names (`--target`, `--gamma`).
"""
import sys
import types
from typing import Callable, List, Sequence

from absl import app
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


def run_absl_command(main: Callable[..., object],
                     defined: types.SimpleNamespace) -> None:
  """`app.run(main)`, main called as main(argv, values).

  Args:
    main: the command.
    defined: the command's flag holders by name, just defined on the global
      FLAGS; `values` holds their parsed values by the same names. They are
      made key flags of the program's main module, so that `--help` lists
      them whether the module runs as `python -m` or from a thin script in
      scripts/.
  """
  for holder in vars(defined).values():
    flags.FLAGS.register_key_flag_for_module(sys.argv[0],
                                             flags.FLAGS[holder.name])

  def command(argv):
    return main(
        argv,
        types.SimpleNamespace(**{
            name: holder.value for name, holder in vars(defined).items()
        }))

  app.run(command)
