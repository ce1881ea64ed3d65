"""T5's multi-head attention in T5X's layout, usable piecewise for a cache.

One attention function serves the three uses (teacher forcing, reading a
decode cache, and a cache plus the chunk being fed): keys and values come
in parts, each in its own layout, with one softmax over all of them.
"""
from typing import NamedTuple, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.layers import DenseGeneral
from specdec_jax.core.models.layers import default_kernel_init

Array = jax.Array

# Key/value layouts: as projected ([B, L, H, D]) and as cached ([B, H, D, L];
# see `network.DecodeCache`).
PROJECTED = "bkhd"
CACHED = "bhdk"


class KeyValues(NamedTuple):
  """One part of the keys/values a query attends to.

  Attributes:
    keys, values: [B, L, H, D] (layout PROJECTED) or [B, H, D, L] (CACHED).
    bias: [B or 1, H, Q, L] relative positions plus mask (0 or -1e10).
    layout: PROJECTED or CACHED.
  """
  keys: Array
  values: Array
  bias: Array
  layout: str


def attend(query: Array, parts: Sequence[KeyValues], config: T5Config) -> Array:
  """Unscaled dot-product attention over the concatenation of `parts`.

  T5 folds 1/sqrt(d) into the query's initializer, so nothing is scaled
  here. A cached chunk attends to its own keys straight from the
  projections (a part of its own) rather than reading them back from the
  cache after writing: the in-place cache write then has one user and XLA
  does not copy the cache around it on every call.

  Args:
    query: [B, Q, H, D].
    parts: the key/value parts, in key order; one softmax over all.
    config: the model's config (dtype, float32_attention_logits).

  Returns:
    [B, Q, H, D].
  """
  if config.float32_attention_logits:
    query = query.astype(jnp.float32)
  logits = []
  for part in parts:
    keys = part.keys
    if config.float32_attention_logits:
      keys = keys.astype(jnp.float32)
    part_logits = jnp.einsum(f"bqhd,{part.layout}->bhqk", query, keys)
    logits.append(part_logits + part.bias.astype(part_logits.dtype))
  all_logits = logits[0] if len(logits) == 1 else jnp.concatenate(
      logits, axis=-1)
  weights = jax.nn.softmax(all_logits).astype(config.dtype)
  terms, offset = [], 0
  for part, part_logits in zip(parts, logits):
    length = part_logits.shape[-1]
    part_weights = (weights if len(parts) == 1 else weights[..., offset:offset +
                                                            length])
    terms.append(
        jnp.einsum(f"bhqk,{part.layout}->bqhd", part_weights, part.values))
    offset += length
  out = terms[0]
  for term in terms[1:]:
    out = out + term
  return out


def tree_visibility(parents: Array) -> Tuple[Array, Array]:
  """Which tree nodes each node attends to, and every node's depth.

  A token tree fed in one call (`network.Decoder.decode_tree`): node i
  attends to itself and its ancestors only, never to a sibling branch.

  Args:
    parents: [B, N] int, parents[b, i] the index of node i's parent among the
      N nodes, or -1 for a node that follows the cached prefix directly
      (depth 0). The parent relation must be acyclic (e.g. parents[i] < i).

  Returns:
    (visible [B, N, N] bool: visible[b, i, j] iff j is i or an ancestor of
    i; depth [B, N] int32: ancestors per node, the node's offset from the
    cache length).
  """
  n = parents.shape[-1]
  nodes = jnp.arange(n)
  edge = parents[..., :, None] == nodes[None, None, :]  # i -> its parent
  reach = (edge | (nodes[:, None] == nodes[None, :])).astype(jnp.float32)
  # Transitive closure by squaring: paths of length < 2^t after t rounds.
  for _ in range(max(1, int(np.ceil(np.log2(max(n, 2)))))):
    reach = jnp.minimum(1.0, reach + reach @ reach)
  visible = reach > 0
  depth = jnp.sum(visible, axis=-1).astype(jnp.int32) - 1
  return visible, depth


def to_cache_layout(x: Array) -> Array:
  """[B, L, H, D] keys or values -> the cache layout [B, H, D, L]."""
  return jnp.transpose(x, (0, 2, 3, 1))


class MultiHeadDotProductAttention(nn.Module):
  """T5X-layout attention whose projections can be used piecewise.

  `project_kv` and `attend` let the decoder write projected keys/values into
  its cache; `__call__` is the plain (uncached) use.
  """
  config: T5Config

  def setup(self):
    cfg = self.config
    features = (cfg.num_heads, cfg.head_dim)
    depth_scaling = float(np.sqrt(cfg.head_dim))
    base = default_kernel_init()
    query_init = lambda *a: base(*a) / depth_scaling  # pylint: disable=unnecessary-lambda-assignment
    self.query = DenseGeneral(features, dtype=cfg.dtype, kernel_init=query_init)
    self.key = DenseGeneral(features, dtype=cfg.dtype, kernel_init=base)
    self.value = DenseGeneral(features, dtype=cfg.dtype, kernel_init=base)
    self.out = DenseGeneral((cfg.emb_dim,), axis=(-2, -1), dtype=cfg.dtype)

  def project_kv(self, x: Array) -> Tuple[Array, Array]:
    """[B, L, emb] -> keys, values [B, L, H, D]."""
    return self.key(x), self.value(x)

  def attend(self, x: Array, parts: Sequence[KeyValues]) -> Array:
    """Queries from x [B, Q, emb] over `parts`; returns [B, Q, emb]."""
    return self.out(attend(self.query(x), parts, self.config))

  def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array) -> Array:
    keys, values = self.project_kv(inputs_kv)
    return self.attend(inputs_q, [KeyValues(keys, values, bias, PROJECTED)])
