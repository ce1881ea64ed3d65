"""Training T5 targets and drafts (`python -m specdec_jax.train`).

Laid out as flax's ``examples/wmt``: `trainer.train_and_evaluate` is the run,
step by step, over one module per concern:

* `config`: `TrainConfig`, every setting (gin's ``train.*``), checked once;
  the optimizer (AdamW / Adafactor, the warmup-then-decay schedule).
* `data`: parallel text read, validated, tokenized; `ParallelData`'s
  deterministic, resumable batches.
* `vocabulary`: the SentencePiece model, loaded or trained, T5 conventions.
* `loss`: cross-entropy or distillation KL, z-loss; the feature-level
  draft's losses.
* `checkpointing`: parameters + optimizer state + step, atomically.
* `teacher`: the distillation teacher's checkpoint, config and weights.
* `trainer`: the run, step by step, its jitted step (cached across runs)
  and validation BLEU (greedy decoding, sacrebleu).
"""
from specdec_jax.training.config import TrainConfig
from specdec_jax.training.trainer import TrainResult
from specdec_jax.training.trainer import train_and_evaluate

__all__ = ["TrainConfig", "TrainResult", "train_and_evaluate"]
