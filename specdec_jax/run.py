r"""Runs the paper's walltime experiment: target alone vs speculative decoding.

  python -m specdec_jax.run --gin_file=ende_small.gin \
      --gin.TARGET_CHECKPOINT_PATH="'gs://.../checkpoint_N'" \
      --gin.OUTPUT_DIR="'/tmp/ende_small'"

Loads the target and the draft (T5X checkpoints, or random weights when no
path is given), encodes the examples of a seqio task or of local files, runs
the baseline (`decoding.temperature_sample`) and speculative decoding
(`decoding.speculative_sample`) on the same examples, and writes to
OUTPUT_DIR:

* `metrics.json`: γ, temperature, α (from acceptance counts, and as mean β),
  target calls, walltimes (compilation excluded: every decoder is compiled
  and run once on the first batch before timing; `block_until_ready`), the
  measured speedup, the cost coefficient c, Theorem 3.8's speedup for the
  measured α and c, and BLEU or ROUGE of both outputs.
* `predictions.jsonl`: per example: input, reference, both outputs, the
  accepted count of every target call and a trace of the draft's guesses.
  Nothing measured goes there (timings are in metrics.json), so two runs
  with the same settings and seed write the same file. Rows are appended
  as batches finish (`experiment.predictions`) and renamed into place.

Everything a run can check without a model is checked before any model is
loaded or compiled, once (`experiment.plan.RunPlan.build`): the gin macros
and run arguments, the vocabulary against both models' `vocab_size`,
TASK_FEATURE_LENGTHS, and OUTPUT_DIR (created and probed with a temporary
file; a metrics.json / alpha.json there from a run with other settings is
not replaced unless OVERWRITE=True), and OUTPUT_DIR is locked for the run's
life (`files.output_folder.claim`: a second run there is refused). The run itself
is `experiment.runner.execute`; this module is its command line. The command prints a plain-words summary (`summary_lines`) before
it writes the result files, so a failed write loses no result; errors are
one line (docs/usage/failures.md).

OUTPUT_DIR may be a gs:// folder. On several hosts (T5X's flags, or a Cloud
TPU VM: `multihost`), each process reads its slice of the examples, process
0 alone writes, and walltimes are the slowest process's.

With COMPILE_TOPOLOGY set (e.g. 'v4-8') it loads and decodes nothing: it
compiles the run's programs for that Cloud TPU slice ahead of time and
writes `compile.json` (`experiment.compile_report`).

With `mode='alpha'` it only measures α as in Corollary 3.6: sample from the
target, then average β = Σ_x min(p(x), q(x)) over the positions of those
samples (`alpha.json`); no walltimes, so it is cheap to run for many
(task, draft, temperature) settings.
"""
from typing import Any, Dict, Optional, Sequence

import gin

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

ConfigError = gin_utils.ConfigError


def run(overrides: Optional[Dict[str, Any]] = None, *,
        providers: Optional[Providers] = None) -> Dict[str, Any]:
  """Runs the experiment gin describes; returns its metrics dict.

  Args:
    overrides: run arguments replacing gin's (`arguments.run_arguments`).
    providers: where the vocabulary, models and decoders come from
      (default: gin's vocabulary, T5X checkpoints, `decoding`'s decoders).
  """
  args = arguments.run_arguments(overrides=overrides)
  return runner.execute(RunPlan.build(args, providers))[0]


# The experiment files a message suggests (gin/, docs/usage/running.md).
EXAMPLE_GIN_FILES = "--gin_file=pretrained_multi30k.gin or local_tiny.gin"


def check_experiment_flags(gin_files: Sequence[str]) -> None:
  """A run needs an experiment file: bindings alone bind no OUTPUT_DIR.

  Raises:
    ConfigError: no --gin_file (only --gin.X bindings, or nothing).
  """
  if not gin_files:
    raise ConfigError(
        "--gin_file is required: a run is described by an experiment gin "
        f"file (gin/*.gin, e.g. {EXAMPLE_GIN_FILES}); --gin.X bindings "
        "change its settings.")


def check_output_dir_bound(gin_files: Sequence[str]) -> None:
  """After parsing: the files (or bindings) bind `run.output_dir`.

  Raises:
    ConfigError: they do not (a model file given alone, an empty file):
      RunArguments would fail with gin's traceback.
  """
  if "output_dir" not in gin.get_bindings("run"):
    raise ConfigError(
        f"OUTPUT_DIR is not set: the gin files ({', '.join(gin_files)}) "
        "bind no run.output_dir; allowed: an experiment file, which "
        f"includes run.gin (e.g. {EXAMPLE_GIN_FILES}).")


def main(argv: Sequence[str], providers: Optional[Providers] = None) -> None:
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {argv[1:]}")
  check_experiment_flags(gin_utils.gin_files_flag())
  try:
    gin_utils.parse_from_flags(check_macros=True)
  except ValueError as e:  # gin's own message names the binding
    raise ConfigError(str(e)) from None
  check_output_dir_bound(gin_utils.gin_files_flag())
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


# Errors of the input (settings, checkpoints, a folder in use, a SPECDEC_*
# variable): one line, exit 2. A failed write or an unreachable gs://
# (OSError): one line, exit 1. `certify` reuses it.
BAD_INPUT = (ConfigError, checkpoints.CheckpointError,
             environment.BadEnvironment)


def cli(argv: Optional[Sequence[str]] = None,
        providers: Optional[Providers] = None) -> int:
  """Entry point: a bad setting prints one line and exits 2, before any
  model is loaded; nothing is written. Ctrl-C: one line, exit 130.
  --traceback shows any error's traceback."""
  gin_utils.define_gin_flags()
  multihost.define_flags()
  console.define_traceback_flag()
  return console.run_cli(
      "run", lambda: gin_utils.run_main(lambda a: main(a, providers), argv),
      BAD_INPUT)


if __name__ == "__main__":
  console.exit_process(cli())
