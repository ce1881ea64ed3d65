"""Exactness of the decoders with T5 models.

* Greedy identity: speculative output == target-alone output, token for
  token, for γ ∈ {1, 3, 7}, batch 1 and 4, EOS early and late.
* Distribution: at temperature 1, with top-k, with top-p, at temperature
  0.7 with top-p 0.9, and with top-k and top-p together, the joint
  distribution of the first 3 generated tokens, over thousands of samples,
  matches the target's exact distribution computed by enumeration from its
  logits with a float64 sort-based reference of the standardization
  (chi-square, significance 1e-3, fixed seeds).
* Bad arguments raise ValueError before anything is compiled.
* The T5 cache refuses to overflow.
* The custom drafter of docs/extending.md works.

The loop's bookkeeping case by case (scripted stubs, hand-written
expectations) is in test_speculative_loop.py.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import kernels
from specdec_jax.core import models
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.decoding import loops

from conftest import DIST_EOS
from conftest import DIST_STEPS
from conftest import GREEDY_LEN
from conftest import REPO
from conftest import distribution_world
from conftest import greedy_world
from conftest import random_model
from conftest import tiny_config

SIGNIFICANCE = 1e-3

# ---------------------------------------------------------------------------
# Greedy identity.
# ---------------------------------------------------------------------------
MAX_LEN = GREEDY_LEN


@pytest.fixture(scope="module")
def greedy_setup():
  """conftest's greedy world: EOS ends one row early and another late, and
  the draft agrees with the target on many but not all tokens, so both the
  accept and the reject paths are exercised."""
  world = greedy_world()
  return world.target, world.draft, world.inputs, world.eos


@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_greedy_speculative_equals_baseline(greedy_setup, gamma):
  target, draft, inputs, eos = greedy_setup
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=MAX_LEN, eos_id=eos)
  lengths = np.asarray(base.lengths)
  assert lengths.min() <= 3 and lengths.max() >= MAX_LEN - 3, lengths
  spec = decoding.speculative_sample(target, draft, inputs,
                                     jax.random.PRNGKey(1), gamma=gamma,
                                     max_decode_length=MAX_LEN, eos_id=eos)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)
  stats_ = spec.statistics()
  hist = np.asarray(stats_["accepted_histogram"])
  # Both acceptances and rejections happened, and fewer target calls were
  # needed than tokens generated.
  assert hist[0] > 0 and hist[1:].sum() > 0, hist
  assert stats_["target_calls"] < stats_["tokens_generated"]
  assert np.all(np.asarray(spec.target_calls) <= lengths)
  assert 0.0 < stats_["alpha_hat"] < 1.0
  np.testing.assert_array_equal(
      np.asarray(spec.accepted_histogram).sum(1), spec.target_calls)


def test_greedy_batch_of_one_and_self_draft(greedy_setup):
  target, draft, inputs, eos = greedy_setup
  for row in range(2):
    one = inputs[row:row + 1]
    base = decoding.temperature_sample(target, one, jax.random.PRNGKey(0),
                                       max_decode_length=MAX_LEN, eos_id=eos)
    spec = decoding.speculative_sample(target, draft, one,
                                       jax.random.PRNGKey(2), gamma=3,
                                       max_decode_length=MAX_LEN, eos_id=eos)
    np.testing.assert_array_equal(spec.tokens, base.tokens)
  # The target drafting for itself accepts everything: γ+1 tokens per call.
  spec = decoding.speculative_sample(target, target, inputs[:1],
                                     jax.random.PRNGKey(2), gamma=3,
                                     max_decode_length=MAX_LEN, eos_id=-1)
  assert spec.statistics()["alpha_hat"] == 1.0
  assert int(spec.target_calls[0]) == int(np.ceil(MAX_LEN / 4))


def test_new_inputs_and_eos_do_not_recompile(greedy_setup):
  """Same shapes, other token values / eos_id / rng: no new compilation."""
  target, draft, inputs, eos = greedy_setup
  other = (inputs + 3) % 32
  for fn, kwargs in ((decoding.temperature_sample, {}),
                     (decoding.speculative_sample, dict(drafter=draft,
                                                        gamma=3))):
    jitted = (loops.BASELINE_PROGRAM if fn is decoding.temperature_sample else
              loops.SPECULATIVE_PROGRAM).jitted()

    def run(x, e, seed, fn=fn, kwargs=kwargs):
      return fn(target, encoder_input_tokens=x, rng=jax.random.PRNGKey(seed),
                max_decode_length=MAX_LEN, eos_id=e, **kwargs).tokens

    jax.block_until_ready(run(inputs, eos, 0))
    before = jitted._cache_size()
    jax.block_until_ready(run(other, -1, 1))
    jax.block_until_ready(run(other, eos + 1, 2))
    assert jitted._cache_size() == before, fn.__name__


def test_decoders_bind_once_and_share_programs(greedy_setup):
  """`baseline_decoder` / `speculative_decoder` (`LoopProgram.bound`): the
  samplers' tokens from a host batch of int64; a decoder of the same
  structure (other weights, another temperature) runs the compiled
  program; another γ (static) gets a program of its own."""
  target, draft, inputs, eos = greedy_setup
  rng, hot = jax.random.PRNGKey(0), sampling.Sampling(temperature=0.7)
  expected = decoding.temperature_sample(target, inputs, rng,
                                         max_decode_length=MAX_LEN,
                                         eos_id=eos).tokens
  batch = np.asarray(inputs, np.int64)

  def speculative(model, method, gamma=3):
    return decoding.speculative_decoder(model, draft, gamma=gamma,
                                        max_decode_length=MAX_LEN,
                                        method=method, eos_id=eos)

  base = decoding.baseline_decoder(target, max_decode_length=MAX_LEN,
                                   method=sampling.Greedy(), eos_id=eos)
  np.testing.assert_array_equal(base(batch, rng).tokens, expected)
  np.testing.assert_array_equal(
      speculative(target, sampling.Greedy())(batch, rng).tokens, expected)
  jax.block_until_ready(speculative(target, hot)(inputs, rng))
  programs = dict(loops.SPECULATIVE_PROGRAM._bound)
  compiled = {k: p._cache_size() for k, p in programs.items()}
  heavier = target.replace(params=jax.tree.map(lambda w: w * 2, target.params))
  # Other weights, another temperature: the same programs, nothing compiled.
  jax.block_until_ready(
      speculative(heavier, hot.replace(temperature=1.3))(inputs, rng))
  assert loops.SPECULATIVE_PROGRAM._bound == programs
  assert {k: p._cache_size() for k, p in programs.items()} == compiled
  jax.block_until_ready(speculative(target, hot, gamma=2)(inputs, rng))
  assert len(loops.SPECULATIVE_PROGRAM._bound) == len(programs) + 1


# ---------------------------------------------------------------------------
# Distribution exactness at temperature > 0.
# ---------------------------------------------------------------------------
STEPS = DIST_STEPS
EOS = DIST_EOS


@pytest.mark.parametrize(
    "temperature,top_k,top_p,gamma",
    [
        (1.0, 0, 1.0, 3),
        (0.8, 3, 1.0, 2),
        (1.0, 0, 0.8, 4),
        # Temperature != 1 with top-p, and top-k with top-p: a verifier and a
        # sampler applying them in different orders would disagree here.
        (0.7, 0, 0.9, 3),
        (0.7, 3, 0.9, 2),
    ])
def test_speculative_matches_target_distribution(temperature, top_k, top_p,
                                                 gamma):
  """conftest's distribution world; a random draft of its config. Its
  scaled-up logits make the distributions far from uniform (top-k/top-p
  then cut real mass) and far from the draft's."""
  world = distribution_world()
  draft = random_model(world.target.config, seed=22)
  out = decoding.speculative_sample(
      world.target, draft, world.rows(),
      jax.random.PRNGKey(int(temperature * 10) + top_k + gamma), gamma=gamma,
      max_decode_length=STEPS, temperature=temperature, top_k=top_k,
      top_p=top_p, eos_id=EOS)
  method = sampling.Sampling(temperature, top_k=top_k, top_p=top_p)
  assert world.pvalue(out.tokens, method) > SIGNIFICANCE
  # The draft really disagrees with the target, so rejections happened.
  alpha = out.statistics()["alpha_hat"]
  assert 0.1 < alpha < 0.95, alpha


