r"""Runs the paper's walltime experiment: target alone vs speculative decoding.

  python -m specdec_jax.run --gin_file=ende_small.gin \
      --gin.TARGET_CHECKPOINT_PATH="'gs://.../checkpoint_N'" \
      --gin.OUTPUT_DIR="'/tmp/ende_small'"

The command line of `experiment.runner.execute`: every setting is checked
before any model is loaded (`experiment.plan.RunPlan.build`), the summary is
printed before the result files (metrics.json, predictions.jsonl; alpha.json
with MODE='alpha'; compile.json with COMPILE_TOPOLOGY) are written, and
errors are one line (docs/usage/running.md, outputs.md, failures.md).
"""
from typing import Any, Dict, Optional, Sequence

import gin

from specdec_jax.config import flag_utils
from specdec_jax import checkpoints
from specdec_jax import multihost
from specdec_jax.config import gin_utils
from specdec_jax.core import environment
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_report
from specdec_jax.experiment import runner
from specdec_jax.experiment import summary
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.files import compilation_cache
from specdec_jax.terminal import console

ConfigError = flag_utils.ConfigError


def run(overrides: Optional[Dict[str, Any]] = None, *,
        providers: Optional[Providers] = None) -> Dict[str, Any]:
  """Runs the experiment gin describes, `overrides` replacing some run
  arguments (`arguments.run_arguments`); returns its metrics dict."""
  args = arguments.run_arguments(overrides=overrides)
  return runner.execute(RunPlan.build(args, providers))[0]


def parse_flags(argv: Sequence[str]) -> None:
  """Parses the experiment's gin flags (`run` and `certify`); ConfigError
  for extra arguments, no --gin_file, a bad binding, or no OUTPUT_DIR."""
  examples = "--gin_file=pretrained_multi30k.gin or local_tiny.gin"
  gin_files = gin_utils.gin_files_flag()
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {argv[1:]}")
  if not gin_files:  # bindings alone bind no OUTPUT_DIR
    raise ConfigError(
        "--gin_file is required: a run is described by an experiment gin "
        f"file (gin/*.gin, e.g. {examples}); --gin.X bindings change its "
        "settings.")
  try:
    gin_utils.parse_from_flags(check_macros=True)
  except ValueError as e:  # gin's own message names the binding
    raise ConfigError(str(e)) from None
  if "output_dir" not in gin.get_bindings("run"):
    raise ConfigError(
        f"OUTPUT_DIR is not set: the gin files ({', '.join(gin_files)}) "
        "bind no run.output_dir; allowed: an experiment file, which "
        f"includes run.gin (e.g. {examples}).")


def main(argv: Sequence[str], providers: Optional[Providers] = None) -> None:
  parse_flags(argv)
  try:  # several hosts: T5X's flags, or a Cloud TPU VM (`multihost`)
    multihost.initialize_from_flags()
  except ValueError as e:
    raise ConfigError(str(e)) from None
  with multihost.failures_end_every_process("run", BAD_INPUT):
    console.setup()  # after the gin check: a typo fails in a second
    args = arguments.run_arguments()
    if args.compile_topology is not None:  # compile only (docs/usage/tpu.md)
      record = compile_report.compile_topology(args, args.compile_topology,
                                               gin_utils.gin_files_flag())
      print("\n".join(compile_report.compile_summary_lines(record)))
      return

    # After the TPU branch: a TPU compile without a TPU cannot use the cache.
    compilation_cache.enable()  # a re-run compiles nothing

    def print_summary(metrics):  # before anything is written
      if multihost.is_first():
        print("\n".join(summary.summary_lines(metrics, args)), flush=True)

    runner.execute(RunPlan.build(args, providers), on_result=print_summary)


# Errors of the input: one line, exit 2 (an OSError: one line, exit 1).
BAD_INPUT = (ConfigError, checkpoints.CheckpointError,
             environment.BadEnvironment)


def cli(argv: Optional[Sequence[str]] = None,
        providers: Optional[Providers] = None) -> int:
  """Entry point: exit 2 for a bad setting, 130 for Ctrl-C (one line;
  --traceback shows the traceback)."""
  gin_utils.define_gin_flags()
  multihost.define_flags()
  console.define_traceback_flag()
  return console.run_cli(
      "run", lambda: gin_utils.run_main(lambda a: main(a, providers), argv),
      BAD_INPUT)


if __name__ == "__main__":
  console.exit_process(cli())
