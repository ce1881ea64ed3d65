"""Validation BLEU: greedy decoding of held-out sentences, scored by sacrebleu.

Batches have one shape (`padded_batches`): a jitted decoder compiles once per
input shape, so a short last batch is padded by repeating its last row (a
real input) and the extra rows' outputs are dropped.
"""
import time
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import T5Model
from specdec_jax.data import tasks
from specdec_jax.metrics import quality as metrics


def evaluate_bleu(config: T5Config, params, sp,
                  examples: Sequence[Mapping[str, str]], *, batch_size: int,
                  max_input_length: int, max_decode_length: int,
                  encoder: Optional[T5Model] = None) -> Dict[str, Any]:
  """Greedy-decodes examples [{'input', 'reference'}]; corpus BLEU and samples.

  Args:
    config, params: the model ({'params': ...}); dropout is switched off.
    sp: the SentencePiece vocabulary.
    batch_size: decoding batch (at most the number of examples); the last
      batch is padded (`padded_batches`), so one compilation serves all.
    max_input_length, max_decode_length: truncation and decode lengths.
    encoder: for a decoder without an encoder (a shared-encoder draft), the
      model whose encoder it reads (`SharedEncoderModel`).

  Returns:
    bleu (`metrics.bleu`, sacrebleu), num_examples, decode_seconds, and the
    first 5 samples {input, reference, prediction}.
  """
  model = T5Model(config.replace(dropout_rate=0.0), params)
  if encoder is not None:
    model = SharedEncoderModel.pair(encoder, model)
  inputs = tasks.encode_batch(sp, [ex["input"] for ex in examples],
                              max_input_length)
  inputs = inputs[:, :max(1, int((inputs > 0).sum(1).max()))]
  batch_size = max(1, min(batch_size, len(examples)))
  pieces = sp.get_piece_size()
  predictions = []
  start = time.time()
  for chunk, real in padded_batches(inputs, batch_size):
    out = decoding.temperature_sample(model, chunk, jax.random.PRNGKey(0),
                                      max_decode_length=max_decode_length,
                                      temperature=0.0)
    tokens = np.asarray(out.tokens)[:real]
    # Ids past the vocabulary (vocab_size may exceed it) decode as padding.
    tokens = np.where(tokens < pieces, tokens, 0)
    predictions.extend(tasks.decode_tokens(sp, tokens))
  return {
      "bleu": metrics.bleu(predictions, [ex["reference"] for ex in examples]),
      "num_examples": len(examples),
      "decode_seconds": time.time() - start,
      "samples": [{
          "input": ex["input"],
          "reference": ex["reference"],
          "prediction": p
      } for ex, p in list(zip(examples, predictions))[:5]],
  }


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
