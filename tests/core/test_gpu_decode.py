"""The GPU decode paths ('packed', 'fused': `models.decode_paths`,
`kernels.gpu`), on the CPU: the Pallas kernels in interpret mode.

What must hold for a GPU to decode exactly through them:
* each kernel computes its sublayer to float32 rounding of a float64
  reference (batch > 1, K > 1, cache slots masked, a chunk ending at the
  cache's last slot, encoder padding);
* a decoder on either path gives XLA's path's logits: to float32 rounding
  in float32, and no further from float32's than XLA's own bfloat16 logits
  in bfloat16; its cache holds the same keys/values, and nothing outside
  the chunk's slots is written; token trees too;
* on 'fused', a row's logits do not depend on how many tokens share the
  call, bit for bit (the K-token call and one-token calls agree exactly,
  as through the CPU kernel), and greedy speculative decoding equals the
  greedy baseline;
* the whole decoder lowers to Triton for CUDA here, 6 kernels a layer and
  one for the logits, at T5-small's shapes too (what the GPU compiles);
* the backend picks the path, an impossible path is one clear error, and
  `params` keep T5X's layout;
* the GPU option sets the device check measures are compiler options this
  jaxlib knows, and the loops take them on a GPU only.

The chi-square tests of every decode mode on 'fused' run the device
check's exactness phase with `--path=fused`
(tests/e2e/test_gpu_decode_e2e.py, with the shipped pair).
"""
import dataclasses
from typing import Tuple

import jax
from jax.extend import core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops
from specdec_jax.core.decoding import programs
from specdec_jax.core.drafters import ModelDrafter
from specdec_jax.core.kernels import _gpu_grid
from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.kernels import gpu_layers
from specdec_jax.core.models import decode_paths
from specdec_jax.core.models import init_params
from specdec_jax.core.models import param_shapes
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.metrics import exactness

from conftest import jit_call
from conftest import tiny_config

F32_ATOL = 2e-5
GPU_PATHS = ("packed", "fused")


def _t5x(config: T5Config, seed: int = 3) -> T5Model:
  return T5Model(config, init_params(config, jax.random.PRNGKey(seed)))


@pytest.fixture(scope="module")
def world():
  """A float32 tiny model, inputs [3, 7] (row 1 padded) and 9 tokens."""
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 32, size=(3, 7)).astype(np.int32)
  enc[1, 4:] = 0
  dec = rng.integers(2, 32, size=(3, 9)).astype(np.int32)
  return _t5x(tiny_config(vocab_size=32)), enc, dec


def _decode(model, enc, dec, sizes, max_len=9):
  """Logits of dec fed in chunks of `sizes` (a cache of max_len slots: the
  last chunk ends at its last slot), and the final cache."""
  cache = jit_call(model, "start", jnp.asarray(enc), max_len)
  out, pos = [], 0
  for k in sizes:
    logits, cache = jit_call(model, "decode_chunk",
                             jnp.asarray(dec[:, pos:pos + k]), cache)
    out.append(np.asarray(logits, np.float32))
    pos += k
  return np.concatenate(out, axis=1), cache


# ---------------------------------------------------------------------------
# The kernels against float64.
# ---------------------------------------------------------------------------
def _f64(x):
  return np.asarray(x, np.float64)


def _normed(x, scale):
  x = _f64(x)
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * _f64(scale)


def _softmax_attend(q, keys, values, bias):
  """q [B, K, H, D], keys/values [B, H, D, L], bias [B, H, K, L]."""
  logits = np.einsum("bkhd,bhdl->bhkl", q, keys) + bias
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bhkl,bhdl->bkhd", weights, values)


def _rand(rng, *shape, scale=1.0):
  return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)


def _self_bias(rng, b, h, k, length, start, tree: bool):
  """A random `gpu.SelfBias` (random buckets; with `tree`, a tree's offsets
  and visibility in row 0 and a chain's in row 1; else a chain's, None)
  and the [B, H, K, L] bias it stands for, by its definition."""
  embedding = rng.standard_normal((h, 8)).astype(np.float32)
  buckets = rng.integers(0, 8, size=2 * length - 1).astype(np.int32)
  offsets = np.array([[0, 1, 1], [0, 1, 2]], np.int32)[:, :k]
  visible = np.tril(np.ones((b, k, k), bool))
  if tree:
    visible[0, 2, 1] = False  # Row 0: tokens 1 and 2 are siblings.
  else:
    offsets[0] = np.arange(k)
  want = np.full((b, h, k, length), -1e10)
  for row in range(b):
    for m in range(k):
      query = start[row] + offsets[row, m]
      cached = np.arange(start[row]) - query + length - 1
      want[row, :, m, :start[row]] = embedding[:, buckets[cached]]
      for c in range(k):
        if visible[row, m, c]:
          at = offsets[row, c] - offsets[row, m] + length - 1
          want[row, :, m, start[row] + c] = embedding[:, buckets[at]]
  bias = gpu.SelfBias(jnp.asarray(embedding), jnp.asarray(buckets))
  if tree:
    bias = bias.replace(offsets=jnp.asarray(offsets),
                        visible=jnp.asarray(visible))
  return bias, want


@pytest.mark.parametrize("tree", [False, True])
def test_self_attention_kernel_matches_float64(tree):
  """Writes the chunk's slots (one row's chunk ends at the last slot), then
  attends over every slot its bias lets it see (a chain's, or a token
  tree's in one row)."""
  rng = np.random.default_rng(0)
  b, k, e, h, d, length = 2, 3, 32, 2, 8, 12
  x, scale = _rand(rng, b, k, e), _rand(rng, e)
  w = _rand(rng, h, 3, e, d, scale=0.3)
  keys, values = _rand(rng, b, h, d, length), _rand(rng, b, h, d, length)
  start = np.array([2, length - k], np.int32)
  bias, want_bias = _self_bias(rng, b, h, k, length, start, tree)
  ctx, new_keys, new_values = jax.jit(gpu.self_attention)(x, scale, w, keys,
                                                          values,
                                                          jnp.asarray(start),
                                                          bias)
  xn = _normed(x, scale)
  q, kk, vv = (np.einsum("bke,hed->bkhd", xn, _f64(w)[:, p]) for p in range(3))
  want_keys, want_values = _f64(keys), _f64(values)
  for row in range(b):
    for m in range(k):
      want_keys[row, :, :, start[row] + m] = kk[row, m]
      want_values[row, :, :, start[row] + m] = vv[row, m]
  np.testing.assert_allclose(new_keys, want_keys, atol=1e-5)
  np.testing.assert_allclose(new_values, want_values, atol=1e-5)
  np.testing.assert_allclose(
      ctx, _softmax_attend(q, want_keys, want_values, want_bias), atol=1e-5)


