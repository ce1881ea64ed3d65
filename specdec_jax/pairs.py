"""A trained (target, draft) pair from its checkpoint folders, ready to
decode from Python in three lines:

    pair = pairs.load_pair("pretrained/multi30k/target_38m",
                           "pretrained/multi30k/draft_1m_distill_38m",
                           "pretrained/multi30k/multi30k.model")
    out = pair.speculative(pair.encode(["A dog runs."]), gamma=3)
    print(pair.decode(out.tokens))  # ['Ein Hund rennt.']

Each folder's `model_config.json` gives the model's sizes and dtype
(`checkpoints.load_model`); a draft decoder without an encoder of its own
(a shared-encoder draft) is paired with the target's encoder. Inputs are
encoded as the run encodes them (SentencePiece ids, then EOS, cut to the
input length) and outputs decoded up to the first EOS.
"""
import dataclasses
from typing import Any, List, Optional, Sequence

import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.core import decoding
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Model


@dataclasses.dataclass(frozen=True)
class Pair:
  """A target, its draft (as speculative decoding runs it) and their
  vocabulary.

  Attributes:
    target: the target model, prepared for decoding.
    draft: the draft model (a `SharedEncoderModel` for a draft decoder
      that reads the target's encoder).
    vocabulary: the pair's SentencePiece model (`vocab.SentencePieceFile`).
  """
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


def load_pair(target_folder: str, draft_folder: str,
              spm_model_path: str) -> Pair:
  """The pair in two checkpoint folders (each a checkpoint or a folder of
  them: the latest) with the SentencePiece model at `spm_model_path`;
  ValueError when the three do not fit together."""
  target = checkpoints.load_model(target_folder)
  draft = checkpoints.load_model(draft_folder)
  vocabulary = vocab_lib.SentencePieceFile(spm_model_path)
  sizes = {target.config.vocab_size, draft.config.vocab_size}
  if len(sizes) != 1 or vocabulary.vocab_size > target.config.vocab_size:
    raise ValueError(
        f"load_pair: target vocab_size {target.config.vocab_size}, draft "
        f"{draft.config.vocab_size}, SentencePiece model {spm_model_path} "
        f"{vocabulary.vocab_size} pieces; allowed: one vocabulary for all "
        "three (the models' vocab_size at least the pieces).")
  return Pair(target, SharedEncoderModel.draft_for(target, draft), vocabulary)
