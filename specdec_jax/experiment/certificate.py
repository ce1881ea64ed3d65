"""A certificate of exactness for the run's own configuration (issue 46).

Built from exactly what `run` builds (`RunPlan`: the pair, the drafter, the
decode mode and its acceptance rule, γ/k, the sampling settings), through
the same registries, so a user's registered drafter, decode mode or rule
is certified without new code:

1. **Greedy identity**: the T = 0 variant of the configuration decodes N
   examples of the run's data speculatively and with the target alone;
   every mismatch is listed with its first differing position.
2. **Distribution**: at the configured sampling settings, the whole
   decoder's first L tokens for one input, drawn M times speculatively and
   M times by the target alone, compared by a two-sample chi-square
   (`metrics.exactness.distribution_test`: cells of enough mass, the rest
   pooled); and the same test against a deliberately wrong target (its
   temperature × 0.9), which must fail: the test's power.
3. A rule that is not exact by design (LENIENCE < 1) is reported so, with
   its documented bound, not tested.

With `CertifySettings.fail_fast` (`--fail_fast`) a certificate stops at the
first failed test: a failed greedy identity skips the distribution test, a
failed distribution test its power check (the certificate fails either
way; the record says what was skipped).

`settings_record` builds every plan the tests will decode with before any
test runs (a setting they cannot decode with is refused naming certify's
flag), and is what certificate.json records as its `settings` (the
OVERWRITE rule). Each phase logs a progress line on stderr
(`console.phase`), and the distribution test's draws how many are drawn
and about how long the rest will take.
"""
import dataclasses
import time
from typing import Any, Dict, Optional, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.experiment import arguments
from specdec_jax.experiment import batches
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import runner
from specdec_jax.experiment.plan import Models
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.metrics import exactness
from specdec_jax.terminal import console

# Where certify records its results (`certificate.json`); its warnings
# name it and certify's own flags.
CERTIFICATE_FILE = "certificate.json"


@dataclasses.dataclass(frozen=True)
class CertifySettings:
  """How hard `certify` tests (command-line flags).

  Attributes:
    examples: N, greedy identity's examples of the run's data.
    length: L, the tokens compared by the distribution test.
    samples: M, draws of each decoder, exactly (any M >= 1: the power
      check says when M was too few to tell anything).
    chunk: rows decoded per call (one compiled shape; at most M).
    significance: p below this fails the test (the power check must).
    fail_fast: stop at the first failed test (see the module doc).
  """
  examples: int = 100
  length: int = 3
  samples: int = 20000
  chunk: int = 2000
  significance: float = 1e-3
  fail_fast: bool = False


def _plan(args: arguments.RunArguments, models: Optional[Models],
          **changes) -> Tuple[DecodePlan, Models]:
  """The run's plan with `changes` to its arguments, loaded (models
  reused)."""
  plan = RunPlan.build(dataclasses.replace(args, **changes))
  models = plan.load_models(models)
  return plan.load(models).decoding(), models


def _chunk(settings: CertifySettings) -> int:
  """Rows per call: --chunk, or M when fewer (M is drawn exactly)."""
  return min(settings.chunk, settings.samples)


def _distribution_changes(args: arguments.RunArguments,
                          settings: CertifySettings) -> Dict[str, Any]:
  """The distribution test's changes to the run's arguments: at least γ
  target tokens (a run's check), of which the first L are compared; one
  input, `_chunk` rows per call."""
  lengths = dict(args.task_feature_lengths, targets=max(settings.length,
                                                        int(args.gamma)))
  return dict(task_feature_lengths=lengths, batch_size=_chunk(settings),
              num_examples=1)


def _sampled(args: arguments.RunArguments) -> bool:
  """Whether certify runs the distribution test (T > 0, no beams)."""
  return args.temperature > 0 and not decode_modes.mode_of(args).beam