def test_baseline_matches_target_distribution():
  """The baseline sampler itself samples the enumerated distribution."""
  world = distribution_world()
  out = decoding.temperature_sample(world.target, world.rows(),
                                    jax.random.PRNGKey(5),
                                    max_decode_length=STEPS, temperature=1.0,
                                    eos_id=EOS)
  assert world.pvalue(out.tokens, sampling.Sampling(1.0)) > SIGNIFICANCE


# ---------------------------------------------------------------------------
# Bad input: ValueError naming the argument, before any compilation.
# ---------------------------------------------------------------------------
@pytest.fixture
def no_compile(monkeypatch):

  def fail(*args, **kwargs):
    raise AssertionError("compiled/ran before validating arguments")

  monkeypatch.setattr(loops, "SPECULATIVE_PROGRAM", fail)
  monkeypatch.setattr(loops, "BASELINE_PROGRAM", fail)


@pytest.mark.parametrize("kwargs,name", [
    (dict(gamma=0), "gamma"),
    (dict(gamma=2.0), "gamma"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(max_decode_length=0), "max_decode_length"),
])
def test_speculative_rejects_bad_arguments(no_compile, kwargs, name):
  config = tiny_config(vocab_size=8)
  model = random_model(config, seed=0)
  args = dict(gamma=2, max_decode_length=4)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    decoding.speculative_sample(model, model, np.ones((1, 3), np.int32),
                                jax.random.PRNGKey(0), **args)


