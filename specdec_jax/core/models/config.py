"""T5 v1.1 model configuration, with the same fields and meaning as T5X's.

Mirrors `t5x/examples/t5/network.py:T5Config` so that gin files written for
T5X bind the same names (`T5Config.emb_dim = 512`, ...). Plain data: the
harness (`gin_utils`) registers it with gin, the core never imports gin.
"""
from typing import Any, Dict, Optional, Sequence

import dataclasses

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 v1.1 encoder-decoder Transformer.

  Attributes:
    vocab_size: size of the shared input/output vocabulary.
    dtype: activation/computation dtype (float32 for CPU tests, bfloat16 on
      TPU). Parameters are always stored in float32 (T5X's convention) unless
      the loader is asked for another dtype.
    emb_dim: model width d_model.
    num_heads: attention heads.
    num_encoder_layers / num_decoder_layers: depth of each stack.
      num_encoder_layers = 0 is a decoder without an encoder of its own: it
      cross-attends to another model's encoder output (a shared-encoder
      draft, `models.SharedEncoderModel`), of width `encoder_width`.
    head_dim: width of one head (d_kv).
    mlp_dim: hidden width of the (gated) MLP (d_ff).
    mlp_activations: activations of the MLP input projections; ('gelu',
      'linear') is T5 v1.1's gated GELU, ('relu',) the original T5 MLP.
    dropout_rate: dropout (0 at inference).
    logits_via_embedding: tie the output projection to the input embedding
      (False for T5 v1.1: a separate `decoder/logits_dense`).
    float32_attention_logits: compute attention logits/softmax in float32.
    encoder_width: width of the encoder output the decoder's cross-attention
      reads (the input width of its key/value projections); None = emb_dim
      (T5). Set only for a decoder without an encoder (num_encoder_layers =
      0), to the width of the model whose encoder it reads.
  """
  vocab_size: int = 32128
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 6
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  head_dim: int = 64
  mlp_dim: int = 1024
  mlp_activations: Sequence[str] = ("gelu", "linear")
  dropout_rate: float = 0.0
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False
  encoder_width: Optional[int] = None

  def __post_init__(self):
    # Gin and JSON give lists; a tuple keeps the config hashable (it is a
    # static argument of jitted decode functions).
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    if isinstance(self.dtype, str):
      object.__setattr__(self, "dtype", jnp.dtype(self.dtype).type)
    for name in ("vocab_size", "emb_dim", "num_heads", "num_decoder_layers",
                 "head_dim", "mlp_dim"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(
            f"T5Config.{name} must be a positive integer, got {value!r}.")
    layers, width = self.num_encoder_layers, self.encoder_width
    if not isinstance(layers, int) or layers < 0:
      raise ValueError("T5Config.num_encoder_layers must be an integer >= 0 "
                       f"(0: no encoder of its own), got {layers!r}.")
    if width is not None and (not isinstance(width, int) or width < 1):
      raise ValueError("T5Config.encoder_width must be None or a positive "
                       f"integer, got {width!r}.")
    if (layers == 0) != (width is not None):
      raise ValueError(
          f"T5Config.num_encoder_layers={layers} with encoder_width="
          f"{width!r}: a decoder without an encoder (num_encoder_layers=0) "
          "reads another model's encoder output and needs its width "
          "(encoder_width); a model with an encoder reads its own "
          "(encoder_width=None).")

  def replace(self, **changes) -> "T5Config":
    return dataclasses.replace(self, **changes)

  @property
  def has_encoder(self) -> bool:
    """False for a decoder reading another model's encoder output."""
    return self.num_encoder_layers > 0

  @property
  def cross_attention_input_dim(self) -> int:
    """Width of the encoder output the cross-attention reads."""
    return self.emb_dim if self.encoder_width is None else self.encoder_width

  @property
  def num_params(self) -> int:
    """Number of parameters (T5X layout, untied logits unless configured)."""
    e, h, d, m, v = (self.emb_dim, self.num_heads, self.head_dim, self.mlp_dim,
                     self.vocab_size)
    attn = 4 * e * h * d
    # Cross-attention: query/out from emb_dim, key/value from the encoder's.
    cross = 2 * e * h * d + 2 * self.cross_attention_input_dim * h * d
    mlp = len(self.mlp_activations) * e * m + m * e
    enc = (self.num_encoder_layers * (attn + mlp + 2 * e) + e +
           h * 32 if self.has_encoder else 0)
    dec = self.num_decoder_layers * (attn + cross + mlp + 3 * e) + e + h * 32
    logits = 0 if self.logits_via_embedding else e * v
    return v * e + enc + dec + logits


def json_fields(config: Any, omit_none: Sequence[str] = ()) -> Dict[str, Any]:
  """A model config dataclass's fields, JSON-ready (what a checkpoint's
  config file and a run's record hold): `dtype` by its name, tuples as
  lists; the fields in `omit_none` left out where None (so that records
  written before such a field existed compare equal)."""
  out = {}
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if field.name in omit_none and value is None:
      continue
    if field.name == "dtype":
      value = jnp.dtype(value).name
    elif isinstance(value, tuple):
      value = list(value)
    out[field.name] = value
  return out