def test_cross_attention_kernel_masks_encoder_padding():
  rng = np.random.default_rng(1)
  b, k, e, h, d, s = 2, 3, 48, 2, 8, 5
  x, scale, wq = _rand(rng, b, k, e), _rand(rng, e), _rand(rng, h, 1, e, d)
  keys, values = _rand(rng, b, h, d, s), _rand(rng, b, h, d, s)
  valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  bias = np.where(valid, 0.0, -1e10).astype(np.float32)
  ctx = jax.jit(gpu.cross_attention)(x, scale, wq * 0.3, keys, values,
                                     jnp.asarray(valid))
  q = np.einsum("bke,hed->bkhd", _normed(x, scale), _f64(wq * 0.3)[:, 0])
  want = _softmax_attend(q, _f64(keys), _f64(values),
                         np.broadcast_to(bias[:, None, None, :], (b, h, k, s)))
  np.testing.assert_allclose(ctx, want, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 11])  # 11: a last block of 3 rows.
def test_dense_kernels_match_float64(rows):
  rng = np.random.default_rng(2)
  e, n = 48, 192
  x, scale, w = _rand(rng, rows, e), _rand(rng, e), _rand(rng, 2, e, n)
  gated = jax.jit(lambda *a: gpu.rms_dense(*a, ("gelu", "linear")))(x, scale,
                                                                    w * 0.2)
  xn = _normed(x, scale)
  up = xn @ _f64(w * 0.2)[0]
  gelu = 0.5 * up * (1 + np.tanh(np.sqrt(2 / np.pi) * (up + 0.044715 * up**3)))
  np.testing.assert_allclose(gated, gelu * (xn @ _f64(w * 0.2)[1]), atol=1e-5)
  h, w2, res = _rand(rng, rows, n), _rand(rng, n, e,
                                          scale=0.1), _rand(rng, rows, e)
  out = jax.jit(gpu.dense_residual)(h, w2, res)
  np.testing.assert_allclose(out, _f64(res) + _f64(h) @ _f64(w2), atol=1e-5)


def test_float32_weights_take_shallower_blocks(monkeypatch):
  """`Tiles.for_weights`: float32 weights' contraction blocks are capped
  (the shipped pair's target spilled 5 KB a thread under 'tall_mma_split'
  on an H200), bfloat16's are the preset's; the dense kernels use it, and
  compute the same sums either way."""
  tall = gpu_tiles.TILE_PRESETS["tall_mma_split"]
  assert tall.for_weights(jnp.bfloat16) is tall
  capped = tall.for_weights(jnp.float32)
  assert (capped.dense_emb_block, capped.in_block) == (
      gpu_tiles.WIDE_WEIGHT_DEPTHS["dense_emb_block"],
      gpu_tiles.WIDE_WEIGHT_DEPTHS["in_block"]) == (128, 512)
  assert capped.emb_block == tall.emb_block and capped.columns == tall.columns
  # Prefetched blocks, held across a barrier, shallower still.
  held = gpu_tiles.TILE_PRESETS["tall_mma_persistent_prefetch"]
  assert (held.for_weights(jnp.float32).in_block,
          held.for_weights(jnp.bfloat16).in_block) == (256, 1024)
  seen = {}
  for name in ("rms_dense_kernel", "dense_residual_kernel"):
    original = getattr(gpu._bodies, name)  # pylint: disable=protected-access

    def spy(*args, original=original, name=name, **kwargs):
      seen.setdefault(name, set()).add(kwargs.get("eb", kwargs.get("kb")))
      return original(*args, **kwargs)

    monkeypatch.setattr(gpu._bodies, name, spy)  # pylint: disable=protected-access
  rng = np.random.default_rng(4)
  e, n = 1024, 2048
  x, scale, w = _rand(rng, 1, e), _rand(rng, e), _rand(rng, 1, e, n, scale=0.03)
  h, w2, res = _rand(rng, 1, n), _rand(rng, n, e, scale=0.03), _rand(rng, 1, e)
  with gpu_tiles.tiles(tall):
    for dtype in (jnp.float32, jnp.bfloat16):
      up = gpu.rms_dense(x, scale, w.astype(dtype), ("linear",))
      out = gpu.dense_residual(h, w2.astype(dtype), res)
      np.testing.assert_allclose(up,
                                 _normed(x, scale) @ _f64(w.astype(dtype))[0],
                                 rtol=2e-2, atol=2e-2)
      np.testing.assert_allclose(out,
                                 _f64(res) + _f64(h) @ _f64(w2.astype(dtype)),
                                 rtol=2e-2, atol=2e-2)
  assert seen == {
      "rms_dense_kernel": {128, 512},
      "dense_residual_kernel": {512, 1024}
  }


# ---------------------------------------------------------------------------
# A decoder on each path against XLA's path.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", GPU_PATHS)
@pytest.mark.parametrize("sizes", [[1] * 9, [4, 1, 4]])
def test_decoder_matches_xla_in_float32(world, path, sizes):
  """Batch 3 (one input padded), K = 1 and K = γ+1, the last chunk ending
  at the cache's last slot; the cache's keys/values too."""
  model, enc, dec = world
  want, want_cache = _decode(model, enc, dec, [9])
  got, cache = _decode(model.prepared_for_decoding(path), enc, dec, sizes)
  np.testing.assert_allclose(got, want, atol=F32_ATOL)
  for mine, theirs in zip(cache.keys + cache.values,
                          want_cache.keys + want_cache.values):
    np.testing.assert_allclose(mine, theirs, atol=F32_ATOL)


@pytest.mark.parametrize("path", GPU_PATHS)
def test_decoder_in_bfloat16_is_as_close_to_float32_as_xla(world, path):
  """bfloat16 rounds differently on each path (the kernels sum in float32
  and round where XLA rounds its outputs): no path may be much further
  from the float32 logits than XLA's own bfloat16 path."""
  model, enc, dec = world
  want, _ = _decode(model, enc, dec, [9])
  bf16 = T5Model(model.config.replace(dtype=jnp.bfloat16), model.params)
  xla_error = np.abs(_decode(bf16, enc, dec, [1] * 9)[0] - want).max()
  assert xla_error > 1e-3  # bfloat16 really rounded.
  for sizes in ([1] * 9, [4, 5]):
    got, _ = _decode(bf16.prepared_for_decoding(path), enc, dec, sizes)
    assert np.abs(got - want).max() <= 1.5 * xla_error


def test_fused_rows_are_bitwise_independent_of_the_call(world):
  """A token's logits are the same bits whether it came in a call of 1, 4
  or 9 tokens (what greedy identity rests on: the loops compare calls of
  γ+1 tokens with one-token calls at one batch size).

  Compiled without LLVM's optimizations: JAX 0.11's XLA:CPU vectorizes
  and contracts the interpreted kernels' arithmetic differently per
  program shape (the last row of a 3-row program differed by 1 ulp, every
  input equal). What is tested is the kernels' data flow; a GPU's rows
  are checked on the GPU (the device check's `paths.rows_identical`)."""
  model, enc, dec = world
  fused = model.prepared_for_decoding("fused")
  one = _decode_unoptimized(fused, enc, dec, [1] * 9)
  np.testing.assert_array_equal(one,
                                _decode_unoptimized(fused, enc, dec, [4, 1, 4]))
  np.testing.assert_array_equal(one, _decode_unoptimized(fused, enc, dec, [9]))


