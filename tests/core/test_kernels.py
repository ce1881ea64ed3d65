"""The CPU matmul kernel (`specdec_jax.core.kernels`) and packed decoder weights.

What must hold for decoding to stay exact through the kernel:
* it computes x @ w to float32 rounding of XLA's dot, for every row count
  1..16 and shapes that are not multiples of the panel width;
* a row's result does not depend on how many rows share the call (so a
  (γ+1)-token verification call and one-token calls give the same logits
  rows, bit for bit, for every matmul);
* a packed model decodes like the unpacked one, and greedy speculative
  output equals the greedy baseline through it (the decoder-level
  distribution tests in test_decoding.py run on packed models too, since
  conftest.random_model prepares them);
* without the kernel (no compiler, or switched off) nothing is packed and
  XLA's dot is used.
"""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import environment
from specdec_jax.core import kernels

from conftest import REPO
from conftest import jit_call
from conftest import random_model
from conftest import tiny_config
from file_helpers import no_hang
from file_helpers import special

needs_kernel = pytest.mark.skipif(
    not kernels.available(),
    reason="the CPU kernel could not be built here (no C++ compiler?); "
    "decoding falls back to XLA's dot, tested elsewhere")


@jax.jit
def _forward(model, inputs, tokens, targets):
  """The teacher-forced forward pass of `model`, compiled as one program."""
  return model.module.apply(model.variables, inputs, tokens, targets)


def _matmul(x, w):
  """x [M, D] @ w [D, N] through the kernel on the packed w."""
  return jax.jit(kernels.dense, static_argnums=2)(x, kernels.pack(w),
                                                  w.shape[1])


@needs_kernel
@pytest.mark.parametrize("d_size,n_size", [(37, 19), (128, 333)])
def test_kernel_matches_xla_dot_for_every_row_count(d_size, n_size):
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((d_size, n_size)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((kernels.MAX_ROWS, d_size)), jnp.float32)
  reference = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  full = np.asarray(_matmul(x, w))
  # float32 rounding of a D-term sum, relative to the terms' magnitude.
  scale = np.abs(np.asarray(x))[:, :, None] * np.abs(np.asarray(w))[None]
  tolerance = 4 * d_size * np.finfo(np.float32).eps * scale.sum(axis=1)
  assert np.all(np.abs(full - reference) <= tolerance)
  for rows in (1, 2, 3, 4, 5, 6, 7, 8, 13, kernels.MAX_ROWS):
    for first in (0, kernels.MAX_ROWS - rows):
      part = np.asarray(_matmul(x[first:first + rows], w))
      # Bit-identical rows whatever the number of rows in the call.
      np.testing.assert_array_equal(part, full[first:first + rows])


@needs_kernel
@pytest.mark.parametrize("d_size,n_size", [(37, 19), (256, 1000)])
def test_every_instruction_set_gives_the_same_bits(d_size, n_size):
  # (256, 1000): 63 panels (a partial one, and a remainder after every tile
  # width) over two threads; 37 x 19: one thread, a partial second panel.
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.standard_normal((d_size, n_size)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((20, d_size)), jnp.float32)
  widest = kernels.instruction_set()
  results = {}
  try:
    for isa in kernels.INSTRUCTION_SETS:
      used = kernels.instruction_set(isa)
      results[used] = [
          np.asarray(_matmul(x[:rows], w))
          for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 20)
      ]
  finally:
    kernels.instruction_set(widest)
  assert "portable" in results and len(results) >= 2, results.keys()
  for isa, outputs in results.items():
    for got, want in zip(outputs, results["portable"]):
      np.testing.assert_array_equal(got, want, err_msg=isa)


def test_instruction_set_cap_is_checked():
  with pytest.raises(ValueError, match="avx512"):
    kernels.instruction_set("sse")


@needs_kernel
def test_pack_unpack_round_trip_and_zero_padding():
  w = jnp.arange(5 * 21, dtype=jnp.float32).reshape(5, 21)
  panels = kernels.pack(w)
  assert panels.shape == (2, 5, kernels.PANEL)
  np.testing.assert_array_equal(panels[1, :, 21 - 16:], 0.0)
  np.testing.assert_array_equal(kernels.unpack(panels, 21), w)


