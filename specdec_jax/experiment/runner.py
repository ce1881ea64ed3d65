"""Runs a `RunPlan`: OUTPUT_DIR locked (`check_output_dir`: another run's
results refused there unless OVERWRITE=True), this process's slice of the
examples read and shared (`multihost`), the models loaded, every choice made
before anything is timed (`pilots.choose`), then one mode:
`walltime.run_walltime`, MODE='infer' (`run_infer`) or MODE='alpha' (α as
Corollary 3.6's mean β, alpha.json).
"""
import contextlib
import dataclasses
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import multihost
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.models import T5Model
from specdec_jax.data import tasks
from specdec_jax.experiment import arguments
from specdec_jax.experiment import batches as batches_lib
from specdec_jax.experiment import loading
from specdec_jax.experiment import pilots
from specdec_jax.experiment import predictions
from specdec_jax.experiment import resume
from specdec_jax.experiment import walltime
from specdec_jax.experiment.plan import ConfigError
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import Models
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.experiment.plan import comparable
from specdec_jax.metrics import analysis
from specdec_jax.metrics import quality as quality_lib
from specdec_jax.metrics import run_metrics
from specdec_jax.multihost import partitioning

# A batch's inputs are cut to its longest row rounded up to this
# (`multihost.Feeder`): one compilation per width, all before timing; the
# encoder masks the padding, so no output changes.
INPUT_BUCKET = 16

# The settings of the run that last started writing here (for predictions
# files, which record none).
SETTINGS_FILE = ".specdec.settings.json"
PREDICTIONS_FILES = (run_metrics.PREDICTIONS_FILE, predictions.PARTIAL_FILE)
RESULT_FILES = (run_metrics.METRICS_FILE, run_metrics.ALPHA_FILE,
                run_metrics.INFER_FILE) + PREDICTIONS_FILES
