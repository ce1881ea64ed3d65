"""`python -m specdec_jax.certify`: a certificate of exactness for the
run's own configuration (issue 46, docs/usage/certify.md).

    python -m specdec_jax.certify --gin_file=pretrained_multi30k.gin \\
      --gin.TEMPERATURE=1.0 --gin.TOPP=0.9

Built from exactly what `run` builds (`RunPlan`), through the same
registries, so a registered drafter, decode mode or rule is certified
without new code: greedy identity on N examples of the run's data; at
T > 0 a two-sample chi-square of the first L tokens of M speculative and M
target-alone draws of one input, with its power check against the target
at temperature × 0.9 (`metrics.exactness`); a rule not exact by design
(LENIENCE < 1) is reported so, not tested. Prints one verdict line and
writes OUTPUT_DIR/certificate.json, claimed as `run` claims it. Exit status
0 when certified (or not exact by design, said so), 1 when a test fails, 2
for a bad setting, before any test runs.
"""
import dataclasses
import os
import time
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import run as run_lib
from specdec_jax.config import gin_utils
from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.experiment import arguments
from specdec_jax.experiment import batches
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import plan as plan_lib
from specdec_jax.experiment import runner
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import Models
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.experiment.plan import comparable
from specdec_jax.files import compilation_cache
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from specdec_jax.metrics import exactness
from specdec_jax.terminal import console

CERTIFICATE_FILE = "certificate.json"
EXIT_NOT_CERTIFIED = 1


@dataclasses.dataclass(frozen=True)
class CertifySettings:
  """How hard certify tests: its flags (N, L, M: the module docstring)."""
  examples: int = 100
  length: int = 3
  samples: int = 20000
  chunk: int = 2000
  significance: float = 1e-3
  fail_fast: bool = False


_DEFAULTS = CertifySettings()
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

# certify decodes with both decoders, as MODE='walltime' does: its plans
# are built so (the memory check counts the target-alone loop).
_BOTH = "walltime"


def _plan(args: arguments.RunArguments, models: Optional[Models],
          **changes) -> Tuple[DecodePlan, Models]:
  """The run's plan with `changes` to its arguments, loaded (models
  reused)."""
  plan = RunPlan.build(dataclasses.replace(args, **changes, mode=_BOTH))
  models = plan.load_models(models)
  return plan.load(models).decoding(), models


def _distribution_changes(args: arguments.RunArguments,
                          settings: CertifySettings) -> Dict[str, Any]:
  """The distribution test's changes to the run's arguments: one input,
  --chunk rows (at most M) per call of at least γ tokens."""
  lengths = dict(args.task_feature_lengths, targets=max(settings.length,
                                                        int(args.gamma)))
  return dict(task_feature_lengths=lengths,
              batch_size=min(settings.chunk, settings.samples), num_examples=1)


def _sampled(args: arguments.RunArguments) -> bool:
  """Whether certify runs the distribution test (T > 0, no beams)."""
  return args.temperature > 0 and not decode_modes.mode_of(args).beam


def settings_record(args: arguments.RunArguments, settings: CertifySettings,
                    providers: Any = None) -> Dict[str, Any]:
  """certificate.json's `settings`: the run's and certify's flags. The
  distribution test's plan is built here too, before any test runs (one it
  cannot decode names --length and --chunk); ConfigError."""
  record = dict(RunPlan.build(args, providers).settings)
  record["certify"] = dataclasses.asdict(settings)
  if not _sampled(args):
    return record
  changes = _distribution_changes(args, settings)
  rows, length = changes["batch_size"], changes["task_feature_lengths"]
  words = (f"--length={settings.length}, --chunk={settings.chunk}: the "
           f"distribution test decodes {rows} rows of max(--length, GAMMA) "
           f"= {length['targets']} tokens per call")
  try:
    RunPlan.build(dataclasses.replace(args, **changes, mode=_BOTH), providers)
  except plan_lib.MemoryRefused as e:
    raise ConfigError(f"{words}, which {e.detail}. Allowed: " + (
        f"--chunk at most {e.rows} at this --length, or a smaller --length."
        if e.rows else "a smaller --length.")) from None
  except ConfigError as e:
    raise ConfigError(
        f"{words} (as TASK_FEATURE_LENGTHS['targets'] and BATCH_SIZE): {e} "
        "Allowed: a smaller --length or --chunk.") from None
  return record