def _decode_unoptimized(model, enc, dec, sizes, max_len=9):
  """`_decode`'s logits, its programs compiled at XLA:CPU's backend
  optimization level 0 (one program per call size)."""
  options = {"xla_backend_optimization_level": 0}
  cache = jax.jit(lambda m, e: m.start(e, max_len)).lower(
      model,
      jnp.asarray(enc)).compile(compiler_options=options)(model,
                                                          jnp.asarray(enc))
  step = jax.jit(lambda m, t, c: m.decode_chunk(t, c))
  compiled, out, pos = {}, [], 0
  for k in sizes:
    tokens = jnp.asarray(dec[:, pos:pos + k])
    if k not in compiled:
      compiled[k] = step.lower(model, tokens,
                               cache).compile(compiler_options=options)
    logits, cache = compiled[k](model, tokens, cache)
    out.append(np.asarray(logits, np.float32))
    pos += k
  return np.concatenate(out, axis=1)


@pytest.fixture(scope="module")
def wide_world():
  """A float32 model wider than the default tiles' blocks (width 128, MLP
  256), so that every preset cuts its contractions differently: on
  'fused', its inputs [2, 5], 4 tokens, XLA's logits of them and the
  default tiles' (one token a call)."""
  rng = np.random.default_rng(5)
  enc = rng.integers(2, 32, size=(2, 5)).astype(np.int32)
  dec = rng.integers(2, 32, size=(2, 4)).astype(np.int32)
  config = tiny_config(vocab_size=32, emb_dim=128, num_heads=2, head_dim=16,
                       mlp_dim=256, num_encoder_layers=1, num_decoder_layers=1)
  model = _t5x(config)
  fused = model.prepared_for_decoding("fused")
  want, _ = _decode(model, enc, dec, [4], max_len=4)
  default, = _decode_traced_now(fused, enc, dec, [1] * 4)
  return fused, enc, dec, want, default


def _decode_traced_now(model, enc, dec, *chunkings, max_len=4):
  """`_decode`'s logits for each chunking of dec, through programs traced
  now (under the current `gpu.tiles`; `jit_call`'s are cached, traced under
  the tiles of their first call)."""
  start = jax.jit(lambda m, e: m.start(e, max_len))
  step = jax.jit(lambda m, t, c: m.decode_chunk(t, c))
  results = []
  for sizes in chunkings:
    cache, out, pos = start(model, jnp.asarray(enc)), [], 0
    for k in sizes:
      logits, cache = step(model, jnp.asarray(dec[:, pos:pos + k]), cache)
      out.append(np.asarray(logits, np.float32))
      pos += k
    results.append(np.concatenate(out, axis=1))
  return results


@pytest.mark.parametrize("preset",
                         sorted(set(gpu_tiles.TILE_PRESETS) - {"default"}))
def test_every_tile_preset_is_exact_and_row_independent(wide_world, preset):
  """The device check times each preset as a candidate default: each must
  compute what XLA computes and give a token the same bits in a call of 1
  or of 4 tokens (its blocks do not depend on the call's rows); and it
  must be in effect (its sums run in other blocks than the default's)."""
  fused, enc, dec, want, default = wide_world
  with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS[preset]):
    one, chunked = _decode_traced_now(fused, enc, dec, [1] * 4, [3, 1])
  np.testing.assert_allclose(one, want, atol=F32_ATOL)
  np.testing.assert_array_equal(one, chunked)
  assert not np.array_equal(one, default)


@pytest.mark.parametrize("base", ["default", "mma"])
def test_split_heads_computes_the_same_bits(wide_world, base):
  """`Tiles.split_heads` moves the attention projections into a kernel of
  their own over more programs: the same sums, rounded alike, so the same
  logits to the bit (here; on a GPU a dot of other columns may round
  otherwise: the device check's rows_identical and exactness), and it is
  in effect: lowered for CUDA, a layer is 8 kernels, not 6."""
  fused, enc, dec, _, _ = wide_world
  tiles = gpu_tiles.TILE_PRESETS[base]
  got, kernels_a_layer = {}, {}
  for split in (False, True):
    with gpu_tiles.tiles(dataclasses.replace(tiles, split_heads=split)):
      got[split], = _decode_traced_now(fused, enc, dec, [1, 3])
      kernels_a_layer[split] = _triton_calls(fused, 4, 1) - 1  # 1 layer
  assert kernels_a_layer == {False: 6, True: 8}
  np.testing.assert_array_equal(got[False], got[True])


@pytest.mark.parametrize("base", ["default", "mma"])
def test_a_small_layer_in_one_kernel_computes_the_same_bits(wide_world, base):
  """`Tiles.layer_bytes`: a layer whose weights fit runs as one kernel, one
  program per row of the batch, the six kernels' bodies in turn: the same
  logits to the bit, rows independent of the call, and in effect (lowered
  for CUDA, a layer is 1 kernel, not 6) only at or under the threshold."""
  fused, enc, dec, _, _ = wide_world
  tiles = gpu_tiles.TILE_PRESETS[base]
  got, kernels_a_layer = {}, {}
  for limit in (0, 1 << 30):
    with gpu_tiles.tiles(dataclasses.replace(tiles, layer_bytes=limit)):
      got[limit], chunked = _decode_traced_now(fused, enc, dec, [1] * 4, [3, 1])
      np.testing.assert_array_equal(got[limit], chunked)
      kernels_a_layer[limit] = _triton_calls(fused, 4, 1) - 1  # 1 layer
  assert kernels_a_layer == {0: 6, 1 << 30: 1}
  np.testing.assert_array_equal(got[0], got[1 << 30])
  assert gpu.one_kernel_layer(100) is False  # off by default
  with gpu_tiles.tiles(dataclasses.replace(tiles, layer_bytes=100)):
    assert gpu.one_kernel_layer(100) and not gpu.one_kernel_layer(101)


def test_the_kernels_argmax_is_jnp_argmax():
  """`_gpu_pieces.argmax_token` (through `gpu_layers.argmax`), in blocks of
  8 of a row of 37: the first of equal maxima within a block and across
  blocks, the first NaN (above +inf), a row of -inf, the maximum in the
  last block, which overlaps the one before; and at the shipped vocabulary
  (8000) in its blocks of 1024."""
  rows = np.random.default_rng(4).standard_normal((7, 37)).astype(np.float32)
  rows[0, [3, 5]] = 9.0  # equal maxima in one block
  rows[1, [5, 20]] = 9.0  # in two blocks
  rows[2, [4, 30]] = [np.inf, np.nan]  # NaN after +inf
  rows[3, [2, 9]] = np.nan
  rows[4] = -np.inf
  rows[5, 36] = 9.0  # in the last block, which overlaps the one before
  rows[6, 0] = 9.0
  want = np.asarray(jnp.argmax(jnp.asarray(rows), axis=-1))
  assert list(want) == [3, 5, 30, 2, 0, 36, 0]
  np.testing.assert_array_equal(gpu_layers.argmax(jnp.asarray(rows), 8), want)
  wide = np.random.default_rng(5).standard_normal((3, 8000)).astype(np.float32)
  wide[1, [1500, 7990]] = 9.0
  np.testing.assert_array_equal(gpu_layers.argmax(jnp.asarray(wide)),
                                np.argmax(wide, axis=-1))


