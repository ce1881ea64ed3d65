"""Training data: parallel text read, tokenized and batched reproducibly:
batch `step` comes from a per-epoch permutation that is a pure function of
(seed, step), so a resumed run sees the batches an uninterrupted one would,
padded to its longest row rounded up to ``length_bucket`` (few shapes).
"""
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from specdec_jax.core.models.config import T5Config
from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocabulary
from specdec_jax.files import io_utils
from specdec_jax.training.config import TrainConfig
from specdec_jax.training.config import TrainPaths


def read_data(
    config: TrainConfig, files: TrainPaths, model: T5Config, *,
    train_vocab: bool
) -> Tuple[List[Tuple[str, str]], List[Mapping[str, str]], Any]:
  """(training pairs, validation examples, vocabulary fitting `model`,
  trained first if missing and `train_vocab`); ValueError naming the file
  and line (and where relative paths are taken from), or the vocabulary."""
  try:
    pairs = tasks.read_parallel_text(files.source_file, files.reference_file)
  except ValueError as e:
    raise ValueError(f"Training data: {e} (relative paths are taken from "
                     f"{os.getcwd()} if they exist there, else from "
                     f"{io_utils.REPO_DIR}).") from e
  if config.num_train_examples is not None:
    pairs = pairs[:config.num_train_examples]
  examples = []
  if files.eval_source_file is not None and config.eval_num_examples:
    try:
      examples = tasks.load_examples(source_file=files.eval_source_file,
                                     reference_file=files.eval_reference_file,
                                     input_prefix=config.input_prefix,
                                     num_examples=config.eval_num_examples)
    except ValueError as e:
      raise ValueError(f"Evaluation data: {e}") from e
  sp = vocabulary.prepare_vocabulary(
      files.spm_model_path, train_vocab=train_vocab, training_files=[
          f for f in (files.source_file, files.reference_file) if f
      ], vocab_size=config.spm_vocab_size, spm_options=config.spm_options)
  vocabulary.check_fits(sp, files.spm_model_path, model)
  return pairs, examples, sp


class ParallelData:
  """Tokenized (input, target) pairs and deterministic, resumable batches.

  Batch `step` (0-based) comes from epoch ``step // steps_per_epoch`` of a
  permutation seeded by (seed, epoch); the last partial batch of an epoch is
  dropped.
  """

  def __init__(self, sp, pairs: Sequence[Tuple[str, str]], *, input_prefix: str,
               max_input_length: int, max_target_length: int, batch_size: int,
               seed: int, length_bucket: int = 8, sort_window: int = 0):
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
    """Batch `step` (0-based) of the run; see `make_batch`."""
    epoch, index = divmod(step, self.steps_per_epoch)
    idx = self._epoch_batches(epoch)[index]
    return make_batch(self.inputs[idx], self.targets[idx], self.length_bucket)


def training_batches(config: TrainConfig, sp,
                     pairs: Sequence[Tuple[str, str]]) -> ParallelData:
  """The run's `ParallelData`, as `config` sets it."""
  return ParallelData(sp, pairs, input_prefix=config.input_prefix,
                      max_input_length=config.max_input_length,
                      max_target_length=config.max_target_length,
                      batch_size=config.batch_size, seed=config.seed,
                      length_bucket=config.length_bucket,
                      sort_window=config.sort_window)


def make_batch(inputs: np.ndarray, targets: np.ndarray,
               length_bucket: int) -> Dict[str, np.ndarray]:
  """encoder_input_tokens [B, S'], decoder_input_tokens [B, T'] (shifted
  right, start token 0), decoder_target_tokens [B, T'] of 0-padded inputs
  [B, S] and targets [B, T], cut to the longest rows rounded up to
  `length_bucket`."""

  def width(rows):
    longest = max(1, int((rows > 0).sum(1).max()))
    return min(rows.shape[1],
               int(math.ceil(longest / length_bucket)) * length_bucket)

  targets = targets[:, :width(targets)]
  decoder_inputs = np.zeros_like(targets)
  decoder_inputs[:, 1:] = targets[:, :-1]  # Shift right, start token 0.
  return {
      "encoder_input_tokens": inputs[:, :width(inputs)],
      "decoder_input_tokens": decoder_inputs,
      "decoder_target_tokens": targets,
  }
