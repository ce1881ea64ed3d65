r"""Trains T5 v1.1 target and draft models on local parallel text (Multi30k).

    python -m specdec_jax.train --gin_file=train/multi30k_target.gin \
        [--gin_bindings="MODEL_DIR = '/tmp/target'"] [--gin.NUM_STEPS=100]

T5X-style command line: ``--gin_file`` and ``--gin_bindings`` are repeatable,
``--gin_search_paths`` is a comma-separated list; the repository's ``gin/``
folder is always on the search path, so bare names such as
``train/multi30k_target.gin`` or ``models/multi30k_draft_1m.gin`` resolve from
any working directory. ``--gin.NAME=VALUE`` is shorthand for
``--gin_bindings='NAME = VALUE'`` (as in T5X). Relative paths (data, vocabulary,
model_dir, distill_from) are taken from the current directory if they exist
there, else from the repository root (as `specdec_jax.run` does), so the
defaults (``../shared/data/multi30k``, ``outputs/multi30k/...``) mean the same
from any directory; give absolute paths to write elsewhere.

What `train` does, in order, all checks before the first step:

1. Vocabulary: loads the SentencePiece model ``spm_model_path``; if it does not
   exist and ``train_vocab`` is set, first trains one on the training source and
   reference files with T5's special ids (pad 0, eos 1, unk 2, no BOS). Checks
   T5 conventions (`vocab.check_t5_vocabulary`) and that it fits the model's
   ``vocab_size``.
2. Data: reads and validates the parallel files (`tasks.read_parallel_text`:
   mismatched line counts, empty lines, ... raise ValueError naming file and
   line), prepends ``input_prefix`` to each source, tokenizes (EOS appended,
   truncated to the maximum lengths). Batches are drawn from a per-epoch
   permutation that is a pure function of (seed, step), so a resumed run sees
   exactly the batches the uninterrupted run would have. Each batch is padded
   to its longest row rounded up to ``length_bucket`` (few distinct shapes, few
   compilations).
3. Distillation (``distill_from``): the teacher's config comes from
   ``teacher_config`` (e.g. ``@teacher/T5Config()``), from ``teacher_model_gin``
   (a model gin file whose ``T5Config.*`` bindings are read without touching the
   global gin config), or from ``model_config.json`` written next to the
   teacher's checkpoints by this trainer. Its vocab_size must equal the
   student's; its parameters are loaded with shape checks.
4. Resume: if ``model_dir`` holds a checkpoint, restores parameters, optimizer
   state and step from the latest one.
5. Training: a jitted step (teacher forcing; decoder inputs are the targets
   shifted right with start token 0; cross-entropy on non-pad target tokens,
   optional label smoothing and T5X's z-loss; or distillation
   ``distill_weight * T^2 * KL(p_teacher^T || q_student^T) + (1 - distill_weight)
   * CE`` per non-pad position), AdamW (default) or Adafactor, linear warmup
   then cosine / rsqrt / constant. Logs loss, learning rate, steps/s and
   tokens/s with absl logging.
6. Checkpoints every ``save_every_steps`` and at the end into
   ``model_dir/checkpoint_<step>/`` (keeping the last ``keep_checkpoints``):
   the parameters via `checkpoints.save_params` (T5X Orbax layout, loadable by
   `checkpoints.load_t5x_params`), plus ``train_state.msgpack`` (step and
   optimizer state, flax msgpack) and ``model_config.json``. The complete
   directory is assembled under a hidden staging name and renamed into place,
   so a crash leaves either no ``checkpoint_<step>`` or a complete one.
7. Evaluation: greedy decoding (`decoding.temperature_sample`) of the first
   ``eval_num_examples`` validation examples, corpus BLEU (`metrics.bleu`),
   logged and written with the training metrics to
   ``model_dir/train_metrics.json`` (atomically).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging as std_logging
import math
import os
import pathlib
import re
import shutil
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

import specdec_jax
from specdec_jax import checkpoints
from specdec_jax import gin_utils
from specdec_jax import io_utils
from specdec_jax import tasks
from specdec_jax import vocab as vocab_lib
from specdec_jax.models.config import T5Config
from specdec_jax.models.t5 import T5Model
from specdec_jax.models.t5 import Transformer
from specdec_jax.models.t5 import init_params
from specdec_jax.models.t5 import param_shapes

REPO_DIR = pathlib.Path(specdec_jax.__file__).parents[1]
GIN_DIR = REPO_DIR / "gin"  # Always on the gin search path.

TRAIN_STATE_FILE = "train_state.msgpack"
MODEL_CONFIG_FILE = "model_config.json"
METRICS_FILE = "train_metrics.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")
_STAGING_PREFIX = ".staging-"

OPTIMIZERS = ("adamw", "adafactor")
DECAYS = ("cosine", "rsqrt", "constant")


# ---------------------------------------------------------------------------
# Model configs as files.
# ---------------------------------------------------------------------------
def config_to_dict(config: T5Config) -> Dict[str, Any]:
  """JSON-serializable fields of a T5Config (dtype as its name)."""
  out = {}
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if field.name == "dtype":
      value = jnp.dtype(value).name
    elif isinstance(value, tuple):
      value = list(value)
    out[field.name] = value
  return out


def config_from_dict(fields: Mapping[str, Any]) -> T5Config:
  """The inverse of `config_to_dict` (global gin bindings never apply)."""
  return gin_utils.t5_config_from_fields(fields, "model config")


# ---------------------------------------------------------------------------
# Vocabulary and data.
# ---------------------------------------------------------------------------
def load_sentencepiece(path: str):
  """A SentencePieceProcessor for a local .model file (or gs:// via seqio)."""
  path = os.fspath(path)
  if "://" in path:
    return vocab_lib.get_vocabulary(path, extra_ids=0).tokenizer
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise ValueError(f"SentencePiece model not found: {path}")
  try:
    return spm.SentencePieceProcessor(model_file=path)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"Cannot load SentencePiece model {path}: {e}") from e


