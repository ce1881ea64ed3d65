"""SentencePiece vocabularies following T5 conventions (pad=0, eos=1, unk=2,
no BOS): read (`load_vocabulary`; `SentencePieceFile` without seqio, which
would import TensorFlow: ~7 s), trained (`train_sentencepiece`,
`prepare_vocabulary`) and checked (`check_t5_vocabulary`, `check_fits`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping, Optional, Sequence, Union

from absl import logging
import gin

from specdec_jax.files import io_utils

DEFAULT_SPM_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
DEFAULT_EXTRA_IDS = 100

# T5 special ids.
PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


@gin.configurable
def get_vocabulary(spm_model_path: str = DEFAULT_SPM_PATH,
                   extra_ids: int = DEFAULT_EXTRA_IDS):
  """Returns a ``seqio.SentencePieceVocabulary`` (model loaded lazily)."""
  from specdec_jax.terminal import console  # pylint: disable=g-import-not-at-top
  console.import_tensorflow_quietly()  # seqio imports TensorFlow
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.SentencePieceVocabulary(spm_model_path, extra_ids=extra_ids)


class SentencePieceFile:
  """A local SentencePiece model without extra ids, read without seqio: as
  ``seqio.SentencePieceVocabulary(path, extra_ids=0)`` (test_tasks.py)."""
  extra_ids = 0
  seqio_kind = "SentencePieceVocabulary"  # what run records (settings)

  def __init__(self, path: str):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.sentencepiece_model_file = path
    proto = io_utils.read_bytes(path)  # a regular file (a FIFO would block)
    self.tokenizer = spm.SentencePieceProcessor()
    self.tokenizer.LoadFromSerializedProto(proto)
    self.vocab_size = self.tokenizer.GetPieceSize()
    self.eos_id = self.tokenizer.eos_id()
    self.unk_id = self.tokenizer.unk_id()
    self.pad_id = PAD_ID

  def encode(self, s: str) -> Sequence[int]:
    return self.tokenizer.EncodeAsIds(s)

  def decode(self, ids) -> str:
    size, unk = self.vocab_size, self.unk_id
    clean = [unk if i >= size else int(i) for i in ids]
    if self.eos_id in clean:
      clean = clean[:clean.index(self.eos_id) + 1]
    return self.tokenizer.DecodeIds(clean)


def load_vocabulary(spm_model_path: str = DEFAULT_SPM_PATH,
                    extra_ids: int = DEFAULT_EXTRA_IDS,
                    what: str = "SPM_MODEL_PATH"):
  """A ``seqio.SentencePieceVocabulary`` (a `SentencePieceFile` for a local
  model without extra ids), read and checked now, not at the first encode;
  errors name the path as `what`.

  Raises:
    ValueError: the file cannot be read or is not a SentencePiece model, or
      it does not use T5's ids (pad 0, EOS 1, unk 2).
  """
  try:
    if extra_ids == 0 and "://" not in os.fspath(spm_model_path):
      vocab = SentencePieceFile(os.fspath(spm_model_path))
    else:
      vocab = get_vocabulary(spm_model_path, extra_ids)
      _ = vocab.tokenizer  # Reads the file.
  except Exception as e:  # pylint: disable=broad-except
    # protobuf's DecodeError, SentencePiece's RuntimeError, OSError, TF's
    # errors: all mean the same thing to the user.
    raise ValueError(
        f"{what}={spm_model_path!r} is not a SentencePiece model: expected a "
        "`.model` file written by SentencePiece's trainer (such as T5's "
        f"{DEFAULT_SPM_PATH}); reading it failed: {_reading_error(e)}"
    ) from None
  check_t5_vocabulary(vocab)
  return vocab


def _reading_error(e: BaseException) -> str:
  """Why a SentencePiece model could not be read, in words (SentencePiece's
  parse error is a line of its C++ source)."""
  text = str(e).strip()
  if "ParseFromArray" in text or "DecodeError" in type(e).__name__:
    return "its bytes are not a serialized SentencePiece model."
  return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def train_sentencepiece(input_files: Union[str, os.PathLike,
                                           Sequence[Union[str, os.PathLike]]],
                        model_prefix: Union[str, os.PathLike], vocab_size: int,
                        *, character_coverage: float = 1.0,
                        model_type: str = "unigram", **trainer_kwargs) -> str:
  """Trains a SentencePiece model with T5's ids on `input_files` (one
  sentence per line) in a temporary folder, then moves it into place: no
  reader sees a partial model. Returns ``<model_prefix>.model``."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if isinstance(input_files, (str, os.PathLike)):
    input_files = [input_files]
  input_files = [os.fspath(f) for f in input_files]
  if not input_files:
    raise ValueError("train_sentencepiece needs at least one input file.")
  for f in input_files:
    if not os.path.isfile(f):
      raise ValueError(f"SentencePiece training file not found: {f}")
    if "," in f:
      raise ValueError(
          f"SentencePiece cannot take input paths containing ',': {f}")
  for key in ("pad_id", "eos_id", "unk_id", "bos_id"):
    if key in trainer_kwargs:
      raise ValueError(
          f"{key} is fixed by T5 conventions and cannot be overridden.")

  trainer_kwargs.setdefault("minloglevel", 1)  # SentencePiece is chatty.
  model_prefix = os.path.abspath(os.fspath(model_prefix))
  out_dir = os.path.dirname(model_prefix)
  os.makedirs(out_dir, exist_ok=True)
  base = os.path.basename(model_prefix)
  tmp_dir = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=out_dir)
  try:
    tmp_prefix = os.path.join(tmp_dir, base)
    spm.SentencePieceTrainer.train(
        input=",".join(input_files), model_prefix=tmp_prefix,
        vocab_size=vocab_size, character_coverage=character_coverage,
        model_type=model_type, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        bos_id=-1, **trainer_kwargs)
    # .vocab first, so that once the .model exists its .vocab does too.
    os.replace(tmp_prefix + ".vocab", model_prefix + ".vocab")
    os.replace(tmp_prefix + ".model", model_prefix + ".model")
  finally:
    shutil.rmtree(tmp_dir, ignore_errors=True)
  return model_prefix + ".model"


