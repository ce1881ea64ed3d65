"""Runs a `RunPlan`: OUTPUT_DIR, the examples, the models, one mode.

`execute(plan)` takes OUTPUT_DIR (created, probed and locked for the run's
life: `output_dir.check_output_dir`), reads this process's slice of the
examples and shares them (`multihost`), loads the models (`plan.load`),
makes every choice before anything is timed (`pilots.choose`: GAMMA,
TREE_WIDTH or SPECULATION 'auto'), and hands everything to the mode:
`walltime.run_walltime` (both decoders timed, metrics.json), MODE='alpha'
(alpha.json) or MODE='infer' (the speculative decoder only:
`infer.run_infer`, infer.json).
"""
import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import multihost
from specdec_jax.config import paths
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.models import T5Model
from specdec_jax.data import tasks
from specdec_jax.experiment import arguments
from specdec_jax.experiment import batches as batches_lib
from specdec_jax.experiment import infer
from specdec_jax.experiment import loading
from specdec_jax.experiment import output_dir as output_dir_lib
from specdec_jax.experiment import pilots
from specdec_jax.experiment import predictions
from specdec_jax.experiment import walltime
from specdec_jax.experiment.plan import ConfigError
from specdec_jax.experiment.plan import Models
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.metrics import analysis
from specdec_jax.metrics import run_metrics
from specdec_jax.multihost import partitioning

# Encoder input widths are multiples of this: a batch's inputs are cut to its
# longest row rounded up to it (`multihost.Feeder`), so the encoder runs on
# ~16-32 positions for a caption rather than on TASK_FEATURE_LENGTHS['inputs']
# = 64 padded ones, in both decoders alike, at the price of one compilation
# per width (all compiled before timing). Trailing padding does not change
# any output: the encoder masks it.
INPUT_BUCKET = 16