def prepare_vocabulary(spm_model_path: str, *, train_vocab: bool,
                       training_files: Sequence[str], vocab_size: int,
                       spm_options: Optional[Mapping[str, Any]] = None):
  """Loads (training it first if needed and allowed) a T5-style vocabulary."""
  spm_model_path = os.fspath(spm_model_path)
  if "://" not in spm_model_path and not os.path.exists(spm_model_path):
    if not train_vocab:
      raise ValueError(
          f"SentencePiece model {spm_model_path} does not exist; train one "
          "with train_vocab=True or point spm_model_path at an existing model.")
    if not spm_model_path.endswith(".model"):
      raise ValueError(
          f"spm_model_path must end in '.model' to be trained, got "
          f"{spm_model_path}.")
    logging.info("Training a SentencePiece vocabulary (%d pieces) on %s -> %s",
                 vocab_size, list(training_files), spm_model_path)
    vocab_lib.train_sentencepiece(list(training_files),
                                  spm_model_path[:-len(".model")], vocab_size,
                                  **dict(spm_options or {}))
  sp = load_sentencepiece(spm_model_path)
  try:
    vocab_lib.check_t5_vocabulary(sp)
  except ValueError as e:
    raise ValueError(f"Vocabulary {spm_model_path}: {e}") from e
  return sp


def resolve_path(path: Optional[str]) -> Optional[str]:
  """A relative path: from the current directory if it exists there, else
  from the repository root (as `specdec_jax.run` resolves gin paths)."""
  if path is None:
    return None
  path = os.fspath(path)
  if "://" in path or os.path.isabs(path):
    return path
  if os.path.exists(path):
    return os.path.abspath(path)
  return os.path.normpath(REPO_DIR / path)


def _resolve(path: Optional[str], base: Optional[str]) -> Optional[str]:
  if path is None:
    return None
  path = os.fspath(path)
  if base is not None and not os.path.isabs(path) and "://" not in path:
    path = os.path.join(os.fspath(base), path)
  return resolve_path(path)


def _round_up(n: int, multiple: int) -> int:
  return int(math.ceil(n / multiple) * multiple)


class ParallelData:
  """Tokenized (input, target) pairs and deterministic, resumable batches.

  Batch `step` (0-based) comes from epoch ``step // steps_per_epoch`` of a
  permutation seeded by (seed, epoch); the last partial batch of an epoch is
  dropped.
  """

  def __init__(self, sp, pairs: Sequence[Tuple[str, str]], *,
               input_prefix: str, max_input_length: int,
               max_target_length: int, batch_size: int, seed: int,
               length_bucket: int = 8, sort_window: int = 0):
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if len(pairs) < batch_size:
      raise ValueError(
          f"Only {len(pairs)} training examples for batch_size {batch_size}.")
    self.inputs = tasks.encode_batch(sp, [input_prefix + s for s, _ in pairs],
                                     max_input_length)
    self.targets = tasks.encode_batch(sp, [r for _, r in pairs],
                                      max_target_length)
    self.input_lengths = (self.inputs > 0).sum(1)
    self.target_lengths = (self.targets > 0).sum(1)
    self.batch_size = batch_size
    self.seed = seed
    self.length_bucket = max(1, int(length_bucket))
    self.sort_window = max(0, int(sort_window))
    self._epoch_cache: Tuple[int, Optional[np.ndarray]] = (-1, None)
    self.steps_per_epoch = self._epoch_batches(0).shape[0]

  def __len__(self) -> int:
    return self.inputs.shape[0]

  def _epoch_batches(self, epoch: int) -> np.ndarray:
    """[steps_per_epoch, batch_size] example indices of one epoch."""
    if self._epoch_cache[0] != epoch:
      rng = np.random.default_rng([self.seed, epoch])
      perm = rng.permutation(len(self))
      b = self.batch_size
      if not self.sort_window:
        n = len(perm) // b
        batches = perm[:n * b].reshape(n, b)
      else:
        # Sort windows of `sort_window` batches by length (less padding),
        # then shuffle the order of the batches.
        chunks = []
        for lo in range(0, len(perm), self.sort_window * b):
          w = perm[lo:lo + self.sort_window * b]
          w = w[np.lexsort((self.input_lengths[w], self.target_lengths[w]))]
          n = len(w) // b
          chunks.append(w[:n * b].reshape(n, b))
        batches = np.concatenate(chunks)
        batches = batches[rng.permutation(batches.shape[0])]
      self._epoch_cache = (epoch, batches)
    return self._epoch_cache[1]

  def batch(self, step: int) -> Dict[str, np.ndarray]:
    epoch, index = divmod(step, self.steps_per_epoch)
    idx = self._epoch_batches(epoch)[index]
    return self.make_batch(self.inputs[idx], self.targets[idx])

  def make_batch(self, inputs: np.ndarray, targets: np.ndarray
                 ) -> Dict[str, np.ndarray]:
    in_len = min(inputs.shape[1], _round_up(
        max(1, int((inputs > 0).sum(1).max())), self.length_bucket))
    tgt_len = min(targets.shape[1], _round_up(
        max(1, int((targets > 0).sum(1).max())), self.length_bucket))
    targets = targets[:, :tgt_len]
    decoder_inputs = np.zeros_like(targets)
    decoder_inputs[:, 1:] = targets[:, :-1]  # Shift right, start token 0.
    return {
        "encoder_input_tokens": inputs[:, :in_len],
        "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets,
    }