@pytest.mark.parametrize("tiles", ["six", "layer", "fold"])
def test_decode_argmax_feeds_the_logits_argmax(world, tiles):
  """`decode_argmax(logits)` is `decode_chunk(argmax(logits))` to the bit,
  the argmax taken by XLA before six kernels a layer, and in the first
  kernel of layers run together or folded; on 'xla' too."""
  model, enc, dec = world
  fused = model.prepared_for_decoding("fused")
  logits = np.random.default_rng(6).standard_normal(
      (3, 2, 32)).astype(np.float32)
  logits[0, 1, [4, 7]] = 9.0  # a tie: the first
  chosen = {
      "six": gpu_tiles.Tiles(),
      "layer": gpu_tiles.Tiles(layer_bytes=1 << 30),
      "fold": gpu_tiles.Tiles(fold_bytes=1 << 30)
  }[tiles]
  for m in (fused, model):
    cache = jax.jit(lambda m, e: m.start(e, 6))(m, jnp.asarray(enc))
    cache = jax.jit(lambda m, t, c: m.decode_chunk(t, c)[1])(
        m, jnp.asarray(dec[:, :2]), cache)
    with gpu_tiles.tiles(chosen):
      got, got_cache = jax.jit(lambda m, x, c: m.decode_argmax(x, c))(
          m, jnp.asarray(logits), cache)
      want, want_cache = jax.jit(lambda m, t, c: m.decode_chunk(t, c))(
          m, jnp.argmax(jnp.asarray(logits), -1).astype(jnp.int32), cache)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_cache.keys[1], want_cache.keys[1])
    np.testing.assert_array_equal(got_cache.length, want_cache.length)


def test_small_layers_run_together_in_one_kernel(world):
  """`Tiles.layer_bytes` bounds the layers run together: the longest runs
  of consecutive layers that fit, each one kernel (here both of the tiny
  model's 2 layers: 2 Triton calls with the logits', not 13), with the
  same logits to the bit as six kernels a layer, rows independent of the
  call; a layer over the bound is a run of its own."""
  fused = world[0].prepared_for_decoding("fused")
  enc, dec = world[1], world[2]
  got, kernels = {}, {}
  for limit in (0, 1 << 30):
    with gpu_tiles.tiles(gpu_tiles.Tiles(layer_bytes=limit)):
      # Compiled unoptimized: XLA:CPU 0.11 rounds a 3-row program's last
      # row apart (`test_fused_rows_are_bitwise_independent_of_the_call`).
      got[limit] = _decode_unoptimized(fused, enc, dec, [1] * 4, max_len=4)
      np.testing.assert_array_equal(
          got[limit], _decode_unoptimized(fused, enc, dec, [3, 1], max_len=4))
      kernels[limit] = _triton_calls(fused, 4, 1)
  assert kernels == {0: 6 * 2 + 1, 1 << 30: 1 + 1}
  np.testing.assert_array_equal(got[0], got[1 << 30])
  with gpu_tiles.tiles(gpu_tiles.Tiles(layer_bytes=10)):
    assert gpu.layer_runs([4, 5, 2, 11, 3, 3, 3, 3]) == [
        range(0, 2),
        range(2, 3),
        range(3, 4),
        range(4, 7),
        range(7, 8)
    ]
  assert gpu.layer_runs([4, 5]) == [range(0, 1), range(1, 2)]  # off


@pytest.mark.parametrize("base", ["default", "mma"])
def test_folded_layers_are_exact_and_row_independent(world, base):
  """`Tiles.fold_bytes`: layers whose weights fit run as three kernels,
  the output projections' partial sums carried to the next kernel (here
  from layer to layer, then summed before the logits): XLA's logits, a
  token's same bits in a call of 1 or 4 tokens, not the six kernels' bits
  (the projections summed in another order: in effect), and lowered for
  CUDA 3 kernels a layer; a layer over the threshold, or of one kernel
  (`layer_bytes`), is not folded. The rows compared compiled without
  LLVM's optimizations, as in `test_fused_rows_are_bitwise_independent_of_
  the_call` (JAX 0.11's XLA:CPU: 1 ulp in a batch's last row)."""
  model, enc, dec = world
  fused = model.prepared_for_decoding("fused")
  want, _ = _decode(model, enc, dec, [9])
  tiles = gpu_tiles.TILE_PRESETS[base]
  got, kernels = {}, {}
  for limit in (0, 1 << 30):
    with gpu_tiles.tiles(dataclasses.replace(tiles, fold_bytes=limit)):
      got[limit] = _decode_unoptimized(fused, enc, dec, [1] * 9)
      chunked = _decode_unoptimized(fused, enc, dec, [4, 1, 4])
      kernels[limit] = _triton_calls(fused, 12, 4)
    np.testing.assert_allclose(got[limit], want, atol=F32_ATOL)
    np.testing.assert_array_equal(got[limit], chunked)
  assert kernels == {0: 6 * 2 + 1, 1 << 30: 3 * 2 + 1}
  assert not np.array_equal(got[0], got[1 << 30])
  assert gpu.folded_layer(100) is False  # off by default
  with gpu_tiles.tiles(dataclasses.replace(tiles, fold_bytes=100)):
    assert gpu.folded_layer(100) and not gpu.folded_layer(101)
    with gpu_tiles.tiles(
        dataclasses.replace(tiles, fold_bytes=100, layer_bytes=100)):
      assert not gpu.folded_layer(100)


def test_tensor_core_rows_are_bitwise_independent_of_the_call(world):
  """As above on tensor cores (the 'mma' preset; the dense kernels' blocks
  are 16 wide and more here), whose tile of 16 rows holds a token at
  another place in each call: its sums must not depend on the place."""
  model, enc, dec = world
  fused = model.prepared_for_decoding("fused")
  with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS["mma"]):
    one, chunked = _decode_traced_now(fused, enc, dec, [1] * 9, [4, 1, 4],
                                      max_len=9)
  np.testing.assert_array_equal(one, chunked)