def greedy_identity(
    args: arguments.RunArguments, settings: CertifySettings,
    models: Optional[Models] = None) -> Tuple[Dict[str, Any], Models]:
  """({'examples', 'identical', 'mismatches': [{'index', 'position'}]},
  the models): the T = 0 variant on the run's first N examples."""
  with console.phase("certify: loading the models for greedy identity"):
    plan, models = _plan(args, models, temperature=0.0, top_k=0, top_p=1.0,
                         num_examples=settings.examples)
  data = runner.read_examples(plan, asked="--examples",
                              recorded_in=CERTIFICATE_FILE)
  identity = exactness.GreedyIdentity()
  with console.phase(f"certify: greedy identity on {len(data.examples)} "
                     "examples (speculative and target alone)"):
    for batch in batches.batches(data.feed, plan.rng):
      base, _ = batch.decode(plan.baseline)
      spec, _ = batch.decode(plan.speculative)
      identity.add(
          np.asarray(base.tokens)[batch.keep],
          np.asarray(spec.tokens)[batch.keep])
  return identity.record(), models


def _draws(decoder, inputs: np.ndarray, rng: jax.Array,
           settings: CertifySettings, what: str = "draws") -> np.ndarray:
  """[M, L] the first L tokens of exactly M decodes of one input, in
  chunks; after each chunk a progress line: drawn so far, time left."""
  chunk = min(settings.chunk, settings.samples)  # M is drawn exactly
  batch = jnp.asarray(np.repeat(inputs[None], chunk, axis=0))
  chunks = -(-settings.samples // chunk)
  out, start = [], time.perf_counter()
  for c in range(chunks):
    try:
      tokens = np.asarray(decoder(batch, jax.random.fold_in(rng, c)).tokens)
    except jax.errors.JaxRuntimeError as e:  # past the start-up estimate
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      raise ConfigError(
          f"--length={settings.length}, --chunk={settings.chunk}: the {what} "
          f"ran out of this machine's memory ({str(e).splitlines()[0]}), "
          "which the start-up check, a lower bound, did not foresee. "
          "Allowed: a smaller --chunk or --length.") from None
    out.append(tokens[:, :settings.length])
    drawn = min((c + 1) * chunk, settings.samples)
    left = (time.perf_counter() - start) / drawn * (settings.samples - drawn)
    logging.info("certify: %s: %d/%d samples drawn, about %.0f s left", what,
                 drawn, settings.samples, left)
  return np.concatenate(out)[:settings.samples]


def distribution_test(
    args: arguments.RunArguments, settings: CertifySettings,
    models: Optional[Models] = None) -> Tuple[Dict[str, Any], Models]:
  """The chi-square of speculative vs target-alone draws, and its power
  check against the target at temperature × 0.9."""
  changes = _distribution_changes(args, settings)
  plan, models = _plan(args, models, **changes)
  first = next(batches.batches(runner.read_examples(plan).feed, plan.rng))
  inputs = np.asarray(first.inputs)[first.keep[0]]
  rng = plan.rng
  with console.phase(f"certify: distribution test, {settings.samples} draws "
                     f"of {settings.length} tokens by each decoder"):
    spec = _draws(plan.speculative, inputs, jax.random.fold_in(rng, 1),
                  settings, "speculative draws")
    base = _draws(plan.baseline, inputs, jax.random.fold_in(rng, 2), settings,
                  "target-alone draws")

  def wrong_draws() -> np.ndarray:  # Drawn only when the power check runs.
    wrong, _ = _plan(args, models, temperature=args.temperature * 0.9,
                     **changes)
    with console.phase("certify: power check, the target at temperature "
                       "× 0.9"):
      return _draws(wrong.baseline, inputs, jax.random.fold_in(rng, 3),
                    settings, "wrong-target draws")

  test = exactness.distribution_test(spec, base, wrong_draws,
                                     significance=settings.significance,
                                     fail_fast=settings.fail_fast)
  record: Dict[str, Any] = {
      "samples": int(len(spec)),
      "length": settings.length,
      **test
  }
  return record, models


def check(args: arguments.RunArguments) -> None:
  """What certify needs of the run's settings: one fixed γ and k, and
  something speculative to certify; ConfigError."""
  if args.auto_gamma or args.decode_mode.auto_width:
    raise ConfigError(
        f"GAMMA={args.gamma!r}, TREE_WIDTH="
        f"{decode_modes.tree_of(args.decode_mode).width!r}: certify tests "
        "one configuration; allowed: integers (the run's metrics.json "
        "records the γ and k 'auto' chose).")
  if args.speculation == decode_modes.SPECULATION_OFF:
    raise ConfigError(
        "SPECULATION='off': the target decodes alone, so there is nothing "
        "speculative to certify (its output is the target's own by "
        "construction). Allowed: SPECULATION='on', or 'auto' (certify "
        "tests its speculative choice).")


def certify(args: arguments.RunArguments,
            settings: CertifySettings) -> Dict[str, Any]:
  """certificate.json's dict: each test's result and the verdict."""
  mode = decode_modes.mode_of(args)
  record: Dict[str, Any] = dict(decode_mode=mode.name,
                                speculation=args.speculation, gamma=args.gamma,
                                temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, lenience=mode.lenience,
                                settings=dataclasses.asdict(settings))
  if mode.lenience != 1:
    record.update(
        exact_by_design=False, certified=False, failed=False,
        why=(f"LENIENCE={mode.lenience:g} < 1: each token's probability is "
             f"at most p(x)/l = {1 / mode.lenience:.3g}·p(x) "
             "(docs/design/beyond_the_paper.md)"))
    record["verdict"] = verdict_line(record)
    return record
  identity, models = greedy_identity(args, settings)
  record["greedy_identity"] = identity
  ok = identity["identical"] == identity["examples"]
  sampled = _sampled(args)
  if sampled and settings.fail_fast and not ok:
    record["skipped"] = ["distribution"]
  elif sampled:
    dist, _ = distribution_test(args, settings, models)
    record["distribution"] = dist
    ok = ok and dist["passed"] and dist["power_ok"]
  record.update(certified=ok, failed=not ok)
  record["verdict"] = verdict_line(record)
  return record


def verdict_line(record: Dict[str, Any]) -> str:
  """One line: 'certified exact: ...' or 'NOT certified: ...'."""
  if record.get("exact_by_design") is False:
    return f"not exact by design: {record['why']}"
  identity = record["greedy_identity"]
  words = [f"identity {identity['identical']}/{identity['examples']}"]
  dist = record.get("distribution")
  if dist:
    power = dist["power_check"]
    words.append(
        f"chi-square p = {dist['test']['p_value']:.2g} (power check " +
        (f"p = {power['p_value']:.2g}" if power else "skipped") +
        f"), {dist['samples']:,} samples × 2 of {dist['length']} tokens")
  words.append(f"T = {record['temperature']:g}")
  if record["top_k"]:
    words.append(f"top-k {record['top_k']}")
  if record["top_p"] != 1:
    words.append(f"top-p {record['top_p']:g}")
  words.append(f"{record['decode_mode']} γ = {record['gamma']}")
  if record.get("speculation") == decode_modes.SPECULATION_AUTO:
    words.append("SPECULATION='auto': its speculative choice tested (its "
                 "other, the target alone, is the target's own)")
  head = "certified exact" if record["certified"] else "NOT certified"
  if record.get("skipped"):
    words.append(f"fail fast: {', '.join(record['skipped'])} skipped")
  if dist and not dist["power_ok"] and dist["passed"]:
    head += " (the power check did not fail: more samples needed)"
  return f"{head}: " + ", ".join(words)


def settings_from_flags() -> CertifySettings:
  """The flags, checked (ConfigError naming the flag)."""
  values = dict(examples=_EXAMPLES.value, length=_LENGTH.value,
                samples=_SAMPLES.value, chunk=_CHUNK.value)
  for name, value in values.items():
    if value < 1:
      raise ConfigError(f"--{name}={value}: allowed: an integer >= 1.")
  if values["length"] > arguments.MAX_DECODE_LENGTH:
    raise ConfigError(
        f"--length={values['length']}: allowed: 1 to "
        f"{arguments.MAX_DECODE_LENGTH} (the tokens the distribution test "
        "compares; each draw decodes that many).")
  if not 0 < _SIGNIFICANCE.value < 1:
    raise ConfigError(f"--significance={_SIGNIFICANCE.value}: "
                      "allowed: a number in (0, 1).")
  return CertifySettings(significance=_SIGNIFICANCE.value,
                         fail_fast=_FAIL_FAST.value, **values)


def _certificates(folder: str) -> Iterator[output_folder.Result]:
  """The certificate.json in `folder` and the settings it records (None:
  one from before certificates recorded the run's)."""
  path = os.path.join(folder, CERTIFICATE_FILE)
  if io_utils.isfile(path):
    settings = output_folder.recorded_settings(path)
    if not (isinstance(settings, dict) and "certify" in settings):
      settings = None
    yield output_folder.Result(CERTIFICATE_FILE, comparable(settings))


def main(argv: Sequence[str]) -> None:
  run_lib.parse_flags(argv)
  settings = settings_from_flags()
  console.setup()
  args = arguments.run_arguments()
  check(args)
  recorded = settings_record(args, settings)
  path = os.path.join(args.output_dir, CERTIFICATE_FILE)
  with output_folder.claim(args.output_dir, comparable(recorded), _certificates,
                           name="OUTPUT_DIR", program="certify",
                           overwrite=args.overwrite,
                           overwrite_flag="OVERWRITE=True"):
    compilation_cache.enable()
    start = time.perf_counter()
    record = certify(args, settings)
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