# ---------------------------------------------------------------------------
# Optimizer and loss.
# ---------------------------------------------------------------------------
def make_schedule(*, learning_rate: float, warmup_steps: int, decay: str,
                  decay_steps: int, final_learning_rate_fraction: float = 0.0):
  """Linear warmup to `learning_rate`, then cosine / rsqrt / constant."""
  if decay not in DECAYS:
    raise ValueError(f"Unknown decay {decay!r}; expected one of {DECAYS}.")
  warmup_steps = max(0, int(warmup_steps))
  lr = float(learning_rate)

  def schedule(count):
    step = jnp.asarray(count, jnp.float32)
    warm = jnp.minimum(1.0, (step + 1.0) / max(1, warmup_steps))
    if decay == "constant":
      after = lr
    elif decay == "rsqrt":
      after = lr * jnp.sqrt(max(1, warmup_steps) / jnp.maximum(
          step + 1.0, max(1, warmup_steps)))
    else:
      span = max(1, int(decay_steps) - warmup_steps)
      frac = jnp.clip((step - warmup_steps) / span, 0.0, 1.0)
      cos = 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
      after = lr * (final_learning_rate_fraction +
                    (1.0 - final_learning_rate_fraction) * cos)
    return jnp.where(step < warmup_steps, lr * warm, after)

  return schedule


def make_optimizer(*, optimizer: str, schedule, weight_decay: float,
                   grad_clip_norm: Optional[float], adam_b1: float,
                   adam_b2: float, adam_eps: float):
  """AdamW (decay on >= 2-D kernels only) or Adafactor (T5X-like)."""
  if optimizer == "adamw":
    def decay_mask(params):
      return jax.tree_util.tree_map(lambda x: x.ndim > 1, params)
    tx = optax.adamw(schedule, b1=adam_b1, b2=adam_b2, eps=adam_eps,
                     weight_decay=weight_decay, mask=decay_mask)
  elif optimizer == "adafactor":
    tx = optax.adafactor(
        learning_rate=schedule,
        weight_decay_rate=weight_decay if weight_decay else None)
  else:
    raise ValueError(f"Unknown optimizer {optimizer!r}; expected one of "
                     f"{OPTIMIZERS}.")
  if grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
  return tx


@dataclasses.dataclass(frozen=True)
class LossSettings:
  label_smoothing: float = 0.0
  z_loss: float = 1e-4
  distill: bool = False
  distill_temperature: float = 1.0
  distill_weight: float = 1.0


def compute_losses(params, batch, dropout_rng, *, config: T5Config,
                   settings: LossSettings, teacher_config=None,
                   teacher_params=None):
  """Per-batch loss and metrics (all means over non-pad target tokens)."""
  train = config.dropout_rate > 0
  logits = Transformer(config).apply(
      params, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
      batch["decoder_target_tokens"], deterministic=not train,
      rngs={"dropout": dropout_rng} if train else None)
  logits = logits.astype(jnp.float32)
  targets = batch["decoder_target_tokens"]
  mask = (targets > 0).astype(jnp.float32)
  num_tokens = jnp.maximum(mask.sum(), 1.0)

  def mean(x):
    return (x * mask).sum() / num_tokens

  log_z = jax.nn.logsumexp(logits, axis=-1)
  log_q = logits - log_z[..., None]
  nll = -jnp.take_along_axis(log_q, targets[..., None], axis=-1)[..., 0]
  ce = mean(nll)
  if settings.label_smoothing:
    smooth = -log_q.mean(-1)
    loss = mean((1.0 - settings.label_smoothing) * nll +
                settings.label_smoothing * smooth)
  else:
    loss = ce
  metrics = {"ce": ce, "num_tokens": num_tokens,
             "accuracy": mean((log_q.argmax(-1) == targets).astype(
                 jnp.float32))}
  if settings.distill:
    t_logits = Transformer(teacher_config).apply(
        teacher_params, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], batch["decoder_target_tokens"],
        deterministic=True)
    t_logits = jax.lax.stop_gradient(t_logits.astype(jnp.float32))
    temp = settings.distill_temperature
    log_p = jax.nn.log_softmax(t_logits / temp, axis=-1)
    log_q_t = log_q if temp == 1.0 else jax.nn.log_softmax(logits / temp, -1)
    kl = mean((jnp.exp(log_p) * (log_p - log_q_t)).sum(-1))
    metrics["kl"] = kl
    w = settings.distill_weight
    loss = w * temp * temp * kl + (1.0 - w) * loss
  z = mean(jnp.square(log_z))
  metrics["z"] = z
  if settings.z_loss:
    loss = loss + settings.z_loss * z
  metrics["loss"] = loss
  return loss, metrics


