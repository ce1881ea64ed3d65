"""`train_and_evaluate`: one training run, from files to a scored checkpoint.

Everything is checked before the first step: MODEL_DIR claimed, data and
vocabulary read (a resumed model_dir must use the same vocabulary), the
teacher loaded when distilling (a shared-encoder student trains and decodes
on its encoder). Then the jitted step (`train_step_fn`) from a fresh or the
latest checkpoint's state, logged and saved periodically, and the greedy
validation BLEU, written to ``model_dir/train_metrics.json``.
"""
import contextlib
import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.core import decoding
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import T5Model
from specdec_jax.data import tasks
from specdec_jax.files import io_utils
from specdec_jax.metrics import quality as metrics
from specdec_jax.terminal import console
from specdec_jax.training import checkpointing
from specdec_jax.training import data as data_lib
from specdec_jax.training import feature_trainer
from specdec_jax.training.config import OptimizerSettings
from specdec_jax.training.config import TrainConfig
from specdec_jax.training.config import TrainPaths
from specdec_jax.training.config import apply_step
from specdec_jax.training.loss import LossSettings
from specdec_jax.training.loss import compute_losses


@dataclasses.dataclass
class TrainResult:
  """What `train_and_evaluate` returns: the step reached and the one it
  started from (> 0 when resumed), the final {'params': ...} and optimizer
  state, one dict of metrics per step run now (`history`), what was written
  to train_metrics.json (`metrics`), the last checkpoint's path and the
  model's T5Config."""
  step: int
  start_step: int
  params: Any
  opt_state: Any
  history: List[Dict[str, float]]
  metrics: Dict[str, Any]
  checkpoint: Optional[str]
  config: T5Config


@dataclasses.dataclass
class _State:
  """The loop's state; `saved_step` is the step of `checkpoint` (or None)."""
  step: int
  params: Any
  opt_state: Any
  checkpoint: Optional[str]
  saved_step: Optional[int]


class TrainingDiverged(FloatingPointError):
  """The loss became inf or nan; names the step."""


class _Progress:
  """Per-step metrics, fetched from the device once per logging window, and
  the throughput of the steps after the first (compiling) one."""

  def __init__(self, log_every_steps: int, num_steps: int, schedule):
    self.history: List[Dict[str, float]] = []
    self._pending: List[Tuple[int, Dict[str, jax.Array]]] = []
    self._log_every, self._num_steps = log_every_steps, num_steps
    self._schedule = schedule
    self._window_start: Optional[float] = None
    self._window_steps = self._window_tokens = 0
    self.total_time, self.total_steps, self.total_tokens = 0.0, 0, 0
    self._last_line = time.time()  # the last progress line's time

  @contextlib.contextmanager
  def step(self, step: int):
    """Around one step: the first (which compiles the train step) as a
    progress phase, with its seconds; later ones as they are."""
    if self._window_start is not None:
      yield
      return
    with console.phase(f"step {step + 1}/{self._num_steps}: compiling "
                       "the train step (the first step; later steps "
                       "reuse it)"):
      yield
    self._last_line = time.time()

  def record(self, step: int, metrics, batch) -> None:
    self._pending.append((step, metrics))
    if self._window_start is None:  # Exclude the first (compiling) step.
      jax.block_until_ready(metrics)
      self._window_start = time.time()
    else:
      self._window_steps += 1
      self._window_tokens += int((batch["decoder_target_tokens"] > 0).sum() +
                                 (batch["encoder_input_tokens"] > 0).sum())
      # Between log_every_steps lines, a line at least every HEARTBEAT_S
      # (the first steps of a slow model are not silent).
      now = time.time()
      if (now - self._last_line >= console.HEARTBEAT_S and
          step % self._log_every and step != self._num_steps):
        logging.info("step %d/%d (%.2f steps/s)", step, self._num_steps,
                     self._window_steps / max(now - self._window_start, 1e-9))
        self._last_line = now

  def flush(self) -> None:
    """Fetches the pending steps' metrics; stops at a non-finite loss."""
    fetched = jax.device_get([m for _, m in self._pending])
    pending, self._pending = self._pending, []
    for (s, _), m in zip(pending, fetched):
      self.history.append({"step": s, **{k: float(v) for k, v in m.items()}})
      if not math.isfinite(self.history[-1]["loss"]):
        raise TrainingDiverged(
            f"the loss is {self.history[-1]['loss']} at step {s} (of "
            f"{self._num_steps}): training diverged; stopped before saving "
            "this state (the last checkpoint is the previous save). Try a "
            "lower train.learning_rate or a grad_clip_norm.")

  def log(self, step: int, metrics) -> None:
    """Logs the window's mean metrics and throughput; starts a new window."""
    jax.block_until_ready(metrics)
    elapsed = time.time() - self._window_start
    self.flush()
    recent = self.history[-self._log_every:]
    mean = {
        k: float(np.mean([h[k]
                          for h in recent])) for k in recent[0] if k != "step"
    }
    timed = self._window_steps and elapsed > 0
    if self._window_steps:
      self.total_time += elapsed
    self.total_steps += self._window_steps
    self.total_tokens += self._window_tokens
    logging.info(
        "step %d/%d: loss=%.4f ce=%.4f%s acc=%.3f lr=%.2e grad_norm=%.3f "
        "steps/s=%.2f tokens/s=%.0f", step, self._num_steps, mean["loss"],
        mean["ce"], f" kl={mean['kl']:.4f}" if "kl" in mean else "",
        mean["accuracy"], float(self._schedule(step - 1)), mean["grad_norm"],
        self._window_steps / elapsed if timed else 0.0,
        self._window_tokens / elapsed if timed else 0.0)
    self._window_start, self._window_steps, self._window_tokens = (time.time(),
                                                                   0, 0)
    self._last_line = self._window_start

  @contextlib.contextmanager
  def paused(self):
    """Time inside the block (saving) is not training time."""
    start = time.time()
    yield
    if self._window_start is not None:
      self._window_start += time.time() - start

  def summary(self) -> Dict[str, float]:
    """Losses at the start and end, and the mean throughput."""
    out = {}
    history, n = self.history, self._log_every
    if history:
      head, tail = history[:n], history[-n:]
      out.update({
          "initial_loss": history[0]["loss"],
          "first_window_loss": float(np.mean([h["loss"] for h in head])),
          "final_loss": float(np.mean([h["loss"] for h in tail])),
          "final_ce": float(np.mean([h["ce"] for h in tail])),
      })
      if "kl" in tail[0]:
        out["final_kl"] = float(np.mean([h["kl"] for h in tail]))
        out["initial_kl"] = history[0]["kl"]
    if self.total_steps:
      out["steps_per_second"] = self.total_steps / self.total_time
      out["tokens_per_second"] = self.total_tokens / self.total_time
    return out


