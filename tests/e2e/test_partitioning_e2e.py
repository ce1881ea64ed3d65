"""Exact decoding and checkpoint restores on a sharded mesh of 8 fake CPU
devices, in subprocesses (XLA_FLAGS must be set before jax is imported).

Two decoding subprocesses, started together:

  A: the unsharded reference (greedy baseline and speculative), then
     speculative on a (data=2, model=4) mesh under `jax.set_mesh`.
  B: the baseline on (2, 4); speculative on a (1, 8) mesh under the legacy
     `with mesh:`; a T5X checkpoint restored straight to (2, 4) shards.

Params and inputs are made with numpy from fixed seeds, so B's tokens are
compared with A's reference. A third restores the T5X-written fixture's
legacy and Orbax checkpoints to shards (`load_t5x_params(shardings=...)`).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from jax.sharding import PartitionSpec as P

from conftest import REPO
from conftest import T5X_TINY
from conftest import require_shared

pytestmark = pytest.mark.slow

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


def _eight_devices_env(*xla_flags: str) -> dict:
  """This process's environment with 8 fake CPU devices (and `xla_flags`),
  the repository first on PYTHONPATH."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = " ".join([
      env.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8",
      *xla_flags
  ]).strip()
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  return env


def _start(part: str) -> subprocess.Popen:
  # LLVM optimization off roughly halves compile time (the SPMD
  # partitioner, an HLO pass, runs all the same).
  env = _eight_devices_env("--xla_backend_optimization_level=0")
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


def test_sharded_1x8(sharded_runs):
  ref = sharded_runs["A"]["ref_base"]
  b = sharded_runs["B"]
  assert b["spec_1x8"] == ref
  # heads=4 on an 8-way axis: rel_embedding falls back to replicated, while
  # joined_kv = 32 still shards.
  sharded = _by_path(b["target_1x8"]["sharded"])
  assert "params/decoder/relpos_bias/rel_embedding" not in sharded
  assert sharded["params/decoder/layers_0/self_attention/key/kernel"] == [32, 4]


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


_SHARDED_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from specdec_jax.checkpoints import load_t5x_params
    legacy, orbax = sys.argv[1], sys.argv[2]
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    specs = {
        ("encoder", "layers_0", "mlp", "wi_0", "kernel"): P(None, "model"),
        ("token_embedder", "embedding"): P("model", None),
        ("decoder", "layers_1", "self_attention", "query", "kernel"):
            P("data", "model"),
        ("decoder", "logits_dense", "kernel"): P(),
    }
    shardings = {}
    for path, spec in specs.items():
        node = shardings
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = NamedSharding(mesh, spec)

    def get(tree, path):
        for k in path:
            tree = tree[k]
        return tree

    ref = load_t5x_params(legacy)
    for ckpt in (legacy, orbax):
        for dtype in (None, jnp.bfloat16):
            got = load_t5x_params(ckpt, shardings=shardings, dtype=dtype)
            assert jax.tree.structure(got) == jax.tree.structure(ref)
            for path, spec in specs.items():
                arr, want = get(got, path), np.asarray(get(ref, path))
                if dtype is not None:
                    want = np.asarray(jnp.asarray(want).astype(dtype))
                assert arr.sharding == NamedSharding(mesh, spec), path
                assert len(arr.addressable_shards) == 8
                shard_shape = arr.sharding.shard_shape(arr.shape)
                for shard in arr.addressable_shards:
                    assert shard.data.shape == shard_shape, path
                    np.testing.assert_array_equal(
                        np.asarray(shard.data), want[shard.index])
                assert np.asarray(arr).tobytes() == want.tobytes(), path
            # Unsharded parameters: default device, same values.
            norm = get(got, ("encoder", "encoder_norm", "scale"))
            assert norm.devices() == {jax.devices()[0]}
    # One sharding for every parameter.
    rep = NamedSharding(mesh, P())
    got = load_t5x_params(orbax, shardings=rep)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        assert a.sharding == rep
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    print("SHARDED_OK")
""")


def test_sharded_restore_subprocess():
  """The T5X-written fixture's legacy and Orbax checkpoints restored to
  (4, 2) shards (../shared)."""
  fixture = require_shared(T5X_TINY)
  proc = subprocess.run([
      sys.executable, "-c", _SHARDED_SCRIPT,
      str(fixture / "legacy" / "checkpoint_0"),
      str(fixture / "orbax" / "checkpoint_0")
  ], env=_eight_devices_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "SHARDED_OK" in proc.stdout