@needs_kernel
def test_more_rows_than_the_kernel_takes_use_the_packed_einsum():
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.standard_normal((24, 40)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((3, 7, 24)), jnp.float32)  # 21 rows
  y = kernels.dense(x, kernels.pack(w), 40)
  np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_prepared_model_decodes_like_the_unpacked_one():
  config = tiny_config(vocab_size=50, emb_dim=24)
  plain = random_model(config, seed=0, prepared=False)
  packed = plain.prepared_for_decoding()
  assert packed.is_packed and not plain.is_packed
  assert packed.prepared_for_decoding() is packed
  # The panels live beside the T5X-layout parameters, which stay as they
  # were: saving or converting `params` never sees a packed weight.
  assert packed.params is plain.params
  assert packed.unpacked().packed is None
  panel_leaves = jax.tree_util.tree_leaves(packed.packed)
  assert panel_leaves and all(leaf.ndim == 3 for leaf in panel_leaves)
  assert all(
      leaf.ndim != 3 for leaf in jax.tree_util.tree_leaves(packed.params))
  inputs = jnp.asarray([[5, 17, 42, 9, 1, 0], [7, 3, 1, 0, 0, 0]], jnp.int32)
  tokens = jnp.asarray([[0, 4, 9, 11, 2], [0, 8, 8, 30, 6]], jnp.int32)
  logits = {}
  for name, model in (("plain", plain), ("packed", packed)):
    cache = jit_call(model, "start", inputs, 8)
    logits[name], _ = jit_call(model, "decode_chunk", tokens, cache)
  np.testing.assert_allclose(logits["packed"], logits["plain"], atol=2e-5,
                             rtol=2e-5)
  # The teacher-forced forward pass (more rows) works on packed weights too.
  forward = _forward(packed, inputs, tokens, tokens + 1)
  np.testing.assert_allclose(forward, _forward(plain, inputs, tokens,
                                               tokens + 1), atol=2e-5,
                             rtol=2e-5)


@needs_kernel
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_equals_baseline_through_the_kernel(gamma):
  config = tiny_config(vocab_size=40, emb_dim=32)
  target = random_model(config, seed=3)
  draft = random_model(config.replace(num_decoder_layers=1), seed=4)
  assert target.is_packed and draft.is_packed
  inputs = np.random.default_rng(2).integers(2, 40, (3, 9)).astype(np.int32)
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=14, eos_id=-1)
  spec = decoding.speculative_sample(target, draft, inputs,
                                     jax.random.PRNGKey(1), gamma=gamma,
                                     max_decode_length=14, eos_id=-1)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  # The unpacked target (XLA's dot) gives the same greedy tokens here.
  plain = decoding.temperature_sample(target.unpacked(), inputs,
                                      jax.random.PRNGKey(0),
                                      max_decode_length=14, eos_id=-1)
  np.testing.assert_array_equal(plain.tokens, base.tokens)


def test_switched_off_kernel_packs_nothing(monkeypatch):
  monkeypatch.setenv("SPECDEC_JAX_CPU_KERNEL", "0")
  kernels.available.cache_clear()
  try:
    assert not kernels.available()
    model = random_model(tiny_config(), seed=0)
    assert not model.is_packed
  finally:
    monkeypatch.delenv("SPECDEC_JAX_CPU_KERNEL")
    kernels.available.cache_clear()


def test_missing_compiler_is_a_clear_error_and_a_fallback(
    monkeypatch, tmp_path):
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path))
  monkeypatch.setattr(kernels, "_compiler", lambda: None)
  with pytest.raises(RuntimeError, match="no C.. compiler"):
    kernels.build()
  kernels.available.cache_clear()
  try:
    assert not kernels.available()
    assert not kernels.packing_enabled()
  finally:
    kernels.available.cache_clear()


