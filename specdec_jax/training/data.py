"""Training data: parallel text read, tokenized and batched reproducibly.

`read_training_pairs` and `read_eval_examples` read and validate the files
(`tasks.read_parallel_text`: mismatched line counts, empty lines, ... raise
ValueError naming file and line) before anything slow happens. `ParallelData`
tokenizes the pairs (EOS appended, truncated to the maximum lengths) and
draws batch `step` from a per-epoch permutation that is a pure function of
(seed, step), so a resumed run sees exactly the batches the uninterrupted run
would have. Each batch is padded to its longest row rounded up to
``length_bucket`` (few distinct shapes, few compilations).
"""
import math
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from specdec_jax.config import paths
from specdec_jax.data import tasks


def read_training_pairs(
    source_file: str, reference_file: Optional[str],
    num_examples: Optional[int] = None) -> List[Tuple[str, str]]:
  """(source, reference) pairs, the first `num_examples` (None: all).

  Raises:
    ValueError: naming the file and line, and where relative paths are
      taken from.
  """
  try:
    pairs = tasks.read_parallel_text(source_file, reference_file)
  except ValueError as e:
    raise ValueError(f"Training data: {e} (relative paths are taken from "
                     f"{os.getcwd()} if they exist there, else from "
                     f"{paths.REPO_DIR}).") from e
  return pairs if num_examples is None else pairs[:num_examples]


def read_eval_examples(source_file: Optional[str],
                       reference_file: Optional[str], *, input_prefix: str,
                       num_examples: int) -> List[Mapping[str, str]]:
  """[{'input', 'reference'}] validation examples ([] if none are wanted)."""
  if source_file is None or not num_examples:
    return []
  try:
    return tasks.load_examples(source_file=source_file,
                               reference_file=reference_file,
                               input_prefix=input_prefix,
                               num_examples=num_examples)
  except ValueError as e:
    raise ValueError(f"Evaluation data: {e}") from e


def _round_up(n: int, multiple: int) -> int:
  return int(math.ceil(n / multiple) * multiple)


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
    return self.make_batch(self.inputs[idx], self.targets[idx])

  def make_batch(self, inputs: np.ndarray,
                 targets: np.ndarray) -> Dict[str, np.ndarray]:
    """Teacher-forcing arrays for inputs [B, S] and targets [B, T] (0-padded).

    Returns:
      encoder_input_tokens [B, S'], decoder_input_tokens [B, T'] (targets
      shifted right, start token 0) and decoder_target_tokens [B, T'], where
      S' and T' are the longest rows rounded up to `length_bucket` (at most
      S and T).
    """
    in_len = min(
        inputs.shape[1],
        _round_up(max(1, int((inputs > 0).sum(1).max())), self.length_bucket))
    tgt_len = min(
        targets.shape[1],
        _round_up(max(1, int((targets > 0).sum(1).max())), self.length_bucket))
    targets = targets[:, :tgt_len]
    decoder_inputs = np.zeros_like(targets)
    decoder_inputs[:, 1:] = targets[:, :-1]  # Shift right, start token 0.
    return {
        "encoder_input_tokens": inputs[:, :in_len],
        "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets,
    }
