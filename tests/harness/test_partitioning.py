"""Sharding rules (T5X conventions), in-process: no devices needed (exact
decoding and checkpoint restores on a sharded mesh of 8 fake devices:
tests/e2e/test_partitioning_e2e.py).
"""
import re

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specdec_jax.multihost import partitioning as pt
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import param_shapes


# ---------------------------------------------------------------------------
# Rules (in-process, no devices needed).
# ---------------------------------------------------------------------------
def _tiny(**overrides) -> T5Config:
  fields = dict(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                num_encoder_layers=2, num_decoder_layers=2)
  fields.update(overrides)
  return T5Config(**fields)


def _flat_specs(specs):
  flat = jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=lambda x: isinstance(x, P))[0]
  return {pt._path_str(path): spec for path, spec in flat}  # pylint: disable=protected-access


T5X_EXPECTED = {
    "token_embedder/embedding": P("model", None),
    "encoder/relpos_bias/rel_embedding": P("model", None),
    "decoder/relpos_bias/rel_embedding": P("model", None),
    "encoder/layers_0/attention/query/kernel": P(None, "model"),
    "encoder/layers_1/attention/key/kernel": P(None, "model"),
    "encoder/layers_0/attention/value/kernel": P(None, "model"),
    "encoder/layers_0/attention/out/kernel": P("model", None),
    "decoder/layers_1/self_attention/query/kernel": P(None, "model"),
    "decoder/layers_0/self_attention/out/kernel": P("model", None),
    "decoder/layers_0/encoder_decoder_attention/key/kernel": P(None, "model"),
    "decoder/layers_1/encoder_decoder_attention/out/kernel": P("model", None),
    "encoder/layers_0/mlp/wi_0/kernel": P(None, "model"),
    "decoder/layers_1/mlp/wi_1/kernel": P(None, "model"),
    "decoder/layers_0/mlp/wo/kernel": P("model", None),
    "decoder/logits_dense/kernel": P(None, "model"),
    "encoder/encoder_norm/scale": P(None),
    "decoder/decoder_norm/scale": P(None),
    "encoder/layers_0/pre_attention_layer_norm/scale": P(None),
    "decoder/layers_1/pre_cross_attention_layer_norm/scale": P(None),
}


@pytest.mark.parametrize("mesh", [None, {
    "data": 2,
    "model": 4
}], ids=["no-mesh", "2x4"])
def test_t5x_rules(mesh):
  shapes = param_shapes(_tiny())
  specs = _flat_specs(pt.param_partition_specs(shapes, mesh))
  for path, expected in T5X_EXPECTED.items():
    assert specs[path] == expected, path
  # Every parameter is covered by a T5X rule (none replicated by default).
  for path in specs:
    assert any(re.search(r, path) for r, _ in pt.T5X_PARAM_AXES), path
  # The structure (with the {'params': ...} wrapper) is preserved.
  tree = pt.param_partition_specs(shapes)
  assert set(tree) == {"params"}
  assert jax.tree_util.tree_structure(tree,
                                      is_leaf=lambda x: isinstance(x, P)) == (
                                          jax.tree_util.tree_structure(shapes))


def test_unwrapped_tree_and_single_mlp():
  shapes = param_shapes(_tiny(mlp_activations=("relu",)))["params"]
  specs = _flat_specs(pt.param_partition_specs(shapes))
  assert specs["encoder/layers_0/mlp/wi/kernel"] == P(None, "model")
  assert specs["token_embedder/embedding"] == P("model", None)


def test_non_divisible_dims_are_replicated():
  # vocab 12, heads 2 and emb 16 do not divide by 8; mlp 32, joined_kv 16 do.
  shapes = param_shapes(
      _tiny(vocab_size=12, emb_dim=16, num_heads=2, mlp_dim=32))
  specs = _flat_specs(pt.param_partition_specs(shapes, {"data": 2, "model": 8}))
  assert specs["token_embedder/embedding"] == P(None, None)
  assert specs["decoder/logits_dense/kernel"] == P(None, None)
  assert specs["decoder/relpos_bias/rel_embedding"] == P(None, None)
  assert specs["decoder/layers_0/mlp/wi_0/kernel"] == P(None, "model")
  assert specs["decoder/layers_0/self_attention/query/kernel"] == P(
      None, "model")
  # mlp 24 on model=16: replicated.
  shapes = param_shapes(_tiny(mlp_dim=24))
  specs = _flat_specs(pt.param_partition_specs(shapes, {
      "data": 1,
      "model": 16
  }))
  assert specs["encoder/layers_0/mlp/wo/kernel"] == P(None, None)


def test_two_d_parameter_partitioning():
  logical = pt.standard_logical_axis_rules(parameter_partitioning_dims=2)
  specs = _flat_specs(
      pt.param_partition_specs(param_shapes(_tiny()), {
          "data": 2,
          "model": 4
      }, logical_axis_rules=logical))
  assert specs["decoder/layers_0/mlp/wi_0/kernel"] == P("data", "model")
  assert specs["decoder/layers_0/mlp/wo/kernel"] == P("model", "data")
  assert specs["token_embedder/embedding"] == P("model", "data")
  assert specs["decoder/decoder_norm/scale"] == P("data")
  # emb 3 does not divide by data=2: only the model axis remains.
  specs = _flat_specs(
      pt.param_partition_specs(param_shapes(_tiny(emb_dim=3)), {
          "data": 2,
          "model": 4
      }, logical_axis_rules=logical))
  assert specs["decoder/layers_0/mlp/wi_0/kernel"] == P(None, "model")
  with pytest.raises(ValueError, match="parameter_partitioning_dims"):
    pt.standard_logical_axis_rules(parameter_partitioning_dims=3)


