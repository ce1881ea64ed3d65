"""`certify`: a certificate of exactness for the run's configuration, end to
end (its checks before decoding: tests/harness/test_certify_checks.py)."""
import dataclasses
import json

from absl import flags
import gin
import jax
import jax.numpy as jnp
import pytest

from specdec_jax import certify
from specdec_jax.core import acceptance
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.protocols import Verdict
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import plan as plan_lib

import run_helpers

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


@structs.dataclass
class _BonusOffByOne(acceptance.ExactAcceptance):
  """A planted bug: after n kept guesses the next token is the target's
  choice at position n + 2 (p_{n+2}), not n + 1."""

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
    kept, _ = sampling.greedy_accept(target_tokens, draft_tokens)
    late = jnp.minimum(kept + 1, draft_tokens.shape[1])
    rows = jnp.arange(target_tokens.shape[0])
    return Verdict(kept, target_tokens[rows, late], None, target_tokens)


@dataclasses.dataclass(frozen=True)
class _BuggyMode(decode_modes.TokenMode):
  name: str = "planted_bonus_off_by_one"
  description: str = "a planted bug"
  own_settings: tuple = ("acceptance",)

  def acceptance_rule(self, args):
    del args
    return _BonusOffByOne()


def _args(bindings, gin_file="local_tiny.gin"):
  return run_helpers.certify_arguments(bindings, gin_file)


def test_the_run_is_certified():
  """Greedy identity through the run's own registries: Algorithm 1 passes
  on N = 4 examples; at T = 0 there is no distribution test."""
  settings = certify.CertifySettings(examples=4)
  good = certify.certify(_args([]), settings)
  assert good["certified"] and not good["failed"]
  assert good["greedy_identity"] == {
      "examples": 4,
      "identical": 4,
      "mismatches": []
  }
  assert good["verdict"].startswith("certified exact: identity 4/4, T = 0")
  assert "distribution" not in good  # T = 0: nothing to sample


def _certify_buggy(bindings, settings):
  """certify with the greedy bonus off-by-one registered as a decode mode."""
  decode_modes.register(_BuggyMode())
  try:
    return certify.certify(
        _args(["ACCEPTANCE = 'planted_bonus_off_by_one'", *bindings]), settings)
  finally:
    decode_modes.SAMPLING.pop(_BuggyMode.name)


def test_a_planted_greedy_bug_is_caught():
  """A decode mode registered with a bonus-token off-by-one fails greedy
  identity, naming each mismatch's first differing position."""
  bad = _certify_buggy([], certify.CertifySettings(examples=4))
  assert bad["failed"] and not bad["certified"]
  identity = bad["greedy_identity"]
  assert identity["identical"] < 4 and identity["mismatches"]
  assert all(m["position"] >= 0 for m in identity["mismatches"])
  assert bad["verdict"].startswith("NOT certified: identity ")
  json.dumps(bad)  # certificate.json's content


def test_a_certificate_fails_fast():
  """With fail_fast, a failed greedy identity at T = 1 skips the
  distribution test (which would otherwise draw `samples` rows twice);
  without it, certify would run it (`sampled`), as the record shows."""
  settings = certify.CertifySettings(examples=4, samples=64, chunk=64,
                                     fail_fast=True)
  bad = _certify_buggy(["TEMPERATURE = 1.0"], settings)
  assert bad["failed"] and not bad["certified"]
  assert bad["greedy_identity"]["identical"] < 4
  assert "distribution" not in bad and bad["skipped"] == ["distribution"]
  assert bad["verdict"].startswith("NOT certified: identity ")
  assert "fail fast: distribution skipped" in bad["verdict"]
  json.dumps(bad)


def _verdict(rng, target_probs, draft_probs, draft_tokens, late=False,
             unclipped=False):
  """Algorithm 1's steps on the given p, with a planted change: `late`, the
  token after n kept guesses drawn at position n + 2; `unclipped`, the
  residual norm(|p - q|) instead of norm(max(0, p - q))."""
  accept_rng, residual_rng = jax.random.split(rng)
  kept = sampling.leading_accepted(
      sampling.acceptance_mask(accept_rng, target_probs, draft_probs,
                               draft_tokens))
  at = jnp.minimum(kept + 1, draft_tokens.shape[1]) if late else kept
  probs = target_probs
  if unclipped:  # residual_sample clips p' - q = |p - q| at 0: a no-op
    q = jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))
    probs = jnp.abs(target_probs - q) + q
  token = sampling.residual_sample(residual_rng, probs, draft_probs, at,
                                   draft_tokens)
  return Verdict(kept, token, target_probs, None)


@structs.dataclass
class _Planted(acceptance.ExactAcceptance):
  """The peers' verifier bugs (issue 46), one per `bug`."""
  bug: str = structs.field(pytree_node=False, default="")

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    if self.bug == "top_p_before_temperature":  # nucleus of the T = 1 probs
      nucleus = method.replace(temperature=1.0,
                               top_k=0).standardize(target_logits) > 0
      tempered = jax.nn.softmax(target_logits / method.temperature, axis=-1)
      p = tempered * nucleus
      p = p / p.sum(-1, keepdims=True)
    elif self.bug == "top_k_on_q_only":  # p without the draft's top-k
      p = method.replace(top_k=0).standardize(target_logits)
    else:
      p = method.standardize(target_logits)
    return _verdict(rng, p, draft_probs, draft_tokens,
                    late=self.bug == "bonus_off_by_one",
                    unclipped=self.bug == "residual_without_max")


