"""`python -m specdec_jax.certify`: a certificate of exactness for the
run's own configuration (docs/usage/certify.md).

    python -m specdec_jax.certify --gin_file=pretrained_multi30k.gin \\
      --gin.TEMPERATURE=1.0 --gin.TOPP=0.9

Takes exactly what `run` takes (the experiment file and --gin.X bindings:
pair, drafter, decode mode, γ/k, temperature, top-k/top-p, lenience),
tests greedy identity on the run's data and, at T > 0, the decoder's
distribution with a power check (`experiment.certificate`), prints one
verdict line and writes OUTPUT_DIR/certificate.json. Exit status 0 when
certified (or not exact by design, said so), 1 when a test fails, 2 for a
bad setting (a flag, a macro, an environment variable, an OUTPUT_DIR that
cannot be claimed), before any test runs.

OUTPUT_DIR is claimed as `run` claims it (`files.output_folder.claim`):
one command at a time, and a certificate.json of other settings (the
run's and certify's flags) is replaced only with the run's own
OVERWRITE=True.
"""
import os
import time
from typing import Any, Dict, Iterator, Optional, Sequence

from absl import flags

from specdec_jax.files import compilation_cache
from specdec_jax.files import output_folder
from specdec_jax.terminal import console
from specdec_jax.config import gin_utils
from specdec_jax.files import io_utils
from specdec_jax import run as run_lib
from specdec_jax.experiment import arguments
from specdec_jax.experiment import certificate
from specdec_jax.experiment import output_dir

CERTIFICATE_FILE = certificate.CERTIFICATE_FILE
EXIT_NOT_CERTIFIED = 1
_DEFAULTS = certificate.CertifySettings()
_EXAMPLES = flags.DEFINE_integer(
    "examples", _DEFAULTS.examples,
    "N: examples of the run's data whose greedy outputs are compared.")
_LENGTH = flags.DEFINE_integer(
    "length", _DEFAULTS.length, "L: leading tokens the distribution test "
    "compares.")
_SAMPLES = flags.DEFINE_integer(
    "samples", _DEFAULTS.samples, "M: draws of each decoder for the "
    "distribution test (exactly M).")
_CHUNK = flags.DEFINE_integer("chunk", _DEFAULTS.chunk,
                              "Rows decoded per call (one compiled shape).")
_SIGNIFICANCE = flags.DEFINE_float(
    "significance", _DEFAULTS.significance,
    "The test fails below this p; the power check must.")
_FAIL_FAST = flags.DEFINE_bool(
    "fail_fast", _DEFAULTS.fail_fast, "Stop at the first failed test: a "
    "failed greedy identity skips the distribution test, a failed "
    "distribution test its power check.")


def settings_from_flags() -> certificate.CertifySettings:
  """The flags, checked (ConfigError naming the flag)."""
  values = dict(examples=_EXAMPLES.value, length=_LENGTH.value,
                samples=_SAMPLES.value, chunk=_CHUNK.value)
  for name, value in values.items():
    if value < 1:
      raise gin_utils.ConfigError(f"--{name}={value}: allowed: an integer "
                                  ">= 1.")
  if values["length"] > arguments.MAX_DECODE_LENGTH:
    raise gin_utils.ConfigError(
        f"--length={values['length']}: allowed: 1 to "
        f"{arguments.MAX_DECODE_LENGTH} (the tokens the distribution test "
        "compares; each draw decodes that many).")
  if not 0 < _SIGNIFICANCE.value < 1:
    raise gin_utils.ConfigError(f"--significance={_SIGNIFICANCE.value}: "
                                "allowed: a number in (0, 1).")
  return certificate.CertifySettings(significance=_SIGNIFICANCE.value,
                                     fail_fast=_FAIL_FAST.value, **values)


def _certificates(folder: str) -> Iterator[output_folder.Result]:
  """The certificate.json in `folder`, with the settings it records (one
  from before certificates recorded the run's settings records none)."""
  path = os.path.join(folder, CERTIFICATE_FILE)
  if io_utils.isfile(path):
    settings = output_folder.recorded_settings(path)
    if not (isinstance(settings, dict) and "certify" in settings):
      settings = None
    yield output_folder.Result(CERTIFICATE_FILE,
                               output_dir.comparable(settings))


def claim_output_dir(args: arguments.RunArguments,
                     settings: Dict[str, Any]) -> output_folder.Claim:
  """OUTPUT_DIR claimed for certify (the module docstring)."""
  return output_folder.claim(args.output_dir, output_dir.comparable(settings),
                             _certificates, name="OUTPUT_DIR",
                             program="certify", overwrite=args.overwrite,
                             overwrite_flag="OVERWRITE=True")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise gin_utils.ConfigError(f"unexpected arguments: {argv[1:]}")
  run_lib.check_experiment_flags(gin_utils.gin_files_flag())
  try:
    gin_utils.parse_from_flags(check_macros=True)
  except ValueError as e:
    raise gin_utils.ConfigError(str(e)) from None
  run_lib.check_output_dir_bound(gin_utils.gin_files_flag())
  settings = settings_from_flags()
  console.setup()
  args = arguments.run_arguments()
  try:
    certificate.check(args)
  except ValueError as e:
    raise gin_utils.ConfigError(str(e)) from None
  recorded = certificate.settings_record(args, settings)
  path = os.path.join(args.output_dir, CERTIFICATE_FILE)
  with claim_output_dir(args, recorded):
    compilation_cache.enable()
    start = time.perf_counter()
    record = certificate.certify(args, settings)
    record["settings"] = recorded
    record["seconds"] = time.perf_counter() - start
    io_utils.write_json(path, record)
  print(record["verdict"])
  print(f"certificate: {path}", flush=True)
  if record["failed"]:
    raise SystemExit(EXIT_NOT_CERTIFIED)


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point: exit 0 certified, 1 a test failed (SystemExit), 2 a bad
  setting."""
  gin_utils.define_gin_flags()
  console.define_traceback_flag()
  return console.run_cli("certify", lambda: gin_utils.run_main(main, argv),
                         run_lib.BAD_INPUT)


if __name__ == "__main__":
  console.exit_process(cli())