def _initial_state(model: T5Config, tx, model_dir: str, init_rng) -> _State:
  """Fresh parameters and optimizer state, or the latest checkpoint's (a
  progress phase)."""
  with console.phase(
      f"Setting up {model.num_params} parameters and the optimizer state "
      f"(fresh, or the latest checkpoint in {model_dir})"):
    params = {"params": checkpoints.random_params(model, init_rng)}
    opt_state = tx.init(params)
    last = checkpoints.latest_checkpoint(model_dir)
    if last is None:
      return _State(0, params, opt_state, checkpoint=None, saved_step=None)
    step, params, opt_state = checkpointing.restore_checkpoint(
        last, model, opt_state)
  logging.info("Resuming from %s at step %d.", last, step)
  return _State(step, params, opt_state, checkpoint=last, saved_step=step)


def _train_loop(config: TrainConfig, model: T5Config, files: TrainPaths,
                state: _State, dataset: data_lib.ParallelData, step_fn,
                teacher_params, dropout_rng, progress: _Progress) -> _State:
  """Steps from `state.step` to `num_steps`, logging and checkpointing
  (each checkpoint with its DIGESTS.json, the vocabulary recorded)."""

  settings = checkpointing.settings_record(config, model)

  def save():
    with progress.paused():
      state.checkpoint = checkpointing.save_checkpoint(
          files.model_dir, state.step, state.params, state.opt_state, model,
          keep=config.keep_checkpoints, vocabulary_file=files.spm_model_path,
          settings=settings)
    state.saved_step = state.step
    logging.info("Saved %s", state.checkpoint)

  while state.step < config.num_steps:
    batch = dataset.batch(state.step)
    with progress.step(state.step):
      state.params, state.opt_state, metrics = step_fn(
          state.params, state.opt_state, batch, dropout_rng,
          jnp.asarray(state.step, jnp.int32), teacher_params)
      state.step += 1
      progress.record(state.step, metrics, batch)
    last = state.step == config.num_steps
    if state.step % config.log_every_steps == 0 or last:
      progress.log(state.step, metrics)
    if state.step % config.save_every_steps == 0 or last:
      progress.flush()
      save()
  progress.flush()
  if state.saved_step != state.step:  # e.g. num_steps == 0 on a fresh dir.
    save()
  return state