def check_t5_vocabulary(vocab) -> None:
  """Raises ValueError unless ``vocab`` (a seqio vocabulary, a
  ``SentencePieceProcessor`` or a .model path) uses T5's ids."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if isinstance(vocab, (str, os.PathLike)):
    sp = load_sentencepiece(vocab)
  elif isinstance(vocab, spm.SentencePieceProcessor):
    sp = vocab
  else:
    sp = getattr(vocab, "tokenizer", None)
    if sp is None or not hasattr(sp, "pad_id"):
      raise TypeError(
          "check_t5_vocabulary expects a seqio.SentencePieceVocabulary, a "
          "sentencepiece.SentencePieceProcessor or a model path, got "
          f"{vocab!r}.")
  got = {"pad": sp.pad_id(), "eos": sp.eos_id(), "unk": sp.unk_id()}
  want = {"pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID}
  bad = [k for k in want if got[k] != want[k]]
  if bad:
    name = getattr(vocab, "sentencepiece_model_file",
                   None) or (os.fspath(vocab) if isinstance(
                       vocab, (str, os.PathLike)) else type(vocab).__name__)
    raise ValueError(
        f"SentencePiece vocabulary {name} does not follow T5 conventions: "
        "expected pad_id=0, eos_id=1, unk_id=2 but got "
        f"pad_id={got['pad']}, eos_id={got['eos']}, unk_id={got['unk']} "
        f"(mismatched: {', '.join(bad)}). Train it with pad_id=0 eos_id=1 "
        "unk_id=2 bos_id=-1 (see specdec_jax.data.vocab.train_sentencepiece).")


def load_sentencepiece(path: str):
  """A SentencePieceProcessor for a local .model file (or gs:// via seqio)."""
  path = os.fspath(path)
  if io_utils.is_url(path):
    return get_vocabulary(path, extra_ids=0).tokenizer
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
  """The vocabulary a model trains with (trained first if missing and
  `train_vocab`); ValueError if missing or not T5's ids."""
  spm_model_path = os.fspath(spm_model_path)
  if not io_utils.is_url(spm_model_path) and not os.path.exists(spm_model_path):
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
    train_sentencepiece(list(training_files), spm_model_path[:-len(".model")],
                        vocab_size, **dict(spm_options or {}))
  sp = load_sentencepiece(spm_model_path)
  try:
    check_t5_vocabulary(sp)
  except ValueError as e:
    raise ValueError(f"Vocabulary {spm_model_path}: {e}") from e
  return sp


def check_fits(sp, spm_model_path: str, config: Any) -> None:
  """Raises ValueError if the vocabulary has more pieces than `vocab_size`."""
  if sp.get_piece_size() > config.vocab_size:
    raise ValueError(
        f"SentencePiece model {spm_model_path} has {sp.get_piece_size()} "
        f"pieces but the model's vocab_size is {config.vocab_size} "
        "(T5Config.vocab_size must be >= the vocabulary size).")
