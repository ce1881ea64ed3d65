"""Trains a feature-level draft (`models.feature_drafter`) by distillation.

`train_and_evaluate` hands a run here when ``train.feature_drafter`` is set
(a `FeatureDrafterConfig`). Same data, vocabulary, teacher loading and
optimizer as every other run; what differs:

1. The teacher (``distill_from``, the frozen target) is required: the
   draft reads its features, encoder output and embedding table.
2. The head's tokens: the ``head_size`` most frequent tokens of the
   training targets (EOS included; ties by id), counted once.
3. The step minimises `loss.feature_losses`.
4. Checkpoints (`checkpoints.feature_draft`: T5X's Orbax layout, the draft's
   parameters, ``head_tokens`` [K] int32 and ``feature_config.json``); a
   model_dir that holds one already is refused (no resumption); a run
   may instead warm-start from an earlier one (``feature_init_from``: its
   parameters and head tokens, a fresh optimizer and schedule).
5. Evaluation: the loss's metrics (acceptance of the first and later
   guesses, `alpha0_*`/`alpha1_*`) on the first ``eval_num_examples``
   validation pairs, teacher-forced, in ``train_metrics.json``.
"""
import functools
import json
import os
import time
from typing import Any, Callable, Dict, List, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import checkpoints
from specdec_jax.checkpoints import feature_draft as feature_checkpoint
from specdec_jax.config import paths
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig
from specdec_jax.core.models.feature_drafter import init_feature_params
from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocabulary
from specdec_jax.files import io_utils
from specdec_jax.training import checkpointing
from specdec_jax.training import data as data_lib
from specdec_jax.training import teacher as teacher_lib
from specdec_jax.training.config import TrainConfig
from specdec_jax.training.loss import FeatureLossSettings
from specdec_jax.training.loss import feature_losses

METRICS_FILE = "train_metrics.json"


def head_tokens_from_targets(targets: np.ndarray, head_size: int,
                             vocab_size: int) -> np.ndarray:
  """[K] int32: the K most frequent non-pad ids of targets [N, T] (ties: the
  lower id first), then unseen ids in order if fewer than K occur."""
  counts = np.bincount(targets[targets > 0].ravel(), minlength=vocab_size)
  counts[0] = -1  # Padding is never a guess.
  order = np.lexsort((np.arange(vocab_size), -counts))
  return np.sort(order[:head_size]).astype(np.int32)


def frequent_tokens(sp, target_file: str, vocab_size: int,
                    max_length: int = 64) -> Callable[[int], np.ndarray]:
  """K -> [K] int32: a trainer's head tokens for a head of K tokens, the K
  most frequent of `target_file`'s lines (the training targets, encoded as
  the trainer encodes them), for `restrict_head` on a trained draft."""
  with open(target_file, encoding="utf-8") as f:
    lines = f.read().splitlines()
  targets = tasks.encode_batch(sp, lines, max_length)
  return lambda k: head_tokens_from_targets(targets, k, vocab_size)


