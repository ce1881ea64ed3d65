"""The SentencePiece vocabulary a model trains with: loaded, or trained first.

T5 conventions (pad 0, EOS 1, unk 2, no BOS) are checked
(`vocab.check_t5_vocabulary`), and the vocabulary must fit the model's
``vocab_size``: ids beyond it would be clamped by the embedding lookup.
"""
import os
from typing import Any, Mapping, Optional, Sequence

from absl import logging

from specdec_jax import paths
from specdec_jax import vocab as vocab_lib
from specdec_jax.models.config import T5Config


def load_sentencepiece(path: str):
  """A SentencePieceProcessor for a local .model file (or gs:// via seqio)."""
  path = os.fspath(path)
  if paths.is_url(path):
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
  """Loads (training it first if needed and allowed) a T5-style vocabulary.

  Raises:
    ValueError: the model is missing and may not be trained, or does not
      follow T5's conventions.
  """
  spm_model_path = os.fspath(spm_model_path)
  if not paths.is_url(spm_model_path) and not os.path.exists(spm_model_path):
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


def check_fits(sp, spm_model_path: str, config: T5Config) -> None:
  """Raises ValueError if the vocabulary has more pieces than `vocab_size`."""
  if sp.get_piece_size() > config.vocab_size:
    raise ValueError(
        f"SentencePiece model {spm_model_path} has {sp.get_piece_size()} "
        f"pieces but the model's vocab_size is {config.vocab_size} "
        "(T5Config.vocab_size must be >= the vocabulary size).")
