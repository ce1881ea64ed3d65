"""`certify`: a certificate of exactness for the run's configuration."""
import dataclasses
import json

import flax
import gin
import jax.numpy as jnp
import pytest

from specdec_jax import gin_utils
from specdec_jax.core import acceptance
from specdec_jax.core import sampling
from specdec_jax.core.protocols import Verdict
from specdec_jax.experiment import arguments
from specdec_jax.experiment import certificate
from specdec_jax.experiment import decode_modes

pytestmark = pytest.mark.usefixtures("clean_gin")


@flax.struct.dataclass
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


def _args(bindings):
  gin.clear_config()
  gin_utils.parse_gin(["local_tiny.gin"],
                      ["OUTPUT_DIR = '/tmp/unused_certify'", *bindings],
                      finalize=False)
  return arguments.run_arguments()


def test_lenience_is_reported_not_exact_by_design_without_decoding():
  record = certificate.certify(_args(["TEMPERATURE = 1.0", "LENIENCE = 0.5"]),
                               certificate.CertifySettings())
  assert record["certified"] is False and record["failed"] is False
  assert record["verdict"].startswith("not exact by design: LENIENCE=0.5 < 1")
  assert "2·p(x)" in record["verdict"] and "greedy_identity" not in record


def test_auto_gamma_is_refused():
  with pytest.raises(ValueError, match="GAMMA='auto'"):
    certificate.check(_args(["GAMMA = 'auto'"]))


@pytest.mark.slow
def test_the_run_is_certified_and_a_planted_bug_is_caught(tmp_path):
  """Greedy identity through the run's own registries: Algorithm 1 passes;
  a decode mode registered with a bonus-token off-by-one fails, naming
  each mismatch's first differing position."""
  settings = certificate.CertifySettings(examples=4)
  good = certificate.certify(_args([]), settings)
  assert good["certified"] and not good["failed"]
  assert good["greedy_identity"] == {
      "examples": 4,
      "identical": 4,
      "mismatches": []
  }
  assert good["verdict"].startswith("certified exact: identity 4/4, T = 0")
  assert "distribution" not in good  # T = 0: nothing to sample
  decode_modes.register(_BuggyMode())
  try:
    bad = certificate.certify(
        _args(["ACCEPTANCE = 'planted_bonus_off_by_one'"]), settings)
  finally:
    decode_modes.SAMPLING.pop(_BuggyMode.name)
  assert bad["failed"] and not bad["certified"]
  identity = bad["greedy_identity"]
  assert identity["identical"] < 4 and identity["mismatches"]
  assert all(m["position"] >= 0 for m in identity["mismatches"])
  assert bad["verdict"].startswith("NOT certified: identity ")
  json.dumps(bad)  # certificate.json's content