@functools.lru_cache(maxsize=4)
def _step_fn(config: FeatureDrafterConfig, teacher, settings, optimizer):
  tx = optimizer.make()
  loss_fn = functools.partial(feature_losses, config=config, teacher=teacher,
                              settings=settings)

  def step(params, opt_state, batch, head_tokens, teacher_params):
    (_, metrics), grads = jax.value_and_grad(loss_fn,
                                             has_aux=True)(params, batch,
                                                           head_tokens,
                                                           teacher_params)
    updates, opt_state = tx.update(grads, opt_state, params)
    metrics["grad_norm"] = jnp.sqrt(
        sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
    return optax.apply_updates(params, updates), opt_state, metrics

  return tx, jax.jit(step), jax.jit(loss_fn)


def _evaluate(eval_fn, params, head_tokens, teacher_params, sp, examples,
              config: TrainConfig) -> Dict[str, float]:
  """Token-weighted means of the loss's metrics on validation pairs."""
  inputs = tasks.encode_batch(sp, [e["input"] for e in examples],
                              config.max_input_length)
  targets = tasks.encode_batch(sp, [e["reference"] for e in examples],
                               config.max_target_length)
  data = data_lib.ParallelData(sp, [("a", "b")], input_prefix="",
                               max_input_length=config.max_input_length,
                               max_target_length=config.max_target_length,
                               batch_size=1, seed=0,
                               length_bucket=config.length_bucket)
  sums: Dict[str, float] = {}
  total = 0.0
  size = config.eval_batch_size
  for i in range(0, len(examples), size):
    batch = data.make_batch(inputs[i:i + size], targets[i:i + size])
    _, m = eval_fn(params, batch, head_tokens, teacher_params)
    n = float(m["num_tokens"])
    total += n
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v) * n
  return {k: v / total for k, v in sums.items() if k != "num_tokens"}


def _prepare(config: TrainConfig):
  """Checks and reads everything a run needs, before anything slow.

  Returns:
    (resolved paths, vocabulary, validation examples, teacher, dataset,
    head_tokens [K] int32).
  """
  model: FeatureDrafterConfig = config.feature_drafter
  files = config.resolved_paths()
  if files.distill_from is None:
    raise ValueError("train.feature_drafter: a feature-level draft reads its "
                     "target's features; set train.distill_from to it.")
  if checkpoints.latest_checkpoint(files.model_dir) is not None:
    raise ValueError(
        f"train.model_dir={files.model_dir} holds a checkpoint already; a "
        "feature-draft run does not resume: use a fresh model_dir.")
  pairs = data_lib.read_training_pairs(files.source_file, files.reference_file,
                                       config.num_train_examples)
  examples = data_lib.read_eval_examples(files.eval_source_file,
                                         files.eval_reference_file,
                                         input_prefix=config.input_prefix,
                                         num_examples=config.eval_num_examples)
  sp = vocabulary.prepare_vocabulary(files.spm_model_path, train_vocab=False,
                                     training_files=[],
                                     vocab_size=config.spm_vocab_size,
                                     spm_options=config.spm_options)
  vocabulary.check_fits(sp, files.spm_model_path, model.layer_config)
  teacher = teacher_lib.load_teacher(files.distill_from, config.teacher_config,
                                     config.teacher_model_gin,
                                     config.search_paths(),
                                     student=model.layer_config)
  dataset = data_lib.ParallelData(sp, pairs, input_prefix=config.input_prefix,
                                  max_input_length=config.max_input_length,
                                  max_target_length=config.max_target_length,
                                  batch_size=config.batch_size,
                                  seed=config.seed,
                                  length_bucket=config.length_bucket,
                                  sort_window=config.sort_window)
  head_tokens = head_tokens_from_targets(dataset.targets, model.head_size,
                                         model.vocab_size)
  return files, sp, examples, teacher, dataset, head_tokens


def _warm_start(config: TrainConfig):
  """(params {'params': ...} float32, head_tokens [K] int32) of
  ``feature_init_from``, or None when it is unset.

  Raises:
    ValueError: its config differs from ``feature_drafter`` (shapes or
      widths would not match the run's).
  """
  if config.feature_init_from is None:
    return None
  ckpt = paths.resolve_path(config.feature_init_from)
  old = feature_checkpoint.read_config(ckpt)
  new = config.feature_drafter
  old_fields = feature_checkpoint.config_fields(old)
  new_fields = feature_checkpoint.config_fields(new)
  if old_fields != new_fields:
    differ = sorted(k for k in new_fields if old_fields.get(k) != new_fields[k])
    raise ValueError(
        f"train.feature_init_from={config.feature_init_from}: its "
        f"feature_config.json differs from train.feature_drafter in {differ} "
        f"({[old_fields.get(k) for k in differ]} vs "
        f"{[new_fields[k] for k in differ]}).")
  _, params, head_tokens = feature_checkpoint.load(ckpt)
  return params, head_tokens


