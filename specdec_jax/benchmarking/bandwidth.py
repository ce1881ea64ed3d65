"""The baseline's memory-bandwidth bound: bytes read per decoder step.

A one-token decoder step reads every decoder weight and one embedding row:
on an accelerator, where a step is memory-bound, that many bytes at the
device's peak bandwidth is a lower bound on the baseline's time per token.
"""
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_jax.core.models.config import T5Config

# Peak HBM bandwidth in GB/s by (substring of) jax device_kind; first match
# wins, so more specific names come first.
DEVICE_BANDWIDTH_GBPS: List[Tuple[str, float]] = [
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),
    ("H200", 4800.0),
    ("A100-SXM4-40GB", 1555.0),
    ("A100-PCIE-40GB", 1555.0),
    ("A100", 2039.0),
    ("TPU v4", 1200.0),
    ("TPU v5 lite", 819.0),
    ("TPU v5e", 819.0),
    ("TPU v5p", 2765.0),
]


def default_bandwidth_gbps(device_kind: str) -> Optional[float]:
  """Known peak memory bandwidth of a device kind, or None."""
  for key, value in DEVICE_BANDWIDTH_GBPS:
    if key.lower() in device_kind.lower():
      return value
  return None


def decoder_param_bytes(params) -> int:
  """Bytes of parameters read per decoder step: decoder stack + logits."""
  tree = params["params"]
  total = sum(x.size * x.dtype.itemsize
              for x in jax.tree_util.tree_leaves(tree["decoder"]))
  emb = tree["token_embedder"]["embedding"]
  return int(total + emb.shape[1] * emb.dtype.itemsize)  # One embedding row.


def kv_bytes_per_step(config: T5Config, batch: int, max_len: int,
                      input_length: int) -> int:
  """Cache bytes read per decoder step (masked attention reads all slots)."""
  itemsize = jnp.dtype(config.dtype).itemsize
  per_pos = 2 * config.num_decoder_layers * config.num_heads * config.head_dim
  return int(batch * per_pos * (max_len + input_length) * itemsize)


def bandwidth_fields(*, param_bytes: int, kv_bytes: int,
                     baseline_ms_per_token: float, flag_gbps: Optional[float],
                     device_kind: str) -> Dict[str, Any]:
  """The result's bandwidth-bound fields ({} when no bandwidth is known).

  Args:
    param_bytes: `decoder_param_bytes` of the target.
    kv_bytes: `kv_bytes_per_step` of the target.
    baseline_ms_per_token: the measured baseline.
    flag_gbps: --device_bandwidth_gbps (wins), or None for the known value
      of `device_kind`.
  """
  bandwidth, source = flag_gbps, "flag"
  if bandwidth is None:
    bandwidth, source = default_bandwidth_gbps(device_kind), "device_kind"
  if bandwidth is None:
    return {}
  bound_ms = param_bytes / (bandwidth * 1e9) * 1e3
  return {
      "device_bandwidth_gbps": bandwidth,
      "device_bandwidth_source": source,
      "baseline_bandwidth_bound_ms_per_token": bound_ms,
      "baseline_bandwidth_bound_ms_per_token_with_kv":
          (param_bytes + kv_bytes) / (bandwidth * 1e9) * 1e3,
      # >= 1: how many times slower than streaming the params at peak.
      "baseline_to_bandwidth_bound_ratio": baseline_ms_per_token / bound_ms,
  }
