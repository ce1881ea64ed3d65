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
loaded or compiled: the gin macros and run arguments, the vocabulary against
both models' `vocab_size`, TASK_FEATURE_LENGTHS, and OUTPUT_DIR (created and
probed with a temporary file; a metrics.json / alpha.json there from a run
with other settings is not replaced unless OVERWRITE=True), and OUTPUT_DIR
is locked for the run's life (`experiment.run_lock`: a second run there is
refused). The command prints a plain-words summary (`summary_lines`) before
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
import dataclasses
import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax import console
from specdec_jax import decoding
from specdec_jax.decoding import block_acceptance
from specdec_jax import gin_utils
from specdec_jax import io_utils
from specdec_jax import metrics as metrics_lib
from specdec_jax import models as models_lib
from specdec_jax import multihost
from specdec_jax import partitioning
from specdec_jax import run_metrics
from specdec_jax import tasks
# Not used here: tests reach (and replace) how the run times calls through
# `run.timing`.
from specdec_jax import timing  # noqa: F401  # pylint: disable=unused-import
from specdec_jax.experiment import drafter_choice
from specdec_jax.experiment import alpha as alpha_mode
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_report
from specdec_jax.experiment import drafting
from specdec_jax.experiment import memory
from specdec_jax.experiment import output_dir as output_dir_lib
from specdec_jax.experiment import predictions as predictions_lib
from specdec_jax.experiment import setup
from specdec_jax.experiment import summary
from specdec_jax.experiment import walltime

# The run's public names (tests, `sweep`, scripts), wherever they live.
METRICS_FILE = run_metrics.METRICS_FILE
PREDICTIONS_FILE = run_metrics.PREDICTIONS_FILE
ALPHA_FILE = run_metrics.ALPHA_FILE
ConfigError = gin_utils.ConfigError
MODES = arguments.MODES
MACROS = arguments.MACROS
RunArguments = arguments.RunArguments
run_arguments = arguments.run_arguments
check_settings = arguments.check_settings
model_config = setup.model_config
describe_vocabulary = setup.describe_vocabulary
check_vocabulary_fits = setup.check_vocabulary_fits
summary_lines = summary.summary_lines
# `Experiment` calls these two through this module, so that tests and the
# multi-host test workers can replace them here (`run.vocabulary = ...`).
vocabulary = setup.vocabulary
load_model = setup.load_model

# Encoder input widths are multiples of this: a batch's inputs are cut to its
# longest row rounded up to it (`multihost.Feeder`), so the encoder runs on
# ~16-32 positions for a caption rather than on TASK_FEATURE_LENGTHS['inputs']
# = 64 padded ones, in both decoders alike, at the price of one compilation
# per width (all compiled before timing). Trailing padding does not change
# any output: the encoder masks it.
INPUT_BUCKET = 16


