"""Shared test helpers: tiny model configs and the ../shared fixtures.

One set of tiny worlds (`greedy_world`, `distribution_world`): a compiled
decode loop is keyed by the models' configs and the shapes, not by the
weights, so tests that decode these worlds share programs (in a worker,
and across files and runs through the persistent compilation cache)
instead of each compiling its own.
"""
import dataclasses
import functools
import gc
import importlib.util
import os
import pathlib

from specdec_jax.core import environment

# The suite runs on the host CPU even where libtpu is installed (CI
# installs the tpu extra for tests/harness/test_compile_check.py): without this,
# every process that starts JAX would first try to open a TPU (about 0.5 s
# and libtpu's warnings on stderr). libtpu's topology API, which compiles
# for a TPU without one, works under it. Set before jax is imported; an
# explicit JAX_PLATFORMS wins.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The TPU compile tests only compile: let them share libtpu with another
# process that has it open (else libtpu's lockfile refuses them).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Most of the suite's time is XLA compilation. A persistent compilation
# cache serves the programs that tests (and the subprocesses they start,
# which inherit these variables) compile again and again, and every later
# run of the suite on this machine. SPECDEC_JAX_TEST_CACHE=0 turns it off.
if os.environ.get("SPECDEC_JAX_TEST_CACHE", "1") != "0":
  os.environ.setdefault(
      "JAX_COMPILATION_CACHE_DIR",
      os.path.join(environment.cache_dir(), "jax-test-compilation-cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  # A size limit makes JAX lock the cache folder (filelock) for each read
  # and write: the two workers and their subprocesses share it, and an
  # entry read while another process writes it aborts XLA. Without
  # filelock JAX refuses every read and write under a limit: none then
  # (the atomic writes below keep readers safe), as `enable()` does.
  from specdec_jax.files import compilation_cache as _cache  # no jax import
  if importlib.util.find_spec("filelock") is not None:
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE",
                          str(_cache.MAX_SIZE_BYTES))
  _cache.add_missing_atimes(os.environ["JAX_COMPILATION_CACHE_DIR"])
  _cache.remove_stale_partials(os.environ["JAX_COMPILATION_CACHE_DIR"])
  # The suite writes thousands of entries (most of them eager one-op
  # programs): with JAX's eviction scan on every write, a cold run spent
  # most of its compile time listing the folder, the other worker waiting
  # on the lock.
  _cache.skip_eviction_scans()
  # Tests kill runs mid-compile: an entry is renamed into place once whole.
  _cache.atomic_writes()

import jax
import numpy as np
import pytest

from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
T5X_TINY = SHARED / "fixtures" / "t5x_tiny"
MULTI30K = SHARED / "data" / "multi30k"


def require_shared(path: pathlib.Path) -> pathlib.Path:
  """Skips the calling test with a clear message when ../shared lacks path."""
  if not path.exists():
    pytest.skip(f"{path} not found: this test needs the workspace's ../shared "
                "folder next to the checkout (present in CI, absent in a "
                "user's fresh clone).")
  return path


def tiny_config(vocab_size=16, **overrides) -> T5Config:
  """A 2+2-layer float32 T5 v1.1 small enough for fast CPU tests."""
  fields = dict(vocab_size=vocab_size, emb_dim=16, num_heads=2, head_dim=8,
                mlp_dim=32, num_encoder_layers=2, num_decoder_layers=2)
  fields.update(overrides)
  return T5Config(**fields)


def random_model(config: T5Config, seed: int, prepared: bool = True) -> T5Model:
  """Random weights; `prepared` (default) packs the decoder as `run` does, so
  decoder tests go through the CPU kernel (`specdec_jax.core.kernels`) where it
  is built, and through XLA's dot where it is not."""
  model = T5Model(config, init_params(config, jax.random.PRNGKey(seed)))
  return model.prepared_for_decoding() if prepared else model


def perturbed(model: T5Model, scale: float, seed: int) -> T5Model:
  """The same model with Gaussian noise on every parameter: a draft that
  agrees with the target often but not always (prepared like `model`)."""
  base = model.unpacked()
  leaves, treedef = jax.tree_util.tree_flatten(base.params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [
      x + scale * jax.numpy.std(x) * jax.random.normal(k, x.shape)
      for x, k in zip(leaves, keys)
  ]
  noisy_model = T5Model(model.config,
                        jax.tree_util.tree_unflatten(treedef, noisy))
  return noisy_model.prepared_for_decoding() if model.is_packed else (
      noisy_model)


# ---------------------------------------------------------------------------
# The tiny worlds.
# ---------------------------------------------------------------------------
GREEDY_VOCAB = 32
GREEDY_LEN = 14  # max_decode_length of the greedy world's decodes
DIST_VOCAB = 5
DIST_STEPS = 3  # the distribution world enumerates the first 3 tokens
DIST_SAMPLES = 12_000
DIST_EOS = 1


@dataclasses.dataclass(frozen=True)
class GreedyWorld:
  """A V = 32 target, a noisy copy of it as the draft (it agrees with the
  target on many but not all tokens), their inputs [4, 6] (row 2 padded)
  and an EOS id that ends one row of the target's greedy output early
  (<= 3 tokens) and another late (>= GREEDY_LEN - 3) or never."""
  target: T5Model
  draft: T5Model
  inputs: np.ndarray
  eos: int

  def baseline(self):
    """The target's greedy output alone (GREEDY_LEN tokens)."""
    from specdec_jax.core import decoding  # pylint: disable=g-import-not-at-top
    return decoding.temperature_sample(self.target, self.inputs,
                                       jax.random.PRNGKey(0),
                                       max_decode_length=GREEDY_LEN,
                                       eos_id=self.eos)


@functools.lru_cache(maxsize=None)
def greedy_world() -> GreedyWorld:
  from specdec_jax.core import decoding  # pylint: disable=g-import-not-at-top
  target = random_model(tiny_config(vocab_size=GREEDY_VOCAB), seed=11)
  rng = np.random.default_rng(1)
  inputs = rng.integers(2, GREEDY_VOCAB, size=(4, 6)).astype(np.int32)
  inputs[2, 3:] = 0
  # The EOS id: from the target's own greedy output with no EOS.
  free = np.asarray(
      decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                  max_decode_length=GREEDY_LEN,
                                  eos_id=-1).tokens)

  def first(tok, row):
    hits = np.flatnonzero(free[row] == tok)
    return hits[0] if hits.size else GREEDY_LEN

  for tok in range(2, GREEDY_VOCAB):
    firsts = [first(tok, r) for r in range(4)]
    if min(firsts) <= 2 and max(firsts) >= GREEDY_LEN - 4:
      return GreedyWorld(target, perturbed(target, scale=0.2, seed=12), inputs,
                         tok)
  raise AssertionError("no token ends one row early and another late")


@dataclasses.dataclass(frozen=True, eq=False)
class DistributionWorld:
  """A V = 5 target whose distribution over its first DIST_STEPS tokens
  for one input [1, 4] is enumerated exactly from its logits."""
  target: T5Model
  inputs: np.ndarray

  def rows(self) -> np.ndarray:
    """The input repeated DIST_SAMPLES times: one decode is all the draws."""
    return np.repeat(self.inputs, DIST_SAMPLES, axis=0)

  def pvalue(self, tokens, method, impossible_ok=False) -> float:
    """The chi-square p-value of the rows of `tokens` [N, DIST_STEPS]
    against the target's distribution under `method` (`sampling.Sampling`).

    A row of probability 0 fails the test, unless impossible_ok (a rule
    known to be wrong: such rows are left out and the rest compared).
    """
    import decoding_helpers  # pylint: disable=g-import-not-at-top
    exact = _exact_distribution(method.temperature, method.top_k, method.top_p)
    observed, expected = decoding_helpers.count_sequences(
        tokens, exact, impossible_ok)
    return decoding_helpers.chisquare_pvalue(observed, expected)


@functools.lru_cache(maxsize=None)
def distribution_world() -> DistributionWorld:
  target = random_model(tiny_config(vocab_size=DIST_VOCAB), seed=21)
  return DistributionWorld(target, np.array([[3, 4, 2, 1]], np.int32))


@functools.lru_cache(maxsize=None)
def _exact_distribution(temperature, top_k, top_p):
  """{first DIST_STEPS tokens (0-padded after EOS): probability} of the
  distribution world's target (`model_sequence_distribution`)."""
  import decoding_helpers  # pylint: disable=g-import-not-at-top
  world = distribution_world()
  exact = decoding_helpers.model_sequence_distribution(
      world.target, world.inputs, (temperature, top_k, top_p), DIST_VOCAB,
      DIST_STEPS, DIST_EOS)
  assert abs(sum(exact.values()) - 1.0) < 1e-5
  assert len(exact) >= 8, exact  # A distribution worth testing.
  return exact


_JITTED = {}


def jit_call(model, name: str, /, *args, **kwargs):
  """`model.<name>(*args, **kwargs)` compiled as one program: the model and
  the arrays traced; Python ints among args, and keywords that are not
  arrays (γ, a sampling method), static.

  Eagerly, a model call dispatches each of its hundreds of operations as a
  program of its own, compiled once per shape: a cold run of the suite
  spent minutes on them. One program per method and shapes instead.
  """
  static = tuple(i + 1 for i, a in enumerate(args) if isinstance(a, int))
  fixed = {
      k: v
      for k, v in kwargs.items()
      if not isinstance(v, (jax.Array, np.ndarray))
  }
  traced = {k: v for k, v in kwargs.items() if k not in fixed}
  key = (name, static, tuple(sorted(fixed.items(), key=lambda kv: kv[0])),
         tuple(sorted(traced)))
  if key not in _JITTED:
    _JITTED[key] = jax.jit(
        lambda m, *a, **t: getattr(m, name)(*a, **t, **fixed),
        static_argnums=static)
  return _JITTED[key](model, *args, **traced)


def free_compiled_programs() -> None:
  """Drops every compiled program this process holds (`jax.clear_caches`,
  `jit_call`'s wrappers).

  XLA:CPU maps each loaded program's code into a few memory regions of its
  own, and a jit cache keeps every program it ever compiled. A test worker
  that runs half the suite held ~65,000 regions, Linux's default limit
  (vm.max_map_count = 65530); the next program it loaded from the cache
  then segfaulted inside XLA (a "worker crashed" in CI).
  """
  _JITTED.clear()
  jax.clear_caches()
  gc.collect()


@pytest.fixture(autouse=True, scope="module")
def _free_programs_after_module():
  """Each test file's programs are freed when it ends: a later file that
  needs one again reads it from the persistent cache."""
  yield
  free_compiled_programs()


@pytest.fixture
def clean_gin():
  """gin's global configuration cleared before and after the test."""
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture
def tiny(tmp_path):
  """local_tiny.gin parsed, not finalized, with OUTPUT_DIR = tmp_path: the
  argument checks' configuration (use with `clean_gin`)."""
  # pylint: disable-next=g-import-not-at-top
  from specdec_jax.config import gin_utils
  gin_utils.parse_gin(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"],
                      finalize=False)


@pytest.fixture
def no_load():
  """`Providers` for `run`/`sweep` that fail the test if a model is loaded
  or a decoder built: pass it as `providers=no_load`."""
  from specdec_jax.experiment import plan  # pylint: disable=g-import-not-at-top

  def fail(*args, **kwargs):
    raise AssertionError("loaded a model / decoded before validating")

  return plan.Providers(load_model=fail, decoders=fail)
