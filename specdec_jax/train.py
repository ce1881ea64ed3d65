r"""Trains T5 v1.1 target and draft models on local parallel text (Multi30k).

    python -m specdec_jax.train --gin_file=train/multi30k_target.gin \
        [--gin_bindings="MODEL_DIR = '/tmp/target'"] [--gin.NUM_STEPS=100]

T5X-style flags; the gin files bind ``train.*``, the fields of
`training.config.TrainConfig`. Relative paths are taken from the current
directory if they exist there, else from the repository root.
"""
import os
from typing import List, Optional, Sequence

from absl import flags
from absl import logging

from specdec_jax.config import flag_utils
from specdec_jax.terminal import console
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.files import io_utils
from specdec_jax.training.checkpointing import METRICS_FILE
from specdec_jax.training.config import TrainConfig
from specdec_jax.training.trainer import TrainResult
from specdec_jax.training.trainer import TrainingDiverged
from specdec_jax.training.trainer import train_and_evaluate

FLAGS = flags.FLAGS


def train(**overrides) -> TrainResult:
  """Trains (or resumes) one model: gin's ``train.*`` bindings, with
  `overrides` (`TrainConfig` fields) winning. ValueError for bad settings
  or input, before anything is trained or written."""
  config = TrainConfig(**overrides)
  check_model_dir(config.model_dir)
  return train_and_evaluate(config)


def check_model_dir(model_dir: str) -> None:
  """MODEL_DIR (`train.model_dir`) is, or can become, a folder: checked
  before anything is read (else a file there fails at the first write, with
  an errno line naming neither the macro nor what is allowed).

  Raises:
    ConfigError: not a string, or the path (or a folder on it) exists and
      is no folder.
  """
  allowed = "allowed: a directory, or a path where one can be created"
  if not isinstance(model_dir, str) or not model_dir:
    raise flag_utils.ConfigError(f"MODEL_DIR={model_dir!r} (train.model_dir): "
                                 f"{allowed}.")
  if io_utils.is_url(model_dir):
    return
  resolved = os.path.abspath(io_utils.resolve_path(model_dir))
  existing = resolved  # the path, or its deepest ancestor that exists
  while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
    existing = os.path.dirname(existing)
  if os.path.isdir(existing):
    return
  kind = "a regular file" if os.path.isfile(existing) else "not a directory"
  what = (f"is {kind}"
          if existing == resolved else f"is inside {existing}, which is {kind}")
  shown = "" if resolved == model_dir else f", {resolved}"
  raise flag_utils.ConfigError(f"MODEL_DIR={model_dir!r} (train.model_dir"
                               f"{shown}) {what}; {allowed}.")


def define_flags() -> None:
  """--gin_file/--gin_bindings/--gin_search_paths (`gin_utils`, idempotent)."""
  gin_utils.define_gin_flags()


def parse_gin(
    gin_files: Sequence[str], gin_bindings: Sequence[str],
    gin_search_paths: Sequence[str] = ()) -> List[str]:
  """Parses gin files then bindings (not finalized); returns the search
  paths used. A binding that does not parse, or a macro nothing reads, is a
  ConfigError naming it."""
  gin_utils.parse_gin(gin_files, gin_bindings, gin_search_paths, finalize=False,
                      check_macros=True)
  return gin_reader.search_paths(gin_search_paths)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise flag_utils.ConfigError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS.gin_file:
    raise flag_utils.ConfigError("give at least one --gin_file, e.g. "
                                 "--gin_file=train/tiny_ci.gin.")
  try:
    search_paths = parse_gin(FLAGS.gin_file, FLAGS.gin_bindings,
                             FLAGS.gin_search_paths)
  # gin's own message names the binding; gin reports a value it cannot
  # parse (`float('nan')`) as a SyntaxError.
  except (ValueError, SyntaxError) as e:
    raise flag_utils.ConfigError(str(e)) from None
  result = train(gin_search_paths=search_paths)
  ev = result.metrics.get("eval", {})
  logging.info("Done: step %d, final loss %s, BLEU %s, metrics in %s",
               result.step, result.metrics.get("final_loss"), ev.get("bleu"),
               os.path.join(result.metrics["model_dir"], METRICS_FILE))


# Bad settings or input (`train`'s ValueError, a checkpoint that cannot be
# resumed): one line, exit 2. A write that failed or a diverged loss: one
# line, exit 1. Ctrl-C: 130 (checkpoints already saved are kept).
BAD_INPUT = (ValueError,)
FAILURES = (OSError, TrainingDiverged)


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point: every error one line (--traceback: the traceback)."""
  define_flags()
  console.define_traceback_flag()
  return console.run_cli("train", lambda: gin_utils.run_main(main, argv),
                         BAD_INPUT, FAILURES)


if __name__ == "__main__":
  console.exit_process(cli())
