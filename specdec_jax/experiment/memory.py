"""Will the decode fit? A lower bound on its memory, checked at startup.

TASK_FEATURE_LENGTHS = {'inputs': S, 'targets': T} of 1e6 would not fail
until the first compiled call runs out of memory, minutes later (or swap
for an hour on a CPU host). `estimate` adds up what any decode of one
model must hold at once, per batch of B rows (float32 = 4 bytes, or the
config's dtype):

* encoder self-attention logits: B x heads x S x S (one layer at a time);
* the decoder's self-attention cache: layers x 2 (keys, values) x B x T x
  heads x head_dim;
* the cross-attention keys and values: layers x 2 x B x S x heads x
  head_dim;
* the encoder's output: B x S x emb.

Parameters, the logits and XLA's temporaries come on top, so the estimate
is a floor: a run refused by it could never fit, and one passed by it may
still not.
"""
import os
from typing import Dict

import jax
import numpy as np

from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.core.models import T5Config


def estimate(config: T5Config, batch: int, inputs: int,
             targets: int) -> Dict[str, int]:
  """Bytes of each part (module docstring) for one model."""
  item = np.dtype(config.dtype).itemsize
  kv = config.num_heads * config.head_dim
  return {
      "encoder attention logits": batch * config.num_heads * inputs * inputs *
                                  4,
      "decoder cache": config.num_decoder_layers * 2 * batch * targets * kv *
                       item,
      "cross-attention keys and values": config.num_decoder_layers * 2 * batch *
                                         inputs * kv * item,
      "encoder output": batch * inputs * config.emb_dim * item,
  }


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


def _gib(n: float) -> str:
  return f"{n / 2**30:.3g} GiB"


def check_fits(configs: Dict[str, T5Config], batch: int, inputs: int,
               targets: int, available: int) -> None:
  """Refuses lengths whose estimated bytes exceed `available`.

  Raises:
    ConfigError: naming TASK_FEATURE_LENGTHS, BATCH_SIZE, the largest parts
      and both byte counts.
  """
  parts = {}
  for role, config in configs.items():
    for part, n in estimate(config, batch, inputs, targets).items():
      parts[f"{role} {part}"] = n
  total = sum(parts.values())
  if total <= available:
    return
  top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
  raise ConfigError(
      f"TASK_FEATURE_LENGTHS={{'inputs': {inputs}, 'targets': {targets}}} "
      f"with BATCH_SIZE={batch} needs at least {_gib(total)} (" +
      ", ".join(f"{name} {_gib(n)}" for name, n in top) +
      f") but this machine has {_gib(available)}. Allowed: lengths whose "
      "examples fit (captions: 64/64; news: 512/128), or a smaller "
      "BATCH_SIZE.")