@functools.lru_cache(maxsize=16)
def _train_step_fn(config: T5Config, teacher_config: Optional[T5Config],
                   settings: LossSettings, opt_key: Tuple):
  """A jitted train step, cached so repeated runs reuse its compilations."""
  tx = make_optimizer(**dict(opt_key[1]), schedule=_schedule_from_key(opt_key))

  def step_fn(params, opt_state, batch, rng, step, teacher_params):
    dropout_rng = jax.random.fold_in(rng, step)
    grad_fn = jax.value_and_grad(
        functools.partial(compute_losses, config=config, settings=settings,
                          teacher_config=teacher_config,
                          teacher_params=teacher_params), has_aux=True)
    (_, metrics), grads = grad_fn(params, batch, dropout_rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics["grad_norm"] = jnp.sqrt(sum(
        jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
    metrics["input_tokens"] = (batch["encoder_input_tokens"] > 0).sum()
    return params, opt_state, metrics

  return tx, jax.jit(step_fn)


def _schedule_from_key(opt_key):
  return make_schedule(**dict(opt_key[0]))


# ---------------------------------------------------------------------------
# Checkpoints with optimizer state.
# ---------------------------------------------------------------------------
class _QuietAbsl:
  """Hides INFO logs (Orbax logs every file it writes) inside the block."""

  def __enter__(self):
    self._level = logging.get_verbosity()
    if self._level >= logging.INFO:
      logging.set_verbosity(logging.WARNING)

  def __exit__(self, *exc):
    logging.set_verbosity(self._level)


def list_checkpoints(model_dir: str) -> List[Tuple[int, str]]:
  """(step, path) of the complete checkpoint_<step> dirs, by step."""
  if not os.path.isdir(model_dir):
    return []
  out = []
  for name in os.listdir(model_dir):
    m = _CHECKPOINT_RE.match(name)
    if m and os.path.isdir(os.path.join(model_dir, name)):
      out.append((int(m.group(1)), os.path.join(model_dir, name)))
  return sorted(out)


def save_checkpoint(model_dir: str, step: int, params, opt_state,
                    config: T5Config, keep: Optional[int] = None) -> str:
  """Writes checkpoint_<step> (params + optimizer state) atomically.

  Parameters go through `checkpoints.save_params`, so the directory is a T5X
  Orbax checkpoint that `load_t5x_params` reads; ``train_state.msgpack`` (flax
  msgpack of {'step', 'opt_state'}) and ``model_config.json`` sit next to its
  ``state/`` item. Everything is written under a hidden staging directory and
  renamed into place at the end. Then only the last `keep` checkpoints are
  kept (all if None or 0).
  """
  from flax import serialization  # pylint: disable=g-import-not-at-top
  model_dir = os.path.abspath(model_dir)
  final = os.path.join(model_dir, f"checkpoint_{step}")
  if os.path.exists(final):
    raise checkpoints.CheckpointError(f"Checkpoint {final} already exists.")
  os.makedirs(model_dir, exist_ok=True)
  staging = os.path.join(model_dir,
                         f"{_STAGING_PREFIX}{step}-{time.time_ns()}")
  try:
    host_params = jax.device_get(params)
    with _QuietAbsl():
      path = checkpoints.save_params(host_params, staging, step=step)
    state = {"step": np.asarray(step, np.int64),
             "opt_state": jax.device_get(opt_state)}
    io_utils.atomic_write(os.path.join(path, TRAIN_STATE_FILE),
                          serialization.to_bytes(state))
    io_utils.atomic_write(os.path.join(path, MODEL_CONFIG_FILE),
                  json.dumps(config_to_dict(config), indent=2))
    os.rename(path, final)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  if keep:
    for _, old in list_checkpoints(model_dir)[:-keep]:
      shutil.rmtree(old, ignore_errors=True)
  return final


def restore_checkpoint(ckpt: str, config: T5Config, opt_state_template
                       ) -> Tuple[int, Any, Any]:
  """(step, {'params': ...}, opt_state) from a checkpoint of `save_checkpoint`.

  Raises:
    CheckpointError (a ValueError): parameters do not match `config`, or the
      optimizer state is missing or does not match the optimizer.
  """
  from flax import serialization  # pylint: disable=g-import-not-at-top
  with _QuietAbsl():
    params = checkpoints.load_t5x_params(ckpt, expected=param_shapes(config))
  state_file = os.path.join(ckpt, TRAIN_STATE_FILE)
  if not os.path.isfile(state_file):
    raise checkpoints.CheckpointError(
        f"Checkpoint {ckpt} has no optimizer state ({TRAIN_STATE_FILE}); it "
        "was not written by specdec_jax.train. Use a fresh model_dir (or "
        "delete the checkpoint) to train from scratch.")
  with open(state_file, "rb") as f:
    raw = f.read()
  template = {"step": np.asarray(0, np.int64),
              "opt_state": opt_state_template}
  try:
    state = serialization.from_bytes(template, raw)
  except Exception as e:  # pylint: disable=broad-except
    raise checkpoints.CheckpointError(
        f"Checkpoint {ckpt}: the optimizer state in {TRAIN_STATE_FILE} does "
        f"not match the configured optimizer: {e}") from e
  opt_state = jax.tree_util.tree_map(jnp.asarray, state["opt_state"])
  return int(state["step"]), {"params": params}, opt_state


def _resolve_teacher(distill_from: str) -> Tuple[str, Optional[str]]:
  """(checkpoint dir, model_config.json path or None) of a teacher."""
  distill_from = os.fspath(distill_from)
  if _CHECKPOINT_RE.match(os.path.basename(os.path.normpath(distill_from))):
    ckpt = distill_from
    if not os.path.isdir(ckpt):
      raise ValueError(f"distill_from: checkpoint {ckpt} does not exist.")
  else:
    ckpt = checkpoints.latest_checkpoint(distill_from)
    if ckpt is None:
      raise ValueError(
          f"distill_from: no checkpoint_<step> found in {distill_from} (train "
          "the teacher first).")
  candidates = [os.path.join(ckpt, MODEL_CONFIG_FILE),
                os.path.join(os.path.dirname(os.path.normpath(ckpt)),
                             MODEL_CONFIG_FILE)]
  for c in candidates:
    if os.path.isfile(c):
      return ckpt, c
  return ckpt, None


_SHAPE_FREE_FIELDS = ("dtype", "dropout_rate", "float32_attention_logits")


def _teacher_config(distill_from, teacher_config, teacher_model_gin,
                    search_paths) -> Tuple[str, T5Config]:
  ckpt, json_path = _resolve_teacher(distill_from)
  stored = None
  if json_path is not None:
    with open(json_path, "r", encoding="utf-8") as f:
      stored = config_from_dict(json.load(f))
  if teacher_config is not None and teacher_model_gin is not None:
    raise ValueError("Give at most one of teacher_config and "
                     "teacher_model_gin.")
  if teacher_model_gin is not None:
    teacher_config = gin_utils.read_t5_config(teacher_model_gin,
                                              search_paths=search_paths)
  if teacher_config is None:
    if stored is None:
      raise ValueError(
          f"distill_from={distill_from}: no {MODEL_CONFIG_FILE} next to "
          f"{ckpt}; give the teacher's config with teacher_model_gin or "
          "teacher_config (e.g. @teacher/T5Config()).")
    teacher_config = stored
  elif stored is not None:
    diff = [f.name for f in dataclasses.fields(T5Config)
            if f.name not in _SHAPE_FREE_FIELDS and
            getattr(stored, f.name) != getattr(teacher_config, f.name)]
    if diff:
      raise ValueError(
          f"Teacher config mismatch: {json_path} (written with the teacher "
          f"checkpoint) differs from the given teacher config in {diff}: "
          + ", ".join(f"{k}={getattr(stored, k)!r} vs "
                      f"{getattr(teacher_config, k)!r}" for k in diff))
  return ckpt, teacher_config.replace(dropout_rate=0.0)


# ---------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------
def evaluate_bleu(config: T5Config, params, sp,
                  examples: Sequence[Mapping[str, str]], *, batch_size: int,
                  max_input_length: int, max_decode_length: int
                  ) -> Dict[str, Any]:
  """Greedy-decodes examples [{'input', 'reference'}]; returns BLEU and samples."""
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax import metrics  # pylint: disable=g-import-not-at-top
  model = T5Model(config.replace(dropout_rate=0.0), params)
  inputs = tasks.encode_batch(sp, [ex["input"] for ex in examples],
                              max_input_length)
  inputs = inputs[:, :max(1, int((inputs > 0).sum(1).max()))]
  batch_size = max(1, min(batch_size, len(examples)))
  pieces = sp.get_piece_size()
  predictions = []
  start = time.time()
  for lo in range(0, len(examples), batch_size):
    chunk = inputs[lo:lo + batch_size]
    n = chunk.shape[0]
    if n < batch_size:  # Same shape for every batch: one compilation.
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - n, 0)])
    out = decoding.temperature_sample(model, chunk, jax.random.PRNGKey(0),
                                      max_decode_length=max_decode_length,
                                      temperature=0.0)
    tokens = np.asarray(out.tokens)[:n]
    tokens = np.where(tokens < pieces, tokens, 0)
    predictions.extend(tasks.decode_tokens(sp, tokens))
  references = [ex["reference"] for ex in examples]
  score = metrics.bleu(predictions, references)
  return {
      "bleu": score,
      "num_examples": len(examples),
      "decode_seconds": time.time() - start,
      "samples": [{"input": ex["input"], "reference": ex["reference"],
                   "prediction": p}
                  for ex, p in list(zip(examples, predictions))[:5]],
  }