def test_failed_compilation_reports_the_compiler_output(monkeypatch, tmp_path):
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path))
  monkeypatch.setattr(kernels, "_compiler", lambda: "false")
  with pytest.raises(RuntimeError, match="compiling cpu_matmul.cc failed"):
    kernels.build()
  # Nothing half-written is left where a later build would find it.
  assert not list(tmp_path.rglob("*.so"))


def test_kernel_source_is_package_data():
  """pyproject.toml ships cpu_matmul.cc: it is compiled where it is used."""
  tomllib = pytest.importorskip("tomllib")  # Python 3.11+.
  pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
  globs = pyproject["tool"]["setuptools"]["package-data"][
      "specdec_jax.core.kernels"]
  assert any(kernels._SOURCE.match(g) for g in globs)  # pylint: disable=protected-access


@pytest.fixture
def fresh_available():
  """`kernels.available` computed anew in the test, and after it."""
  kernels.available.cache_clear()
  yield
  kernels.available.cache_clear()


@pytest.mark.parametrize("text", ["false", "off", "no", "0"])
def test_the_switch_reads_every_spelling_of_off(monkeypatch, text,
                                                fresh_available):
  monkeypatch.setenv("SPECDEC_JAX_CPU_KERNEL", text)
  assert not kernels.available()


@pytest.mark.parametrize("name,value", [("SPECDEC_JAX_KERNEL_ISA", "avx9000"),
                                        ("SPECDEC_JAX_CPU_KERNEL", "maybe"),
                                        ("SPECDEC_JAX_CACHE", "<file>")])
def test_a_bad_kernel_variable_is_refused_not_a_silent_fallback(
    monkeypatch, tmp_path, capsys, fresh_available, name, value):
  """Issue 59: avx9000 warned and ran XLA's dot; a SPECDEC_JAX_CACHE that
  is a file turned the kernel off silently. Now: `BadEnvironment` naming
  the variable, and the command exits 2 with one line (nothing built)."""
  if value == "<file>":
    value = str(tmp_path / "file")
    (tmp_path / "file").write_text("x")
  monkeypatch.setenv(name, value)
  monkeypatch.setattr(kernels, "build", _not_built)
  with pytest.raises(environment.BadEnvironment, match=name):
    kernels.available()
  assert kernels.main() == 2
  out, err = capsys.readouterr()
  assert not out
  assert err.startswith(f"specdec_jax.core.kernels: error: {name}=")
  assert len(err.splitlines()) == 1


def _not_built(force=False):
  raise AssertionError("built with a bad variable")


def test_the_kernel_command_fails_when_the_kernel_cannot_load(
    monkeypatch, capsys):
  """Issue 59: it printed "(not loadable)" and exited 0."""
  monkeypatch.delenv("SPECDEC_JAX_CPU_KERNEL", raising=False)
  monkeypatch.setattr(kernels, "build",
                      lambda force=False: pathlib.Path("/cache/lib.so"))
  monkeypatch.setattr(kernels, "available", lambda: False)
  monkeypatch.setitem(kernels._loaded, "error", "undefined symbol")  # pylint: disable=protected-access
  assert kernels.main() == 1
  err = capsys.readouterr().err
  assert "/cache/lib.so was built but cannot be loaded (undefined symbol)" in (
      err)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_cached_library_record_that_is_special_is_rebuilt_not_read(
    tmp_path, kind):
  """`_intact` checks the record and the library are regular files before
  reading them: a FIFO blocked the build, /dev/zero filled the memory."""
  library = tmp_path / "libspecdec_cpu_x.so"
  library.write_bytes(b"\x7fELF")
  record = tmp_path / "libspecdec_cpu_x.json"
  special(record, kind)
  with no_hang():
    assert not kernels._intact(library)  # pylint: disable=protected-access
  record.unlink()
  record.write_text('{"bytes": 4, "sha256": "x"}')
  library.unlink()
  library.symlink_to("/dev/zero")
  assert not kernels._intact(library)  # pylint: disable=protected-access
