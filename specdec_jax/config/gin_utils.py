"""Gin plumbing shared by the entry points (T5X style).

Flags: `--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin_search_paths` (comma-separated), and `--gin.NAME=VALUE` for
`--gin_bindings='NAME=VALUE'`. The repository's `gin/` folder is always on
the search path (`--gin_file=ende_small.gin`). `parse_gin` refuses macros
that nothing reads (`gin_macros`) before gin parses anything. Gin files read
beside a live configuration (a model's `T5Config`) are `gin_reader`.
"""
import logging as std_logging
import os
import sys
from typing import List, Optional, Sequence

from absl import flags
import gin

from specdec_jax.config import gin_macros
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
    gin_macros.check_macro_bindings(
        gin_bindings, gin_reader.gin_file_macros(gin_files, paths))
  # Always: a macro that files or bindings define and nothing reads is a
  # typo (`GAMA = 3` in a file; `--gin.NUM_STEP=3`), silently ignored by gin.
  gin_macros.check_unused_macros(gin_files, gin_bindings, paths)
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
  """`absl.app.run(main)` with `--gin.X=Y` shorthand support."""
  from absl import app  # pylint: disable=g-import-not-at-top
  argv = rewrite_gin_args(sys.argv if argv is None else argv)
  app.run(main, argv=argv)
