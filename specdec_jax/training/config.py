"""`TrainConfig`: every setting of a training run (gin's ``train.*``), one
frozen object checked when built, before anything slow; and the optimizer
(AdamW or Adafactor over a warmup-then-decay schedule).
"""
import dataclasses
import math
import os
from typing import Any, Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import optax

from specdec_jax.config import flag_utils
from specdec_jax.config import gin_reader
from specdec_jax.files import io_utils
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig
from specdec_jax.training.loss import LossSettings

OPTIMIZERS = ("adamw", "adafactor")
DECAYS = ("cosine", "rsqrt", "constant")


def _check_choice(name: str, value: str, allowed) -> None:
  if value not in allowed:
    raise ValueError(f"Unknown {name} {value!r}; expected one of {allowed}.")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """Optimizer and schedule (fields: `TrainConfig`'s), hashable: it keys
  the cache of compiled train steps (`trainer.train_step_fn`).
  `decay_steps` is 0 but for the cosine decay, so runs of other lengths
  share one compiled step."""
  optimizer: str
  learning_rate: float
  warmup_steps: int
  decay: str
  decay_steps: int
  final_learning_rate_fraction: float
  weight_decay: float
  grad_clip_norm: Optional[float]
  adam_b1: float
  adam_b2: float
  adam_eps: float

  def __post_init__(self):
    _check_choice("optimizer", self.optimizer, OPTIMIZERS)
    _check_choice("decay", self.decay, DECAYS)

  def schedule(self):
    """The learning rate as a function of the update count."""
    return make_schedule(
        learning_rate=self.learning_rate, warmup_steps=self.warmup_steps,
        decay=self.decay, decay_steps=self.decay_steps,
        final_learning_rate_fraction=self.final_learning_rate_fraction)

  def make(self) -> optax.GradientTransformation:
    """The optax optimizer over `schedule()`."""
    return make_optimizer(optimizer=self.optimizer, schedule=self.schedule(),
                          weight_decay=self.weight_decay,
                          grad_clip_norm=self.grad_clip_norm,
                          adam_b1=self.adam_b1, adam_b2=self.adam_b2,
                          adam_eps=self.adam_eps)