def test_fused_call_writes_only_its_chunks_slots(world):
  model, enc, dec = world
  fused = model.prepared_for_decoding("fused")
  cache = jit_call(fused, "start", jnp.asarray(enc), 12)
  _, cache = jit_call(fused, "decode_chunk", jnp.asarray(dec[:, :3]), cache)
  cache = cache.replace(length=jnp.asarray([3, 1, 2], jnp.int32))
  poisoned = cache.replace(keys=tuple(
      jnp.full_like(k, 7.0) for k in cache.keys))
  _, after = jit_call(fused, "decode_chunk", jnp.asarray(dec[:, 3:5]), poisoned)
  for layer in after.keys:
    layer = np.asarray(layer)
    for row, start in enumerate([3, 1, 2]):
      written = np.zeros(12, bool)
      written[start:start + 2] = True
      assert np.all(layer[row][..., ~written] == 7.0)
      assert not np.any(layer[row][..., written] == 7.0)


def test_fused_tree_call_matches_xla(world):
  """decode_tree (a root, two children, a grandchild) and commit_path, then
  a chunk after the kept path, as on XLA's path."""
  model, enc, dec = world
  parents = np.array([-1, 0, 0, 2], np.int32)
  path, kept = np.array([[0, 2, 3]] * 3, np.int32), np.array([3, 1, 2],
                                                             np.int32)
  out = []
  for m in (model, model.prepared_for_decoding("fused")):
    cache = jit_call(m, "start", jnp.asarray(enc), 12)
    _, cache = jit_call(m, "decode_chunk", jnp.asarray(dec[:, :2]), cache)
    tree, cache = jit_call(m, "decode_tree", jnp.asarray(dec[:, 2:6]),
                           jnp.asarray(parents), cache)
    cache = jit_call(m, "commit_path", cache, jnp.asarray(path),
                     jnp.asarray(kept))
    after, _ = jit_call(m, "decode_chunk", jnp.asarray(dec[:, 6:8]), cache)
    out.append((np.asarray(tree), np.asarray(after)))
  np.testing.assert_allclose(out[1][0], out[0][0], atol=F32_ATOL)
  np.testing.assert_allclose(out[1][1], out[0][1], atol=F32_ATOL)


@pytest.mark.parametrize("path", ["packed", "fused"])
def test_greedy_speculative_equals_the_baseline_on(path):
  """The GPU's paths, whose drafts catch up without a branch (one 2-token
  call each iteration, also when no row lags)."""
  target = _t5x(tiny_config(vocab_size=32), seed=11)
  noisy = jax.tree_util.tree_map(
      lambda x: x + 0.2 * jnp.std(x) * jax.random.normal(
          jax.random.PRNGKey(12), x.shape), target.params)
  target = target.prepared_for_decoding(path)
  draft = T5Model(target.config, noisy).prepared_for_decoding(path)
  assert draft.flat_chunk_cost
  inputs = np.random.default_rng(1).integers(2, 32, (4, 6)).astype(np.int32)
  inputs[2, 3:] = 0
  rng = jax.random.PRNGKey(0)
  base = decoding.temperature_sample(target, inputs, rng, max_decode_length=10)
  spec = decoding.speculative_sample(target, draft, inputs, rng, gamma=3,
                                     max_decode_length=10)
  record = exactness.greedy_identity(base.tokens, spec.tokens)
  assert record["identical"] == 4, record
  assert 0 < spec.statistics()["alpha_hat"] < 1  # Guesses kept and rejected.


@pytest.mark.parametrize("preset", [
    "mma", "mma_fold", "mma_layer", "mma_persistent",
    "tall_mma_persistent_prefetch_fold"
])
def test_greedy_speculative_equals_the_baseline_on_tensor_cores(preset):
  """`Tiles.dot` (the 'mma' preset; 'mma_fold': its layers folded, the
  partial sums carried from layer to layer; 'mma_layer': both layers one
  kernel, which takes the draft's argmax; 'mma_persistent': that kernel's
  stages over many programs; '..._fold': their attentions' output
  projections summed by the next stage, layer after layer) in a model
  wide enough for its
  tiles (width 128, heads of 16): the loops' K-token calls and one-token
  calls agree to the bit, so greedy speculative decoding is the
  baseline."""
  config = tiny_config(vocab_size=32, emb_dim=128, num_heads=2, head_dim=16,
                       mlp_dim=256, num_encoder_layers=1, num_decoder_layers=2)
  target = _t5x(config, seed=13)
  noisy = jax.tree_util.tree_map(
      lambda x: x + 0.3 * jnp.std(x) * jax.random.normal(
          jax.random.PRNGKey(14), x.shape), target.params)
  target = target.prepared_for_decoding("fused")
  draft = T5Model(config, noisy).prepared_for_decoding("fused")
  inputs = np.random.default_rng(2).integers(2, 32, (2, 6)).astype(np.int32)
  rng = jax.random.PRNGKey(0)
  jax.clear_caches()  # The loops traced here, under the preset: not reused.
  try:
    with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS[preset]):
      base = decoding.temperature_sample(target, inputs, rng,
                                         max_decode_length=8)
      spec = decoding.speculative_sample(target, draft, inputs, rng, gamma=3,
                                         max_decode_length=8)
  finally:
    jax.clear_caches()
  record = exactness.greedy_identity(base.tokens, spec.tokens)
  assert record["identical"] == 2, record
  assert 0 < spec.statistics()["alpha_hat"] < 1  # Guesses kept and rejected.


# ---------------------------------------------------------------------------
# What the GPU compiles.
# ---------------------------------------------------------------------------
def _lowered(model: T5Model, cache_len: int, k: int) -> str:
  """`decode_chunk` of k tokens lowered for CUDA here (StableHLO text)."""
  cache = jax.eval_shape(lambda m, e: m.start(e, cache_len), model.unpacked(),
                         jax.ShapeDtypeStruct((1, 16), jnp.int32))
  with gpu.lowering_for_gpu():
    lowered = jax.jit(lambda m, t, c: m.decode_chunk(t, c)).trace(
        model, jax.ShapeDtypeStruct((1, k), jnp.int32),
        cache).lower(lowering_platforms=("cuda",))
  return lowered.as_text()


def _triton_calls(model: T5Model, cache_len: int, k: int) -> int:
  """Triton kernels in `decode_chunk` of k tokens lowered for CUDA here."""
  return _lowered(model, cache_len, k).count(gpu.TRITON_CALL)


@pytest.mark.parametrize("split,prefetch", [(False, False), (True, False),
                                            (True, True)])