OnResult = Callable[[Dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class RunData:
  """All N examples ({'input', 'reference'}, every process's), this
  process's batches and the result file's keys known before decoding
  (`info`: the data's; once the models are loaded, their `decode_paths`)."""
  examples: List[Dict[str, Any]]
  feed: multihost.Feeder
  info: Dict[str, Any]


def execute(plan: RunPlan, *, on_result: Optional[OnResult] = None,
            models: Optional[Models] = None) -> Tuple[Dict[str, Any], Models]:
  """Locks OUTPUT_DIR, reads the examples, loads, decodes and writes;
  returns (the result file's dict, the models). `on_result(result)` comes
  before anything is written; `models`: an earlier plan's (`sweep`)."""
  on_result = on_result or (lambda record: None)
  with _output_folder(plan):
    data = read_examples(plan)
    logging.info("%d examples; mode=%s γ=%s T=%s", len(data.examples),
                 plan.args.mode, plan.args.gamma, plan.args.temperature)
    models = plan.load_models(models)
    multihost.barrier("models_loaded")
    paths = loading.decode_paths_record(models.target, models.draft)
    data = dataclasses.replace(data, info={**data.info, "decode_paths": paths})
    if plan.args.mode == "alpha":
      return _run_alpha(plan, models, data, on_result), models
    decode_plan = pilots.choose(plan.load(models), data.feed)
    if plan.args.mode == "infer":  # the speculative decoder only
      return run_infer(decode_plan, data.feed, data.examples, data.info,
                       on_result), models
    return walltime.run_walltime(decode_plan, data.feed, data.examples,
                                 data.info, on_result), models


@contextlib.contextmanager
def _output_folder(plan: RunPlan) -> Iterator[None]:
  """OUTPUT_DIR for the run's life (`check_output_dir`; on several hosts
  process 0, the writer, holds it), then removed if this run made it and
  it stayed empty."""
  a, locks = plan.args, []
  created = not io_utils.is_url(a.output_dir) and not os.path.exists(
      a.output_dir)
  prepare = lambda: locks.append(  # pylint: disable=g-long-lambda
      check_output_dir(a.output_dir, plan.settings, a.overwrite))
  multihost.run_on_first("output_dir", prepare)
  try:
    yield
  finally:
    for lock in locks:
      lock.release()
    if created and multihost.is_first():
      with contextlib.suppress(OSError):
        os.rmdir(a.output_dir)  # only if empty


def _recorded_settings(path: str) -> Any:
  """The `settings` a results file records (None: none, or unreadable)."""
  return comparable(output_folder.recorded_settings(path))


def check_output_dir(out: str, settings: Dict[str, Any],
                     overwrite: bool) -> "_ResultsLock":
  """Claims `out` (created, probed and locked) and refuses a result file
  there of other settings (or of none) unless `overwrite`; returns the lock
  (the caller releases it). ConfigError."""
  held = output_folder.claim(out, comparable(settings), _results,
                             name="OUTPUT_DIR", program="run",
                             overwrite=overwrite,
                             overwrite_flag="OVERWRITE=True")
  try:
    # Whose results the folder will hold, before any is written: a kept
    # predictions file (full disk, Ctrl-C) is protected as metrics.json is.
    io_utils.write_json(os.path.join(out, SETTINGS_FILE),
                        {"settings": settings})
  except BaseException:
    held.release()
    raise
  return _ResultsLock(held, out)


class _ResultsLock:
  """The folder's claim; `release` also drops SETTINGS_FILE when the run
  kept no result file (nothing to protect)."""

  def __init__(self, held: output_folder.Claim, out: str):
    self.held, self.out = held, out

  def release(self) -> None:
    record = os.path.join(self.out, SETTINGS_FILE)
    try:
      if io_utils.isfile(record) and not any(
          _holds_results(self.out, name) for name in RESULT_FILES):
        io_utils.remove(record)
    except OSError as e:  # the results are written: only warn
      logging.warning("could not remove %s: %s", SETTINGS_FILE, e)
    self.held.release()


def _holds_results(out: str, name: str) -> bool:
  """Whether `out/name` is a result file to protect (an empty `.partial`,
  killed before its first row, is not)."""
  path = os.path.join(out, name)
  if not io_utils.isfile(path):
    return False
  if name == predictions.PARTIAL_FILE and not io_utils.is_url(path):
    try:
      return os.path.getsize(path) > 0
    except OSError:
      return False
  return True


def _results(out: str) -> Iterator[output_folder.Result]:
  """Every result file and its settings (the predictions files': those
  metrics.json, or else SETTINGS_FILE, records)."""
  for name in RESULT_FILES:
    if not _holds_results(out, name):
      continue
    if name not in PREDICTIONS_FILES:
      yield output_folder.Result(name,
                                 _recorded_settings(os.path.join(out, name)))
      continue
    old = _recorded_settings(os.path.join(out, run_metrics.METRICS_FILE))
    if old is None:
      old = _recorded_settings(os.path.join(out, SETTINGS_FILE))
    yield output_folder.Result(name, old, kept=True)


def read_examples(plan: RunPlan, asked: str = "NUM_EXAMPLES",
                  recorded_in: str = "metrics.json") -> RunData:
  """Each process reads and encodes its slice of the examples and shares
  texts and token counts (`asked`, `recorded_in`: `check_examples`)."""
  a = plan.args
  sharding = partitioning.data_sharding(plan.mesh, a.batch_size)
  try:
    layout = multihost.data_layout(sharding, a.batch_size)
  except ValueError as e:
    raise ConfigError(f"MESH_SHAPE={a.mesh_shape!r}: {e}") from None
  local, inputs, full_lengths = encoded_examples(
      plan, layout.shard_info if layout.num_shards > 1 else None)
  shared = multihost.share_examples(layout, local, inputs, full_lengths)
  info = check_examples(a, shared.examples, asked, recorded_in)
  info.update(check_truncation(a, shared.full_lengths))
  feed = multihost.Feeder(layout, inputs, shared, sharding, INPUT_BUCKET)
  return RunData(shared.examples, feed, info)


def encoded_examples(plan: RunPlan, shard_info: Any = None):
  """(examples, [N, S] input ids, [N] lengths with EOS before truncation)
  of this process's slice (`shard_info`; all of them when None)."""
  a = plan.args
  try:
    examples = tasks.load_examples(
        mixture_or_task_name=a.mixture_or_task_name, split=a.split,
        num_examples=a.num_examples, source_file=loading.resolve(a.source_file),
        reference_file=loading.resolve(a.reference_file),
        input_prefix=a.input_prefix, shard_info=shard_info)
  except ValueError as e:  # names the file and line, or the task
    raise ConfigError(str(e)) from None
  inputs, full_lengths = tasks.encode_batch(plan.vocab,
                                            [e["input"] for e in examples],
                                            a.task_feature_lengths["inputs"],
                                            return_lengths=True)
  return examples, inputs, full_lengths


def check_examples(a, examples, asked: str = "NUM_EXAMPLES",
                   recorded_in: str = "metrics.json") -> Dict[str, Any]:
  """All examples (every process's): none is an error; fewer than asked is
  logged, naming the setting that asked (`asked`) and the file recording
  both (`recorded_in`)."""
  source = (f"task {a.mixture_or_task_name!r} split {a.split!r}"
            if a.mixture_or_task_name else f"SOURCE_FILE={a.source_file!r}")
  if not examples:
    raise ConfigError(f"No examples to decode in {source}.")
  if len(examples) < a.num_examples:
    logging.warning(
        "%s=%d but %s has only %d examples: decoding %d (%s records both "
        "numbers).", asked, a.num_examples, source, len(examples),
        len(examples), recorded_in)
  return {"num_examples_requested": a.num_examples}


def check_truncation(a, lengths: np.ndarray) -> Dict[str, Any]:
  """Inputs longer than S (all examples' `lengths`): counted, logged."""
  length = a.task_feature_lengths["inputs"]
  truncated = int(np.sum(lengths > length))
  if truncated:
    logging.warning(
        "TASK_FEATURE_LENGTHS['inputs']=%d truncates %d of %d inputs (the "
        "longest has %d tokens with EOS); they are decoded from their "
        "first %d tokens. Raise it to decode whole inputs.", length, truncated,
        len(lengths), int(lengths.max()), length - 1)
  return dict(inputs_length=length, inputs_truncated=truncated,
              longest_input_tokens=int(lengths.max()))


def run_infer(plan: DecodePlan, feed: multihost.Feeder,
              examples: Sequence[Dict[str, Any]], data_info: Dict[str, Any],
              on_result: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
  """MODE='infer', as T5X's `infer.py`: the speculative decoder only, each
  batch's rows written to predictions.jsonl as it finishes, with an ETA,
  an interrupted run of the same settings resumed (`resume`);
  `on_result(record)` before infer.json is written. Returns its dict."""
  compile_s = batches_lib.compile_widths(feed,
                                         [("speculative", plan.speculative)],
                                         plan.rng)
  out = plan.args.output_dir
  ident = resume.identity(plan.settings, examples)
  resumed = resume.Resumed.from_json(
      multihost.run_on_first("resume",
                             lambda: resume.load(out, ident).to_json()))
  writer = predictions.PredictionsWriter(out, multihost.is_first(),
                                         resumed.lines)
  checkpoints = resume.Checkpointer(out, ident, writer)
  texts, tally = resumed.texts(), resumed.new_tally()
  if resumed.batches:
    logging.info(
        "infer: resuming an interrupted run after %d of %d examples (%d "
        "batches; their rows kept)", resumed.examples, len(examples),
        resumed.batches)
  current = plan  # SPECULATION='auto': the choice of the batches before
  try:
    for batch in batches_lib.batches(feed, plan.rng, start=resumed.batches):
      result, seconds = batch.decode(current.speculative, plan.providers.clock)
      tally.add(result, batch.keep, current.mode, seconds)
      rows = np.asarray(result.tokens)[batch.keep]
      row_calls = np.asarray(result.target_calls)[batch.keep]
      start = len(texts)
      texts += tasks.decode_tokens(plan.vocab, rows)
      writer.add([
          predictions.row(start + j, examples[start + j], texts[start + j],
                          int(row_calls[j])) for j in range(len(rows))
      ])
      done, decode_s = batch.index + 1, sum(tally.seconds)
      logging.info("infer: batch %d/%d, %d examples, %.1f s, ETA %.0f s", done,
                   feed.num_batches, len(texts), decode_s,
                   decode_s / done * (feed.num_batches - done))
      checkpoints.after(tally)
      if plan.online is not None:  # the next batch's choice
        current = plan.online.after_batch(batch, None, seconds, result, feed)
  except KeyboardInterrupt:
    checkpoints.after(tally, force=True)
    writer.close()
    then = ("; the same command resumes after them"
            if checkpoints.saved else "")
    raise KeyboardInterrupt(f"kept {writer.kept()}; {run_metrics.INFER_FILE} "
                            f"was not written{then}") from None
  record = infer_record(plan, examples, texts, tally, compile_s, data_info)
  if resumed.batches:
    record["resumed_after_examples"] = resumed.examples
  on_result(record)

  def write():
    predictions.publish(writer, len(examples),
                        os.path.join(out, run_metrics.INFER_FILE), record)
    checkpoints.finish()

  multihost.run_on_first("write", write)
  return record


def infer_record(plan: DecodePlan, examples: Sequence[Dict[str, Any]],
                 texts: List[str], tally: batches_lib.Tally, compile_s: float,
                 data_info: Dict[str, Any]) -> Dict[str, Any]:
  """infer.json's dict: what was decoded, how fast, how well (`tally`:
  the speculative decoder's counts). A run that switched choices
  (SPECULATION='auto') records the last one's settings, GAMMA='auto' its
  `gamma_auto`."""
  ended, auto, switch_compile_s = (plan.online.outcome() if plan.online else
                                   (plan, None, 0.0))
  args = ended.args
  references = [e.get("reference") for e in examples]
  quality = None
  if all(r is not None for r in references):
    quality = quality_lib.quality_metrics(plan.task_kind, texts, references)
  decode_s = sum(tally.seconds)
  record = dict(
      mode="infer", task=args.label, target_model=args.target_name,
      draft_model=args.drafting.label(args.draft_name) + ended.mode.label(args),
      decode_mode=ended.mode.name, gamma=args.gamma,
      temperature=args.temperature, num_examples=len(examples),
      tokens_generated=tally.tokens, target_calls=tally.calls,
      tokens_per_target_call=tally.tokens / max(tally.calls, 1),
      alpha=tally.alpha, decode_s=decode_s,
      compile_time_s=compile_s + switch_compile_s,
      tokens_per_second=tally.tokens / max(decode_s, 1e-9), quality=quality,
      **data_info, settings=plan.settings,
      **run_metrics.speculation_keys(args.speculation, auto))
  if plan.gamma_auto is not None:  # how the γ (and k) decoded were chosen
    record["gamma_auto"] = plan.gamma_auto
  return record


def _run_alpha(plan: RunPlan, models: Models, data: RunData,
               on_result: OnResult) -> Dict[str, Any]:
  """α as the mean of β over target-sampled positions (Corollary 3.6):
  alpha.json, with its standard error."""
  a = plan.args
  betas = sampled_betas(a, data.feed, models.target, models.draft)
  mean, stderr = analysis.alpha_from_beta_samples(betas)
  result = dict(task=a.label, target_model=a.target_name,
                draft_model=a.draft_name, temperature=a.temperature,
                top_k=a.top_k, top_p=a.top_p, num_examples=len(data.examples),
                num_positions=int(betas.size), alpha_beta=mean,
                alpha_beta_stderr=stderr, random_weights=a.random_weights,
                **data.info, settings=plan.settings)
  on_result(result)
  path = os.path.join(plan.args.output_dir, run_metrics.ALPHA_FILE)
  multihost.run_on_first(
      "write",
      lambda: predictions.write_result(path, result, "the summary above"))
  logging.info("alpha = %.4f ± %.4f over %d positions", result["alpha_beta"],
               result["alpha_beta_stderr"], betas.size)
  return result


@jax.jit
def beta_per_position(target: T5Model, draft: T5Model, inputs, outputs, lengths,
                      method: sampling.SamplingMethod):
  """(β [B, T], valid [B, T]): Definition 3.1's β_t = Σ_x min(p_t(x),
  q_t(x)) along target-generated outputs [B, T], both models reading the
  same teacher-forced prefixes; valid = positions < lengths [B]."""
  decoder_inputs = jnp.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  valid = jnp.arange(outputs.shape[1])[None, :] < lengths[:, None]
  ones = jnp.ones_like(outputs)
  logits_p = target.teacher_forced_logits(inputs, decoder_inputs, ones)
  # A shared-encoder draft (`SharedEncoderModel`) reads the target's encoder.
  logits_q = draft.teacher_forced_logits(inputs, decoder_inputs, ones)
  return sampling.acceptance_beta(method.standardize(logits_p),
                                  method.standardize(logits_q)), valid


def sampled_betas(args: arguments.RunArguments, feed: multihost.Feeder,
                  target: T5Model, draft: T5Model) -> np.ndarray:
  """[positions] β at every position of target samples, over all batches."""
  method = args.method()

  def betas_of(inputs, rng):  # (β [B, T], valid [B, T]) of target samples
    out = decoding.temperature_sample(target, inputs, rng,
                                      max_decode_length=args.max_decode_length,
                                      method=method)
    return beta_per_position(target, draft, inputs, out.tokens, out.lengths,
                             method)

  betas = []
  for batch in batches_lib.batches(feed, jax.random.PRNGKey(args.seed)):
    (beta, valid), _ = batch.decode(betas_of)  # every row
    beta, valid = np.asarray(beta)[batch.keep], np.asarray(valid)[batch.keep]
    betas.append(beta[valid])
  return np.concatenate(betas)