def test_vocab_mismatch_and_baseline_args_rejected(no_compile):
  target = random_model(tiny_config(vocab_size=8), seed=0)
  draft = random_model(tiny_config(vocab_size=9), seed=0)
  with pytest.raises(ValueError, match="vocab_size"):
    decoding.speculative_sample(target, draft, np.ones((1, 3), np.int32),
                                jax.random.PRNGKey(0), gamma=2,
                                max_decode_length=4)
  with pytest.raises(ValueError, match="max_decode_length"):
    decoding.temperature_sample(target, np.ones((1, 3), np.int32),
                                jax.random.PRNGKey(0), max_decode_length=0)
  with pytest.raises(ValueError, match="temperature"):
    decoding.temperature_sample(target, np.ones((1, 3), np.int32),
                                jax.random.PRNGKey(0), max_decode_length=3,
                                temperature=-0.5)
  with pytest.raises(ValueError, match="encoder_input_tokens"):
    decoding.temperature_sample(target, np.ones((3,), np.int32),
                                jax.random.PRNGKey(0), max_decode_length=3)


@pytest.fixture(scope="module")
def model8():
  return random_model(tiny_config(vocab_size=8), seed=0)


def _decoders(model):
  """Both decoders with valid defaults; kwargs override."""

  def spec(inputs, rng, **kwargs):
    return decoding.speculative_sample(
        model, model, inputs, rng, **{
            "gamma": 2,
            "max_decode_length": 4,
            **kwargs
        })

  def base(inputs, rng, **kwargs):
    return decoding.temperature_sample(model, inputs, rng, **{
        "max_decode_length": 4,
        **kwargs
    })

  return {"speculative": spec, "baseline": base}


GOOD = np.ones((1, 3), np.int32)


@pytest.mark.parametrize("decoder", ["speculative", "baseline"])
@pytest.mark.parametrize(
    "inputs,rng,match", [
        (np.ones((1, 3), np.float32), jax.random.PRNGKey(0),
         r"encoder_input_tokens must have an integer dtype.*float32"),
        (np.ones((1, 3), bool), jax.random.PRNGKey(0),
         r"encoder_input_tokens must have an integer dtype"),
        (np.array([[2, 8, 1]], np.int32), jax.random.PRNGKey(0),
         r"encoder_input_tokens must hold token ids in \[0, 8\).*got 8 at \[0, 1\]"
        ),
        (np.array([[2, -1, 0]], np.int64), jax.random.PRNGKey(0),
         r"encoder_input_tokens .*got -1"),
        (jnp.array([[3, 30]], jnp.int32), jax.random.PRNGKey(0),
         r"encoder_input_tokens .*got 30"),
        (GOOD, 42, r"rng must be a single JAX PRNG key.*got 42"),
        (GOOD, None, r"rng must be .*got None"),
        (GOOD, np.zeros(2, np.float32), r"rng must be .*float32"),
        (GOOD, jax.random.split(jax.random.PRNGKey(0), 2), r"rng must be"),
        (GOOD, jax.random.split(jax.random.key(0), 2), r"rng must be"),
    ], ids=[
        "float", "bool", "id>=vocab", "negative-id", "jax-array-id", "rng=42",
        "rng=None", "rng-float", "rng-batch", "typed-key-batch"
    ])
