"""Frozen dataclasses that are JAX pytrees, each class a node type of its own.

The API of `flax.struct.dataclass` (arrays as fields, Python settings as
`field(pytree_node=False)`, `.replace`), registered differently: with
`jax.tree_util.register_pytree_with_keys`, not `register_dataclass`. On JAX
0.10 two register_dataclass classes with the same fields have tree
structures that compare equal (their hashes differ), and jit's cache then
runs one class's compiled program for the other now and then: in a test,
76 of 400 calls of one jitted function with 200 field-less classes ran
another class's program (one field each: 16 of 400). An acceptance rule,
drafter or model would be silently swapped for another of its shape (a
planted acceptance bug passed certify so). A custom node's structure
compares its class, so nothing is swapped (JAX 0.11 fixed register_dataclass
too). Every pytree class of specdec_jax is declared here; a plug-in of
one's own should be too.
"""
import dataclasses
from typing import Any, Optional, Type, TypeVar

import jax
import typing_extensions

_T = TypeVar("_T")
_MARK = "_specdec_jax_struct"


def field(pytree_node: bool = True, *, metadata: Optional[dict] = None,
          **kwargs: Any) -> Any:
  """A dataclass field; pytree_node=False: a static setting (hashable,
  part of the tree's structure: a new value compiles anew), else a leaf or
  subtree (an array: a new value reuses the compiled program)."""
  return dataclasses.field(
      metadata={
          **(metadata or {}), "pytree_node": pytree_node
      }, **kwargs)


def _replace(self: _T, **updates: Any) -> _T:
  """A copy with `updates` to its fields (`dataclasses.replace`)."""
  return dataclasses.replace(self, **updates)  # type: ignore[type-var]


@typing_extensions.dataclass_transform(field_specifiers=(field,),
                                       frozen_default=True)
def dataclass(cls: Type[_T]) -> Type[_T]:
  """Makes `cls` a frozen dataclass and a pytree node: its `init` fields
  in order, `pytree_node=False` ones static (the node's aux data), the rest
  its children. Unflattening calls the class (as register_dataclass does),
  so `__post_init__` checks run."""
  if _MARK in vars(cls):  # already this class's own registration
    return cls
  klass: Any = dataclasses.dataclass(frozen=True)(cls)
  fields = [f for f in dataclasses.fields(klass) if f.init]
  data = tuple(f.name for f in fields if f.metadata.get("pytree_node", True))
  meta = tuple(
      f.name for f in fields if not f.metadata.get("pytree_node", True))
  keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)

  def flatten(x):
    return (tuple(getattr(x, n) for n in data),
            tuple(getattr(x, n) for n in meta))

  def flatten_with_keys(x):
    children, aux = flatten(x)
    return tuple(zip(keys, children)), aux

  def unflatten(aux, children):
    return klass(**dict(zip(meta, aux)), **dict(zip(data, children)))

  jax.tree_util.register_pytree_with_keys(klass, flatten_with_keys, unflatten,
                                          flatten)
  klass.replace = _replace
  setattr(klass, _MARK, True)
  return klass
