"""`certify`'s checks before anything decodes: LENIENCE < 1 is not exact by
design, GAMMA='auto' is refused, its OUTPUT_DIR is claimed as `run`'s is
(end to end: tests/e2e/test_certify.py)."""
import json
import os
import re
import types

from absl import flags
import gin
import jax
import numpy as np
import pytest

from specdec_jax import certify
from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.core import environment
from specdec_jax.experiment import runner
from specdec_jax.files import output_folder

import run_helpers

pytestmark = pytest.mark.usefixtures("clean_gin")


def _args(bindings):
  return run_helpers.certify_arguments(bindings)


def test_lenience_is_reported_not_exact_by_design_without_decoding():
  record = certify.certify(_args(["TEMPERATURE = 1.0", "LENIENCE = 0.5"]),
                           certify.CertifySettings())
  assert record["certified"] is False and record["failed"] is False
  assert record["verdict"].startswith("not exact by design: LENIENCE=0.5 < 1")
  assert "2·p(x)" in record["verdict"] and "greedy_identity" not in record


def test_auto_gamma_is_refused():
  with pytest.raises(ValueError, match="GAMMA='auto'"):
    certify.check(_args(["GAMMA = 'auto'"]))


# ---------------------------------------------------------------------------
# Issue 59: certify's OUTPUT_DIR (defects 3, 4), flags and weak spots.
# ---------------------------------------------------------------------------
def _certify_cli(argv, capsys, monkeypatch, record=None):
  """(exit status, stderr lines, certify's calls) of `certify` run in this
  process on local_tiny.gin, its tests replaced by a stub returning
  `record` (none decodes)."""
  calls = []

  def stub(args, settings):
    calls.append((args, settings))
    return dict(record or {"verdict": "certified exact: stub", "failed": False})

  monkeypatch.setattr(certify, "certify", stub)
  flags.FLAGS.unparse_flags()
  try:
    code = certify.cli(["certify", "--gin_file=local_tiny.gin", *argv])
  except SystemExit as e:  # absl's app.run ends a run that went well so
    code = e.code or 0
  finally:
    flags.FLAGS.unparse_flags()
    gin.clear_config()
  return code, capsys.readouterr().err.strip().splitlines(), calls


def _out(path):
  return f"--gin.OUTPUT_DIR='{path}'"


def test_a_bad_flag_is_one_line_and_exit_2(capsys, monkeypatch):
  """It was absl's "FATAL Flags parsing error", rc 1 (documented: 2)."""
  code, err, calls = _certify_cli(["--samples=abc"], capsys, monkeypatch)
  assert (code, calls) == (2, []), err
  assert err == [
      "certify: error: flag --samples=abc: invalid literal for int() with "
      "base 10: 'abc'"
  ]


@pytest.mark.parametrize("inside", [False, True])
def test_an_output_dir_that_is_a_file_is_refused_before_any_test(
    inside, tmp_path, capsys, monkeypatch):
  """Defect 3: every test ran, then `[Errno 17] File exists`, no verdict."""
  a_file = tmp_path / "f"
  a_file.write_text("mine")
  out = a_file / "sub" if inside else a_file
  code, err, calls = _certify_cli([_out(out)], capsys, monkeypatch)
  assert (code, calls) == (2, [])
  assert len(err) == 1 and err[0].startswith(
      f"certify: error: OUTPUT_DIR={str(out)!r}: not a writable directory")


def test_two_certify_runs_into_one_folder(tmp_path, capsys, monkeypatch):
  """Defect 4: both exited 0 and printed the same certificate path."""
  out = tmp_path / "out"
  out.mkdir()
  with output_folder.hold(str(out), "certify"):
    code, err, calls = _certify_cli([_out(out)], capsys, monkeypatch)
  assert (code, calls) == (2, []) and len(err) == 1, err
  assert f"OUTPUT_DIR={str(out)!r} is in use by certify (pid" in err[0]


def test_a_certificate_of_other_settings_needs_overwrite(
    tmp_path, capsys, monkeypatch):
  """Defect 4: a certificate of other settings was replaced silently; now
  certificate.json records its settings and the run's OVERWRITE rules."""
  out = tmp_path / "out"
  code, _, calls = _certify_cli([_out(out), "--examples=4"], capsys,
                                monkeypatch)
  assert code == 0 and len(calls) == 1
  written = json.loads((out / certify.CERTIFICATE_FILE).read_text())
  assert written["settings"]["certify"]["examples"] == 4
  assert written["settings"]["run"]["gamma"] == 4
  code, _, calls = _certify_cli([_out(out), "--examples=4"], capsys,
                                monkeypatch)
  assert code == 0 and len(calls) == 1  # the same settings: again
  code, err, calls = _certify_cli([_out(out), "--gin.GAMMA=2"], capsys,
                                  monkeypatch)
  assert (code, calls) == (2, []), err
  assert "holds certificate.json, which is from a run with other " in err[0]
  assert "certify.examples: 4 -> 100" in err[0] and "run.gamma: 4 -> 2" in err[0]
  assert "pass --gin.OVERWRITE=True to replace it" in err[0]
  code, _, calls = _certify_cli(
      [_out(out), "--gin.GAMMA=2", "--gin.OVERWRITE=True"], capsys, monkeypatch)
  assert code == 0 and len(calls) == 1
  written = json.loads((out / certify.CERTIFICATE_FILE).read_text())
  assert written["settings"]["run"]["gamma"] == 2
  assert sorted(os.listdir(out)) == [certify.CERTIFICATE_FILE]  # no lock


