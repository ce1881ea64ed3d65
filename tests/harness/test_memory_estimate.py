"""The start-up memory check (`plan.check_fits`) against what the compiled
decode loops hold: certify --length=5000 on local_tiny (2,000 rows of 5,000
tokens) passed it and then failed in its draws with XLA's RESOURCE_EXHAUSTED
and a traceback (27.1 GB asked on a 23.5 GiB machine; the target-alone loop
asks 41.6 GB): the estimate counted the target's cache once, and XLA:CPU's
target-alone loop holds it twice."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import certify
from specdec_jax.checkpoints import sizes
from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.core.acceptance import ExactAcceptance
from specdec_jax.core import decoding
from specdec_jax.core.decoding import loops
from specdec_jax.core.models import T5Config
from specdec_jax.experiment import arguments
from specdec_jax.experiment import plan
from specdec_jax.experiment.plan import RunPlan

import run_helpers

pytestmark = pytest.mark.usefixtures("clean_gin")

MACHINE = 25_276_059_648  # the 23.5 GiB host where certify failed


@pytest.fixture
def machine(monkeypatch):
  """This machine is the one certify failed on (its bytes over its
  devices, as `_check_memory` multiplies them back)."""
  monkeypatch.setattr(sizes, "available_bytes",
                      lambda: MACHINE // jax.device_count())


def test_certify_refuses_draws_that_cannot_fit_before_any_test(machine):
  """It passed the check, then failed with a traceback in the draws."""
  del machine
  args = run_helpers.certify_arguments(["TEMPERATURE = 1.0"])
  with pytest.raises(ConfigError) as e:
    certify.settings_record(args, certify.CertifySettings(length=5000))
  text = str(e.value)
  assert text.startswith(
      "--length=5000, --chunk=2000: the distribution test decodes 2000 rows "
      "of max(--length, GAMMA) = 5000 tokens per call, which needs at least ")
  assert "in the target-alone loop (target decoder cache " in text
  assert "target decoder cache (XLA's copy)" in text
  assert "this machine has 23.5 GiB" in text and "\n" not in text
  most = int(text.split("--chunk at most ")[1].split()[0])
  assert text.endswith(f"Allowed: --chunk at most {most} at this --length, "
                       "or a smaller --length.")
  # The rows it names are the most the check lets through.
  certify.settings_record(args, certify.CertifySettings(length=5000,
                                                        chunk=most))
  with pytest.raises(ConfigError, match=f"--chunk={most + 1}: "):
    certify.settings_record(
        args, certify.CertifySettings(length=5000, chunk=most + 1))


def test_run_counts_each_loop_it_decodes_with(tmp_path, machine):
  """A run of 2,000 rows of 5,000 tokens: MODE='walltime' decodes with the
  target alone too (its cache twice), MODE='infer' with the speculative
  loop only (the verification's attention over the cache counted),
  MODE='alpha' samples with the target alone."""
  del machine
  run_helpers.parse_local_tiny_out(tmp_path, "TEMPERATURE = 1.0")
  long = dict(batch_size=2000, task_feature_lengths={
      "inputs": 64,
      "targets": 5000
  })
  with pytest.raises(
      plan.MemoryRefused, match="BATCH_SIZE=2000 needs at least "
      r"\S+ GiB in the target-alone loop"):
    RunPlan.build(arguments.run_arguments(long))
  with pytest.raises(plan.MemoryRefused) as e:
    RunPlan.build(arguments.run_arguments({**long, "mode": "infer"}))
  assert "in the speculative loop (" in str(e.value)
  assert "target verification attention" in str(e.value)
  with pytest.raises(plan.MemoryRefused, match="in the target-alone loop"):
    RunPlan.build(arguments.run_arguments({**long, "mode": "alpha"}))
  assert not (tmp_path / "out").exists()


def test_each_phase_is_counted_on_its_own():
  config = T5Config(vocab_size=16, emb_dim=8, num_heads=2, head_dim=4,
                    mlp_dim=8, num_encoder_layers=1, num_decoder_layers=3)
  parts = plan.estimate(config, batch=2, inputs=10, targets=7)
  phases = plan.program_estimates({
      "t": config,
      "d": config
  }, 2, 10, 7, verified=3, target_alone=True, backend="cpu")
  assert phases["encoder"] == {
      "t encoder attention logits": parts["encoder attention logits"],
      "t encoder output": parts["encoder output"]
  }
  cache = parts["decoder cache"]
  assert phases["target-alone loop"]["t decoder cache (XLA's copy)"] == cache
  # 3 arrays of [B, H, γ+1, T] float32 on XLA:CPU, 1 elsewhere.
  attention = 2 * config.num_heads * 3 * 7 * 4
  assert phases["speculative loop"]["t verification attention"] == (
      plan.CPU_SCORE_ARRAYS * attention)
  elsewhere = plan.program_estimates({"t": config}, 2, 10, 7, verified=3,
                                     target_alone=True, backend="gpu")
  assert elsewhere["speculative loop"]["t verification attention"] == attention
  assert "t decoder cache (XLA's copy)" not in elsewhere["target-alone loop"]
  assert plan.cache_copies("cpu") == 2 and plan.cache_copies("gpu") == 1


def _bytes(compiled) -> int:
  """What a compiled program holds while it runs (parameters included)."""
  m = compiled.memory_analysis()
  return (m.argument_size_in_bytes + m.output_size_in_bytes +
          m.temp_size_in_bytes - m.alias_size_in_bytes)


def test_the_estimate_is_a_lower_bound_of_the_compiled_loops(tmp_path):
  """Each phase's estimate is at most what XLA:CPU allocates for the loop
  (compiled, not run), and the target-alone loop's second cache is real:
  without it the program would hold less than the estimate says."""
  if jax.default_backend() != "cpu":
    pytest.skip("measured on XLA:CPU")
  rows, length = 16, 256
  built = run_helpers.tiny_run_plan(
      tmp_path, batch_size=rows, temperature=1.0, task_feature_lengths={
          "inputs": 32,
          "targets": length
      })
  loaded = built.load(built.load_models())
  target, drafter = loaded.models.target, loaded.drafter
  a = loaded.args
  inputs = jnp.ones((rows, 32), jnp.int32)
  rng, eos = jax.random.PRNGKey(0), np.int32(loops.EOS_ID)
  alone = loops.BASELINE_PROGRAM.jitted(target=target).lower(
      target, inputs, rng, eos, max_decode_length=length,
      method=a.method()).compile()
  speculative = loops.SPECULATIVE_PROGRAM.jitted().lower(
      decoding.speculative_target(target, drafter),
      decoding.as_drafter(drafter), inputs, rng, eos, gamma=a.gamma,
      max_decode_length=length, method=a.method(), acceptance=ExactAcceptance(),
      statistics=True).compile()
  phases = plan.program_estimates(
      {
          "target": built.target_config,
          "draft": built.draft_config
      }, rows, 32, length, verified=a.gamma + 1, target_alone=True)
  need = {name: sum(parts.values()) for name, parts in phases.items()}
  assert max(need["encoder"], need["target-alone loop"]) <= _bytes(alone)
  assert max(need["encoder"], need["speculative loop"]) <= _bytes(speculative)
  # Sensitive: a loop holding one cache less would fall below it.
  one_cache = phases["target-alone loop"]["target decoder cache"]
  assert _bytes(alone) - one_cache < need["target-alone loop"]


def test_draws_that_run_out_of_memory_end_in_one_line():
  """Past the lower bound: XLA's RESOURCE_EXHAUSTED becomes a bad setting
  naming --length and --chunk, not a traceback."""

  def decoder(batch, rng):
    del batch, rng
    raise jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory allocating 27094781576 bytes.")

  settings = certify.CertifySettings(length=5000, samples=10, chunk=10)
  with pytest.raises(ConfigError) as e:
    certify._draws(  # pylint: disable=protected-access
        decoder, np.ones(5, np.int32), jax.random.PRNGKey(0), settings,
        "speculative draws")
  assert str(e.value) == (
      "--length=5000, --chunk=10: the speculative draws ran out of this "
      "machine's memory (RESOURCE_EXHAUSTED: Out of memory allocating "
      "27094781576 bytes.), which the start-up check, a lower bound, did "
      "not foresee. Allowed: a smaller --chunk or --length.")

  def broken(batch, rng):
    del batch, rng
    raise jax.errors.JaxRuntimeError("INTERNAL: a bug")

  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    certify._draws(  # pylint: disable=protected-access
        broken, np.ones(5, np.int32), jax.random.PRNGKey(0), settings)