# ---------------------------------------------------------------------------
# The training loop.
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class TrainResult:
  """What `train` returns.

  Attributes:
    step: the step reached (== num_steps).
    start_step: the step training started from (> 0 when resumed).
    params: final {'params': ...}.
    opt_state: final optimizer state.
    history: one dict per step run now: step, loss, ce (and kl when
      distilling), accuracy, grad_norm.
    metrics: what was written to model_dir/train_metrics.json.
    checkpoint: path of the last checkpoint.
    config: the trained model's T5Config.
  """
  step: int
  start_step: int
  params: Any
  opt_state: Any
  history: List[Dict[str, float]]
  metrics: Dict[str, Any]
  checkpoint: Optional[str]
  config: T5Config


def _clean_staging(model_dir: str) -> None:
  if os.path.isdir(model_dir):
    for name in os.listdir(model_dir):
      if name.startswith(_STAGING_PREFIX):
        shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)


@gin.configurable
def train(*,
          model_dir: str = gin.REQUIRED,
          num_steps: int = gin.REQUIRED,
          model_config: Optional[T5Config] = None,
          # Data.
          data_dir: Optional[str] = None,
          source_file: str = gin.REQUIRED,
          reference_file: Optional[str] = None,
          input_prefix: str = "",
          num_train_examples: Optional[int] = None,
          max_input_length: int = 64,
          max_target_length: int = 64,
          length_bucket: int = 8,
          sort_window: int = 0,
          batch_size: int = 64,
          # Vocabulary.
          spm_model_path: str = gin.REQUIRED,
          train_vocab: bool = False,
          spm_vocab_size: int = 8000,
          spm_options: Optional[Mapping[str, Any]] = None,
          # Optimization.
          optimizer: str = "adamw",
          learning_rate: float = 1e-3,
          warmup_steps: int = 500,
          decay: str = "cosine",
          decay_steps: Optional[int] = None,
          final_learning_rate_fraction: float = 0.0,
          weight_decay: float = 0.01,
          grad_clip_norm: Optional[float] = 1.0,
          adam_b1: float = 0.9,
          adam_b2: float = 0.98,
          adam_eps: float = 1e-9,
          label_smoothing: float = 0.0,
          z_loss: float = 1e-4,
          seed: int = 0,
          # Distillation.
          distill_from: Optional[str] = None,
          teacher_config: Optional[T5Config] = None,
          teacher_model_gin: Optional[str] = None,
          distill_temperature: float = 1.0,
          distill_weight: float = 1.0,
          # Checkpoints and logging.
          save_every_steps: int = 1000,
          keep_checkpoints: Optional[int] = 3,
          log_every_steps: int = 50,
          # Evaluation.
          eval_source_file: Optional[str] = None,
          eval_reference_file: Optional[str] = None,
          eval_num_examples: int = 200,
          eval_batch_size: int = 64,
          eval_max_decode_length: Optional[int] = None,
          gin_search_paths: Optional[Sequence[str]] = None) -> TrainResult:
  """Trains (or resumes training of) one T5 model; see the module docstring.

  Args:
    model_dir: checkpoints, model_config.json, config.gin and
      train_metrics.json go here; a checkpoint already there is resumed.
    num_steps: total number of steps (a resumed run continues up to it).
    model_config: the model; None: ``T5Config()`` with the gin bindings
      ``T5Config.*`` (from a model gin file).
    data_dir: if set, relative data file names are taken inside it.
      Relative paths (data_dir, files, model_dir, spm_model_path,
      distill_from) are resolved by `resolve_path`.
    source_file, reference_file: training data (see
      `tasks.read_parallel_text`: line-aligned files, or one TSV file).
    input_prefix: prepended to every source sentence.
    num_train_examples: use only the first N training pairs.
    max_input_length, max_target_length: truncation lengths (EOS included).
    length_bucket: batch lengths are rounded up to a multiple of it.
    sort_window: if > 0, each epoch's examples are sorted by length within
      windows of this many batches (less padding: about 1.7x faster on
      Multi30k with 100), and the batches are then shuffled.
    batch_size: examples per step.
    spm_model_path: SentencePiece model (.model); trained first if missing and
      `train_vocab`.
    train_vocab: allow training the vocabulary.
    spm_vocab_size: pieces of a trained vocabulary.
    spm_options: extra `SentencePieceTrainer` options for training it.
    optimizer: 'adamw' or 'adafactor'.
    learning_rate: peak learning rate.
    warmup_steps: linear warmup steps.
    decay: 'cosine' (to `final_learning_rate_fraction` at `decay_steps`),
      'rsqrt' or 'constant' after warmup.
    decay_steps: end of the cosine decay (default num_steps).
    final_learning_rate_fraction: cosine floor as a fraction of the peak.
    weight_decay: AdamW decoupled weight decay (kernels and embeddings only) or
      Adafactor's weight_decay_rate.
    grad_clip_norm: global gradient-norm clipping (None/0: off).
    adam_b1, adam_b2, adam_eps: AdamW moments.
    label_smoothing: on the reference cross-entropy.
    z_loss: T5X's auxiliary log(Z)^2 loss weight.
    seed: parameter init, data order and dropout.
    distill_from: teacher model_dir or checkpoint_<step> dir; enables
      distillation.
    teacher_config: the teacher's T5Config (e.g. ``@teacher/T5Config()``; note
      that unscoped ``T5Config.*`` bindings also apply inside a gin scope, so
      bind every field the teacher does not share with the student).
    teacher_model_gin: a model gin file (e.g. 'models/multi30k_target.gin')
      read into the teacher's T5Config.
    distill_temperature: temperature T applied to teacher and student logits.
    distill_weight: w in ``w T^2 KL + (1 - w) CE``.
    save_every_steps: checkpoint period (and one at the end).
    keep_checkpoints: keep only the latest K checkpoints (None/0: all).
    log_every_steps: logging period.
    eval_source_file, eval_reference_file: validation data for the final
      greedy-decoding BLEU (None: no evaluation).
    eval_num_examples: evaluate on the first N validation pairs (0: skip).
    eval_batch_size: decoding batch size.
    eval_max_decode_length: default max_target_length.
    gin_search_paths: where `teacher_model_gin` is looked up (default: the
      current directory, then the repository's gin/ folder).

  Returns:
    A `TrainResult`.

  Raises:
    ValueError: bad input (data files, vocabulary, teacher), before training.
  """
  t_begin = time.time()
  if model_config is None:
    model_config = T5Config()
  config = model_config
  if num_steps < 0:
    raise ValueError(f"num_steps must be >= 0, got {num_steps}.")
  if not 0.0 <= distill_weight <= 1.0:
    raise ValueError(f"distill_weight must be in [0, 1], got "
                     f"{distill_weight}.")
  if distill_temperature <= 0:
    raise ValueError(f"distill_temperature must be > 0, got "
                     f"{distill_temperature}.")
  if distill_from is None and (teacher_config is not None or
                               teacher_model_gin is not None):
    raise ValueError("teacher_config/teacher_model_gin need distill_from.")
  if optimizer not in OPTIMIZERS:
    raise ValueError(f"Unknown optimizer {optimizer!r}; expected one of "
                     f"{OPTIMIZERS}.")
  if decay not in DECAYS:
    raise ValueError(f"Unknown decay {decay!r}; expected one of {DECAYS}.")
  model_dir = os.path.abspath(resolve_path(model_dir))
  spm_model_path = resolve_path(spm_model_path)
  if distill_from is not None:
    distill_from = resolve_path(distill_from)
  source_file = _resolve(source_file, data_dir)
  reference_file = _resolve(reference_file, data_dir)
  eval_source_file = _resolve(eval_source_file, data_dir)
  eval_reference_file = _resolve(eval_reference_file, data_dir)
  if gin_search_paths is None:
    gin_search_paths = [".", str(GIN_DIR)]

  # 1. Data files (validated before anything slow happens).
  try:
    pairs = tasks.read_parallel_text(source_file, reference_file)
  except ValueError as e:
    raise ValueError(f"Training data: {e} (relative paths are taken from "
                     f"{os.getcwd()} if they exist there, else from "
                     f"{REPO_DIR}).") from e
  if num_train_examples is not None:
    pairs = pairs[:num_train_examples]
  eval_examples = []
  if eval_source_file is not None and eval_num_examples:
    try:
      eval_examples = tasks.load_examples(
          source_file=eval_source_file, reference_file=eval_reference_file,
          input_prefix=input_prefix, num_examples=eval_num_examples)
    except ValueError as e:
      raise ValueError(f"Evaluation data: {e}") from e

  # 2. Vocabulary.
  training_files = [source_file] + ([reference_file] if reference_file else [])
  sp = prepare_vocabulary(spm_model_path, train_vocab=train_vocab,
                          training_files=training_files,
                          vocab_size=spm_vocab_size, spm_options=spm_options)
  if sp.get_piece_size() > config.vocab_size:
    raise ValueError(
        f"SentencePiece model {spm_model_path} has {sp.get_piece_size()} "
        f"pieces but the model's vocab_size is {config.vocab_size} "
        "(T5Config.vocab_size must be >= the vocabulary size).")

  # 3. Teacher.
  teacher_params, t_config, teacher_ckpt = None, None, None
  if distill_from is not None:
    teacher_ckpt, t_config = _teacher_config(distill_from, teacher_config,
                                             teacher_model_gin,
                                             gin_search_paths)
    if t_config.vocab_size != config.vocab_size:
      raise ValueError(
          f"Distillation teacher {teacher_ckpt} has vocab_size "
          f"{t_config.vocab_size} but the student has {config.vocab_size}: "
          "the KL loss compares their distributions token by token, so both "
          "must use the same vocabulary.")
    with _QuietAbsl():
      teacher_params = {"params": checkpoints.load_t5x_params(
          teacher_ckpt, expected=param_shapes(t_config))}
    logging.info("Distilling from %s (%d params, T=%g, weight=%g).",
                 teacher_ckpt, t_config.num_params, distill_temperature,
                 distill_weight)

  data = ParallelData(sp, pairs, input_prefix=input_prefix,
                      max_input_length=max_input_length,
                      max_target_length=max_target_length,
                      batch_size=batch_size, seed=seed,
                      length_bucket=length_bucket, sort_window=sort_window)

  # 4. Optimizer, state, resume.
  sched_key = tuple(sorted(dict(
      learning_rate=float(learning_rate), warmup_steps=int(warmup_steps),
      decay=decay,
      # Only the cosine schedule depends on the run length: with the others,
      # runs of different lengths share one compiled train step.
      decay_steps=int(decay_steps or num_steps) if decay == "cosine" else 0,
      final_learning_rate_fraction=float(final_learning_rate_fraction)
  ).items()))
  opt_key = (sched_key, tuple(sorted(dict(
      optimizer=optimizer, weight_decay=float(weight_decay),
      grad_clip_norm=grad_clip_norm, adam_b1=float(adam_b1),
      adam_b2=float(adam_b2), adam_eps=float(adam_eps)).items())))
  settings = LossSettings(label_smoothing=float(label_smoothing),
                          z_loss=float(z_loss),
                          distill=distill_from is not None,
                          distill_temperature=float(distill_temperature),
                          distill_weight=float(distill_weight))
  tx, step_fn = _train_step_fn(config, t_config, settings, opt_key)
  schedule = _schedule_from_key(opt_key)

  os.makedirs(model_dir, exist_ok=True)
  _clean_staging(model_dir)
  rng = jax.random.PRNGKey(seed)
  init_rng, dropout_rng = jax.random.split(rng)
  params = init_params(config, init_rng)
  opt_state = tx.init(params)
  start_step = 0
  last_ckpt = checkpoints.latest_checkpoint(model_dir)
  if last_ckpt is not None:
    start_step, params, opt_state = restore_checkpoint(last_ckpt, config,
                                                       opt_state)
    logging.info("Resuming from %s at step %d.", last_ckpt, start_step)
  io_utils.atomic_write(os.path.join(model_dir, MODEL_CONFIG_FILE),
                json.dumps(config_to_dict(config), indent=2))
  try:
    io_utils.atomic_write(os.path.join(model_dir, "config.gin"),
                  gin.operative_config_str())
  except Exception:  # pylint: disable=broad-except
    pass
  logging.info(
      "Training %s: %d params, %d examples (%d steps/epoch), batch %d, "
      "steps %d -> %d.", model_dir, config.num_params, len(data),
      data.steps_per_epoch, batch_size, start_step, num_steps)

  # 5. Train.
  history: List[Dict[str, float]] = []
  pending: List[Tuple[int, Dict[str, jax.Array]]] = []
  window_start, window_steps, window_tokens = None, 0, 0
  total_time, total_steps, total_tokens = 0.0, 0, 0
  last_saved = start_step if last_ckpt is not None else None
  ckpt_path = last_ckpt

  def flush():
    nonlocal pending
    if pending:
      fetched = jax.device_get([m for _, m in pending])
      for (s, _), m in zip(pending, fetched):
        history.append({"step": s, **{k: float(v) for k, v in m.items()}})
      pending = []

  step = start_step
  while step < num_steps:
    batch = data.batch(step)
    params, opt_state, metrics = step_fn(params, opt_state, batch, dropout_rng,
                                         jnp.asarray(step, jnp.int32),
                                         teacher_params)
    step += 1
    pending.append((step, metrics))
    if window_start is None:  # Exclude the first (compiling) step.
      jax.block_until_ready(metrics)
      window_start = time.time()
    else:
      window_steps += 1
      window_tokens += int((batch["decoder_target_tokens"] > 0).sum() +
                           (batch["encoder_input_tokens"] > 0).sum())
    if step % log_every_steps == 0 or step == num_steps:
      jax.block_until_ready(metrics)
      now = time.time()
      elapsed = now - window_start
      flush()
      recent = history[-log_every_steps:]
      mean = {k: float(np.mean([h[k] for h in recent])) for k in recent[0]
              if k != "step"}
      sps = window_steps / elapsed if window_steps and elapsed > 0 else 0.0
      tps = window_tokens / elapsed if window_steps and elapsed > 0 else 0.0
      total_time += elapsed if window_steps else 0.0
      total_steps += window_steps
      total_tokens += window_tokens
      logging.info(
          "step %d/%d: loss=%.4f ce=%.4f%s acc=%.3f lr=%.2e grad_norm=%.3f "
          "steps/s=%.2f tokens/s=%.0f", step, num_steps, mean["loss"],
          mean["ce"], f" kl={mean['kl']:.4f}" if "kl" in mean else "",
          mean["accuracy"], float(schedule(step - 1)), mean["grad_norm"], sps,
          tps)
      window_start, window_steps, window_tokens = time.time(), 0, 0
    if step % save_every_steps == 0 or step == num_steps:
      flush()
      t_save = time.time()
      ckpt_path = save_checkpoint(model_dir, step, params, opt_state, config,
                                  keep=keep_checkpoints)
      last_saved = step
      logging.info("Saved %s", ckpt_path)
      if window_start is not None:  # Saving is not training time.
        window_start += time.time() - t_save
  flush()
  if last_saved != step:  # e.g. num_steps == 0 on a fresh model_dir.
    ckpt_path = save_checkpoint(model_dir, step, params, opt_state, config,
                                keep=keep_checkpoints)

  # 6. Evaluate and write metrics.
  result_metrics: Dict[str, Any] = {
      "model_dir": model_dir,
      "step": step,
      "start_step": start_step,
      "num_params": config.num_params,
      "model_config": config_to_dict(config),
      "checkpoint": ckpt_path,
      "spm_model_path": os.path.abspath(spm_model_path)
                        if "://" not in spm_model_path else spm_model_path,
      "vocab_pieces": sp.get_piece_size(),
      "input_prefix": input_prefix,
      "train_examples": len(data),
      "batch_size": batch_size,
      "distill_from": teacher_ckpt,
  }
  if history:
    tail = history[-min(len(history), log_every_steps):]
    head = history[:min(len(history), log_every_steps)]
    result_metrics.update({
        "initial_loss": history[0]["loss"],
        "first_window_loss": float(np.mean([h["loss"] for h in head])),
        "final_loss": float(np.mean([h["loss"] for h in tail])),
        "final_ce": float(np.mean([h["ce"] for h in tail])),
    })
    if "kl" in tail[0]:
      result_metrics["final_kl"] = float(np.mean([h["kl"] for h in tail]))
      result_metrics["initial_kl"] = history[0]["kl"]
  if total_steps:
    result_metrics.update({
        "steps_per_second": total_steps / total_time,
        "tokens_per_second": total_tokens / total_time,
    })
  if eval_examples:
    ev = evaluate_bleu(config, params, sp, eval_examples,
                       batch_size=eval_batch_size,
                       max_input_length=max_input_length,
                       max_decode_length=eval_max_decode_length or
                       max_target_length)
    logging.info("Validation BLEU (greedy, %d examples): %.2f", ev["num_examples"],
                 ev["bleu"])
    for s in ev["samples"][:3]:
      logging.info("  %s\n    ref: %s\n    hyp: %s", s["input"], s["reference"],
                   s["prediction"])
    result_metrics["eval"] = ev
  result_metrics["wall_seconds"] = time.time() - t_begin
  io_utils.atomic_write(os.path.join(model_dir, METRICS_FILE),
                json.dumps(result_metrics, indent=2, ensure_ascii=False))
  return TrainResult(step=step, start_step=start_step, params=params,
                     opt_state=opt_state, history=history,
                     metrics=result_metrics, checkpoint=ckpt_path,
                     config=config)


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------
FLAGS = flags.FLAGS