def _write_run_files(model_dir: str, model: T5Config, spm_path: str) -> None:
  """model_config.json, the vocabulary's record and the operative gin
  config (config.gin), after `checkpointing.check_vocabulary`."""
  checkpointing.write_model_config(model_dir, model)
  io_utils.write_json(os.path.join(model_dir, checkpointing.VOCABULARY_FILE),
                      checkpointing.vocabulary_record(spm_path))
  try:
    io_utils.atomic_write(os.path.join(model_dir, "config.gin"),
                          gin.operative_config_str())
  except Exception:  # pylint: disable=broad-except
    pass  # A record for the reader only: never a reason to stop a run.


def _run_metrics(config: TrainConfig, files: TrainPaths, model: T5Config, state,
                 start_step: int, sp, train_examples: int,
                 progress: "_Progress", teacher) -> Dict[str, Any]:
  """What `metrics.json` records about a finished run (before evaluation)."""
  return {
      "model_dir": files.model_dir,
      "step": state.step,
      "start_step": start_step,
      "num_params": model.num_params,
      "model_config": gin_reader.t5_config_fields(model),
      "checkpoint": state.checkpoint,
      "spm_model_path": (files.spm_model_path if io_utils.is_url(
          files.spm_model_path) else os.path.abspath(files.spm_model_path)),
      "vocab_pieces": sp.get_piece_size(),
      "input_prefix": config.input_prefix,
      "train_examples": train_examples,
      "batch_size": config.batch_size,
      "distill_from": teacher and teacher.checkpoint,
      **progress.summary(),
  }


def train_and_evaluate(config: TrainConfig) -> TrainResult:
  """Trains (or resumes training of) one model (module docstring);
  ValueError for bad input, before training."""
  model_dir = config.resolved_paths().model_dir
  if config.feature_drafter is not None:  # never resumes: the lock only
    held, _ = checkpointing.claim_model_dir(model_dir, None, config.overwrite)
    with held:
      metrics, params, ckpt = feature_trainer.train_feature_drafter(config)
    return TrainResult(step=config.num_steps, start_step=0, params=params,
                       opt_state=None, history=metrics["history"],
                       metrics=metrics, checkpoint=ckpt,
                       config=config.feature_drafter.layer_config)
  model = config.model_config or T5Config()  # pylint: disable=no-value-for-parameter
  held, replace = checkpointing.claim_model_dir(
      model_dir, checkpointing.settings_record(config, model), config.overwrite)
  with held:
    return _train(config, model, replace)


def _train(config: TrainConfig, model: T5Config, replace: bool) -> TrainResult:
  """`train_and_evaluate` in the claimed MODEL_DIR (`replace`: train
  afresh, its checkpoints of other settings removed after the checks)."""
  t_begin = time.time()
  files: TrainPaths = config.resolved_paths()
  # Everything that can be wrong, before anything slow.
  pairs, eval_examples, sp = data_lib.read_data(config, files, model,
                                                train_vocab=config.train_vocab)
  if not replace:
    checkpointing.check_vocabulary(files.model_dir, files.spm_model_path)
  teacher = None
  if files.distill_from is None and not model.has_encoder:
    raise ValueError(
        "T5Config.num_encoder_layers = 0: a shared-encoder draft decoder "
        "reads its teacher's encoder; set distill_from (the target whose "
        "encoder it reads) and the teacher's config.")
  if files.distill_from is not None:
    teacher = checkpointing.load_teacher(files.distill_from,
                                         config.teacher_config,
                                         config.teacher_model_gin,
                                         config.search_paths(), student=model)
    logging.info("Distilling from %s (%d params, T=%g, weight=%g).",
                 teacher.checkpoint, teacher.config.num_params,
                 config.distill_temperature, config.distill_weight)
  dataset = data_lib.training_batches(config, sp, pairs)
  optimizer = config.optimizer_settings()
  tx, step_fn = train_step_fn(model, teacher and teacher.config,
                              config.loss_settings(), optimizer)
  os.makedirs(files.model_dir, exist_ok=True)
  checkpointing.clean_staging(files.model_dir)
  if replace:
    checkpointing.remove_checkpoints(files.model_dir)
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  state = _initial_state(model, tx, files.model_dir, init_rng)
  start_step = state.step
  _write_run_files(files.model_dir, model, files.spm_model_path)
  logging.info(
      "Training %s: %d params, %d examples (%d steps/epoch), batch %d, "
      "steps %d -> %d.", files.model_dir, model.num_params, len(dataset),
      dataset.steps_per_epoch, config.batch_size, start_step, config.num_steps)
  progress = _Progress(config.log_every_steps, config.num_steps,
                       optimizer.schedule())
  state = _train_loop(config, model, files, state, dataset, step_fn, teacher and
                      teacher.params, dropout_rng, progress)
  gins = checkpointing.write_run_gin_files(files.model_dir, model,
                                           files.spm_model_path)
  logging.info(
      "Wrote %s: this model as a run's %s (give it after an experiment "
      "file)", ", ".join(gins.values()), " or ".join(gins))
  metrics = _run_metrics(config, files, model, state, start_step, sp,
                         len(dataset), progress, teacher)
  if eval_examples:
    metrics["eval"] = evaluate_bleu(config, model, state.params, sp,
                                    eval_examples, teacher)
  metrics["wall_seconds"] = time.time() - t_begin
  io_utils.atomic_write(
      os.path.join(files.model_dir, checkpointing.METRICS_FILE),
      json.dumps(metrics, indent=2, ensure_ascii=False))
  return TrainResult(step=state.step, start_step=start_step,
                     params=state.params, opt_state=state.opt_state,
                     history=progress.history, metrics=metrics,
                     checkpoint=state.checkpoint, config=model)