def test_bad_inputs_and_rng_rejected_before_compiling(no_compile, model8,
                                                      decoder, inputs, rng,
                                                      match):
  with pytest.raises(ValueError, match=match):
    _decoders(model8)[decoder](inputs, rng)


@pytest.mark.parametrize("decoder", ["speculative", "baseline"])
@pytest.mark.parametrize(
    "rng", [jax.random.PRNGKey(0), jax.random.key(0)], ids=["raw", "typed"])
def test_valid_inputs_and_keys_reach_the_compiled_loop(no_compile, model8,
                                                       decoder, rng):
  """Both kinds of key and the whole id range pass the checks (and only
  then reach the jitted loop, here a stub that raises)."""
  inputs = np.array([[0, 7, 1]], np.uint8)
  with pytest.raises(AssertionError, match="compiled/ran"):
    _decoders(model8)[decoder](inputs, rng)


@pytest.mark.parametrize("kwargs,match", [
    (dict(method=sampling.Greedy(),
          temperature=1.0), "either method or temperature"),
    (dict(method="greedy"), "method must be a sampling.SamplingMethod"),
    (dict(temperature=float("inf")), "temperature must be a finite"),
    (dict(temperature=1.0, top_p=float("nan")), "top_p"),
    (dict(eos_id=1.5), "eos_id"),
    (dict(acceptance="exact"), "acceptance must be a decoding.AcceptanceRule"),
    (dict(statistics="yes"), "statistics must be True or False"),
])
def test_speculative_rejects_bad_settings(no_compile, model8, kwargs, match):
  with pytest.raises(ValueError, match=match):
    _decoders(model8)["speculative"](GOOD, jax.random.PRNGKey(0), **kwargs)


class _PlainDrafter(drafters.Drafter):
  """A drafter that is not a pytree: jit could not take it."""
  vocab_size = 8

  def init(self, encoder_input_tokens, max_len, encoder_output=None):
    return ()

  def propose(self, state, buffer, length, rng, *, gamma, method):
    return state, jnp.zeros((buffer.shape[0], gamma), jnp.int32), None

  def rollback(self, state, length):
    return state


@structs.dataclass
class _StringLeafDrafter(_PlainDrafter):
  """A pytree whose leaf is a Python string (should have been static)."""
  name: str = "ngram"


def test_drafter_and_target_must_be_pytrees_with_the_protocols(
    no_compile, model8):
  rng = jax.random.PRNGKey(0)
  with pytest.raises(
      ValueError, match=r"drafter must be a JAX pytree .*_PlainDrafter.*"
      r"specdec_jax.core.structs.dataclass"):
    decoding.speculative_sample(model8, _PlainDrafter(), GOOD, rng, gamma=2,
                                max_decode_length=4)
  with pytest.raises(ValueError, match=r"drafter.name is a str"):
    decoding.speculative_sample(model8, _StringLeafDrafter(), GOOD, rng,
                                gamma=2, max_decode_length=4)
  with pytest.raises(ValueError, match="drafter must be a specdec_jax"):
    decoding.speculative_sample(model8, object(), GOOD, rng, gamma=2,
                                max_decode_length=4)
  with pytest.raises(
      ValueError, match=r"target must implement .*missing "
      r"\['start_token', 'start', 'length', 'decode_chunk', "
      r"'truncate'\]"):
    decoding.speculative_sample(_PlainDrafter(), model8, GOOD, rng, gamma=2,
                                max_decode_length=4)


