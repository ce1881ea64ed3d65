"""What the decode loops need from a target and from a drafter.

The loops (`decoding.loops`) know no concrete model: a target is anything
with the `Target` interface below (`models.T5Model` implements it; the
tests drive the loop with a scripted-logits stub), and a drafter anything
implementing `drafters.Drafter` (defined in `specdec_jax.drafters`, beside
the drafters themselves). Both are passed to `jax.jit` as arguments,
so both must be pytrees; `check_pytree` says so clearly before anything is
traced.
"""
import numbers
from typing import Any, Protocol, Tuple, runtime_checkable

import jax
import numpy as np

Array = jax.Array


@runtime_checkable
class Target(Protocol):
  """The target model M_p as the loops use it.

  Positions are those of the loop's token buffer: position 0 holds the
  decoder start token, position t the t-th generated token. The state
  holds positions 0..L-1 for some per-row L (its length); the loops keep
  track of L themselves.
  """

  @property
  def vocab_size(self) -> int:
    """Size V of the output distribution."""

  def start(self, encoder_input_tokens: Array, max_len: int) -> Any:
    """Prefills from inputs [B, S] int32 (0 = padding): an empty state
    (L = 0 in every row) with room for positions 0..max_len-1."""

  def decode_chunk(self, tokens: Array, state: Any) -> Tuple[Array, Any]:
    """Feeds tokens [B, K] int32 at positions L..L+K-1 of each row.

    Returns (logits [B, K, V] float32, state with L advanced by K): logits
    [b, k] is the distribution of the token at position L[b]+k+1. Writing
    past max_len must be an error, never a silent clamp.
    """

  def truncate(self, state: Any, length: Array) -> Any:
    """Forgets positions >= length [B] int32 (L = min(L, length))."""


def _is_array_leaf(leaf: Any) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic,
                           numbers.Number))


def check_pytree(name: str, obj: Any) -> None:
  """Raises ValueError unless `obj` can be a `jax.jit` argument.

  A plain Python object is a single opaque leaf for JAX: jit would fail
  deep inside with a TypeError about an invalid JAX type. Leaves must be
  arrays (or numbers); Python configuration belongs in static fields.
  """
  leaves, treedef = jax.tree_util.tree_flatten(obj)
  # Runs on every decode call: one flatten when all is well, paths only to
  # name a bad leaf.
  if all(map(_is_array_leaf, leaves)):
    return
  if jax.tree_util.treedef_is_leaf(treedef) and leaves and leaves[0] is obj:
    raise ValueError(
        f"{name} must be a JAX pytree (it is passed to jax.jit), got a plain "
        f"{type(obj).__name__} object. Declare the class with "
        "@flax.struct.dataclass (arrays as fields, Python settings as "
        "flax.struct.field(pytree_node=False)) or register it with "
        "jax.tree_util.register_pytree_node_class.")
  for path, leaf in jax.tree_util.tree_flatten_with_path(obj)[0]:
    if not _is_array_leaf(leaf):
      raise ValueError(
          f"{name}{jax.tree_util.keystr(path)} is a {type(leaf).__name__}, "
          "not an array: a pytree's leaves must be arrays (mark Python "
          "settings as flax.struct.field(pytree_node=False)).")