@dataclasses.dataclass(frozen=True)
class _PlantedMode(decode_modes.TokenMode):
  description: str = "a planted bug"
  own_settings: tuple = ("acceptance",)

  def acceptance_rule(self, args):
    return _Planted(bug=self.name)


# Each bug with sampling settings under which it changes the output of
# local_tiny.gin's random pair: temperatures well below 1 make its nearly
# uniform distributions over 259 tokens peaked, as a trained model's are,
# so that 1,000 draws of 3 tokens fill cells the chi-square can compare
# (at T = 1 nearly every sequence is unique and pooled: nothing fails).
PLANTED = {
    "top_p_before_temperature": ["TEMPERATURE = 0.25", "TOPP = 0.7"],
    "top_k_on_q_only": ["TEMPERATURE = 0.25", "TOPK = 3"],
    "residual_without_max": ["TEMPERATURE = 0.3"],
    "bonus_off_by_one": ["TEMPERATURE = 0.25"],
}
SAMPLES = 1000
# Where the control also asserts certify's own power check (the target at
# T x 0.9 fails): top-p moves the nucleus with T, a shift 1,000 draws see.
CONTROL = "top_p_before_temperature"


@pytest.fixture(scope="module")
def pair_models():
  """local_tiny.gin's pair, loaded once for the module's distribution
  tests."""
  return plan_lib.RunPlan.build(_args(["TEMPERATURE = 1.0"])).load_models()


def _distribution(bug, pair_models, planted=True):
  """certify's distribution test of the tiny pair at PLANTED[bug]'s
  settings (fail fast), with the planted rule `bug` (or Algorithm 1)."""
  settings = certify.CertifySettings(length=3, samples=SAMPLES, chunk=SAMPLES,
                                     fail_fast=True)
  if not planted:
    return certify.distribution_test(_args(PLANTED[bug]), settings,
                                     pair_models)[0]
  # A mode's name is what it is (a class attribute): one class per bug.
  decode_modes.register(
      type(f"_Planted_{bug}", (_PlantedMode,), {"name": bug})())
  try:
    return certify.distribution_test(
        _args([*PLANTED[bug], f"ACCEPTANCE = '{bug}'"]), settings,
        pair_models)[0]
  finally:
    decode_modes.SAMPLING.pop(bug)


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_certify_fails_each_planted_sampling_bug(bug, pair_models):
  """A verifier bug the peers shipped: the distribution test fails
  (p < 0.001; 1,000 draws of 3 tokens), and failing fast skips the power
  check."""
  record = _distribution(bug, pair_models)
  assert not record["passed"], record["test"]
  assert record["power_check"] is None and record["skipped"] == ["power_check"]


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_algorithm_1_passes_each_planted_bugs_test(bug, pair_models):
  """The control: Algorithm 1 at each planted bug's settings (the same
  draws) passes, so each failure above is the bug's; at CONTROL's the power
  check (the target at T x 0.9) fails as it must."""
  exact = _distribution(bug, pair_models, planted=False)
  assert exact["passed"] and "skipped" not in exact, exact
  if bug == CONTROL:
    assert exact["power_ok"], exact


def test_the_command_records_its_settings_and_names_its_own_flag(
    tmp_path, capsys, caplog):
  """Issue 59 (3, 4) and issue 58 (5), end to end on local_tiny.gin: the
  command claims OUTPUT_DIR, says what it is doing on stderr, names
  --examples (not NUM_EXAMPLES, not metrics.json) when the data has
  fewer, and certificate.json records the settings the OVERWRITE rule
  compares."""
  out = tmp_path / "out"
  flags.FLAGS.unparse_flags()
  try:
    with caplog.at_level("INFO"):
      certify.cli([
          "certify", "--gin_file=local_tiny.gin", f"--gin.OUTPUT_DIR='{out}'",
          "--examples=100"
      ])
  except SystemExit as e:
    assert not e.code, capsys.readouterr().err[-2000:]
  finally:
    flags.FLAGS.unparse_flags()
    gin.clear_config()
  stdout = capsys.readouterr().out.splitlines()
  assert stdout[-2].startswith("certified exact: identity 12/12, T = 0")
  assert stdout[-1] == f"certificate: {out / certify.CERTIFICATE_FILE}"
  messages = [r.getMessage() for r in caplog.records]
  assert any(
      m.startswith("--examples=100 but SOURCE_FILE=") and
      "(certificate.json records both numbers)" in m
      for m in messages), messages
  assert any(
      m.startswith("certify: greedy identity on 12 examples") and "done in" in m
      for m in messages), messages
  record = json.loads((out / certify.CERTIFICATE_FILE).read_text())
  assert record["settings"]["certify"]["examples"] == 100
  assert record["greedy_identity"]["examples"] == 12
  assert record["settings"]["run"]["gamma"] == 4