def test_a_bad_environment_variable_is_a_bad_setting(tmp_path, capsys,
                                                     monkeypatch):

  def bad():
    raise environment.BadEnvironment("SPECDEC_JAX_COMPILATION_CACHE='x': "
                                     "allowed: 1 or 0.")

  monkeypatch.setattr(certify.compilation_cache, "enable", bad)
  code, err, _ = _certify_cli([_out(tmp_path / "o")], capsys, monkeypatch)
  assert code == 2
  assert err == [
      "certify: error: SPECDEC_JAX_COMPILATION_CACHE='x': allowed: "
      "1 or 0."
  ]


def test_length_is_named_by_its_flag(tmp_path, capsys, monkeypatch):
  """--length=100000 named TASK_FEATURE_LENGTHS['targets'], which the user
  never set."""
  code, err, _ = _certify_cli([_out(tmp_path / "o"), "--length=100000"], capsys,
                              monkeypatch)
  assert code == 2
  assert err == [
      "certify: error: --length=100000: allowed: 1 to 8192 (the "
      "tokens the distribution test compares; each draw decodes "
      "that many)."
  ]
  settings = certify.CertifySettings(length=8192, samples=10**7, chunk=10**7)
  with pytest.raises(ConfigError) as e:
    certify.settings_record(_args(["TEMPERATURE = 1.0"]), settings)
  assert str(e.value).startswith(
      "--length=8192, --chunk=10000000: the distribution test decodes "
      "10000000 rows of max(--length, GAMMA) = 8192 tokens per call")
  assert re.search(
      r"Allowed: --chunk at most \d+ at this --length, or a smaller "
      r"--length\.$", str(e.value))


def test_samples_are_drawn_exactly(caplog):
  """--samples=10 drew 2,000 (a whole chunk); now exactly M, with a
  progress line after each chunk."""
  rows = []

  def decoder(batch, rng):
    del rng
    rows.append(batch.shape[0])
    return types.SimpleNamespace(tokens=np.ones((batch.shape[0], 6), np.int32))

  draws = certify._draws(  # pylint: disable=protected-access
      decoder, np.ones(5, np.int32), jax.random.PRNGKey(0),
      certify.CertifySettings(length=3, samples=10), "speculative draws")
  assert draws.shape == (10, 3) and rows == [10]
  rows.clear()
  with caplog.at_level("INFO"):
    draws = certify._draws(  # pylint: disable=protected-access
        decoder, np.ones(5, np.int32), jax.random.PRNGKey(0),
        certify.CertifySettings(length=3, samples=25, chunk=10), "draws")
  assert draws.shape == (25, 3) and rows == [10, 10, 10]
  lines = [r.getMessage() for r in caplog.records if "drawn" in r.getMessage()]
  assert len(lines) == 3 and "25/25 samples drawn" in lines[-1]


def test_speculation_off_has_nothing_to_certify():
  """It printed "certified exact ... off γ = 4"."""
  with pytest.raises(
      ValueError, match="SPECULATION='off': the target decodes "
      "alone, so there is nothing speculative to certify"):
    certify.check(_args(["SPECULATION = 'off'"]))


def test_speculation_auto_says_which_mode_was_certified():
  record = {
      "decode_mode": "token",
      "speculation": "auto",
      "gamma": 4,
      "temperature": 0.0,
      "top_k": 0,
      "top_p": 1.0,
      "certified": True,
      "greedy_identity": {
          "examples": 4,
          "identical": 4
      }
  }
  assert certify.verdict_line(record) == (
      "certified exact: identity 4/4, T = 0, token γ = 4, SPECULATION='auto':"
      " its speculative choice tested (its other, the target alone, is the "
      "target's own)")


def test_too_few_examples_are_named_by_certifys_flag(caplog):
  """Issue 58 (5): certify warned "NUM_EXAMPLES=100 ... (metrics.json
  records both numbers)"; certify's flag is --examples and it writes
  certificate.json."""
  args = types.SimpleNamespace(mixture_or_task_name=None, source_file="a.tsv",
                               num_examples=100)
  with caplog.at_level("WARNING"):
    runner.check_examples(args, [{}] * 12, "--examples",
                          certify.CERTIFICATE_FILE)
  assert caplog.records[-1].getMessage() == (
      "--examples=100 but SOURCE_FILE='a.tsv' has only 12 examples: decoding "
      "12 (certificate.json records both numbers).")