def define_flags() -> None:
  """--gin_file/--gin_bindings/--gin_search_paths (`gin_utils`, idempotent)."""
  gin_utils.define_gin_flags()


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str],
              gin_search_paths: Sequence[str] = ()) -> List[str]:
  """Parses gin files then bindings; returns the search paths used.

  The search path is the current directory, `gin_search_paths`, then the
  repository's gin/ folder (`gin_utils.parse_gin`); the config is not
  finalized.
  """
  # gin also tries each candidate path as a Python package resource and logs
  # "Path not found" errors for every search path that lacks the file; those
  # are not errors here.
  quiet = _DropGinPathNotFound()
  root = std_logging.getLogger()
  root.addFilter(quiet)
  try:
    gin_utils.parse_gin(gin_files, gin_bindings, gin_search_paths,
                        finalize=False)
  finally:
    root.removeFilter(quiet)
  return gin_utils.search_paths(gin_search_paths)


class _DropGinPathNotFound(std_logging.Filter):

  def filter(self, record):
    return not str(record.msg).startswith(
        ("Path not found", "system_path_file_exists"))


rewrite_gin_args = gin_utils.rewrite_gin_args


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.gin_file:
    raise app.UsageError("Give at least one --gin_file, e.g. "
                         "--gin_file=train/tiny_ci.gin.")
  paths = parse_gin(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  try:
    result = train(gin_search_paths=paths)
  except ValueError as e:
    logging.error("%s", e)
    raise
  ev = result.metrics.get("eval", {})
  logging.info("Done: step %d, final loss %s, BLEU %s, metrics in %s",
               result.step, result.metrics.get("final_loss"), ev.get("bleu"),
               os.path.join(result.metrics["model_dir"], METRICS_FILE))


if __name__ == "__main__":
  define_flags()
  gin_utils.run_main(main)