def test_rule_overrides_and_errors():
  shapes = param_shapes(_tiny())
  # Prepended rules win; entries may be mesh axes or None (replicated).
  specs = _flat_specs(
      pt.param_partition_specs(
          shapes, additional_rules=[
              (r"mlp/wo/kernel$", None),
              (r"logits_dense/kernel$", ("data", None)),
              (r"(^|/)scale$", P("model")),
          ]))
  assert specs["decoder/layers_0/mlp/wo/kernel"] == P()
  assert specs["decoder/logits_dense/kernel"] == P("data", None)
  assert specs["encoder/encoder_norm/scale"] == P("model")
  assert specs["decoder/layers_0/mlp/wi_0/kernel"] == P(None, "model")
  # Replacing the table: unmatched parameters are replicated.
  specs = _flat_specs(
      pt.param_partition_specs(shapes, rules=[(r"mlp/wi_\d/kernel$", ("embed",
                                                                      "mlp"))]))
  assert specs["decoder/layers_0/mlp/wi_1/kernel"] == P(None, "model")
  assert specs["decoder/layers_0/mlp/wo/kernel"] == P()
  # A rule naming more axes than the parameter has.
  with pytest.raises(ValueError, match="scale.*3 axes"):
    pt.param_partition_specs(
        shapes, additional_rules=[(r"scale$", ("embed", None, None))])
  # A name that is neither a logical axis nor a mesh axis.
  with pytest.raises(ValueError, match="'tensor'.*not a logical axis"):
    pt.param_partition_specs(
        shapes, {
            "data": 1,
            "model": 2
        }, additional_rules=[(r"wo/kernel$", ("tensor", None))])


def test_rules_are_gin_configurable():
  shapes = param_shapes(_tiny())
  try:
    gin.parse_config("""
        param_partition_specs.additional_rules = [
            (r'mlp/wo/kernel$', (None, 'model'))]
        standard_logical_axis_rules.parameter_partitioning_dims = 2
    """)
    specs = _flat_specs(pt.param_partition_specs(shapes))
  finally:
    gin.clear_config()
  assert specs["decoder/layers_0/mlp/wo/kernel"] == P(None, "model")
  assert specs["decoder/layers_0/mlp/wi_0/kernel"] == P("data", "model")
  specs = _flat_specs(pt.param_partition_specs(shapes))
  assert specs["decoder/layers_0/mlp/wo/kernel"] == P("model", None)


def test_make_mesh_and_data_sharding_in_process():
  n = jax.device_count()
  mesh = pt.make_mesh()
  assert dict(mesh.shape) == {"data": 1, "model": 1}
  assert mesh.axis_names == ("data", "model")
  assert pt.data_sharding(mesh, 4).spec == P("data", None)
  # One device: shardings are trivial but valid, and params stay equal.
  shapes = param_shapes(_tiny())
  shardings = pt.param_shardings(mesh, shapes)
  wi = shardings["params"]["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert wi.spec == P(None, "model") and wi.mesh == mesh
  params = jax.tree_util.tree_map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
  placed = pt.shard_params(mesh, params)
  assert jax.tree_util.tree_all(
      jax.tree_util.tree_map(lambda a, b: bool((a == b).all()), params, placed))
  tokens = pt.shard_inputs(mesh, np.ones((3, 5), np.int32))
  assert tokens.shape == (3, 5) and tokens.sharding.spec == P("data", None)
  with pytest.raises(ValueError) as err:
    pt.make_mesh(data=2, model=n)
  msg = str(err.value)
  assert f"data=2, model={n}" in msg and str(2 * n) in msg
  assert f"only {n} are available" in msg
  with pytest.raises(ValueError, match=r"model must be a positive integer, "
                     r"got 0"):
    pt.make_mesh(data=1, model=0)
  with pytest.raises(ValueError, match="data must be a positive integer"):
    pt.make_mesh(data=1.5)
  with pytest.raises(
      ValueError, match=r"data=1, model=2.* 2 devices but 1 "
      r"devices were given"):
    pt.make_mesh(data=1, model=2, devices=jax.devices()[:1])


def test_xxl_per_device_bytes_on_8way_model_axis():
  xxl = T5Config(vocab_size=32128, emb_dim=4096, num_heads=64, head_dim=64,
                 mlp_dim=10240, num_encoder_layers=24, num_decoder_layers=24,
                 dtype=jnp.bfloat16)
  shapes = param_shapes(xxl)  # eval_shape: nothing allocated.
  sizes = {"data": 1, "model": 8}
  specs = pt.param_partition_specs(shapes, sizes)
  itemsize = jnp.dtype(jnp.bfloat16).itemsize
  total = per_device = 0
  for leaf, spec in zip(
      jax.tree_util.tree_leaves(shapes),
      jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))):
    shard = list(leaf.shape)
    for i, axis in enumerate(spec):
      if axis is not None:
        assert shard[i] % sizes[axis] == 0
        shard[i] //= sizes[axis]
    total += int(np.prod(leaf.shape)) * itemsize
    per_device += int(np.prod(shard)) * itemsize
  assert total == xxl.num_params * itemsize  # ~11.1e9 params, 22.3 GB.
  assert per_device < total / 6, (per_device, total)
  assert per_device == pt.param_bytes_per_device(shapes, sizes, jnp.bfloat16)
  # Only the layer norm scales stay replicated (~0.01% of the bytes).
  assert per_device < total / 8 * 1.001