def run(overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """Runs the experiment gin describes; returns its metrics dict."""
  return Experiment(run_arguments(overrides=overrides)).run()


class Experiment:
  """One (target, draft, settings) run; models can be reused across runs.

  Everything that can fail without a model fails in `__init__` (the
  arguments, the vocabulary sizes, NGRAM_CORPUS) or at the start of `run`
  (the vocabulary, the n-gram table, OUTPUT_DIR), before loading.
  """

  def __init__(self, args: RunArguments, *, models=None):
    """Checks what needs no model.

    Args:
      args: the run's arguments (`run_arguments`, or a `RunArguments`).
      models: (mesh, target, draft) of an earlier run (`models()`), reused
        when the gin model bindings are the same (`sweep`).
    """
    self.args = args
    self.target_config = model_config("target")
    self.draft_config = model_config("draft")
    self.drafting = args.drafting
    self.ngram = None  # The n-gram table, counted by `run` before loading.
    corpus = setup.resolve(self.drafting.ngram_corpus)
    try:
      if self.drafting.order is not None and not os.path.isfile(corpus):
        raise ValueError(f"NGRAM_CORPUS={self.drafting.ngram_corpus!r}: no "
                         "such file (a text file with one sentence per "
                         "line, or a .npz of token ids).")
      decoding.check_vocab_sizes(self.target_config.vocab_size,
                                 self.draft_config.vocab_size)
      self.drafting.check_draft_config(self.draft_config, self.target_config)
    except ValueError as e:  # a bad setting, not a bug: no traceback
      raise ConfigError(str(e)) from None
    self._models = models
    self._mesh = None
    self.data_info: Dict[str, Any] = {}

  # -- startup checks (no model) ---------------------------------------------
  def check_memory(self) -> None:
    """Refuses lengths no machine here could decode (`memory`)."""
    a = self.args
    configs = {"target": self.target_config}
    if self.drafting.uses_draft_model:
      configs["draft"] = self.draft_config
    memory.check_fits(configs, a.batch_size, a.task_feature_lengths["inputs"],
                      a.max_decode_length,
                      memory.available_bytes() * jax.device_count())

  def vocabulary(self):
    """The vocabulary, checked against both models' vocab_size."""
    vocab = vocabulary()
    check_vocabulary_fits(vocab, self.target_config, self.draft_config)
    setup.check_vocabulary_for_run(vocab, self.args)  # TOPK, DIGESTS.json
    return vocab

  def settings(self, vocab) -> Dict[str, Any]:
    """What makes this run's results what they are (the OVERWRITE rule;
    `output_dir.settings_record`)."""
    return output_dir_lib.settings_record(self.args, self.target_config,
                                          self.draft_config, vocab)

  def prepare_output_dir(self, settings: Dict[str, Any]) -> None:
    """Creates and probes OUTPUT_DIR, takes its lock (`run_lock`: one run
    at a time) and refuses another run's results there
    (`output_dir.check_output_dir`). On several hosts process 0 (the
    writer) checks and holds the lock, and the others follow its verdict.
    """
    out = self.args.output_dir
    # A folder this run creates is removed again if the run ends with
    # nothing in it (a later check failed).
    self._created_dir = not io_utils.is_url(out) and not os.path.exists(out)

    def prepare():
      self._lock = output_dir_lib.check_output_dir(out, settings,
                                                   self.args.overwrite)

    multihost.run_on_first("output_dir", prepare)

  def release_output_dir(self) -> None:
    """Releases the lock; removes the folder if this run made it empty."""
    lock, self._lock = getattr(self, "_lock", None), None
    if lock is not None:
      lock.release()
    out = self.args.output_dir
    if getattr(self, "_created_dir", False) and multihost.is_first():
      try:
        os.rmdir(out)  # only if empty
      except OSError:
        pass

  # -- loading --------------------------------------------------------------
  def mesh(self):
    """The (data, model) mesh over every process's devices (no model)."""
    if self._models is not None:
      return self._models[0]
    if self._mesh is None:
      try:
        self._mesh = partitioning.make_mesh(*self.args.mesh_shape)
      except ValueError as e:
        raise ConfigError(f"MESH_SHAPE={self.args.mesh_shape!r}: {e}") from None
    return self._mesh

  def models(self):
    """(mesh, target, draft), loaded once; draft is None while no run has
    needed it (DRAFTER 'model' and 'hierarchical' do)."""
    a = self.args
    if self._models is None:
      mesh = self.mesh()
      target = load_model(self.target_config, a.target_checkpoint_path, a.seed,
                          mesh, "target")
      self._models = (mesh, target, None)
    mesh, target, draft = self._models
    if draft is None and self.drafting.uses_draft_model:
      draft = load_model(self.draft_config, a.draft_checkpoint_path, a.seed + 1,
                         mesh, "draft")
      # DRAFTER='shared_encoder': the draft decoder reads the target's
      # encoder (started from the target's encoder output in the loop).
      draft = models_lib.SharedEncoderModel.draft_for(target, draft)
      self._models = (mesh, target, draft)
    return self._models

  def examples(self, layout: Optional[multihost.DataLayout] = None):
    """This process's slice of the examples (`layout`; all of them on one
    host)."""
    a = self.args
    sliced = layout is not None and layout.num_shards > 1
    try:
      return tasks.load_examples(
          mixture_or_task_name=a.mixture_or_task_name, split=a.split,
          num_examples=a.num_examples, source_file=setup.resolve(a.source_file),
          reference_file=setup.resolve(a.reference_file),
          input_prefix=a.input_prefix,
          shard_info=layout.shard_info if sliced else None)
    except ValueError as e:  # names the file and line, or the task
      raise ConfigError(str(e)) from None

  def check_examples(self, examples) -> None:
    """All examples (every process's): none, or fewer than NUM_EXAMPLES,
    is an error, or logged and recorded."""
    a = self.args
    source = (f"task {a.mixture_or_task_name!r} split {a.split!r}"
              if a.mixture_or_task_name else f"SOURCE_FILE={a.source_file!r}")
    if not examples:
      raise ConfigError(f"No examples to decode in {source}.")
    self.data_info["num_examples_requested"] = a.num_examples
    if len(examples) < a.num_examples:
      logging.warning(
          "NUM_EXAMPLES=%d but %s has only %d examples: decoding "
          "%d (metrics.json records both numbers).", a.num_examples, source,
          len(examples), len(examples))

  def encode_inputs(self, vocab, examples) -> Tuple[np.ndarray, np.ndarray]:
    """([N, S] input ids, [N] lengths with EOS before truncation)."""
    length = self.args.task_feature_lengths["inputs"]
    return tasks.encode_batch(vocab, [e["input"] for e in examples], length,
                              return_lengths=True)

  def check_truncation(self, lengths: np.ndarray) -> None:
    """Inputs longer than S (all examples' `lengths`): counted, logged."""
    length = self.args.task_feature_lengths["inputs"]
    truncated = int(np.sum(lengths > length))
    self.data_info.update(inputs_length=length, inputs_truncated=truncated,
                          longest_input_tokens=int(lengths.max()))
    if truncated:
      logging.warning(
          "TASK_FEATURE_LENGTHS['inputs']=%d truncates %d of %d inputs (the "
          "longest has %d tokens with EOS); they are decoded from their "
          "first %d tokens. Raise it to decode whole inputs.", length,
          truncated, len(lengths), int(lengths.max()), length - 1)

  def task_kind(self) -> str:
    a = self.args
    if a.task_kind:
      return a.task_kind
    if a.mixture_or_task_name:
      return tasks.get_task_kind(a.mixture_or_task_name)
    return metrics_lib.TRANSLATION

  # -- running --------------------------------------------------------------
  def run(
      self, on_result: Optional[Callable[[Dict[str, Any]], None]] = None
  ) -> Dict[str, Any]:
    """Checks, loads, decodes and writes; returns metrics.json's dict (or
    alpha.json's in MODE='alpha').

    `on_result(metrics)` is called before anything is written (`run`
    prints its summary there: a failed write loses no result).
    """
    # Everything that can fail without a model fails here, before loading.
    vocab = self.vocabulary()
    self.check_memory()
    self.ngram = self.ngram_table(vocab)
    self.prepare_output_dir(self.settings(vocab))
    try:
      return self._run_locked(vocab, on_result or (lambda metrics: None))
    finally:
      self.release_output_dir()

  def _run_locked(self, vocab, on_result) -> Dict[str, Any]:
    """`run` after the startup checks, OUTPUT_DIR's lock held."""
    a = self.args
    # Each process reads its slice of the examples; texts and token counts
    # are exchanged, so every process knows all of them (`multihost`).
    sharding = partitioning.data_sharding(self.mesh(), a.batch_size)
    try:
      layout = multihost.data_layout(sharding, a.batch_size)
    except ValueError as e:
      raise ConfigError(f"MESH_SHAPE={a.mesh_shape!r}: {e}") from None
    local = self.examples(layout)
    inputs, full_lengths = self.encode_inputs(vocab, local)
    shared = multihost.share_examples(layout, local, inputs, full_lengths)
    examples = shared.examples
    self.check_examples(examples)
    self.check_truncation(shared.full_lengths)
    feed = multihost.Feeder(layout, inputs, shared, sharding, INPUT_BUCKET)
    logging.info("%d examples; mode=%s γ=%s T=%s", len(examples), a.mode,
                 a.gamma, a.temperature)
    mesh, target, draft = self.models()
    # No process enters the decoders' collectives long before the others.
    multihost.barrier("models_loaded")
    if a.mode == "alpha":
      return self._run_alpha(vocab, examples, feed, mesh, target, draft,
                             on_result)
    return self._run_walltime(vocab, examples, feed, mesh, target, draft,
                              on_result)

  # -- drafting (DRAFTER, LENIENCE, ADAPTIVE_THRESHOLD, GAMMA='auto') --------
  def ngram_table(self, vocab):
    """The n-gram drafter's table (None without one), counted before any
    model is loaded: a bad NGRAM_CORPUS fails here."""
    try:
      return self.drafting.ngram_table(
          vocab, self.target_config.vocab_size,
          setup.resolve(self.drafting.ngram_corpus))
    except ValueError as e:
      raise ConfigError(str(e)) from None

  def drafter(self, draft):
    """What guesses: the draft model itself, or a `drafters` drafter."""
    return self.drafting.build(draft, self.ngram, self.target_config.vocab_size)

  def acceptance(self) -> Optional[decoding.AcceptanceRule]:
    """None (Algorithm 1) unless LENIENCE < 1 or ACCEPTANCE='block'."""
    lenience = self.args.lenience
    if self.args.acceptance == "block":
      return block_acceptance.BlockAcceptance()
    return None if lenience == 1 else decoding.LenientAcceptance(
        np.float32(lenience))

  def _decoders(self, target, draft, gamma: Optional[int] = None):
    """(baseline, speculative): each (batch [B, S], rng) -> its output."""
    a = self.args
    gamma = a.gamma if gamma is None else gamma
    max_len = a.max_decode_length
    method = a.method()
    drafter, acceptance = self.drafter(draft), self.acceptance()

    def baseline(batch, rng):
      return decoding.temperature_sample(target, batch, rng,
                                         max_decode_length=max_len,
                                         method=method)

    def speculative(batch, rng):
      return decoding.speculative_sample(target, drafter, batch, rng,
                                         gamma=gamma, max_decode_length=max_len,
                                         method=method, acceptance=acceptance)

    return baseline, speculative

  def _choose_gamma(self, feed, target, draft) -> Dict[str, Any]:
    """GAMMA='auto' (`drafting.choose_gamma`): metrics.json's gamma_auto."""
    _, pilot = self._decoders(target, draft, drafter_choice.AUTO_GAMMA_PILOT)
    return drafting.choose_gamma(self.args, pilot, feed, self.drafter(draft),
                                 target, draft)

  # -- the two modes ----------------------------------------------------------
  def _quality(self, base_text, spec_text, examples) -> Dict[str, Any]:
    """{'bleu' or 'rouge': {'baseline': ..., 'speculative': ...}}."""
    kind = self.task_kind()
    references = [e["reference"] for e in examples]
    base = metrics_lib.quality_metrics(kind, base_text, references)
    spec = metrics_lib.quality_metrics(kind, spec_text, references)
    key = next(iter(base))
    return {key: {"baseline": base[key], "speculative": spec[key]}}

  def _run_walltime(self, vocab, examples, feed, mesh, target, draft,
                    on_result):
    """Both decoders timed (`walltime`); predictions.jsonl written as
    batches finish (`predictions`), then metrics.json (a sweep takes it as
    "done")."""
    args, gamma_auto = self.args, None
    if args.auto_gamma:
      gamma_auto = self._choose_gamma(feed, target, draft)
      args = dataclasses.replace(args, gamma=gamma_auto["chosen_gamma"])
    baseline, speculative = self._decoders(target, draft, args.gamma)
    rng = jax.random.PRNGKey(args.seed)
    compile_s = walltime.compile_decoders(feed, baseline, speculative, rng)
    writer = predictions_lib.PredictionsWriter(args.output_dir,
                                               multihost.is_first())
    try:
      decoded = walltime.decode_examples(
          vocab, feed, baseline, speculative, rng, args.gamma,
          on_batch=self._row_writer(vocab, examples, writer))
    except KeyboardInterrupt:
      writer.close()
      raise KeyboardInterrupt(f"kept {writer.kept()}; "
                              f"{METRICS_FILE} was not written") from None
    base_text = tasks.decode_tokens(vocab, decoded.base_tokens)
    spec_text = tasks.decode_tokens(vocab, decoded.spec_tokens)
    steps = walltime.step_times(args, self.drafter(draft), target, draft,
                                feed.batch(0),
                                int(decoded.tokens_generated / len(examples)))
    decoded, compile_s, steps = walltime.slowest(decoded, compile_s, steps)
    metrics = walltime.walltime_metrics(
        args, decoded, self._quality(base_text, spec_text, examples), compile_s,
        steps, self.data_info, self.settings(vocab), gamma_auto).to_dict()
    on_result(metrics)
    out = args.output_dir

    def write():
      writer.finish(len(examples))
      _write_result(os.path.join(out, METRICS_FILE), metrics,
                    f"the summary above and {PREDICTIONS_FILE} (complete)")

    multihost.run_on_first("write", write)  # the others wait for it
    logging.info("speedup %.2fx (theory %.2fx), alpha %.3f, c %.3f; wrote %s",
                 metrics["speedup"], metrics["theoretical_speedup"],
                 metrics["alpha"], metrics["cost_coefficient_c"], out)
    return metrics

  @staticmethod
  def _row_writer(vocab, examples, writer):
    """`decode_examples`' on_batch: predictions.jsonl rows as they come.

    Nothing measured in the rows: same settings and seed, same file. The
    Figure-5 timeline is modeled by `report` from `accepted_counts` and
    the step times.
    """
    done = [0]

    def on_batch(base_tokens, spec_tokens, records):
      start = done[0]
      base = tasks.decode_tokens(vocab, base_tokens)
      spec = tasks.decode_tokens(vocab, spec_tokens)
      writer.add([{
          "index": start + j,
          "input": examples[start + j]["input"],
          "reference": examples[start + j]["reference"],
          "baseline": base[j],
          "speculative": spec[j],
          **r
      } for j, r in enumerate(records)])
      done[0] += len(records)

    return on_batch

  def _run_alpha(self, vocab, examples, feed, mesh, target, draft, on_result):
    """α as the mean of β over target-sampled positions (Corollary 3.6)."""
    betas = alpha_mode.sampled_betas(self.args, feed, target, draft)
    result = alpha_mode.alpha_record(self.args, betas, len(examples),
                                     self.data_info, self.settings(vocab))
    on_result(result)
    multihost.run_on_first(
        "write",
        lambda: _write_result(os.path.join(self.args.output_dir, ALPHA_FILE),
                              result, "the summary above"))
    logging.info("alpha = %.4f ± %.4f over %d positions", result["alpha_beta"],
                 result["alpha_beta_stderr"], betas.size)
    return result


def _write_result(path: str, record: Dict[str, Any], kept: str) -> None:
  """io_utils.write_json; a failure names the file and what was kept."""
  try:
    io_utils.write_json(path, record)
  except OSError as e:
    raise predictions_lib.OutputWriteError(
        f"cannot write {path}: {e.strerror or e}. Kept: {kept}.") from None


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {argv[1:]}")
  try:
    gin_utils.parse_from_flags(check_macros=True)
  except ValueError as e:  # gin's own message names the binding
    raise ConfigError(str(e)) from None
  try:  # several hosts: T5X's flags, or a Cloud TPU VM (`multihost`)
    multihost.initialize_from_flags()
  except ValueError as e:
    raise ConfigError(str(e)) from None
  with multihost.failures_end_every_process("run", BAD_INPUT):
    console.setup()  # after the gin check: a typo fails in a second
    args = run_arguments()
    topology = compile_report.topology_value()
    if topology is not None:  # compile only (README, "Check a TPU ...")
      record = compile_report.compile_topology(args, topology,
                                               gin_utils.gin_files_flag())
      print("\n".join(compile_report.summary_lines(record)))
      return

    def print_summary(metrics):  # before anything is written
      if multihost.is_first():
        print("\n".join(summary_lines(metrics, args)), flush=True)

    Experiment(args).run(on_result=print_summary)


# Errors of the input (settings, checkpoints, a folder in use): one line,
# exit 2. A failed write or an unreachable gs:// (OSError): one line, exit 1.
BAD_INPUT = (ConfigError, checkpoints.CheckpointError)


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point: a bad setting prints one line and exits 2, before any
  model is loaded; nothing is written. Ctrl-C: one line, exit 130.
  --traceback shows any error's traceback."""
  gin_utils.define_gin_flags()
  multihost.define_flags()
  console.define_traceback_flag()
  return console.run_cli("run", lambda: gin_utils.run_main(main, argv),
                         BAD_INPUT)


if __name__ == "__main__":
  console.exit_process(cli())