def test_layers_over_many_programs_compute_the_same_bits(
    wide_world, split, prefetch):
  """`Tiles.programs`: the one-kernel layer's stages divided among each
  row's programs (3 here: blocks of 2, 6 and 8 do not divide evenly),
  apart by barriers, compute what the layer's own kernels compute on the
  same blocks (with `split_heads`, eight a layer; with `prefetch`, each
  block's first weights, biases or encoder keys loaded apart and its
  contraction's or attention's first block run on them; attention in
  blocks of 2 slots, so that more follow) to the bit, rows independent of
  the call; one kernel a layer lowered for CUDA, its barriers an atomic
  counter and the lowering's only atomics."""
  fused, enc, dec, _, _ = wide_world
  base = gpu_tiles.Tiles(dot=True, columns=16, split_heads=split, slots=2)
  many = dataclasses.replace(base, programs=6,
                             prefetch=prefetch)  # layers of any size
  got = {}
  for name, tiles in (("kernels", base), ("programs", many)):
    with gpu_tiles.tiles(tiles):
      got[name], chunked = _decode_traced_now(fused, enc, dec, [1] * 4, [3, 1])
      np.testing.assert_array_equal(got[name], chunked)
  np.testing.assert_array_equal(got["kernels"], got["programs"])
  assert not gpu.one_kernel_run(1)
  with gpu_tiles.tiles(many):
    assert gpu_layers.programs_per_row(2) == 3
    assert gpu.one_kernel_run(1) and not gpu.folded_layer(1)
    text = _lowered(fused, 4, 1)
  assert text.count(gpu.TRITON_CALL) - 1 == 1  # 1 layer, then the logits
  assert "atomic_rmw" in text


def test_folded_outputs_take_two_barriers_fewer_a_layer(wide_world,
                                                        monkeypatch):
  """`Tiles.fold_outputs`: each attention's stage ends with its output
  projection's partial sums (blocks of (head, 64 columns) here: 6
  programs a row, 2 heads), read by the next stage as it reads the
  residual: 5 barriers in a layer, not 7, still XLA's logits, a token's
  the same bits in a call of 1 or of 3; not where the sums are wider than
  `gpu_layers.FOLD_PARTS_BYTES` a row."""
  fused, enc, dec, want, _ = wide_world
  waits = []
  wait = _gpu_grid.Stages.wait
  monkeypatch.setattr(_gpu_grid.Stages, "wait", lambda self:
                      (waits.append(1), wait(self))[1])
  counted, ones = {}, {}
  # "wide": heads' partial sums over FOLD_PARTS_BYTES a row (XXL's):
  # unfolded, the same bits as without fold_outputs.
  for fold, parts_bytes in ((False, None), (True, None), ("wide", 0)):
    if parts_bytes is not None:
      monkeypatch.setattr(gpu_layers, "FOLD_PARTS_BYTES", parts_bytes)
    waits.clear()
    tiles = gpu_tiles.Tiles(dot=True, columns=16, split_heads=True, slots=2,
                            programs=12, prefetch=True, fold_outputs=bool(fold))
    with gpu_tiles.tiles(tiles):
      one, chunked = _decode_traced_now(fused, enc, dec, [1] * 4, [3, 1])
    np.testing.assert_allclose(one, want, atol=F32_ATOL)
    np.testing.assert_array_equal(one, chunked)
    counted[fold], ones[fold] = len(waits) / 2, one  # k 1 and 3, 1 layer
  assert counted == {False: 7, True: 5, "wide": 7}
  np.testing.assert_array_equal(ones["wide"], ones[False])
  assert [
      gpu_layers.out_columns(*a)
      for a in ((512, 6, 128), (128, 2, 64), (768, 12, 128), (128, 2, 6))
  ] == [32, 16, 128, 64]


def _dots(jaxpr: jex_core.Jaxpr) -> int:
  """How many `dot_general`s `jaxpr` holds, inside its Pallas kernels and
  control flow too."""
  return sum((eqn.primitive.name == "dot_general") +
             sum(_dots(sub)
                 for sub in jex_core.jaxprs_in_params(eqn.params))
             for eqn in jaxpr.eqns)


def _dots_in_call(model, enc, dec) -> int:
  """`_dots` of `model`'s call on dec [B, K] after `start` (traced only,
  under the current tiles)."""
  cache = jax.eval_shape(lambda e: model.start(e, 32), jnp.asarray(enc))
  return _dots(
      jax.make_jaxpr(lambda t, c: model.decode_chunk(t, c))(jnp.asarray(dec),
                                                            cache).jaxpr)


def test_attention_on_tensor_cores_is_exact_and_row_independent():
  """`Tiles.attention_dot`: a head's rows over the cache (20 tokens in
  blocks of 16 slots: the online softmax rescaled across them) and over the encoder (16
  positions, some padding) on tensor cores, in the attention kernels and
  in a run of layers over many programs (its first blocks prefetched,
  the same bits as the kernels'): XLA's logits, a token's the same bits
  in calls of 1 or of 3. In effect: a call's kernels hold more dots with
  it than without (the attention's scores and values), on both. Not
  asserted: other bits than the per-row reductions' (XLA:CPU may sum an
  interpreted dot in a reduction's order: on an AMD EPYC host the bits
  agreed, 2026-11-30)."""
  rng = np.random.default_rng(7)
  enc = rng.integers(2, 32, size=(2, 16)).astype(np.int32)
  enc[1, 12:] = 0  # padding: masked encoder positions
  dec = rng.integers(2, 32, size=(2, 20)).astype(np.int32)
  config = tiny_config(vocab_size=32, emb_dim=128, num_heads=2, head_dim=16,
                       mlp_dim=256, num_encoder_layers=1, num_decoder_layers=1)
  model = _t5x(config, seed=3)
  fused = model.prepared_for_decoding("fused")
  want, _ = _decode(model, enc, dec, [20], max_len=32)
  split = gpu_tiles.Tiles(dot=True, split_heads=True, slots=16, columns=16)
  programs = dataclasses.replace(split, programs=12, prefetch=True)
  got, dots = {}, {}
  for name, tiles in (("rows", split),
                      ("kernels", dataclasses.replace(split,
                                                      attention_dot=True)),
                      ("programs",
                       dataclasses.replace(programs, attention_dot=True))):
    with gpu_tiles.tiles(tiles):
      dots[name] = _dots_in_call(fused, enc, dec[:, :3])
      one, chunked = _decode_traced_now(fused, enc, dec, [1] * 20,
                                        [3] * 6 + [2], max_len=32)
    np.testing.assert_allclose(one, want, atol=F32_ATOL)
    np.testing.assert_array_equal(one, chunked)
    got[name] = one
  with gpu_tiles.tiles(programs):
    dots["programs_rows"] = _dots_in_call(fused, enc, dec[:, :3])
  assert dots["kernels"] > dots["rows"], dots
  assert dots["programs"] > dots["programs_rows"], dots
  np.testing.assert_array_equal(got["kernels"], got["programs"])
  assert gpu_tiles.TILE_PRESETS["mma_split_attention"].attention_dot


def test_programs_are_divided_among_the_rows():
  """Every program resident at once: `Tiles.programs` in all, each row at
  least one; none without it."""
  assert gpu_layers.programs_per_row(1) == 0
  assert gpu_layers.barrier_counters(1) is None
  with gpu_tiles.tiles(gpu_tiles.Tiles(programs=128)):
    assert [gpu_layers.programs_per_row(b) for b in (1, 3, 8, 200)
           ] == [128, 42, 16, 1]
    assert gpu_layers.barrier_counters(8).shape == (8,)