def apply_step(tx: optax.GradientTransformation, loss_fn, params, opt_state,
               *args):
  """(params, opt_state, metrics + grad_norm): one update of `loss_fn(params,
  *args) -> (loss, metrics)`."""
  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *args)
  updates, opt_state = tx.update(grads, opt_state, params)
  metrics["grad_norm"] = jnp.sqrt(
      sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
  return optax.apply_updates(params, updates), opt_state, metrics


def make_schedule(*, learning_rate: float, warmup_steps: int, decay: str,
                  decay_steps: int, final_learning_rate_fraction: float = 0.0):
  """Linear warmup to `learning_rate`, then cosine / rsqrt / constant."""
  _check_choice("decay", decay, DECAYS)
  warmup_steps = max(0, int(warmup_steps))
  lr = float(learning_rate)

  def schedule(count):
    step = jnp.asarray(count, jnp.float32)
    warm = jnp.minimum(1.0, (step + 1.0) / max(1, warmup_steps))
    if decay == "constant":
      after = lr
    elif decay == "rsqrt":
      after = lr * jnp.sqrt(
          max(1, warmup_steps) / jnp.maximum(step + 1.0, max(1, warmup_steps)))
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
  _check_choice("optimizer", optimizer, OPTIMIZERS)
  if optimizer == "adamw":

    def decay_mask(params):
      return jax.tree_util.tree_map(lambda x: x.ndim > 1, params)

    tx = optax.adamw(schedule, b1=adam_b1, b2=adam_b2, eps=adam_eps,
                     weight_decay=weight_decay, mask=decay_mask)
  else:
    tx = optax.adafactor(
        learning_rate=schedule,
        weight_decay_rate=weight_decay if weight_decay else None)
  if grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
  return tx


def _int(low, high=None, none=False):

  def test(v):
    if v is None:
      return none
    return (isinstance(v, int) and not isinstance(v, bool) and v >= low and
            (high is None or v <= high))

  return test


def _real(low, high, low_open=False, high_open=False, none=False):

  def test(v):
    if v is None:
      return none
    if isinstance(
        v, bool) or not isinstance(v, (int, float)) or (not math.isfinite(v)):
      return False
    return ((v > low if low_open else v >= low) and
            (v < high if high_open else v <= high))

  return test


_INF = math.inf
# (field, test, what is allowed): every number `train` takes.
_NUMBERS = (
    ("num_steps", _int(0), "an integer >= 0"),
    ("num_train_examples", _int(1, none=True), "None or an integer >= 1"),
    ("max_input_length", _int(2), "an integer >= 2 (EOS included)"),
    ("max_target_length", _int(2), "an integer >= 2 (EOS included)"),
    ("length_bucket", _int(1), "an integer >= 1"),
    ("sort_window", _int(0), "an integer >= 0 (0: off)"),
    ("batch_size", _int(1), "an integer >= 1"),
    ("spm_vocab_size", _int(1), "an integer >= 1"),
    ("learning_rate", _real(0, _INF, low_open=True, high_open=True),
     "a finite number > 0 (a negative rate ascends the loss)"),
    ("warmup_steps", _int(0), "an integer >= 0"),
    ("decay_steps", _int(1, none=True), "None or an integer >= 1"),
    ("final_learning_rate_fraction", _real(0, 1), "a number in [0, 1]"),
    ("weight_decay", _real(0, _INF, high_open=True), "a finite number >= 0"),
    ("grad_clip_norm", _real(0, _INF, high_open=True, none=True),
     "None, 0 (off) or a finite number > 0"),
    ("adam_b1", _real(0, 1, high_open=True), "a number in [0, 1)"),
    ("adam_b2", _real(0, 1, high_open=True), "a number in [0, 1)"),
    ("adam_eps", _real(0, _INF, low_open=True,
                       high_open=True), "a finite number > 0"),
    ("label_smoothing", _real(0, 1, high_open=True), "a number in [0, 1)"),
    ("z_loss", _real(0, _INF, high_open=True), "a finite number >= 0"),
    ("seed", _int(-2**63), "an integer"),
    ("save_every_steps", _int(1), "an integer >= 1"),
    ("keep_checkpoints", _int(0, none=True), "None, 0 (all) or an integer "
     ">= 1"),
    ("log_every_steps", _int(1), "an integer >= 1"),
    ("eval_num_examples", _int(0), "an integer >= 0 (0: skip)"),
    ("eval_batch_size", _int(1), "an integer >= 1"),
    ("eval_max_decode_length", _int(1, none=True), "None or an integer >= 1"),
    ("feature_weight", _real(0, _INF, high_open=True), "a finite number >= 0"),
    ("unroll_weight", _real(0, _INF, high_open=True), "a finite number >= 0"),
)


def check_numbers(config: "TrainConfig") -> None:
  """ConfigError (naming `train.<field>`, the value and what is allowed)
  unless every number of `config` is in its range."""
  for name, test, allowed in _NUMBERS:
    value = getattr(config, name)
    if not test(value):
      raise flag_utils.ConfigError(f"train.{name}={value!r}: allowed: "
                                   f"{allowed}.")


@dataclasses.dataclass(frozen=True)
class TrainPaths:
  """A run's files as absolute paths or URLs (`io_utils.resolve_path`)."""
  model_dir: str
  spm_model_path: str
  source_file: str
  reference_file: Optional[str]
  eval_source_file: Optional[str]
  eval_reference_file: Optional[str]
  distill_from: Optional[str]


@gin.configurable("train")
@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run (or the resumption of one); fields not listed mean
  what their names say.

  Attributes:
    model_dir: checkpoints and records; a checkpoint there is resumed (one
      of other settings only with `overwrite`, which trains afresh) up to
      `num_steps`.
    model_config: the model; None: ``T5Config()`` with gin's bindings.
    data_dir: if set, relative data file names are taken inside it.
    source_file, reference_file: line-aligned files, or one TSV file.
    sort_window: if > 0, each epoch's examples are sorted by length within
      windows of this many batches (less padding), the batches shuffled.
    length_bucket: batch lengths are rounded up to a multiple of it.
    spm_model_path: SentencePiece model; trained first if missing and
      `train_vocab` (`spm_vocab_size` pieces, `spm_options`).
    decay: after a linear warmup, 'cosine' (to `final_learning_rate_fraction`
      of the peak at `decay_steps`, default num_steps), 'rsqrt', 'constant'.
    weight_decay: AdamW's (kernels and embeddings only) or Adafactor's.
    grad_clip_norm, keep_checkpoints: None or 0: off (all checkpoints).
    z_loss: T5X's log(Z)^2 weight.
    distill_from: teacher model_dir or checkpoint_<step> dir: distillation,
      with ``w T^2 KL + (1 - w) CE`` (`distill_weight`, `_temperature`).
    teacher_config, teacher_model_gin: the teacher's T5Config (e.g.
      ``@teacher/T5Config()``: unscoped ``T5Config.*`` bindings apply inside
      the scope too), or a model gin file read into one.
    eval_*: validation data for the final greedy BLEU (none: None or 0);
      `eval_max_decode_length` defaults to max_target_length.
    seed: parameter init, data order and dropout.
    gin_search_paths: where `teacher_model_gin` is looked up.
    feature_drafter: a feature-level draft to train instead of a T5 model
      (``@FeatureDrafterConfig()``): needs distill_from; `feature_weight`
      and `unroll_weight` weigh its loss (`loss.feature_losses`).
    feature_init_from: a feature-level draft's checkpoint_<step> to start
      from (same config; its head tokens kept, a fresh optimizer).
  """
  model_dir: str = gin.REQUIRED
  num_steps: int = gin.REQUIRED
  overwrite: bool = False
  model_config: Optional[T5Config] = None
  # Data.
  data_dir: Optional[str] = None
  source_file: str = gin.REQUIRED
  reference_file: Optional[str] = None
  input_prefix: str = ""
  num_train_examples: Optional[int] = None
  max_input_length: int = 64
  max_target_length: int = 64
  length_bucket: int = 8
  sort_window: int = 0
  batch_size: int = 64
  # Vocabulary.
  spm_model_path: str = gin.REQUIRED
  train_vocab: bool = False
  spm_vocab_size: int = 8000
  spm_options: Optional[Mapping[str, Any]] = None
  # Optimization.
  optimizer: str = "adamw"
  learning_rate: float = 1e-3
  warmup_steps: int = 500
  decay: str = "cosine"
  decay_steps: Optional[int] = None
  final_learning_rate_fraction: float = 0.0
  weight_decay: float = 0.01
  grad_clip_norm: Optional[float] = 1.0
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  adam_eps: float = 1e-9
  label_smoothing: float = 0.0
  z_loss: float = 1e-4
  seed: int = 0
  # Distillation.
  distill_from: Optional[str] = None
  teacher_config: Optional[T5Config] = None
  teacher_model_gin: Optional[str] = None
  distill_temperature: float = 1.0
  distill_weight: float = 1.0
  # Checkpoints and logging.
  save_every_steps: int = 1000
  keep_checkpoints: Optional[int] = 3
  log_every_steps: int = 50
  # Evaluation.
  eval_source_file: Optional[str] = None
  eval_reference_file: Optional[str] = None
  eval_num_examples: int = 200
  eval_batch_size: int = 64
  eval_max_decode_length: Optional[int] = None
  gin_search_paths: Optional[Sequence[str]] = None
  # Feature-level draft.
  feature_drafter: Optional[FeatureDrafterConfig] = None
  feature_weight: float = 1.0
  unroll_weight: float = 1.0
  feature_init_from: Optional[str] = None

  def __post_init__(self):
    check_numbers(self)
    if self.feature_init_from is not None and self.feature_drafter is None:
      raise ValueError(
          f"train.feature_init_from={self.feature_init_from!r} needs "
          "train.feature_drafter (it warm-starts a feature-level draft).")
    if self.distill_from is None and (self.teacher_config is not None or
                                      self.teacher_model_gin is not None):
      raise ValueError("teacher_config/teacher_model_gin need distill_from.")
    self.loss_settings()  # Checks the distillation weight and temperature.
    self.optimizer_settings()  # Checks the optimizer's and decay's names.

  def loss_settings(self) -> LossSettings:
    return LossSettings(label_smoothing=float(self.label_smoothing),
                        z_loss=float(self.z_loss), distill=self.distill_from
                        is not None,
                        distill_temperature=float(self.distill_temperature),
                        distill_weight=float(self.distill_weight))

  def optimizer_settings(self) -> OptimizerSettings:
    fields = {
        f.name: getattr(self, f.name)
        for f in dataclasses.fields(OptimizerSettings)
    }
    # Only the cosine schedule depends on the run length: with the others,
    # runs of different lengths share one compiled train step.
    fields["decay_steps"] = (int(self.decay_steps or self.num_steps)
                             if self.decay == "cosine" else 0)
    return OptimizerSettings(**fields)

  def search_paths(self) -> Sequence[str]:
    if self.gin_search_paths is None:
      return gin_reader.search_paths()
    return self.gin_search_paths

  def resolved_paths(self) -> TrainPaths:
    """The run's files, resolved against the current directory now."""

    def data(path):
      return io_utils.resolve_path(path, self.data_dir)

    return TrainPaths(
        model_dir=os.path.abspath(io_utils.resolve_path(self.model_dir)),
        spm_model_path=io_utils.resolve_path(self.spm_model_path),
        source_file=data(self.source_file), reference_file=data(
            self.reference_file), eval_source_file=data(self.eval_source_file),
        eval_reference_file=data(self.eval_reference_file),
        distill_from=io_utils.resolve_path(self.distill_from))
