"""Trains a feature-level draft (`models.feature_drafter`) by distillation
(``train.feature_drafter``): the frozen target is the required teacher, the
head's tokens the ``head_size`` most frequent of the training targets, the
loss `loss.feature_losses`; no resumption (``feature_init_from``
warm-starts); validation reports the loss's metrics, teacher-forced.
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

from specdec_jax import checkpoints
from specdec_jax.checkpoints import feature_draft as feature_checkpoint
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig
from specdec_jax.core.models.feature_drafter import init_feature_params
from specdec_jax.data import tasks
from specdec_jax.files import io_utils
from specdec_jax.training import checkpointing
from specdec_jax.training import data as data_lib
from specdec_jax.training.config import TrainConfig
from specdec_jax.training.config import apply_step
from specdec_jax.training.loss import FeatureLossSettings
from specdec_jax.training.loss import feature_losses


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

  # step(params, opt_state, batch, head_tokens, teacher_params)
  step = functools.partial(apply_step, tx, loss_fn)
  return tx, jax.jit(step), jax.jit(loss_fn)


def _evaluate(eval_fn, params, head_tokens, teacher_params, sp, examples,
              config: TrainConfig) -> Dict[str, float]:
  """Token-weighted means of the loss's metrics on validation pairs."""
  inputs = tasks.encode_batch(sp, [e["input"] for e in examples],
                              config.max_input_length)
  targets = tasks.encode_batch(sp, [e["reference"] for e in examples],
                               config.max_target_length)
  sums: Dict[str, float] = {}
  total = 0.0
  size = config.eval_batch_size
  for i in range(0, len(examples), size):
    batch = data_lib.make_batch(inputs[i:i + size], targets[i:i + size],
                                config.length_bucket)
    _, m = eval_fn(params, batch, head_tokens, teacher_params)
    n = float(m["num_tokens"])
    total += n
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v) * n
  return {k: v / total for k, v in sums.items() if k != "num_tokens"}


def _prepare(config: TrainConfig):
  """(resolved paths, vocabulary, validation examples, teacher, dataset,
  head_tokens [K] int32), all checked before anything slow."""
  model: FeatureDrafterConfig = config.feature_drafter
  files = config.resolved_paths()
  if files.distill_from is None:
    raise ValueError("train.feature_drafter: a feature-level draft reads its "
                     "target's features; set train.distill_from to it.")
  if checkpoints.latest_checkpoint(files.model_dir) is not None:
    raise ValueError(
        f"train.model_dir={files.model_dir} holds a checkpoint already; a "
        "feature-draft run does not resume: use a fresh model_dir.")
  pairs, examples, sp = data_lib.read_data(config, files, model.layer_config,
                                           train_vocab=False)
  teacher = checkpointing.load_teacher(files.distill_from,
                                       config.teacher_config,
                                       config.teacher_model_gin,
                                       config.search_paths(),
                                       student=model.layer_config)
  dataset = data_lib.training_batches(config, sp, pairs)
  head_tokens = head_tokens_from_targets(dataset.targets, model.head_size,
                                         model.vocab_size)
  return files, sp, examples, teacher, dataset, head_tokens


def _warm_start(config: TrainConfig):
  """(params {'params': ...} float32, head_tokens [K] int32) of
  ``feature_init_from``, or None when it is unset; ValueError if its config
  differs from ``feature_drafter``."""
  if config.feature_init_from is None:
    return None
  ckpt = io_utils.resolve_path(config.feature_init_from)
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
  """(metrics as written to train_metrics.json, final {'params': ...}, the
  last checkpoint's path) of one feature-draft run; ValueError before
  training for bad input (no teacher, or one of another width)."""
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
  io_utils.atomic_write(
      os.path.join(files.model_dir, checkpointing.METRICS_FILE),
      json.dumps(metrics_out, indent=2))
  return metrics_out, params, ckpt
