"""The corpus an n-gram drafter counts: token-id sentences in the model's
vocabulary, read on the host before anything is compiled.

Two formats:

* text (any other extension): UTF-8, one sentence per line, tokenized with
  the run's vocabulary (EOS appended), e.g. the training targets
  (Multi30k's train.de). A file mostly made of unknown pieces is refused:
  it is in a language or script the vocabulary does not cover.
* `.npz` (`write_token_corpus`): `ids` (all sentences' ids, concatenated),
  `lengths` (ids per sentence) and `vocab_size` (of the vocabulary that
  produced them), for a corpus tokenized elsewhere. A different
  `vocab_size`, or an id outside it, is refused.
"""
import io
from typing import Any, List, Sequence

import numpy as np

from specdec_jax.files import io_utils

# More unknown pieces than this (share of all tokens) means another
# vocabulary's language or script.
MAX_UNKNOWN_SHARE = 0.05
UNK_ID = 2  # T5's unknown piece.
EOS_ID = 1


def write_token_corpus(path: str, sentences: Sequence[Sequence[int]],
                       vocab_size: int) -> None:
  """Writes token-id sentences as a `.npz` corpus (atomically)."""
  ids = [np.asarray(s, np.int32).ravel() for s in sentences]
  buffer = io.BytesIO()
  np.savez(buffer, ids=np.concatenate(ids) if ids else np.zeros(0, np.int32),
           lengths=np.array([len(s) for s in ids],
                            np.int64), vocab_size=np.int64(vocab_size))
  io_utils.atomic_write(path, buffer.getvalue())


def read_corpus(path: str, vocab: Any, vocab_size: int,
                what: str = "NGRAM_CORPUS") -> List[np.ndarray]:
  """Token-id sentences [n_i] int32 from `path` (see the module docstring).

  Args:
    path: the corpus file.
    vocab: the run's vocabulary (`encode(text) -> ids`), for text files.
    vocab_size: the models' vocabulary size.
    what: how messages name the path (the gin macro).

  Raises:
    ValueError: naming `what`, the path and what is wrong: missing, empty,
      not a regular file (a FIFO), over `io_utils.DEFAULT_MAX_BYTES`,
      not UTF-8, in another vocabulary.
  """
  allowed = "a text file with one sentence per line, or a .npz of token ids"
  try:
    data = io_utils.read_bytes(path) if path else None
  except (FileNotFoundError, NotADirectoryError):
    data = None
  except io_utils.RefusedFile as e:
    raise ValueError(f"{what}={path!r}: {e.strerror}. Allowed: "
                     f"{allowed}.") from None
  if data is None:
    raise ValueError(f"{what}={path!r}: no such file ({allowed}).")
  if path.endswith(".npz"):
    return _read_ids(data, path, vocab_size, what)
  try:
    # Lines as a text file reads them (universal newlines).
    lines = [line.strip() for line in io.StringIO(data.decode("utf-8"), None)]
  except UnicodeDecodeError as e:
    raise ValueError(f"{what}={path!r} is not UTF-8 text ({e}).") from None
  sentences = [
      np.asarray(list(vocab.encode(line)) + [EOS_ID], np.int32)
      for line in lines
      if line
  ]
  if not sentences:
    raise ValueError(f"{what}={path!r} has no sentences.")
  tokens = np.concatenate(sentences)
  unknown = float(np.mean(tokens == UNK_ID))
  if unknown > MAX_UNKNOWN_SHARE:
    raise ValueError(
        f"{what}={path!r}: {unknown:.0%} of its tokens are unknown to the "
        f"vocabulary (at most {MAX_UNKNOWN_SHARE:.0%} allowed): it is in "
        "another language or vocabulary than the models'.")
  return sentences


def _read_ids(raw: bytes, path: str, vocab_size: int,
              what: str) -> List[np.ndarray]:
  try:
    with np.load(io.BytesIO(raw)) as data:
      ids, lengths = data["ids"], data["lengths"]
      corpus_vocab = int(data["vocab_size"])
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f"{what}={path!r}: not a token corpus (.npz with ids, "
                     f"lengths, vocab_size): {e}") from None
  if corpus_vocab != vocab_size:
    raise ValueError(
        f"{what}={path!r} holds ids of a vocabulary of {corpus_vocab} ids, "
        f"but the models' has {vocab_size}: it was tokenized with another "
        "vocabulary.")
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"{what}={path!r}: ids outside [0, {vocab_size}).")
  if int(np.sum(lengths)) != ids.size or np.any(lengths < 0):
    raise ValueError(f"{what}={path!r}: lengths do not add up to the ids.")
  if not ids.size:
    raise ValueError(f"{what}={path!r} has no tokens.")
  return [s.astype(np.int32) for s in np.split(ids, np.cumsum(lengths)[:-1])]
