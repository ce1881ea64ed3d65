"""Gin and absl plumbing shared by the command-line entry points (T5X style).

Flags: `--gin_file` (repeatable), `--gin_bindings` (repeatable),
`--gin_search_paths` (comma-separated), and `--gin.NAME=VALUE` as shorthand
for `--gin_bindings='NAME=VALUE'`. The repository's top-level `gin/` folder
is always on the search path, so experiment files resolve by bare name
(`--gin_file=ende_small.gin`).
"""
import os
import pathlib
import sys
from typing import List, Optional, Sequence

from absl import flags
import gin

GIN_DIR = pathlib.Path(__file__).resolve().parents[1] / "gin"


def define_gin_flags() -> None:
  """Defines the T5X-style gin flags (idempotent)."""
  if "gin_file" in flags.FLAGS:
    return
  flags.DEFINE_multi_string("gin_file", [], "Gin files to parse, in order; "
                            "bare names are looked up on the search path.")
  flags.DEFINE_multi_string("gin_bindings", [], "Individual gin bindings, "
                            "applied after the files.")
  flags.DEFINE_list("gin_search_paths", [], "Extra folders searched for gin "
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


def search_paths(extra: Sequence[str] = ()) -> List[str]:
  return [os.getcwd(), *extra, str(GIN_DIR)]


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str],
              extra_search_paths: Sequence[str] = (),
              finalize: bool = True) -> None:
  """Parses gin files and bindings with the search paths set up.

  A missing file raises ValueError naming it and the folders searched.
  """
  paths = search_paths(extra_search_paths)
  for path in paths:
    gin.add_config_file_search_path(path)
  for name in gin_files:
    if not os.path.isabs(name) and not any(
        os.path.exists(os.path.join(p, name)) for p in paths):
      raise ValueError(
          f"--gin_file={name!r} not found in the gin search path {paths}.")
  gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                      finalize_config=finalize)


def parse_from_flags(finalize: bool = True) -> None:
  f = flags.FLAGS
  parse_gin(f.gin_file, f.gin_bindings, f.gin_search_paths, finalize)


def run_main(main, argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run(main)` with `--gin.X=Y` shorthand support."""
  from absl import app  # pylint: disable=g-import-not-at-top
  argv = rewrite_gin_args(sys.argv if argv is None else argv)
  app.run(main, argv=argv)
