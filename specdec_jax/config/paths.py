"""Where the repository's files are, and how a relative path is resolved.

Gin files name data, vocabularies and output folders by paths relative to the
repository (``../shared/data/multi30k``, ``outputs/multi30k/target``), yet a
command may run from any directory. One rule, for every command, gin value
and sweep file (`resolve_path`): a relative path is the current directory's
if it exists there, else the repository's if it exists there (the shipped
data, models and configs mean the same from anywhere), else the current
directory's (what a run creates never lands in the checkout unless you run
from it). Absolute paths and URLs (``gs://``) are kept as they are.
"""
import os
import pathlib
from typing import Optional, Union

PathLike = Union[str, os.PathLike]

REPO_DIR = pathlib.Path(__file__).resolve().parents[2]
GIN_DIR = REPO_DIR / "gin"  # Always on the gin search path (`gin_utils`).


def is_url(path: PathLike) -> bool:
  """True for ``gs://...`` and other URLs (never resolved locally)."""
  return "://" in os.fspath(path)


def resolve_path(path: Optional[PathLike],
                 base: Optional[PathLike] = None) -> Optional[str]:
  """An absolute path for `path` (None stays None).

  Args:
    path: absolute, a URL, or relative.
    base: if given, a relative `path` is first joined to it (e.g. a data
      folder holding the files that a gin file names by bare name).

  Returns:
    A URL or absolute path as given; a relative path (after `base`) from the
    current directory if it exists there, else from `REPO_DIR` if it
    exists there, else from the current directory (a path to create).
  """
  if path is None:
    return None
  path = os.fspath(path)
  if base is not None and not os.path.isabs(path) and not is_url(path):
    path = os.path.join(os.fspath(base), path)
  if is_url(path) or os.path.isabs(path):
    return path
  if os.path.exists(path) or not os.path.exists(REPO_DIR / path):
    return os.path.abspath(path)
  return os.path.normpath(REPO_DIR / path)