def settings_record(args: arguments.RunArguments, settings: CertifySettings,
                    providers: Any = None) -> Dict[str, Any]:
  """certificate.json's `settings`: the run's (`RunPlan.settings`, as its
  metrics.json records them) and certify's flags (`certify`).

  The distribution test's plan is built here too, before any test runs.

  Raises:
    ConfigError: a bad setting; one the distribution test cannot decode
      with names --length and --chunk (the user set no
      TASK_FEATURE_LENGTHS['targets'] or BATCH_SIZE of its own).
  """
  record = dict(RunPlan.build(args, providers).settings)
  record["certify"] = dataclasses.asdict(settings)
  if not _sampled(args):
    return record
  changes = _distribution_changes(args, settings)
  try:
    RunPlan.build(dataclasses.replace(args, **changes), providers)
  except ConfigError as e:
    raise ConfigError(
        f"--length={settings.length}, --chunk={settings.chunk}: the "
        f"distribution test decodes {changes['batch_size']} rows of "
        f"max(--length, GAMMA) = {changes['task_feature_lengths']['targets']}"
        " tokens per call (as TASK_FEATURE_LENGTHS['targets'] and "
        f"BATCH_SIZE): {e} Allowed: a smaller --length or --chunk.") from None
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
  with console.phase(f"certify: greedy identity on {len(data.examples)} "
                     "examples (speculative and target alone)"):
    return _identity(plan, data), models


def _identity(plan: DecodePlan, data: runner.RunData) -> Dict[str, Any]:
  """`greedy_identity`'s record: each batch decoded both ways."""
  identity = exactness.GreedyIdentity()
  for batch in batches.batches(data.feed, plan.rng):
    base, _ = batch.decode(plan.baseline)
    spec, _ = batch.decode(plan.speculative)
    identity.add(
        np.asarray(base.tokens)[batch.keep],
        np.asarray(spec.tokens)[batch.keep])
  return identity.record()


def _draws(decoder, inputs: np.ndarray, rng: jax.Array,
           settings: CertifySettings, what: str = "draws") -> np.ndarray:
  """[M, L] the first L tokens of exactly M decodes of one input, in
  chunks; after each chunk a progress line: drawn so far, time left."""
  chunk = _chunk(settings)
  batch = jnp.asarray(np.repeat(inputs[None], chunk, axis=0))
  chunks = -(-settings.samples // chunk)
  out, start = [], time.perf_counter()
  for c in range(chunks):
    tokens = decoder(batch, jax.random.fold_in(rng, c)).tokens
    out.append(np.asarray(tokens)[:, :settings.length])
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
  """What certify needs of the run's settings: one fixed γ and k (the
  'auto' pilots choose them by measuring), and something speculative to
  certify; ValueError."""
  if args.auto_gamma or args.decode_mode.auto_width:
    raise ValueError(
        f"GAMMA={args.gamma!r}, TREE_WIDTH="
        f"{decode_modes.tree_of(args.decode_mode).width!r}: certify tests "
        "one configuration; allowed: integers (the run's metrics.json "
        "records the γ and k 'auto' chose).")
  if args.speculation == decode_modes.SPECULATION_OFF:
    raise ValueError(
        "SPECULATION='off': the target decodes alone, so there is nothing "
        "speculative to certify (its output is the target's own by "
        "construction). Allowed: SPECULATION='on', or 'auto' (certify "
        "tests its speculative choice).")


def certify(args: arguments.RunArguments,
            settings: CertifySettings) -> Dict[str, Any]:
  """certificate.json's dict: each test's result and the verdict."""
  mode = decode_modes.mode_of(args)
  record: Dict[str, Any] = {
      "decode_mode": mode.name,
      "speculation": args.speculation,
      "gamma": args.gamma,
      "temperature": args.temperature,
      "top_k": args.top_k,
      "top_p": args.top_p,
      "lenience": mode.lenience,
      "settings": dataclasses.asdict(settings),
  }
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