def _log(step: int, num_steps: int, metrics, seconds: float) -> Dict:
  """Logs one step's metrics; returns them as floats."""
  m = {k: float(v) for k, v in jax.device_get(metrics).items()}
  logging.info(
      "step %d/%d: loss=%.4f head=%.4f feature=%.4f alpha0 %.3f/%.3f "
      "alpha1 %.3f/%.3f off_head=%.3f (%.1f s)", step, num_steps, m["loss"],
      m["head_1"], m["feature_1"], m["alpha0_1"], m.get("alpha0_2",
                                                        0.0), m["alpha1_1"],
      m.get("alpha1_2", 0.0), m["off_head_1"], seconds)
  if not np.isfinite(m["loss"]):
    raise FloatingPointError(f"the loss is {m['loss']} at step {step}.")
  return {"step": step, **m}


def train_feature_drafter(
    config: TrainConfig) -> Tuple[Dict[str, Any], Any, str]:
  """One feature-draft run (see the module docstring).

  Returns:
    (metrics as written to train_metrics.json, final {'params': ...}, the
    last checkpoint's path).

  Raises:
    ValueError: no teacher, a teacher of another width or vocabulary, or a
      model_dir that holds a checkpoint already; before training.
  """
  t_begin = time.time()
  model: FeatureDrafterConfig = config.feature_drafter
  warm = _warm_start(config)
  files, sp, examples, teacher, dataset, head_tokens = _prepare(config)
  if warm is not None:
    params, head_tokens = warm
  else:
    params = init_feature_params(model, jax.random.PRNGKey(config.seed))
  settings = FeatureLossSettings(feature_weight=config.feature_weight,
                                 unroll_weight=config.unroll_weight,
                                 z_loss=config.z_loss)
  tx, step_fn, eval_fn = _step_fn(model, teacher.config, settings,
                                  config.optimizer_settings())
  opt_state = tx.init(params)
  os.makedirs(files.model_dir, exist_ok=True)
  logging.info(
      "Training feature draft %s: %d params (%d read per step), "
      "head %d tokens, %d steps.", files.model_dir, model.num_params,
      model.step_params, model.head_size, config.num_steps)
  history: List[Dict[str, float]] = []
  ckpt = ""
  head = jnp.asarray(head_tokens)
  t_train = time.time()
  for step in range(1, config.num_steps + 1):
    params, opt_state, metrics = step_fn(params, opt_state,
                                         dataset.batch(step - 1), head,
                                         teacher.params)
    last = step == config.num_steps
    if step % config.log_every_steps == 0 or last:
      history.append(
          _log(step, config.num_steps, metrics,
               time.time() - t_train))
    if step % config.save_every_steps == 0 or last:
      with checkpointing.quiet_absl():
        ckpt = feature_checkpoint.save(files.model_dir, step, params,
                                       head_tokens, model)
      logging.info("Saved %s", ckpt)
  metrics_out: Dict[str, Any] = {
      "model_dir": files.model_dir,
      "step": config.num_steps,
      "num_params": model.num_params,
      "step_params": model.step_params,
      "feature_config": feature_checkpoint.config_fields(model),
      "distill_from": teacher.checkpoint,
      "init_from": config.feature_init_from,
      "train_seconds": time.time() - t_train,
      "history": history,
  }
  if examples:
    metrics_out["eval"] = _evaluate(eval_fn, params, head, teacher.params, sp,
                                    examples, config)
    logging.info("Validation (teacher-forced, %d pairs): %s", len(examples),
                 metrics_out["eval"])
  metrics_out["wall_seconds"] = time.time() - t_begin
  io_utils.atomic_write(os.path.join(files.model_dir, METRICS_FILE),
                        json.dumps(metrics_out, indent=2))
  return metrics_out, params, ckpt
