"""Sharding rules (T5X conventions) and exact decoding on a sharded mesh.

The mesh tests run in two subprocesses, started together, with 8 fake CPU
devices (XLA_FLAGS must be set before jax is imported):

  A: the unsharded reference (greedy baseline and speculative), then
     speculative on a (data=2, model=4) mesh under `jax.set_mesh`.
  B: the baseline on (2, 4); speculative on a (1, 8) mesh under the legacy
     `with mesh:`; a T5X checkpoint restored straight to (2, 4) shards.

Params and inputs are made with numpy from fixed seeds, so B's tokens are
compared with A's reference.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specdec_jax.multihost import partitioning as pt
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import param_shapes

REPO = Path(__file__).resolve().parents[2]
T5X_TINY = REPO.parent / "shared" / "fixtures" / "t5x_tiny"

# ---------------------------------------------------------------------------
# Sharded decoding on 8 fake devices (subprocesses).
# ---------------------------------------------------------------------------
_SCRIPT = r'''
import json, sys, warnings
import jax, numpy as np
from jax.sharding import PartitionSpec as P
from specdec_jax.multihost import partitioning as pt
from specdec_jax.core import decoding
from specdec_jax.core.models import T5Config, T5Model, param_shapes

part = sys.argv[1]
assert jax.device_count() == 8, jax.devices()
TARGET = T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8,
                  mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2)
DRAFT = TARGET.replace(num_encoder_layers=1, num_decoder_layers=1)


def random_params(cfg, seed):
  rs = np.random.RandomState(seed)
  def make(path, s):
    name = jax.tree_util.keystr(path)
    if name.endswith("['scale']"):
      x = 1.0 + 0.1 * rs.randn(*s.shape)
    elif "token_embedder" in name:
      x = rs.randn(*s.shape)
    else:
      x = rs.randn(*s.shape) / np.sqrt(s.shape[0])
    return x.astype(np.float32)
  return jax.tree_util.tree_map_with_path(make, param_shapes(cfg))


def first_layers(tree):
  """The target truncated to layers_0 of each stack, lightly perturbed."""
  if isinstance(tree, dict):
    return {k: first_layers(v) for k, v in tree.items() if k != "layers_1"}
  noise = np.random.RandomState(tree.size).randn(*tree.shape)
  return (tree + 0.1 * tree.std() * noise).astype(np.float32)


target = T5Model(TARGET, random_params(TARGET, 0))
draft = T5Model(DRAFT, first_layers(target.params))
inputs = np.random.RandomState(2).randint(2, 64, (4, 7)).astype(np.int32)
inputs[1, 5:] = 0
inputs[3, 3:] = 0
rng = jax.random.PRNGKey(0)


def base(t, x):
  return np.asarray(decoding.temperature_sample(
      t, x, rng, max_decode_length=10).tokens).tolist()


def spec(t, d, x):
  out = decoding.speculative_sample(t, d, x, rng, gamma=3,
                                    max_decode_length=10)
  return (np.asarray(out.tokens).tolist(),
          np.asarray(out.accepted_histogram).sum(0).tolist())


def sharding_report(model):
  leaves = jax.tree_util.tree_leaves_with_path(model.params)
  sharded = {jax.tree_util.keystr(p): list(a.sharding.shard_shape(a.shape))
             for p, a in leaves if a.sharding.shard_shape(a.shape) != a.shape}
  return {"num_params": len(leaves), "sharded": sharded}


result = {}
if part == "A":
  result["ref_base"] = base(target, inputs)
  result["ref_spec"], result["ref_histogram"] = spec(target, draft, inputs)
  mesh = pt.make_mesh(data=2, model=4)
  st, sd = pt.shard_model(mesh, target), pt.shard_model(mesh, draft)
  x = pt.shard_inputs(mesh, inputs)
  with jax.set_mesh(mesh):
    result["spec"], _ = spec(st, sd, x)
  result["target"] = sharding_report(st)
  result["draft"] = sharding_report(sd)
  result["input_spec"] = str(x.sharding.spec)
  result["odd_batch_spec"] = str(pt.data_sharding(mesh, 3).spec)
else:
  mesh = pt.make_mesh(data=2, model=4)
  with jax.set_mesh(mesh):
    result["base"] = base(pt.shard_model(mesh, target),
                          pt.shard_inputs(mesh, inputs))
  mesh = pt.make_mesh(data=1, model=8)
  st, sd = pt.shard_model(mesh, target), pt.shard_model(mesh, draft)
  x = pt.shard_inputs(mesh, inputs)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with mesh:  # The legacy context (deprecated for jax.set_mesh).
      result["spec_1x8"], _ = spec(st, sd, x)
  result["target_1x8"] = sharding_report(st)
  mesh = pt.make_mesh(data=2, model=4)
  if len(sys.argv) > 2:  # T5X-written checkpoint: restore straight to shards.
    import os
    from specdec_jax.checkpoints import load_t5x_params
    path = os.path.join(sys.argv[2], "legacy", "checkpoint_0")
    with open(os.path.join(sys.argv[2], "config.json")) as f:
      cfg = T5Config(**json.load(f))
    shapes = param_shapes(cfg)
    restored = load_t5x_params(path, expected=shapes,
                               shardings=pt.param_shardings(mesh, shapes))
    plain = load_t5x_params(path)
    result["ckpt_equal"] = all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()),
        restored, plain)))
    result["ckpt"] = sharding_report(T5Model(cfg, {"params": restored}))
print("RESULT " + json.dumps(result))
'''


def _start(part: str) -> subprocess.Popen:
  env = dict(os.environ)
  # 8 fake CPU devices; LLVM optimization off roughly halves compile time
  # (the SPMD partitioner, an HLO pass, runs all the same).
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      " --xla_force_host_platform_device_count=8"
                      " --xla_backend_optimization_level=0").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  args = [part] + ([str(T5X_TINY)] if part == "B" and T5X_TINY.is_dir() else [])
  return subprocess.Popen([sys.executable, "-c", _SCRIPT] + args, env=env,
                          cwd=str(REPO), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def sharded_runs():
  """Both subprocesses, run concurrently; {'A': result, 'B': result}."""
  procs = {part: _start(part) for part in ("A", "B")}
  results = {}
  try:
    for part, proc in procs.items():
      out, err = proc.communicate(timeout=600)
      lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
      assert proc.returncode == 0 and lines, (
          f"subprocess {part} failed (rc={proc.returncode}):\n{out}\n{err}")
      results[part] = json.loads(lines[-1][len("RESULT "):])
  finally:
    for proc in procs.values():
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  return results


def _by_path(sharded):
  """keystr paths ("['params']['decoder']...") -> slash-joined paths."""
  return {
      k.replace("][", "/").replace("'", "").strip("[]"): v
      for k, v in sharded.items()
  }


@pytest.mark.slow
def test_sharded_2x4_matches_unsharded(sharded_runs):
  a = sharded_runs["A"]
  # Exactness unsharded first: speculative == greedy baseline.
  assert a["ref_spec"] == a["ref_base"]
  assert len(a["ref_base"]) == 4 and all(len(r) == 10 for r in a["ref_base"])
  # The draft is neither perfect nor useless: accepts and rejects both occur.
  assert a["ref_histogram"][0] > 0 and sum(a["ref_histogram"][1:]) > 0
  # Sharded on (data=2, model=4): the same tokens (the baseline's in B).
  assert a["spec"] == a["ref_base"]
  assert sharded_runs["B"]["base"] == a["ref_base"]
  # Sharding really happened, on the expected dims.
  sharded = a["target"]["sharded"]
  assert len(sharded) > a["target"]["num_params"] // 2
  by_path = _by_path(sharded)
  assert by_path["params/decoder/layers_0/mlp/wi_0/kernel"] == [32, 16]
  assert by_path["params/decoder/layers_1/mlp/wo/kernel"] == [16, 32]
  assert by_path["params/encoder/layers_0/attention/query/kernel"] == [32, 8]
  assert by_path["params/decoder/layers_0/self_attention/out/kernel"] == [8, 32]
  assert by_path["params/token_embedder/embedding"] == [16, 32]
  assert by_path["params/decoder/logits_dense/kernel"] == [32, 16]
  assert by_path["params/decoder/relpos_bias/rel_embedding"] == [1, 32]
  assert not any(p.endswith("/scale") for p in by_path)
  assert a["draft"]["sharded"]
  assert a["input_spec"] == str(P("data", None))
  assert a["odd_batch_spec"] == str(P())


@pytest.mark.slow
def test_sharded_1x8(sharded_runs):
  ref = sharded_runs["A"]["ref_base"]
  b = sharded_runs["B"]
  assert b["spec_1x8"] == ref
  # heads=4 on an 8-way axis: rel_embedding falls back to replicated, while
  # joined_kv = 32 still shards.
  sharded = _by_path(b["target_1x8"]["sharded"])
  assert "params/decoder/relpos_bias/rel_embedding" not in sharded
  assert sharded["params/decoder/layers_0/self_attention/key/kernel"] == [32, 4]


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


@pytest.mark.slow
def test_sharded_checkpoint_restore(sharded_runs):
  """`param_shardings` names fit a T5X-written checkpoint (../shared)."""
  b = sharded_runs["B"]
  if "ckpt" not in b:
    pytest.skip(f"{T5X_TINY} not found: needs the workspace's ../shared "
                "folder next to the checkout.")
  assert b["ckpt_equal"]
  sharded = _by_path(b["ckpt"]["sharded"])
  assert sharded["params/encoder/layers_1/mlp/wi_1/kernel"] == [32, 16]
  assert sharded["params/token_embedder/embedding"] == [32, 32]
  assert sharded["params/decoder/layers_0/encoder_decoder_attention/out/"
                 "kernel"] == [8, 32]
