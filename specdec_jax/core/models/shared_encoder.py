"""A draft decoder that reads its target's encoder: `SharedEncoderModel`."""
import dataclasses
from typing import Optional, Tuple, cast

import jax

from specdec_jax.core import structs
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.network import DecodeCache
from specdec_jax.core.models.network import Transformer
from specdec_jax.core.models.t5 import EncoderOutput
from specdec_jax.core.models.t5 import T5Model

Array = jax.Array


@structs.dataclass
class SharedEncoderModel:
  """A decoder reading another T5 model's encoder: a shared-encoder draft.

  `decoder` has no encoder of its own (`T5Config.num_encoder_layers = 0`);
  its cross-attention projects keys/values from `encoder`'s output (width
  `encoder.config.emb_dim` = the decoder's `encoder_width`). In speculative
  decoding `encoder` is the target: the drafter starts from the output the
  target's `start` already computed (`start_from_encoder_output`, via
  `Target.encoder_output` and `Drafter.init`), so the draft encodes nothing.
  `start` (encode, then start) is for running it on its own (timing, tests).

  It has `Target`'s interface (`start`, `decode_chunk`, `truncate`, ...),
  so `drafters.ModelDrafter` drafts with it. Only the decoder's parameters
  are its own: a checkpoint holds `token_embedder/` and `decoder/` in T5X's
  layout (`decoder` alone); `encoder`'s decoder is never called.
  """
  encoder: T5Model
  decoder: T5Model

  @classmethod
  def draft_for(cls, target: T5Model, draft: T5Model):
    """The draft as speculative decoding runs it: `draft` itself, or, for a
    decoder without an encoder of its own, `draft` paired with `target`,
    whose encoder it reads."""
    return draft if draft.config.has_encoder else cls.pair(target, draft)

  @classmethod
  def pair(cls, encoder: T5Model, decoder: T5Model) -> "SharedEncoderModel":
    """Checks that `decoder` reads `encoder`'s output, then pairs them."""
    cfg = decoder.config
    if cfg.has_encoder:
      raise ValueError(
          "SharedEncoderModel: the decoder model has an encoder of its own "
          f"({cfg.num_encoder_layers} layers); a shared-encoder draft has "
          "num_encoder_layers=0 and encoder_width = the target's emb_dim.")
    if not encoder.config.has_encoder:
      raise ValueError("SharedEncoderModel: the encoder model has no "
                       "encoder.")
    if cfg.encoder_width != encoder.config.emb_dim:
      raise ValueError(f"SharedEncoderModel: the decoder's encoder_width is "
                       f"{cfg.encoder_width} but the encoder's emb_dim is "
                       f"{encoder.config.emb_dim}.")
    if cfg.vocab_size != encoder.config.vocab_size:
      raise ValueError(
          f"SharedEncoderModel: vocab_size {cfg.vocab_size} (decoder) != "
          f"{encoder.config.vocab_size} (encoder).")
    return cls(encoder=encoder, decoder=decoder)

  @property
  def config(self) -> T5Config:
    """The decoder's config (the draft's own)."""
    return self.decoder.config

  @property
  def flat_chunk_cost(self) -> bool:
    return self.decoder.flat_chunk_cost

  @property
  def unroll_draft_steps(self) -> bool:
    return self.decoder.unroll_draft_steps

  @property
  def argmax_in_call(self) -> bool:
    return self.decoder.argmax_in_call

  @property
  def vocab_size(self) -> int:
    return self.decoder.vocab_size

  def prepared_for_decoding(self,
                            path: Optional[str] = None) -> "SharedEncoderModel":
    """Both prepared; `path` (`T5Model.prepared_for_decoding`) is the
    decoder's, the one that decodes."""
    return dataclasses.replace(self,
                               encoder=self.encoder.prepared_for_decoding(),
                               decoder=self.decoder.prepared_for_decoding(path))

  @property
  def tiles(self):
    """Its decoder's `T5Model.tiles`."""
    return self.decoder.tiles

  def with_tiles(self, tiles) -> "SharedEncoderModel":
    """Its decoder's `T5Model.with_tiles` (the encoder runs no GPU
    kernels): itself when the decoder's tiles are already `tiles`."""
    decoder = self.decoder.with_tiles(tiles)
    if decoder is self.decoder:
      return self
    return dataclasses.replace(self, decoder=decoder)

  def start_token(self, encoder_input_tokens: Array) -> Array:
    return self.decoder.start_token(encoder_input_tokens)

  def length(self, cache: DecodeCache) -> Array:
    return cache.length

  def encode(self, encoder_input_tokens: Array) -> EncoderOutput:
    return self.encoder.encode(encoder_input_tokens)

  def start(self, encoder_input_tokens: Array, max_len: int) -> DecodeCache:
    """Encodes with `encoder`, then starts the decoder (standalone use)."""
    return self.start_from_encoder_output(self.encode(encoder_input_tokens),
                                          max_len)

  def start_from_encoder_output(self, encoder_output: EncoderOutput,
                                max_len: int) -> DecodeCache:
    return self.decoder.start_from_encoder_output(encoder_output, max_len)

  def encoder_output(self, cache: DecodeCache) -> EncoderOutput:
    return self.decoder.encoder_output(cache)

  @property
  def reads_target_encoder(self) -> bool:
    return True

  def decode_chunk(self, tokens: Array,
                   cache: DecodeCache) -> Tuple[Array, DecodeCache]:
    return self.decoder.decode_chunk(tokens, cache)

  def decode_argmax(self, logits: Array,
                    cache: DecodeCache) -> Tuple[Array, DecodeCache]:
    return self.decoder.decode_argmax(logits, cache)

  def truncate(self, cache: DecodeCache, length: Array) -> DecodeCache:
    return self.decoder.truncate(cache, length)

  def teacher_forced_logits(self, encoder_input_tokens: Array,
                            decoder_input_tokens: Array,
                            decoder_target_tokens: Array) -> Array:
    """[B, T, V] the decoder's teacher-forced logits on `encoder`'s output."""
    encoded = self.encode(encoder_input_tokens).encoded
    return cast(
        Array,
        self.decoder.module.apply(self.decoder.variables, encoded,
                                  encoder_input_tokens, decoder_input_tokens,
                                  decoder_target_tokens,
                                  method=Transformer.decode))
