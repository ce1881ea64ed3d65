"""A model's sizes against its checkpoint and this machine, from numbers
alone, before any shape is built (a config edited to 10^7 layers once ran a
minute to a MemoryError). Both checks raise `CheckpointError` prefixed by
`fields` (where the config came from: 'target/T5Config.' or
'<folder>/model_config.json: ').
"""
import os
import re
from typing import Dict, Mapping, Optional, Tuple

import jax
import numpy as np

from specdec_jax.checkpoints.layout import CheckpointError
from specdec_jax.checkpoints.layout import ParamPath
from specdec_jax.core.models import T5Config

Shapes = Mapping[ParamPath, Tuple[int, ...]]


def available_bytes() -> int:
  """The first device's memory limit (accelerators), else the host's RAM."""
  stats = None
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except  # not reported here
    pass
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gib(n: float) -> str:
  return f"{n / 2**30:.3g} GiB"


def parameter_bytes(config: T5Config) -> int:
  """The bytes of `config`'s parameters in its dtype (as loaded)."""
  return config.num_params * np.dtype(config.dtype).itemsize


def check_fits_memory(config: T5Config, fields: str,
                      available: Optional[int] = None) -> None:
  """Refuses parameters larger than `available` bytes (default: this
  machine's): loading them would fail minutes later."""
  available = available_bytes() if available is None else available
  need = parameter_bytes(config)
  if need <= available:
    return
  sizes = ", ".join(f"{name} = {getattr(config, name)}"
                    for name in ("vocab_size", "emb_dim", "mlp_dim",
                                 "num_heads", "head_dim", "num_encoder_layers",
                                 "num_decoder_layers"))
  raise CheckpointError(
      f"{fields.rstrip(': .')}: the model's {config.num_params:,} parameters "
      f"need {gib(need)} ({np.dtype(config.dtype).name}) but this machine "
      f"has {gib(available)} ({sizes}); allowed: sizes whose parameters fit "
      "in this machine's memory.")


def _layers(shapes: Shapes, stack: str) -> int:
  """How many `stack`/layers_<i> the checkpoint holds."""
  return len({
      p[1]
      for p in shapes
      if len(p) > 1 and p[0] == stack and re.fullmatch(r"layers_\d+", p[1])
  })


def _stored_sizes(shapes: Shapes) -> Dict[str, Tuple[int, str]]:
  """Field -> (its value, the arrays that show it), for the fields the
  checkpoint's shapes show."""
  out: Dict[str, Tuple[int, str]] = {}

  def take(field, path, axis):
    shape = shapes.get(tuple(path.split("/")))
    if shape is not None and len(shape) > axis and field not in out:
      out[field] = (int(shape[axis]), f"{path} {list(shape)}")

  take("vocab_size", "token_embedder/embedding", 0)
  take("emb_dim", "token_embedder/embedding", 1)
  take("num_heads", "decoder/relpos_bias/rel_embedding", 0)
  take("mlp_dim", "decoder/layers_0/mlp/wi_0/kernel", 1)
  take("mlp_dim", "decoder/layers_0/mlp/wi/kernel", 1)
  take("encoder_width", "decoder/layers_0/encoder_decoder_attention/key/kernel",
       0)
  query = "decoder/layers_0/self_attention/query/kernel"
  take("num_heads * head_dim", query, 1)
  if "num_heads" in out and "num_heads * head_dim" in out:
    heads, width = out["num_heads"][0], out.pop("num_heads * head_dim")
    if heads and width[0] % heads == 0:
      out["head_dim"] = (width[0] // heads, f"{width[1]} over {heads} heads")
  for stack in ("encoder", "decoder"):
    n = _layers(shapes, stack)
    out[f"num_{stack}_layers"] = (n, f"{n} {stack}/layers_<i>")
  mlp = ("decoder", "layers_0", "mlp")
  wis = {
      p[3]
      for p in shapes
      if len(p) > 3 and p[:3] == mlp and p[3].startswith("wi")
  }
  if wis:
    out["mlp_activations"] = (len(wis), f"{len(wis)} input projections "
                              "decoder/layers_0/mlp/wi*")
  return out


def check_against_checkpoint(config: T5Config, shapes: Shapes, fields: str,
                             ckpt: str) -> None:
  """Refuses a config whose sizes are not the stored `shapes` of `ckpt`,
  naming the first field that differs and the array that shows it."""
  want = {
      "vocab_size": config.vocab_size,
      "emb_dim": config.emb_dim,
      "num_heads": config.num_heads,
      "head_dim": config.head_dim,
      "mlp_dim": config.mlp_dim,
      "mlp_activations": len(config.mlp_activations),
      "encoder_width": config.cross_attention_input_dim,
      "num_encoder_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers,
  }
  stored = _stored_sizes(shapes)
  for field, value in want.items():
    if field in stored and stored[field][0] != value:
      got, where = stored[field]
      shown = getattr(config, field)
      if field == "mlp_activations":
        shown = f"{list(shown)} ({value} input projections)"
      elif shown is None:  # encoder_width: the model reads its own encoder
        shown = f"None (emb_dim, {value})"
      raise CheckpointError(
          f"{fields}{field} = {shown} but checkpoint {ckpt} stores {got} "
          f"({where}); allowed: the sizes the checkpoint was trained with.")