# ---------------------------------------------------------------------------
# The T5 cache refuses to overflow.
# ---------------------------------------------------------------------------
def test_t5_cache_refuses_to_overflow(model8):
  cache = model8.start(np.ones((2, 3), np.int32), 4)
  with pytest.raises(ValueError, match="chunk of 5 tokens cannot fit .*"
                     "max_len=4"):
    model8.decode_chunk(jnp.ones((2, 5), jnp.int32), cache)
  _, cache = model8.decode_chunk(jnp.ones((2, 3), jnp.int32), cache)
  # Concrete lengths (outside jit): checked on the host.
  with pytest.raises(
      ValueError, match=r"at cache lengths \[3, 3\] writes "
      "past the cache's max_len=4"):
    model8.decode_chunk(jnp.ones((2, 2), jnp.int32), cache)
  # Traced lengths: a checkify assertion inside traced_overflow_checks().
  with models.traced_overflow_checks():
    step = checkify.checkify(jax.jit(lambda m, t, c: m.decode_chunk(t, c)))
    err, _ = step(model8, jnp.ones((2, 2), jnp.int32), cache)
  assert "writes past the cache's max_len=4" in str(err.get())
  err, (_, cache) = step(model8, jnp.ones((2, 1), jnp.int32), cache)
  assert err.get() is None
  np.testing.assert_array_equal(cache.length, [4, 4])
  # truncate rolls back by index (never forward).
  cache = model8.truncate(cache, jnp.array([1, 9], jnp.int32))
  np.testing.assert_array_equal(cache.length, [1, 4])


def test_decode_loops_have_no_effects(model8):
  """Any JAX effect (e.g. a traced checkify check) in a jitted program makes
  JAX dispatch every call in Python (~1.5 ms per call here): the decoders
  must trace effect-free, while `traced_overflow_checks` still adds one."""
  inputs = jnp.ones((2, 3), jnp.int32)
  rng = jax.random.PRNGKey(0)
  eos = np.int32(1)
  method = sampling.Sampling(temperature=1.0)

  def traces():
    return [
        jax.make_jaxpr(lambda t, x, r: loops.temperature_loop(
            t, x, r, eos, max_decode_length=4, method=method))(model8, inputs,
                                                               rng),
        jax.make_jaxpr(
            lambda t, x, r: loops.speculative_loop(t, drafters.ModelDrafter(
                t), x, r, eos, gamma=2, max_decode_length=4, method=method))(
                    model8, inputs, rng)
    ]

  assert [j.effects for j in traces()] == [set(), set()]
  with models.traced_overflow_checks():
    assert all(j.effects for j in traces())


# ---------------------------------------------------------------------------
# The custom drafter of docs/extending.md.
# ---------------------------------------------------------------------------
def _extending_code() -> str:
  text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
  section = text[text.index("## The plug points"):]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_extending_custom_drafter_runs_and_is_exact():
  config = tiny_config(vocab_size=128)
  target = random_model(config, seed=3)
  inputs = np.array([[5, 17, 42, 9, 1], [7, 7, 3, 0, 0]], np.int32)
  namespace = {"target": target, "inputs": inputs}
  exec(_extending_code(), namespace)  # pylint: disable=exec-used
  out = namespace["out"]
  assert out.tokens.shape == (2, 16)
  # Greedy with the same drafter: token-identical to the target alone.
  drafter = namespace["BigramDrafter"](namespace["table"])
  spec = decoding.speculative_sample(target, drafter, inputs,
                                     jax.random.PRNGKey(0), gamma=4,
                                     max_decode_length=16)
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=16)
  np.testing.assert_array_equal(spec.tokens, base.tokens)


def test_speculative_sample_uses_the_cpu_program_on_cpu():
  # XLA:CPU compiles the speculative loop with its own options (Eigen on the
  # calling thread); other backends keep XLA's defaults.
  assert jax.default_backend() == "cpu"
  assert loops.SPECULATIVE_PROGRAM.options() == (
      kernels.CPU_SPECULATIVE_COMPILER_OPTIONS)
  assert loops.BASELINE_PROGRAM.options() == (
      kernels.CPU_BASELINE_COMPILER_OPTIONS)
  # Other backends compile with XLA's defaults.
  assert loops.SPECULATIVE_PROGRAM.options("gpu") == {}
  assert loops.SPECULATIVE_PROGRAM.jitted() is (
      loops.SPECULATIVE_PROGRAM.jitted("cpu"))
  assert kernels.CPU_SPECULATIVE_COMPILER_OPTIONS == {
      "xla_cpu_multi_thread_eigen": False,
      "xla_cpu_copy_insertion_use_region_analysis": True
  }
