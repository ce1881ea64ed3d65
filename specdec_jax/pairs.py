"""A trained (target, draft) pair from its checkpoint folders, ready to
decode from Python in three lines:

    pair = pairs.load_pair("pretrained/multi30k/target_38m",
                           "pretrained/multi30k/draft_1m_distill_38m",
                           "pretrained/multi30k/multi30k.model")
    out = pair.speculative(pair.encode(["A dog runs."]), gamma=3)
    print(pair.decode(out.tokens))  # ['Ein Hund rennt.']

Everything is checked as `run` checks it; inputs are encoded and outputs
decoded as the run does.
"""
import dataclasses
import os
from typing import Any, List, Optional, Sequence

import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.files import io_utils
from specdec_jax.core import decoding
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.experiment import loading
from specdec_jax.files import compilation_cache as cache_lib
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Model
from specdec_jax.terminal import console


@dataclasses.dataclass(frozen=True)
class Pair:
  """A target, its draft (a `SharedEncoderModel` for a draft decoder that
  reads the target's encoder) and their `vocab.SentencePieceFile`."""
  target: T5Model
  draft: Any
  vocabulary: vocab_lib.SentencePieceFile

  @property
  def eos_id(self) -> int:
    return self.vocabulary.eos_id

  def encode(self, texts: Sequence[str], length: int = 64) -> np.ndarray:
    """[len(texts), length] int32: each text's ids, then EOS, cut to
    `length` (0-padded), as `run` feeds the encoder."""
    out = np.zeros((len(texts), length), np.int32)
    for i, text in enumerate(texts):
      ids = list(self.vocabulary.encode(text))[:length - 1] + [self.eos_id]
      out[i, :len(ids)] = ids
    return out

  def decode(self, tokens: Any) -> List[str]:
    """Each row of [B, T] tokens as text, up to its first EOS."""
    return [self.vocabulary.decode(list(row)) for row in np.asarray(tokens)]

  def speculative(self, inputs: np.ndarray, rng: Optional[jax.Array] = None, *,
                  gamma: int = 3, max_decode_length: int = 64,
                  **sampling) -> decoding.SpeculativeOutput:
    """`decoding.speculative_sample` on this pair (greedy unless
    `temperature=`, `top_k=`, `top_p=` or `method=` are given)."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    return decoding.speculative_sample(self.target, self.draft, inputs, rng,
                                       gamma=gamma,
                                       max_decode_length=max_decode_length,
                                       eos_id=self.eos_id, **sampling)

  def target_alone(self, inputs: np.ndarray, rng: Optional[jax.Array] = None, *,
                   max_decode_length: int = 64,
                   **sampling) -> decoding.DecodeOutput:
    """`decoding.temperature_sample` with the target alone."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    return decoding.temperature_sample(self.target, inputs, rng,
                                       max_decode_length=max_decode_length,
                                       eos_id=self.eos_id, **sampling)


# How the vocabulary checks name `load_pair`'s arguments.
NAMES = loading.Names(vocabulary="spm_model_path", extra_ids=None,
                      vocab_size="{role}_folder's model_config.json vocab_size",
                      checkpoint="{role}_folder", size_mismatch=None)


def load_pair(target_folder: str, draft_folder: str, spm_model_path: str, *,
              compilation_cache: bool = True) -> Pair:
  """The pair in two checkpoint folders (a checkpoint, or a folder of them:
  the latest) with the SentencePiece model at `spm_model_path`, resolved as
  the commands resolve paths, and checked as `run` checks them before any
  array is read (`CheckpointError`, `ConfigError`). `compilation_cache`:
  turn on the commands' persistent compilation cache. JAX starts as the
  commands start it (libtpu's search for a TPU VM kept aside where it
  can only fail: `console.start_backends_quietly`)."""
  console.start_backends_quietly()
  target = checkpoints.check_model(target_folder, "target_folder")
  draft = checkpoints.check_model(draft_folder, "draft_folder")
  spm_path = io_utils.resolve_path(os.fspath(spm_model_path))
  vocabulary = vocab_lib.load_vocabulary(spm_path, 0, what="spm_model_path")
  try:
    decoding.check_vocab_sizes(target.config.vocab_size,
                               draft.config.vocab_size)
  except ValueError as e:
    raise loading.ConfigError(
        f"target_folder, draft_folder: {e} Allowed: a target and a draft "
        "trained with one vocabulary.") from None
  loading.vocabulary_fits(vocabulary, target.config, draft.config, names=NAMES)
  for role, model in (("target", target), ("draft", draft)):
    loading.check_vocabulary_digest(vocabulary, role, model.path, NAMES)
  if compilation_cache:
    cache_lib.enable()
  target_model = target.load()
  return Pair(target_model,
              SharedEncoderModel.draft_for(target_model, draft.load()),
              vocabulary)