OnResult = Callable[[Dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class RunData:
  """Every process's examples, this process's batches, their counts.

  Attributes:
    examples: all N examples ({'input', 'reference'}), in order.
    feed: this process's batches (`multihost.Feeder`).
    info: metrics.json's data keys (requested / truncated counts).
  """
  examples: List[Dict[str, Any]]
  feed: multihost.Feeder
  info: Dict[str, Any]


def execute(plan: RunPlan, *, on_result: Optional[OnResult] = None,
            models: Optional[Models] = None) -> Tuple[Dict[str, Any], Models]:
  """Locks OUTPUT_DIR, reads the examples, loads, decodes and writes.

  Args:
    plan: a built (checked) plan.
    on_result: called with the result before anything is written (`run`
      prints its summary there: a failed write loses no result).
    models: an earlier plan's models to reuse (`sweep`).

  Returns:
    (metrics.json's dict, or alpha.json's in MODE='alpha'; the models).
  """
  on_result = on_result or (lambda record: None)
  with _output_folder(plan):
    data = read_examples(plan)
    logging.info("%d examples; mode=%s γ=%s T=%s", len(data.examples),
                 plan.args.mode, plan.args.gamma, plan.args.temperature)
    models = plan.load_models(models)
    # No process enters the decoders' collectives long before the others.
    multihost.barrier("models_loaded")
    if plan.args.mode == "alpha":
      return _run_alpha(plan, models, data, on_result), models
    # Every choice (GAMMA, TREE_WIDTH or SPECULATION 'auto') is made
    # before the timed decode starts, then the decoders are built once.
    decode_plan = pilots.choose(plan.load(models), data.feed)
    if plan.args.mode == "infer":  # the speculative decoder only
      return infer.run_infer(decode_plan, data.feed, data.examples, data.info,
                             on_result), models
    return walltime.run_walltime(decode_plan, data.feed, data.examples,
                                 data.info, on_result), models


class _output_folder:  # pylint: disable=invalid-name
  """OUTPUT_DIR for the run's life: created and probed, locked (one run at
  a time), another run's results refused (`output_dir.check_output_dir`);
  on exit the lock is released and a folder this run made is removed if
  it stayed empty. On several hosts process 0 (the writer) checks and
  holds the lock, and the others follow its verdict."""

  def __init__(self, plan: RunPlan):
    self.out = plan.args.output_dir
    self.plan = plan
    self.lock = None
    self.created = not paths.is_url(self.out) and not os.path.exists(self.out)

  def __enter__(self):

    def prepare():
      self.lock = output_dir_lib.check_output_dir(self.out, self.plan.settings,
                                                  self.plan.args.overwrite)

    multihost.run_on_first("output_dir", prepare)
    return self

  def __exit__(self, *exc):
    if self.lock is not None:
      self.lock.release()
    if self.created and multihost.is_first():
      try:
        os.rmdir(self.out)  # only if empty
      except OSError:
        pass
    return False


def read_examples(plan: RunPlan, asked: str = "NUM_EXAMPLES",
                  recorded_in: str = "metrics.json") -> RunData:
  """Each process reads its slice of the examples, encodes it and shares
  texts and token counts, so every process knows all of them (`asked`,
  `recorded_in`: `check_examples`)."""
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
  """All examples (every process's): none is an error; fewer than
  NUM_EXAMPLES is logged and recorded (the line names the setting that
  asked for them, `asked`, and the file recording both, `recorded_in`:
  certify's --examples and certificate.json)."""
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


def _run_alpha(plan: RunPlan, models: Models, data: RunData,
               on_result: OnResult) -> Dict[str, Any]:
  """α as the mean of β over target-sampled positions (Corollary 3.6)."""
  betas = sampled_betas(plan.args, data.feed, models.target, models.draft)
  result = alpha_record(plan.args, betas, len(data.examples), data.info,
                        plan.settings)
  on_result(result)
  path = os.path.join(plan.args.output_dir, run_metrics.ALPHA_FILE)
  multihost.run_on_first(
      "write",
      lambda: predictions.write_result(path, result, "the summary above"))
  logging.info("alpha = %.4f ± %.4f over %d positions", result["alpha_beta"],
               result["alpha_beta_stderr"], betas.size)
  return result


# -- alpha ---------------------------------------------------------------------
# MODE='alpha': α as Corollary 3.6 measures it, without walltimes.
#
# Sample from the target, then average β = Σ_x min(p(x), q(x)) over the
# positions of those samples (`alpha.json`): cheap enough to run for many
# (task, draft, temperature) settings.
@jax.jit
def beta_per_position(target: T5Model, draft: T5Model, inputs, outputs, lengths,
                      method: sampling.SamplingMethod):
  """β_t = Σ_x min(p_t(x), q_t(x)) along target-generated outputs [B, T].

  Both models read the same teacher-forced prefixes (the target's samples),
  so β_t is Definition 3.1's β at position t of a target sequence.

  Returns (beta [B, T], valid [B, T]) with valid = positions < lengths [B].
  """
  decoder_inputs = jnp.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  valid = jnp.arange(outputs.shape[1])[None, :] < lengths[:, None]
  ones = jnp.ones_like(outputs)
  logits_p = target.teacher_forced_logits(inputs, decoder_inputs, ones)
  # A shared-encoder draft (`SharedEncoderModel`) reads the target's encoder.
  logits_q = draft.teacher_forced_logits(inputs, decoder_inputs, ones)
  p = method.standardize(logits_p)
  q = method.standardize(logits_q)
  return sampling.acceptance_beta(p, q), valid


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


def alpha_record(args: arguments.RunArguments, betas: np.ndarray,
                 num_examples: int, data_info: Dict[str, Any],
                 settings: Dict[str, Any]) -> Dict[str, Any]:
  """alpha.json: Corollary 3.6's α (mean β) with its standard error."""
  mean, stderr = analysis.alpha_from_beta_samples(betas)
  return {
      "task": args.label,
      "target_model": args.target_name,
      "draft_model": args.draft_name,
      "temperature": args.temperature,
      "top_k": args.top_k,
      "top_p": args.top_p,
      "num_examples": num_examples,
      "num_positions": int(betas.size),
      "alpha_beta": mean,
      "alpha_beta_stderr": stderr,
      "random_weights": args.random_weights,
      **data_info,
      "settings": settings,
  }
