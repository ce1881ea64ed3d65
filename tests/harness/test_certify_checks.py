"""`certify`'s checks before anything decodes: LENIENCE < 1 is not exact by
design, GAMMA='auto' is refused (end to end: tests/e2e/test_certify.py)."""
import pytest

from specdec_jax.experiment import certificate

import run_helpers

pytestmark = pytest.mark.usefixtures("clean_gin")


def _args(bindings):
  return run_helpers.certify_arguments(bindings)


def test_lenience_is_reported_not_exact_by_design_without_decoding():
  record = certificate.certify(_args(["TEMPERATURE = 1.0", "LENIENCE = 0.5"]),
                               certificate.CertifySettings())
  assert record["certified"] is False and record["failed"] is False
  assert record["verdict"].startswith("not exact by design: LENIENCE=0.5 < 1")
  assert "2·p(x)" in record["verdict"] and "greedy_identity" not in record


def test_auto_gamma_is_refused():
  with pytest.raises(ValueError, match="GAMMA='auto'"):
    certificate.check(_args(["GAMMA = 'auto'"]))