@functools.lru_cache(maxsize=16)
def train_step_fn(config: T5Config, teacher_config: Optional[T5Config],
                  loss: LossSettings, optimizer: OptimizerSettings):
  """(optax optimizer, jitted ``step_fn(params, opt_state, batch, rng, step,
  teacher_params) -> (params, opt_state, metrics + input_tokens)``), cached
  across runs. Dropout's key is `rng` folded with `step`: a resumed run
  draws the keys an uninterrupted one would."""
  tx = optimizer.make()

  def step_fn(params, opt_state, batch, rng, step, teacher_params):
    loss_fn = functools.partial(compute_losses, config=config, settings=loss,
                                teacher_config=teacher_config,
                                teacher_params=teacher_params)
    params, opt_state, metrics = apply_step(tx, loss_fn, params,
                                            opt_state, batch,
                                            jax.random.fold_in(rng, step))
    metrics["input_tokens"] = (batch["encoder_input_tokens"] > 0).sum()
    return params, opt_state, metrics

  return tx, jax.jit(step_fn)


def evaluate_bleu(config: TrainConfig, model_config: T5Config, params, sp,
                  examples: Sequence[Mapping[str, str]],
                  teacher=None) -> Dict[str, Any]:
  """Greedy validation BLEU of `model_config`, `params` (no dropout; a
  shared-encoder student decodes on the teacher's encoder) on examples
  [{'input', 'reference'}], logged: bleu (sacrebleu), num_examples,
  decode_seconds and the first 5 samples {input, reference, prediction}.
  Batches of ``eval_batch_size`` (the last repeats its last row: one
  compilation)."""
  model = T5Model(model_config.replace(dropout_rate=0.0), params)
  if not model_config.has_encoder:
    model = SharedEncoderModel.pair(T5Model(teacher.config, teacher.params),
                                    model)
  inputs = tasks.encode_batch(sp, [ex["input"] for ex in examples],
                              config.max_input_length)
  inputs = inputs[:, :max(1, int((inputs > 0).sum(1).max()))]
  batch_size = max(1, min(config.eval_batch_size, len(examples)))
  pieces = sp.get_piece_size()
  predictions = []
  start = time.time()
  for lo in range(0, len(inputs), batch_size):
    chunk = inputs[lo:lo + batch_size]
    real = len(chunk)
    chunk = np.concatenate([chunk] + [chunk[-1:]] * (batch_size - real))
    out = decoding.temperature_sample(
        model, chunk, jax.random.PRNGKey(0),
        max_decode_length=(config.eval_max_decode_length or
                           config.max_target_length), temperature=0.0)
    tokens = np.asarray(out.tokens)[:real]
    # Ids past the vocabulary (vocab_size may exceed it) decode as padding.
    tokens = np.where(tokens < pieces, tokens, 0)
    predictions.extend(tasks.decode_tokens(sp, tokens))
  ev = {
      "bleu": metrics.bleu(predictions, [ex["reference"] for ex in examples]),
      "num_examples": len(examples),
      "decode_seconds": time.time() - start,
      "samples": [{
          "input": ex["input"],
          "reference": ex["reference"],
          "prediction": p
      } for ex, p in list(zip(examples, predictions))[:5]],
  }
  logging.info("Validation BLEU (greedy, %d examples): %.2f", len(examples),
               ev["bleu"])
  for sample in ev["samples"][:3]:
    logging.info("  %s\n    ref: %s\n    hyp: %s", sample["input"],
                 sample["reference"], sample["prediction"])
  return ev
