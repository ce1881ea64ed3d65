"""Fixed-shape batches for jitted decoders: the last batch is padded.

A jitted decoder compiles once per input shape, so a last batch of fewer rows
would compile it again. `padded_batches` pads that batch by repeating its last
row (a real input, so nothing out of the ordinary is decoded) and says how
many rows are real; callers drop the outputs of the others.
"""
from typing import Iterator, Tuple

import numpy as np


def pad_rows(rows: np.ndarray, batch_size: int) -> np.ndarray:
  """`rows` [n, ...] with its last row repeated up to [batch_size, ...]."""
  n = rows.shape[0]
  if not 1 <= n <= batch_size:
    raise ValueError(f"pad_rows: {n} rows for batch_size {batch_size} "
                     "(allowed: 1 to batch_size rows).")
  if n == batch_size:
    return rows
  return np.concatenate([rows, np.repeat(rows[-1:], batch_size - n, axis=0)])


def padded_batches(array: np.ndarray,
                   batch_size: int) -> Iterator[Tuple[np.ndarray, int]]:
  """Yields (batch [batch_size, ...], number of real rows) over `array`'s rows.

  Every batch has `batch_size` rows; the last one is padded by `pad_rows`.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  for start in range(0, len(array), batch_size):
    chunk = array[start:start + batch_size]
    yield pad_rows(chunk, batch_size), len(chunk)
