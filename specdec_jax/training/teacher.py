"""The distillation teacher: which checkpoint, which config, its parameters.

``distill_from`` names a teacher model_dir (its latest checkpoint) or one
``checkpoint_<step>`` directory. The teacher's config comes from
``teacher_config`` (e.g. ``@teacher/T5Config()``), from ``teacher_model_gin``
(a model gin file read with `gin_reader.read_t5_config`, without touching the
global gin config), or from the ``model_config.json`` that this trainer wrote
next to the teacher's checkpoints; a given config must agree with that file.
Its vocab_size must equal the student's (the KL compares distributions token
by token); its parameters are loaded with shape checks. A shared-encoder
student (no encoder of its own) reads the teacher's encoder: its
encoder_width must be the teacher's emb_dim.
"""
import dataclasses
import os
from typing import Any, Optional, Sequence, Tuple

import jax.numpy as jnp

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import param_shapes
from specdec_jax.training import checkpointing

# Fields that do not change the parameters' shapes or values.
_SHAPE_FREE_FIELDS = ("dtype", "dropout_rate", "float32_attention_logits")


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A loaded teacher: its checkpoint, config (no dropout) and parameters."""
  checkpoint: str
  config: T5Config
  params: Any  # {'params': ...}


def resolve_checkpoint(distill_from: str) -> Tuple[str, Optional[str]]:
  """(checkpoint dir, model_config.json path or None) of a teacher."""
  distill_from = os.fspath(distill_from)
  if checkpoints.checkpoint_step(distill_from) is not None:
    ckpt = distill_from
    if not os.path.isdir(ckpt):
      raise ValueError(f"distill_from: checkpoint {ckpt} does not exist.")
  else:
    ckpt = checkpoints.latest_checkpoint(distill_from)
    if ckpt is None:
      raise ValueError(
          f"distill_from: no checkpoint_<step> found in {distill_from} (train "
          "the teacher first).")
  for candidate in (os.path.join(ckpt, checkpointing.MODEL_CONFIG_FILE),
                    os.path.join(os.path.dirname(os.path.normpath(ckpt)),
                                 checkpointing.MODEL_CONFIG_FILE)):
    if os.path.isfile(candidate):
      return ckpt, candidate
  return ckpt, None


def _check_agrees(stored: T5Config, json_path: str, given: T5Config) -> None:
  diff = [
      f.name
      for f in dataclasses.fields(T5Config)
      if f.name not in _SHAPE_FREE_FIELDS and
      getattr(stored, f.name) != getattr(given, f.name)
  ]
  if diff:
    raise ValueError(
        f"Teacher config mismatch: {json_path} (written with the teacher "
        f"checkpoint) differs from the given teacher config in {diff}: " +
        ", ".join(f"{k}={getattr(stored, k)!r} vs "
                  f"{getattr(given, k)!r}" for k in diff))


def teacher_config(distill_from: str, config: Optional[T5Config],
                   model_gin: Optional[str],
                   search_paths: Sequence[str]) -> Tuple[str, T5Config]:
  """(checkpoint, config without dropout) of the teacher; see the module doc.

  Raises:
    ValueError: no checkpoint, both or neither of a given config and a
      stored one, or a given config that disagrees with the stored one.
  """
  ckpt, json_path = resolve_checkpoint(distill_from)
  stored = (None if json_path is None else
            checkpointing.read_model_config(json_path))
  if config is not None and model_gin is not None:
    raise ValueError("Give at most one of teacher_config and "
                     "teacher_model_gin.")
  if model_gin is not None:
    config = gin_reader.read_t5_config(model_gin, search_paths=search_paths)
  if config is None:
    if stored is None:
      raise ValueError(
          f"distill_from={distill_from}: no "
          f"{checkpointing.MODEL_CONFIG_FILE} next to {ckpt}; give the "
          "teacher's config with teacher_model_gin or teacher_config (e.g. "
          "@teacher/T5Config()).")
    config = stored
  elif stored is not None:
    _check_agrees(stored, json_path, config)
  return ckpt, config.replace(dropout_rate=0.0)


def load_teacher(distill_from: str, config: Optional[T5Config],
                 model_gin: Optional[str], search_paths: Sequence[str], *,
                 student: T5Config) -> Teacher:
  """The teacher, checked against the student before its weights are read."""
  ckpt, t_config = teacher_config(distill_from, config, model_gin, search_paths)
  if t_config.vocab_size != student.vocab_size:
    raise ValueError(
        f"Distillation teacher {ckpt} has vocab_size "
        f"{t_config.vocab_size} but the student has {student.vocab_size}: "
        "the KL loss compares their distributions token by token, so both "
        "must use the same vocabulary.")
  if not student.has_encoder and student.encoder_width != t_config.emb_dim:
    raise ValueError(
        f"The student has no encoder and reads the teacher's (width "
        f"T5Config.encoder_width={student.encoder_width}), but teacher "
        f"{ckpt} has emb_dim {t_config.emb_dim}: set encoder_width to it.")
  # float32 whatever the stored dtype: a shipped bfloat16 checkpoint would
  # otherwise run the teacher in bfloat16 matmuls (slow on CPU).
  with checkpointing.quiet_absl():
    params = {
        "params": checkpoints.load_t5x_params(ckpt,
                                              expected=param_shapes(t_config),
                                              dtype=jnp.float32)
    }
  return Teacher(checkpoint=ckpt, config=t_config, params=params)
