"""Tests of specdec_jax.checkpoints on a real checkpoint written by T5X.

The fixture (`../shared/fixtures/t5x_tiny`, see its README.md) holds the same
tiny T5 v1.1 model in T5X's legacy (msgpack + zarr) and Orbax layouts
(restored to shards on 8 fake devices: tests/e2e/test_partitioning_e2e.py).
"""
import json
import os
from pathlib import Path
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.checkpoints import CheckpointError
from specdec_jax.checkpoints import latest_checkpoint
from specdec_jax.checkpoints import legacy
from specdec_jax.checkpoints import load_t5x_params
from specdec_jax.checkpoints import reads
from specdec_jax.checkpoints import save as save_lib
from specdec_jax.checkpoints import save_params

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO.parent / "shared" / "fixtures" / "t5x_tiny"
LEGACY = FIXTURE / "legacy" / "checkpoint_0"
ORBAX = FIXTURE / "orbax" / "checkpoint_0"

if not FIXTURE.is_dir():
  pytest.skip(
      f"../shared/fixtures/t5x_tiny not found: expected the T5X-written "
      f"fixture at {FIXTURE} (a checkout next to the shared/ folder).",
      allow_module_level=True)

# ---------------------------------------------------------------- helpers


def flat(tree, prefix=()):
  """{('encoder', ..., 'kernel'): leaf} for a nested dict."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flat(v, prefix + (k,)))
    else:
      out[prefix + (k,)] = v
  return out


def unflat(d):
  out = {}
  for path, v in d.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = v
  return out


def assert_bit_identical(a, b):
  fa, fb = flat(a), flat(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    x, y = np.asarray(fa[k]), np.asarray(fb[k])
    assert x.dtype == y.dtype, k
    assert x.shape == y.shape, k
    assert x.tobytes() == y.tobytes(), k


def expected_shapes(cfg):
  """Parameter shapes of T5X's t5x/examples/t5/network.py Transformer.

  T5X's DenseGeneral stores kernels flattened to 2-D, so the attention
  query/key/value kernels are [emb, heads*head_dim] and the output kernel
  [heads*head_dim, emb] (reshaped to [emb, heads, head_dim] only in the layer).
  """
  e, h, d, m, v = (cfg["emb_dim"], cfg["num_heads"], cfg["head_dim"],
                   cfg["mlp_dim"], cfg["vocab_size"])
  hd = h * d
  n_buckets = 32  # T5X's RelativePositionBiases default.

  def attn(prefix):
    return {
        prefix + ("query", "kernel"): (e, hd),
        prefix + ("key", "kernel"): (e, hd),
        prefix + ("value", "kernel"): (e, hd),
        prefix + ("out", "kernel"): (hd, e)
    }

  def mlp(prefix):
    out = {
        prefix + (f"wi_{i}", "kernel"): (e, m)
        for i in range(len(cfg["mlp_activations"]))
    }
    out[prefix + ("wo", "kernel")] = (m, e)
    return out

  s = {("token_embedder", "embedding"): (v, e)}
  for stack, n in (("encoder", cfg["num_encoder_layers"]),
                   ("decoder", cfg["num_decoder_layers"])):
    s[(stack, "relpos_bias", "rel_embedding")] = (h, n_buckets)
    s[(stack, f"{stack}_norm", "scale")] = (e,)
    for i in range(n):
      layer = (stack, f"layers_{i}")
      s.update(mlp(layer + ("mlp",)))
      s[layer + ("pre_mlp_layer_norm", "scale")] = (e,)
      if stack == "encoder":
        s.update(attn(layer + ("attention",)))
        s[layer + ("pre_attention_layer_norm", "scale")] = (e,)
      else:
        s.update(attn(layer + ("self_attention",)))
        s.update(attn(layer + ("encoder_decoder_attention",)))
        s[layer + ("pre_self_attention_layer_norm", "scale")] = (e,)
        s[layer + ("pre_cross_attention_layer_norm", "scale")] = (e,)
  if not cfg["logits_via_embedding"]:
    s[("decoder", "logits_dense", "kernel")] = (e, v)
  return s


@pytest.fixture(scope="module")
def cfg():
  return json.loads((FIXTURE / "config.json").read_text())


@pytest.fixture(scope="module")
def expected(cfg):
  return unflat({
      k: jax.ShapeDtypeStruct(s, jnp.float32)
      for k, s in expected_shapes(cfg).items()
  })


@pytest.fixture(scope="module")
def legacy_params():
  return load_t5x_params(LEGACY)


@pytest.fixture(scope="module")
def orbax_params():
  return load_t5x_params(str(ORBAX))


def writable_copy(src, dst):
  """Copies a (read-only) fixture checkpoint to a writable directory."""
  shutil.copytree(src, dst, copy_function=shutil.copyfile)
  for root, dirs, _ in os.walk(dst):
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o755)
  os.chmod(dst, 0o755)
  return dst


def load_error(path, **kw):
  with pytest.raises(CheckpointError) as info:
    load_t5x_params(path, **kw)
  return str(info.value)


# ------------------------------------------------- 1. both layouts, names


def test_both_layouts_load_identical_params(legacy_params, orbax_params):
  assert_bit_identical(legacy_params, orbax_params)
  for leaf in flat(legacy_params).values():
    assert isinstance(leaf, jax.Array)
    assert leaf.dtype == jnp.float32


def test_param_names_and_shapes_match_config(legacy_params, orbax_params, cfg):
  want = expected_shapes(cfg)
  for params in (legacy_params, orbax_params):
    got = {k: tuple(v.shape) for k, v in flat(params).items()}
    assert got == want  # Exactly T5X's names; nothing more, nothing less.
    p = params
    assert p["encoder"]["layers_0"]["attention"]["query"]["kernel"].shape == (
        32, 32)  # [emb, heads * head_dim] = [32, 4 * 8]
    assert p["encoder"]["layers_0"]["attention"]["out"]["kernel"].shape == (
        32, 32)  # [heads * head_dim, emb]
    assert p["decoder"]["layers_1"]["mlp"]["wi_0"]["kernel"].shape == (32, 64)
    assert p["decoder"]["layers_1"]["mlp"]["wo"]["kernel"].shape == (64, 32)
    assert p["encoder"]["relpos_bias"]["rel_embedding"].shape == (4, 32)
    assert p["decoder"]["logits_dense"]["kernel"].shape == (32, 128)
    assert p["token_embedder"]["embedding"].shape == (128, 32)


def test_no_optimizer_state_leaks(legacy_params, orbax_params):
  for params in (legacy_params, orbax_params):
    assert set(params) == {"encoder", "decoder", "token_embedder"}
    names = {k for path in flat(params) for k in path}
    assert not names & {
        "target", "state", "param_states", "step", "m", "v", "v_row", "v_col",
        "optimizer", "version", "params"
    }


def test_params_are_not_trivial(legacy_params):
  # Guards the bit-identity tests against e.g. all-zero (missing) data.
  for k, v in flat(legacy_params).items():
    v = np.asarray(v)
    assert np.all(np.isfinite(v)), k
    if k[-1] == "kernel":
      assert np.std(v) > 0, k


def test_expected_matching_passes_and_params_wrapper(legacy_params, expected):
  got = load_t5x_params(LEGACY, expected={"params": expected})
  assert_bit_identical(got, legacy_params)


def test_legacy_inline_arrays_and_gcs_specs(tmp_path, legacy_params):
  """Public T5X checkpoints: small arrays inline, gcs/old-style specs."""
  from flax import serialization
  ckpt = writable_copy(LEGACY, tmp_path / "checkpoint_0")
  raw = (ckpt / "checkpoint").read_bytes()
  contents = serialization.msgpack_restore(raw)
  target = contents["optimizer"]["target"]
  # 1) a small array stored in the msgpack itself;
  norm = np.asarray(legacy_params["encoder"]["encoder_norm"]["scale"])
  target["encoder"]["encoder_norm"]["scale"] = norm
  shutil.rmtree(ckpt / "target.encoder.encoder_norm.scale")
  # 2) a spec written to GCS by tensorstore < 0.1.14 (path at top level).
  old = target["decoder"]["logits_dense"]["kernel"]
  target["decoder"]["logits_dense"]["kernel"] = {
      "driver": "zarr",
      "dtype": "float32",
      "kvstore": {
          "driver": "gcs",
          "bucket": "t5x-dummy-bucket"
      },
      "path": old["kvstore"]["path"].rstrip("/"),
      "metadata": old["metadata"]
  }
  (ckpt / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))
  assert_bit_identical(load_t5x_params(ckpt), legacy_params)
  # 3) very old files without the {'version', 'optimizer'} wrapper.
  (ckpt / "checkpoint").write_bytes(
      serialization.msgpack_serialize(contents["optimizer"]))
  assert_bit_identical(load_t5x_params(ckpt), legacy_params)


def test_gs_paths_map_to_gcs_kvstore():
  spec = legacy.legacy_spec(
      "gs://b/m/checkpoint_1000000", "gs://b/m/checkpoint_1000000",
      "decoder/logits_dense/kernel", {
          "driver": "zarr",
          "kvstore": {
              "driver": "gcs",
              "bucket": "t5x-dummy-bucket"
          },
          "path": "target.decoder.logits_dense.kernel",
          "metadata": {
              "shape": [4, 8],
              "chunks": [4, 8]
          }
      })
  assert spec["kvstore"] == {
      "driver": "gcs",
      "bucket": "b",
      "path": "m/checkpoint_1000000/target.decoder.logits_dense.kernel/"
  }
  assert spec["metadata"] == {"shape": [4, 8]}
  assert reads.kvstore("gs://bucket/a/state/") == {
      "driver": "gcs",
      "bucket": "bucket",
      "path": "a/state/"
  }


def test_old_orbax_msgpack_with_placeholders(tmp_path, orbax_params):
  from flax import serialization
  ckpt = writable_copy(ORBAX, tmp_path / "checkpoint_0")
  os.remove(ckpt / "state" / "_METADATA")
  tree = {
      "target": unflat({
          k: "PLACEHOLDER://target." + ".".join(k) for k in flat(orbax_params)
      }),
      "state": {
          "step": "PLACEHOLDER://state.step"
      }
  }
  (ckpt / "state" / "checkpoint").write_bytes(
      serialization.msgpack_serialize(tree))
  assert_bit_identical(load_t5x_params(ckpt), orbax_params)


def test_old_orbax_placeholder_outside_the_folder_refused(
    tmp_path, orbax_params):
  """Issue 37 (2): a `PLACEHOLDER://../..` leaf was read from outside."""
  from flax import serialization
  ckpt = writable_copy(ORBAX, tmp_path / "checkpoint_0")
  os.remove(ckpt / "state" / "_METADATA")
  leaves = {k: "PLACEHOLDER://target." + ".".join(k) for k in flat(orbax_params)}
  victim = sorted(leaves)[0]
  leaves[victim] = "PLACEHOLDER://../../../secret/x"
  (ckpt / "state" / "checkpoint").write_bytes(
      serialization.msgpack_serialize({"target": unflat(leaves)}))
  with pytest.raises(
      CheckpointError, match=r"'\.\./\.\./\.\./secret/x', "
      "outside the checkpoint folder"):
    load_t5x_params(ckpt)


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_orbax_metadata_key_outside_the_folder_refused(tmp_path, use_ocdbt):
  """Issue 37 (2): a `_METADATA` key with `/../` named a folder outside."""
  ckpt = writable_copy(ORBAX, tmp_path / "checkpoint_0")
  meta_path = ckpt / "state" / "_METADATA"
  meta = json.loads(meta_path.read_text())
  meta["use_ocdbt"] = use_ocdbt
  key = next(k for k, v in meta["tree_metadata"].items()
             if v["key_metadata"][0]["key"] == "target")
  meta["tree_metadata"][key]["key_metadata"][-1]["key"] = "k/../../../../x"
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
    load_t5x_params(str(ckpt))


# -------------------------------------------------------- 2. round trip


def test_round_trip_bit_identical(tmp_path, legacy_params):
  path = save_params(legacy_params, tmp_path / "model", step=7)
  assert path == str(tmp_path / "model" / "checkpoint_7")
  assert latest_checkpoint(tmp_path / "model") == path
  assert sorted(os.listdir(tmp_path / "model")) == ["checkpoint_7"]  # No tmp.
  assert (Path(path) / "state" / "_METADATA").is_file()
  assert_bit_identical(load_t5x_params(path), legacy_params)

  bf16 = load_t5x_params(path, dtype=jnp.bfloat16)
  want = {
      k: jnp.asarray(v).astype(jnp.bfloat16)
      for k, v in flat(legacy_params).items()
  }
  assert_bit_identical(bf16, unflat(want))

  with pytest.raises(CheckpointError, match="already exists"):
    save_params(legacy_params, tmp_path / "model", step=7)


def test_round_trip_mixed_dtypes_and_numpy(tmp_path):
  rng = np.random.default_rng(0)
  params = {
      "a": {
          "kernel": jnp.asarray(rng.normal(size=(3, 5)), jnp.bfloat16)
      },
      "b": {
          "scale": rng.normal(size=(7,)).astype(np.float32)
      },  # numpy
      "c": jnp.arange(6, dtype=jnp.int32).reshape(2, 3),
      "d": jnp.asarray([np.nan, -0.0, np.inf], jnp.float32),
  }
  path = save_params({"params": params}, tmp_path, step=0)
  got = load_t5x_params(path)
  assert_bit_identical(got, params)
  assert got["a"]["kernel"].dtype == jnp.bfloat16


def test_save_refuses_packed_panels_and_writes_nothing(tmp_path):
  # A 3-D `kernel` is the CPU kernel's panel layout, never T5X's.
  params = {
      "decoder": {
          "layers_0": {
              "mlp": {
                  "wo": {
                      "kernel": jnp.zeros((2, 8, 16), jnp.float32)
                  }
              }
          }
      }
  }
  with pytest.raises(ValueError, match="decoder/layers_0/mlp/wo/kernel"):
    save_params({"params": params}, tmp_path / "model", step=0)
  assert not (tmp_path / "model").exists()


def test_save_is_atomic(tmp_path, legacy_params, monkeypatch):
  first = save_params(legacy_params, tmp_path, step=1)

  def crash(src, dst):
    raise KeyboardInterrupt("simulated crash before the final rename")

  monkeypatch.setattr(save_lib, "_rename", crash)
  with pytest.raises(KeyboardInterrupt):
    save_params(legacy_params, tmp_path, step=2)
  monkeypatch.undo()
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_1"]
  assert latest_checkpoint(tmp_path) == first
  # A half-written temp dir left by a killed process never counts.
  writable_copy(ORBAX, tmp_path / "checkpoint_3.orbax-checkpoint-tmp-123")
  assert latest_checkpoint(tmp_path) == first


def test_latest_checkpoint(tmp_path):
  assert latest_checkpoint(tmp_path / "missing") is None
  assert latest_checkpoint(tmp_path) is None
  writable_copy(LEGACY, tmp_path / "checkpoint_9")
  writable_copy(ORBAX, tmp_path / "checkpoint_10")
  os.makedirs(tmp_path / "checkpoint_11")  # Empty: not a checkpoint.
  os.makedirs(tmp_path / "checkpoint_12.tmp-5" / "state")
  (tmp_path / "checkpoint_99").write_text("not a dir")
  assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint_10")
  assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_10")


# ------------------------------------------------------ 3. bad checkpoints


def test_missing_directory(tmp_path):
  msg = load_error(tmp_path / "checkpoint_5")
  assert str(tmp_path / "checkpoint_5") in msg and "does not exist" in msg


def test_missing_msgpack_file(tmp_path):
  ckpt = writable_copy(LEGACY, tmp_path / "checkpoint_0")
  os.remove(ckpt / "checkpoint")
  msg = load_error(ckpt)
  assert str(ckpt) in msg and "'checkpoint'" in msg


def test_truncated_msgpack_file(tmp_path):
  ckpt = writable_copy(LEGACY, tmp_path / "checkpoint_0")
  data = (ckpt / "checkpoint").read_bytes()
  (ckpt / "checkpoint").write_bytes(data[:len(data) // 2])
  msg = load_error(ckpt)
  assert str(ckpt / "checkpoint") in msg


def test_missing_orbax_metadata(tmp_path):
  ckpt = writable_copy(ORBAX, tmp_path / "checkpoint_0")
  os.remove(ckpt / "state" / "_METADATA")
  msg = load_error(ckpt)
  assert str(ckpt) in msg and "_METADATA" in msg


def test_deleted_chunk_names_parameter(tmp_path):
  ckpt = writable_copy(LEGACY, tmp_path / "checkpoint_0")
  os.remove(ckpt / "target.encoder.layers_1.mlp.wo.kernel" / "0.0")
  msg = load_error(ckpt)
  assert "encoder/layers_1/mlp/wo/kernel" in msg and str(ckpt) in msg


def test_deleted_zarr_metadata_names_parameter(tmp_path):
  ckpt = writable_copy(LEGACY, tmp_path / "checkpoint_0")
  os.remove(ckpt / "target.token_embedder.embedding" / ".zarray")
  msg = load_error(ckpt)
  assert "token_embedder/embedding" in msg and str(ckpt) in msg


def test_truncated_chunk_names_parameter(tmp_path):
  ckpt = writable_copy(LEGACY, tmp_path / "checkpoint_0")
  chunk = ckpt / "target.decoder.layers_0.self_attention.key.kernel" / "0.0"
  data = chunk.read_bytes()
  chunk.write_bytes(data[:len(data) // 2])
  msg = load_error(ckpt)
  assert "decoder/layers_0/self_attention/key/kernel" in msg
  assert str(ckpt) in msg


def test_corrupt_orbax_data_file(tmp_path):
  ckpt = writable_copy(ORBAX, tmp_path / "checkpoint_0")
  data_dir = ckpt / "state" / "ocdbt.process_0" / "d"
  for f in data_dir.iterdir():
    f.write_bytes(f.read_bytes()[:10])
  msg = load_error(ckpt)
  assert str(ckpt) in msg and "parameter '" in msg


@pytest.mark.parametrize("ckpt", [LEGACY, ORBAX], ids=["legacy", "orbax"])
def test_expected_shape_mismatch(ckpt, cfg):
  shapes = expected_shapes(cfg)
  shapes[("decoder", "layers_0", "mlp", "wi_0", "kernel")] = (32, 65)
  exp = unflat({
      k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()
  })
  msg = load_error(ckpt, expected=exp)
  assert "decoder/layers_0/mlp/wi_0/kernel" in msg
  assert "[32, 64]" in msg and "[32, 65]" in msg and str(ckpt) in msg


def test_expected_param_missing_from_checkpoint(cfg):
  shapes = expected_shapes(cfg)
  shapes[("decoder", "layers_0", "mlp", "wi_2", "kernel")] = (32, 64)
  exp = unflat({
      k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()
  })
  msg = load_error(LEGACY, expected=exp)
  assert "decoder/layers_0/mlp/wi_2/kernel" in msg and "missing" in msg


def test_checkpoint_param_not_expected(cfg):
  shapes = expected_shapes(cfg)
  del shapes[("encoder", "relpos_bias", "rel_embedding")]
  exp = unflat({
      k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()
  })
  msg = load_error(ORBAX, expected=exp)
  assert "encoder/relpos_bias/rel_embedding" in msg and "not expect" in msg


def test_metadata_checked_before_any_data(tmp_path, cfg):
  """A shape mismatch is reported before a broken chunk is ever read."""
  ckpt = writable_copy(LEGACY, tmp_path / "checkpoint_0")
  os.remove(ckpt / "target.decoder.layers_0.mlp.wi_0.kernel" / "0.0")
  shapes = expected_shapes(cfg)
  shapes[("token_embedder", "embedding")] = (129, 32)  # Sorted last.
  exp = unflat({
      k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()
  })
  msg = load_error(ckpt, expected=exp)
  assert "token_embedder/embedding" in msg and "[129, 32]" in msg


def test_sharding_for_unknown_param():
  s = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  msg = load_error(LEGACY, shardings={"decoder": {"nope": {"kernel": s}}})
  assert "decoder/nope/kernel" in msg