def test_a_fused_cache_carries_the_barriers_counters(wide_world):
  """`DecodeCache.barriers`: a 'fused' model under `Tiles.programs` (its
  own tiles or the context's) starts its cache with [B] int32 counters
  and its calls hand them on (XLA zeroes none a call); without programs,
  or off 'fused', none."""
  fused, enc, dec = wide_world[:3]
  persistent = gpu_tiles.TILE_PRESETS["mma_persistent"]

  def shapes(model):
    cache = jax.eval_shape(lambda e: model.start(e, 6), jnp.asarray(enc))
    _, after = jax.eval_shape(lambda t, c: model.decode_chunk(t, c),
                              jnp.asarray(dec[:, :2]), cache)
    return cache.barriers, after.barriers

  for counters in shapes(fused.with_tiles(persistent)):
    assert (counters.shape, counters.dtype) == ((2,), jnp.int32)
  # A call's counters out are its kernel's, not the ones it was handed.
  model = fused.with_tiles(persistent)
  cache = jax.eval_shape(lambda e: model.start(e, 6), jnp.asarray(enc))
  closed = jax.make_jaxpr(lambda t, c: model.decode_chunk(t, c)[1].barriers)(
      jnp.asarray(dec[:, :2]), cache)
  assert closed.jaxpr.outvars[0] not in closed.jaxpr.invars
  with gpu_tiles.tiles(persistent):
    assert shapes(fused)[1].shape == (2,)
    assert shapes(fused.unpacked()) == (None, None)
  assert shapes(fused) == (None, None)


def test_a_program_past_a_stages_blocks_loads_nothing_early():
  """`Tiles.prefetch`: program p loads its first block (p) early; one past
  the stage's blocks the last block's addresses with its loads masked
  (live False), so that a stage of 8 heads on 128 programs reads 8
  blocks, not 128; where every program has a block, no mask."""
  stages = _gpu_grid.Stages(programs=4, on_gpu=True, prefetch=True)

  def fetch(i, live=None):
    return int(i), None if live is None else bool(live)

  assert [stages.first_loads(fetch, jnp.int32(p), 2) for p in range(4)
         ] == [(0, True), (1, True), (1, False), (1, False)]
  assert [stages.first_loads(fetch, jnp.int32(p), 6) for p in range(4)
         ] == [(p, None) for p in range(4)]


def _t5_small_shaped() -> T5Model:
  """T5 v1.1 small's shapes in bfloat16 on 'fused' (nothing allocated)."""
  config = T5Config(vocab_size=32128, dtype=jnp.bfloat16)
  shapes = jax.tree_util.tree_map(
      lambda s: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16),
      param_shapes(config))
  packed = jax.eval_shape(
      lambda p: decode_paths.pack(p["params"], "fused", config), shapes)
  return T5Model(config, shapes, packed=packed, decode_path="fused")


def test_decoder_lowers_for_cuda_in_six_kernels_a_layer(world):
  model = world[0].prepared_for_decoding("fused")
  assert _triton_calls(model, 12, 4) == 6 * 2 + 1


def test_a_model_traces_its_kernels_under_its_own_tiles(world):
  """`T5Model.with_tiles`: its decode calls' kernels traced under its tiles
  (folded: 3 kernels a layer, not 6), over the context's; part of the jit
  cache's key (a model under other tiles traced anew, not served the
  other's program; the same tiles again, not retraced); kept through
  `prepared_for_decoding`; anything but Tiles refused."""
  model = world[0]
  folded = model.with_tiles(
      gpu_tiles.TILE_PRESETS["mma_fold"]).prepared_for_decoding("fused")
  plain = folded.with_tiles(gpu_tiles.Tiles())
  assert _triton_calls(folded, 12, 4) == 3 * 2 + 1
  with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS["mma_fold"]):
    assert _triton_calls(plain, 12, 4) == 6 * 2 + 1
  traced = []
  step = jax.jit(lambda m, t, c:
                 (traced.append(m.tiles), m.decode_chunk(t, c))[1])
  cache = jax.eval_shape(lambda m, e: m.start(e, 12), model,
                         jax.ShapeDtypeStruct((1, 16), jnp.int32))
  tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  for m in (folded, plain, folded):
    jax.eval_shape(step, m, tokens, cache)
  assert traced == [folded.tiles, plain.tiles]
  with pytest.raises(TypeError, match="with_tiles: tiles='mma_fold'"):
    model.with_tiles("mma_fold")


def test_t5_small_shaped_decoder_lowers_for_cuda():
  """T5 v1.1 small's shapes in bfloat16: blocks of every width, a cache of
  52 slots, a verification call of 4."""
  assert _triton_calls(_t5_small_shaped(), 52, 4) == 6 * 8 + 1


def test_a_folded_decoder_is_its_kernels_alone():
  """Folded (`mma_fold`), a T5-small-shaped call is 3 kernels a layer and
  the logits', with nothing for XLA to gather, select or convert around
  them (each an XLA kernel per call on a GPU) but the last layer's partial
  sums (`gpu_layers.summed`): the kernels gather the embedding and build
  the attention biases and masks from the parameters as they are."""
  with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS["mma_fold"]):
    text = _lowered(_t5_small_shaped(), 52, 4)
  assert text.count(gpu.TRITON_CALL) == 3 * 8 + 1
  outside = [line for line in text.splitlines() if gpu.TRITON_CALL not in line]
  for op in ("stablehlo.gather", "stablehlo.select"):
    assert not [line for line in outside if op in line], op
  converts = [line for line in outside if "stablehlo.convert" in line]
  assert converts and all("tensor<1x4x512x" in line for line in converts)


# ---------------------------------------------------------------------------
# Which path, and the weights beside the parameters.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "backend,devices,head_dim,packs,want",
    [
        ("gpu", 1, 8, False, "packed"),  # "fused": opt-in until a GPU ran it
        ("gpu", 2, 8, False, "xla"),
        ("gpu", 1, 12, False, "packed"),
        ("tpu", 1, 8, False, "xla"),
        ("cpu", 1, 8, False, "xla"),
        ("cpu", 1, 8, True, "cpu_kernel"),
    ])
def test_the_backend_picks_the_path(monkeypatch, backend, devices, head_dim,
                                    packs, want):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  monkeypatch.setattr(jax, "device_count", lambda: devices)
  monkeypatch.setattr(kernels, "packing_enabled", lambda dtype: packs)
  config = tiny_config(head_dim=head_dim)
  assert decode_paths.default_path(config) == want
  assert decode_paths.check(None, config) == want
  # The registry's objects say it: one default at most ('xla' the rest),
  # and the default can run here.
  claimed = [p for p in decode_paths.PATHS.values() if p.is_default(config)]
  assert claimed == ([] if want == "xla" else [decode_paths.PATHS[want]])
  assert decode_paths.default(config) is decode_paths.PATHS[want]
  assert decode_paths.default(config).unavailable(config) is None


