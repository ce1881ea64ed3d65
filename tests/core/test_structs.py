"""`structs.dataclass`: flax.struct's API, each class a pytree node of its
own (jit never runs one class's program for another of the same fields)."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

from specdec_jax.core import structs


def _rule_classes(count, fields):
  """`count` struct classes of one shape, class i adding i to its input:
  no fields, one leaf `a`, or one static setting `m`."""
  made = []
  for i in range(count):

    def call(self, x, i=i):
      return x + i + (0 * self.a if fields == "leaf" else 0)

    namespace = {"__call__": call, "__annotations__": {}}
    if fields == "leaf":
      namespace["__annotations__"]["a"] = jax.Array
    elif fields == "static":
      namespace["__annotations__"]["m"] = str
      namespace["m"] = structs.field(pytree_node=False, default="")
    made.append(structs.dataclass(type(f"Rule{i}", (), namespace)))
  return made


@pytest.mark.parametrize("fields", ["none", "leaf", "static"])
def test_classes_of_one_shape_never_share_a_compiled_program(fields):
  """Issue: on JAX 0.10 (pinned here for Python 3.11) jit's cache ran one
  flax.struct class's program for another of the same fields: this test
  with flax.struct.dataclass misrouted 76, 16 and 16 of 400 calls (200
  classes) on JAX 0.10.2 (a planted acceptance bug passed certify so).
  Each class here must run its own program, at its first call and later."""
  apply = jax.jit(lambda rule, x: rule(x))
  kw = {"leaf": {"a": jnp.int32(0)}}.get(fields, {})
  rules = [cls(**kw) for cls in _rule_classes(100, fields)]
  got = [[int(apply(rule, 0)) for rule in rules] for _ in range(2)]
  assert got == [list(range(100))] * 2


@structs.dataclass
class _Rule:
  """A leaf, a static setting and a check run by __init__."""
  weight: jax.Array
  name: str = structs.field(pytree_node=False, default="rule")

  def __post_init__(self):
    if isinstance(self.weight, str):
      raise ValueError("weight must be an array")


@structs.dataclass
class _Child(_Rule):
  extra: jax.Array = 0


def test_a_struct_has_flax_structs_api():
  rule = _Rule(jnp.ones(2), name="r")
  leaves, treedef = jax.tree_util.tree_flatten(rule)
  assert len(leaves) == 1 and leaves[0] is rule.weight
  paths = [
      jax.tree_util.keystr(p)
      for p, _ in jax.tree_util.tree_flatten_with_path(rule)[0]
  ]
  assert paths == [".weight"]
  back = jax.tree_util.tree_unflatten(treedef, [jnp.zeros(2)])
  assert type(back) is _Rule and back.name == "r"
  assert back.weight.tolist() == [0.0, 0.0]
  assert rule.replace(name="s").name == "s" and rule.name == "r"
  with pytest.raises(dataclasses.FrozenInstanceError):
    rule.name = "s"  # type: ignore[misc]
  # The static setting is part of the structure: a new one compiles anew.
  assert treedef != jax.tree_util.tree_structure(rule.replace(name="s"))
  assert treedef == jax.tree_util.tree_structure(rule.replace(weight=1.0))
  # Unflattening calls the class: its checks run.
  with pytest.raises(ValueError, match="weight must be an array"):
    jax.tree_util.tree_unflatten(treedef, ["w"])
  assert structs.dataclass(_Rule) is _Rule  # decorating again: no-op


def test_a_subclass_is_a_node_of_its_own():
  child = _Child(jnp.ones(2), extra=jnp.zeros(3))
  assert [
      jax.tree_util.keystr(p)
      for p, _ in jax.tree_util.tree_flatten_with_path(child)[0]
  ] == [".weight", ".extra"]
  parent_def = jax.tree_util.tree_structure(_Rule(jnp.ones(2)))
  assert jax.tree_util.tree_structure(_Child(jnp.ones(2),
                                             extra=None)) != (parent_def)
