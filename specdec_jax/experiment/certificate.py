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
   (`device_check.stats.two_sample_chisquare`: cells of enough mass, the
   rest pooled); and the same test against a deliberately wrong target
   (its temperature × 0.9), which must fail: the test's power.
3. A rule that is not exact by design (LENIENCE < 1) is reported so, with
   its documented bound, not tested.

With `CertifySettings.fail_fast` (`--fail_fast`) a certificate stops at the
first failed test: a failed greedy identity skips the distribution test, a
failed distribution test its power check (the certificate fails either
way; the record says what was skipped).
"""
import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.device_check import stats
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import runner
from specdec_jax.experiment.plan import Models
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import RunPlan


@dataclasses.dataclass(frozen=True)
class CertifySettings:
  """How hard `certify` tests (command-line flags).

  Attributes:
    examples: N, greedy identity's examples of the run's data.
    length: L, the tokens compared by the distribution test.
    samples: M, draws of each decoder (rounded up to whole chunks).
    chunk: rows decoded per call (one compiled shape).
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


def greedy_identity(
    args: arguments.RunArguments, settings: CertifySettings,
    models: Optional[Models] = None) -> Tuple[Dict[str, Any], Models]:
  """({'examples', 'identical', 'mismatches': [{'index', 'position'}]},
  the models): the T = 0 variant on the run's first N examples."""
  plan, models = _plan(args, models, temperature=0.0, top_k=0, top_p=1.0,
                       num_examples=settings.examples)
  data = runner.read_examples(plan)
  mismatches: List[Dict[str, int]] = []
  done = 0
  for i, (batch, keep) in enumerate(data.feed.batches()):
    rng = jax.random.fold_in(plan.rng, i)
    base = np.asarray(plan.baseline(batch, rng).tokens)[keep]
    spec = np.asarray(plan.speculative(batch, rng).tokens)[keep]
    for j, (b, s) in enumerate(zip(base, spec)):
      differ = np.flatnonzero(b != s)
      if differ.size:
        mismatches.append({"index": done + j, "position": int(differ[0])})
    done += len(base)
  return {
      "examples": done,
      "identical": done - len(mismatches),
      "mismatches": mismatches
  }, models


def _draws(decoder, inputs: np.ndarray, rng: jax.Array,
           settings: CertifySettings) -> np.ndarray:
  """[M, L] the first L tokens of M decodes of one input, in chunks."""
  batch = jnp.asarray(np.repeat(inputs[None], settings.chunk, axis=0))
  chunks = -(-settings.samples // settings.chunk)
  out = [
      np.asarray(decoder(batch,
                         jax.random.fold_in(rng,
                                            c)).tokens)[:, :settings.length]
      for c in range(chunks)
  ]
  return np.concatenate(out)


def distribution_test(
    args: arguments.RunArguments, settings: CertifySettings,
    models: Optional[Models] = None) -> Tuple[Dict[str, Any], Models]:
  """The chi-square of speculative vs target-alone draws, and its power
  check against the target at temperature × 0.9."""
  # At least γ target tokens (a run's check); the first L are compared.
  lengths = dict(args.task_feature_lengths, targets=max(settings.length,
                                                        int(args.gamma)))
  plan, models = _plan(args, models, task_feature_lengths=lengths,
                       batch_size=settings.chunk, num_examples=1)
  inputs = np.asarray(next(iter(
      runner.read_examples(plan).feed.batches()))[0])[0]
  rng = plan.rng
  spec = _draws(plan.speculative, inputs, jax.random.fold_in(rng, 1), settings)
  base = _draws(plan.baseline, inputs, jax.random.fold_in(rng, 2), settings)
  test = stats.two_sample_chisquare(spec, base)
  record: Dict[str, Any] = {
      "samples": int(len(spec)),
      "length": settings.length,
      "test": test,
      "passed": test["p_value"] >= settings.significance,
  }
  if settings.fail_fast and not record["passed"]:
    record.update(power_check=None, power_ok=None, skipped=["power_check"])
    return record, models
  wrong, _ = _plan(args, models, task_feature_lengths=lengths,
                   batch_size=settings.chunk, num_examples=1,
                   temperature=args.temperature * 0.9)
  off = _draws(wrong.baseline, inputs, jax.random.fold_in(rng, 3), settings)
  power = stats.two_sample_chisquare(spec, off)
  record.update(power_check=power, power_ok=power["p_value"]
                < settings.significance)
  return record, models


def check(args: arguments.RunArguments) -> None:
  """What certify needs of the run's settings: one fixed γ and k (the
  'auto' pilots choose them by measuring); ValueError."""
  if args.auto_gamma or args.auto_tree_width:
    raise ValueError(
        f"GAMMA={args.gamma!r}, TREE_WIDTH={args.tree_width!r}: certify tests "
        "one configuration; allowed: integers (the run's metrics.json "
        "records the γ and k 'auto' chose).")


def certify(args: arguments.RunArguments,
            settings: CertifySettings) -> Dict[str, Any]:
  """certificate.json's dict: each test's result and the verdict."""
  mode = decode_modes.mode_of(args)
  record: Dict[str, Any] = {
      "decode_mode": mode.name,
      "gamma": args.gamma,
      "temperature": args.temperature,
      "top_k": args.top_k,
      "top_p": args.top_p,
      "lenience": args.lenience,
      "settings": dataclasses.asdict(settings),
  }
  if args.lenience != 1:
    record.update(
        exact_by_design=False, certified=False, failed=False,
        why=(f"LENIENCE={args.lenience:g} < 1: each token's probability is "
             f"at most p(x)/l = {1 / args.lenience:.3g}·p(x) "
             "(docs/design/beyond_the_paper.md)"))
    record["verdict"] = verdict_line(record)
    return record
  identity, models = greedy_identity(args, settings)
  record["greedy_identity"] = identity
  ok = identity["identical"] == identity["examples"]
  sampled = args.temperature > 0 and not mode.beam
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
  head = "certified exact" if record["certified"] else "NOT certified"
  if record.get("skipped"):
    words.append(f"fail fast: {', '.join(record['skipped'])} skipped")
  if dist and not dist["power_ok"] and dist["passed"]:
    head += " (the power check did not fail: more samples needed)"
  return f"{head}: " + ", ".join(words)