def test_the_registry_holds_every_path_by_its_name():
  """Every name in DECODE_PATHS has its one object (which the modules and
  `pack` look up), and an unknown name is refused naming the allowed."""
  paths = decode_paths.PATHS
  assert tuple(paths) == decode_paths.DECODE_PATHS
  assert decode_paths.DECODE_PATHS == ("xla", "cpu_kernel", "packed", "fused")
  for name, path in paths.items():
    assert isinstance(path, decode_paths.DecodePath) and path.name == name
    assert decode_paths.get(name) is path
    hash(path)  # Frozen: a static argument of the packing program.
  # What differs is in the objects: the fused decoder on 'fused' only, the
  # biases behind a barrier on 'packed' only.
  assert [p.name for p in paths.values() if p.fused] == ["fused"]
  assert [p.name for p in paths.values() if p.biases_once] == ["packed"]
  config = tiny_config()
  assert decode_paths.check(None, config) == decode_paths.default(config).name
  assert decode_paths.pack({}, "xla", config) is None
  for call in (lambda: decode_paths.get("triton"),
               lambda: decode_paths.pack({}, "triton", config),
               lambda: decode_paths.check("triton", config)):
    with pytest.raises(
        ValueError, match="='triton': allowed: xla, "
        "cpu_kernel, packed, fused "):
      call()


@pytest.mark.parametrize("path,config,match", [
    ("triton", tiny_config(), "path='triton': allowed: xla, cpu_kernel, "
     "packed, fused"),
    ("fused", tiny_config(head_dim=12), "head_dim=12 is not a power of 2"),
    ("cpu_kernel", tiny_config(dtype=jnp.bfloat16), "needs float32"),
])
def test_a_path_that_cannot_run_is_one_clear_error(path, config, match):
  model = T5Model(config, param_shapes(config))
  with pytest.raises(ValueError, match=match) as raised:
    model.prepared_for_decoding(path)
  assert "\n" not in str(raised.value)


def test_params_keep_t5x_layout_and_paths_round_trip(world):
  model = world[0]
  for path in GPU_PATHS:
    prepared = model.prepared_for_decoding(path)
    assert prepared.decode_path == path and prepared.is_packed
    assert prepared.params is model.params
    assert prepared.prepared_for_decoding(path) is prepared
    layer = prepared.packed["decoder"]["layers_1"]
    e, h, d = 16, 2, 8
    assert layer["self_qkv"].shape == ((e, 3 * h * d) if path == "packed" else
                                       (h, 3, e, d))
    assert prepared.unpacked().decode_path == "xla"
    assert prepared.unpacked().packed is None
  # Float32 kernels stored, bfloat16 computed: the output kernels copied in
  # bfloat16 for the kernels; the others read from params as they are.
  bf16 = T5Model(model.config.replace(dtype=jnp.bfloat16), model.params)
  layer = bf16.prepared_for_decoding("fused").packed["decoder"]["layers_0"]
  assert layer["mlp_wo"].dtype == jnp.bfloat16
  assert "mlp_wo" not in model.prepared_for_decoding(
      "fused").packed["decoder"]["layers_0"]


def test_shared_encoder_draft_takes_the_path(world):
  model = world[0]
  decoder = _t5x(
      tiny_config(vocab_size=32, num_encoder_layers=0, encoder_width=16), 5)
  draft = SharedEncoderModel(encoder=model, decoder=decoder)
  assert draft.prepared_for_decoding("packed").decoder.decode_path == "packed"


# ---------------------------------------------------------------------------
# XLA:GPU options per program.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(gpu.GPU_OPTION_SETS))
def test_gpu_option_sets_are_options_this_jaxlib_knows(name):
  """XLA parses per-program options into its DebugOptions on every backend:
  a misspelt or removed field fails here, not on the GPU."""
  fn = jax.jit(lambda v: v * 2.0, compiler_options=gpu.GPU_OPTION_SETS[name])
  np.testing.assert_array_equal(fn(jnp.ones(3)), 2.0)


def test_loops_take_the_gpu_options_on_a_gpu_only():
  program = programs.LoopProgram(lambda x: x, (), {"xla_cpu_a": True},
                                 {"xla_gpu_b": 1})
  assert program.options("gpu") == {"xla_gpu_b": 1}
  assert program.options("cpu") == {"xla_cpu_a": True}
  assert program.options("tpu") == {}
  assert programs.LoopProgram(lambda x: x,
                              ()).options("gpu") == gpu.GPU_LOOP_OPTIONS


def test_loops_compile_in_place_for_interpreted_kernels(world):
  """The 'fused' path off a GPU runs Pallas' interpreter, whose loop over
  kernel programs carries whole arrays: every loop compiles it with
  region-analysis copy insertion (the default copied them once per
  program: the device check's 8,192-row baseline took 27 s, not 0.3 s).
  The CPU's own paths keep each program's options as they were."""
  model = world[0]
  fused = model.prepared_for_decoding("fused")
  assert fused.interpreted_kernels and not model.interpreted_kernels
  in_place = kernels.CPU_IN_PLACE_COMPILER_OPTIONS
  base = loops.BASELINE_PROGRAM
  assert base.options("cpu", model) == dict(base.cpu_options)
  assert base.options("cpu", fused) == {**base.cpu_options, **in_place}
  assert base.options("gpu", fused) == dict(base.gpu_options)
  assert base.jitted("cpu", fused) is not base.jitted("cpu", model)
  with gpu.lowering_for_gpu():  # Traced for Triton: no interpreter.
    assert not fused.interpreted_kernels


def _control_flow(draft: T5Model, target: T5Model) -> Tuple[int, int]:
  """Branches (`lax.cond`) and loops in the lowered speculative loop."""
  text = jax.jit(
      loops.speculative_loop,
      static_argnames=("gamma", "max_decode_length", "method",
                       "statistics")).lower(
                           target, ModelDrafter(draft),
                           jax.ShapeDtypeStruct(
                               (2, 6), jnp.int32), jax.random.PRNGKey(0),
                           jnp.int32(1), gamma=3, max_decode_length=8,
                           method=sampling.Greedy(), statistics=False,
                           acceptance=decoding.ExactAcceptance()).as_text()
  return (text.count("stablehlo.case") + text.count("stablehlo.if"),
          text.count("stablehlo.while"))


def test_only_the_gpu_paths_draft_without_branches_or_loops(world):
  """A GPU reads a branch's index and a loop's test back to the host: on
  its paths, whose K-token calls cost about one, the draft always feeds
  two tokens to catch up, and its γ-1 later steps are unrolled."""
  model = world[0]
  flags = {
      name: (p.flat_chunk_cost, p.unroll_draft_steps)
      for name, p in decode_paths.PATHS.items()
  }
  assert flags == {
      "xla": (False, False),
      "cpu_kernel": (False, False),
      "packed": (True, True),
      "fused": (True, True)
  }
  packed = model.prepared_for_decoding("packed")
  branches, whiles = _control_flow(model, model)
  # Gone: the catch-up's branch and the draft steps' loop.
  assert _control_flow(packed, model) == (branches - 1, whiles - 1)
  assert branches == 1
