"""The decode benchmark: baseline vs speculative walltime, cost curves, c.

  python -m tools.benchmarks.decode --target small --draft xsmall \\
      --max_decode_length 64 --output benchmarks/cpu_small.json

Sizes: tiny, mini, xsmall (gin/models/bench_<size>.gin), small, base, large,
xl, xxl (gin/models/t5_1_1_<size>.gin), or a gin file binding T5Config
(e.g. gin/models/multi30k_target.gin, gin/local_tiny.gin).

What it measures, for a target and a draft T5 config with random weights, on
the default JAX backend (`decode_measure.run_benchmark`):

* `baseline_ms_per_token`: `decoding.temperature_sample` (the target alone)
  over `max_decode_length` tokens with eos_id=-1 (it never stops early),
  walltime / max_decode_length. Includes the one-off encoding.
* `target_cost_ratio_by_k`: the target's time for one `decode_chunk` call of
  K new tokens (cache filled to `fill_length`), divided by K = 1's.
* `draft_ms_per_step`, `target_ms_per_step` (one-token calls) and the cost
  coefficient c = draft / target (Definition 3.7).
* `iteration_split_ms[γ]`: one speculative iteration (Algorithm 1 as
  `decoding.speculative_iteration` runs it) split into the draft loop
  (`drafter.propose`, γ draft steps), the target's γ+1 chunk (the K = γ+1
  point of the sweep, which always includes it), and the rest (total - the
  two: standardization, acceptance, statistics/trace writes, rollback).
* `points`: for each (α, γ), the speculative decoder's walltime over the
  same number of tokens with a *synthetic* acceptance rule (each draft token
  accepted independently with probability α), the measured speedup over the
  baseline, Theorem 3.8's prediction for α, γ and the measured c, and the
  efficiency = measured / theoretical; also the prediction with the
  measured cost of the γ+1 chunk in place of 1 target step
  (`theoretical_speedup_chunk_adjusted`), and the walltime modeled as the
  two encodings + iterations x the measured iteration time.
* Memory-bandwidth bound of the baseline: decoder parameter bytes read per
  token / device bandwidth (`--device_bandwidth_gbps`, else a known value for
  the device kind; omitted when unknown, e.g. on CPU).
* With `--check_greedy_identity`, the one exactness question the benchmark
  answers, with real acceptance (`decode_measure.greedy_identity_check`).

Synthetic acceptance is for timing only: the emitted tokens are not samples
of the target's distribution. The rule (`synthetic.SyntheticAcceptance`)
lives in the benchmarks only; `decoding` never uses it unless it is passed
as the loop's acceptance rule, as this benchmark does. The output says
`"synthetic_acceptance": true`.

Timing method (`specdec_jax.metrics.timing`, which `run` times c with too).
Every timed function is jitted; the first call (compile and first run) is a
warm-up whose excess over the median run is reported as `compile_time_s`,
never part of a timing. Timings are medians over `repeats` runs, each ended
by `jax.block_until_ready`. Per-call costs (K sweep, draft step, iteration
split) run `inner_steps` calls inside one jitted `lax.fori_loop` (carrying
the cache, so nothing is hoisted or dead-code eliminated) and divide: like
the decode loops themselves, they then pay no per-call dispatch. Each call
resets the cache length to the fill length (alternating +0/+1 so nothing is
loop-invariant); all per-call timings use one cache capacity
(max_decode_length + max K + 2).

Every flag arrives as text and is checked by `validate`, the one check
shared with Python callers, before any model is built or compiled: a bad
value prints one line naming the flag, the value and what is allowed, and
exits 2. Random weights come from
`specdec_jax.checkpoints.random_params`, as `run`'s without
checkpoints.
"""
import argparse
import functools
import inspect
import math
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax

from specdec_jax.core.models.config import T5Config
from tools.benchmarks import common
from tools.benchmarks import decode_measure
from tools.benchmarks.decode_measure import BenchmarkConfig
from tools.benchmarks.common import BenchmarkFlagError
from tools.benchmarks.common import DTYPES
from tools.benchmarks.common import flag_error

PROGRAM = "benchmark_decode"


# ---------------------------------------------------------------------------
# Values.
# ---------------------------------------------------------------------------
def _parse_list(flag: str, value: Any, kind: Callable[[str], Any], allowed: str,
                check: Callable[[Any], bool]) -> Tuple:
  """A comma-separated list (or a list) -> tuple, deduplicated in order."""
  text = (",".join(
      str(v) for v in value) if isinstance(value,
                                           (list, tuple)) else str(value))
  items = [s.strip() for s in text.split(",")]
  if any(not s for s in items):
    raise flag_error(flag, text, allowed)
  values = []
  for s in items:
    try:
      v = kind(s)
    except ValueError:
      raise flag_error(flag, s, allowed) from None
    if not check(v):
      raise flag_error(flag, s, allowed)
    values.append(v)
  return tuple(dict.fromkeys(values))


def _parse_int(flag: str, text: Any, minimum: int,
               allowed: Optional[str] = None) -> int:
  allowed = allowed or f"an integer >= {minimum}"
  try:
    v = int(str(text).strip())
  except ValueError:
    raise flag_error(flag, text, allowed) from None
  if v < minimum:
    raise flag_error(flag, text, allowed)
  return v


def _parse_float(flag: str, text: Any, minimum: float, strict: bool,
                 unit: str = "") -> float:
  """A finite number >= minimum (> minimum if `strict`)."""
  allowed = f"a finite number {'>' if strict else '>='} {minimum:g}{unit}"
  try:
    v = float(text)
  except (TypeError, ValueError):
    raise flag_error(flag, text, allowed) from None
  if math.isinf(v) or not (v > minimum if strict else v >= minimum):
    raise flag_error(flag, text, allowed)
  return v


def _parse_fill(fill_length: Any, max_decode_length: int) -> int:
  if fill_length is None:
    return max_decode_length // 2
  allowed = (f"an integer in [0, max_decode_length - 1 = "
             f"{max_decode_length - 1}]")
  fill = _parse_int("fill_length", fill_length, 0, allowed)
  if fill >= max_decode_length:
    raise flag_error("fill_length", fill_length, allowed)
  return fill


def _check_output(output: Optional[str]) -> Optional[str]:
  if output and not os.path.isdir(os.path.dirname(os.path.abspath(output))):
    raise flag_error("output", output, "a file path in an existing directory")
  return output or None


def _model_pair(target: str, draft: str,
                dtype: str) -> Tuple[T5Config, str, T5Config, str, List[str]]:
  """Both models' configs in `dtype`; the draft must share the vocabulary."""
  target_config, target_label, w1 = common.resolve_model_config(
      target, "target")
  draft_config, draft_label, w2 = common.resolve_model_config(draft, "draft")
  if draft_config.vocab_size != target_config.vocab_size:
    raise BenchmarkFlagError(
        f"--draft: {draft!r} has vocab_size {draft_config.vocab_size} but "
        f"--target {target!r} has {target_config.vocab_size} (allowed: a "
        "draft with the target's vocabulary).")
  return (target_config.replace(dtype=DTYPES[dtype]), target_label,
          draft_config.replace(dtype=DTYPES[dtype]), draft_label, w1 + w2)


def validate(*, target="small", draft="xsmall", alphas="0.5,0.75,0.9",
             gammas="1,3,5,7", chunk_sizes="1,2,4,8,16", batch_size=1,
             input_length=64, max_decode_length=64, fill_length=None, repeats=5,
             inner_steps=8, temperature=0.0, dtype=None,
             device_bandwidth_gbps=None, seed=0, output="benchmark.json",
             check_greedy_identity=False) -> BenchmarkConfig:
  """Checks every setting (strings or values) and returns a BenchmarkConfig.

  Its keyword defaults are the benchmark's (`--help` shows them as the
  flags' defaults). `fill_length` None: max_decode_length // 2; `dtype` None:
  `default_dtype()`.

  Raises:
    BenchmarkFlagError naming the flag, the bad value and what is allowed.
  """
  ints = "comma-separated integers >= 1"
  alphas = _parse_list("alphas", alphas, float,
                       "comma-separated numbers in [0, 1]",
                       lambda a: 0.0 <= a <= 1.0)
  gammas = _parse_list("gammas", gammas, int, ints, lambda g: g >= 1)
  ks = _parse_list("chunk_sizes", chunk_sizes, int, ints, lambda k: k >= 1)
  max_decode_length = _parse_int("max_decode_length", max_decode_length, 1)
  dtype = default_dtype() if dtype is None else dtype
  if dtype not in DTYPES:
    raise flag_error("dtype", dtype, ", ".join(DTYPES))
  if device_bandwidth_gbps is not None:
    device_bandwidth_gbps = _parse_float("device_bandwidth_gbps",
                                         device_bandwidth_gbps, 0.0,
                                         strict=True, unit=" (GB/s)")
  settings = dict(
      alphas=alphas, gammas=gammas, chunk_sizes=tuple(sorted(set(ks) | {1})),
      max_decode_length=max_decode_length,
      fill_length=_parse_fill(fill_length, max_decode_length),
      temperature=_parse_float("temperature", temperature, 0.0,
                               strict=False), dtype=dtype,
      device_bandwidth_gbps=device_bandwidth_gbps, output=_check_output(output),
      check_greedy_identity=bool(check_greedy_identity))
  for name, value, minimum in (("batch_size", batch_size,
                                1), ("input_length", input_length,
                                     1), ("repeats", repeats, 1),
                               ("inner_steps", inner_steps, 1), ("seed", seed,
                                                                 0)):
    settings[name] = _parse_int(name, value, minimum)
  (target_config, target_label, draft_config, draft_label,
   warnings) = _model_pair(target, draft, dtype)
  return BenchmarkConfig(target=target_label, draft=draft_label,
                         target_config=target_config, draft_config=draft_config,
                         warnings=tuple(warnings), **settings)


def default_dtype() -> str:
  """bfloat16 on accelerators, float32 on CPU."""
  return "float32" if jax.default_backend() == "cpu" else "bfloat16"


# -- the command line ----------------------------------------------------------
_HELP = {
    "target": "target model: a size (" + ", ".join(common.MODEL_SIZES) +
              ") or a gin file",
    "draft": "draft model: a size or a gin file",
    "alphas": "synthetic acceptance rates, comma-separated in [0, 1]",
    "gammas": "draft tokens per iteration, comma-separated ints >= 1",
    "chunk_sizes": "K values of the target cost curve (1 is always added)",
    "batch_size": "rows decoded together",
    "input_length": "encoder input tokens per row",
    "max_decode_length": "tokens generated per row (eos never stops a row)",
    "fill_length": "decoder cache fill for per-call timings (default "
                   "max_decode_length // 2)",
    "repeats": "timed runs (median)",
    "inner_steps": "calls per timed program for per-call costs",
    "temperature": "sampling temperature of both decoders (0 = greedy)",
    "dtype": "float32 or bfloat16 (default: bfloat16 on accelerators, "
             "float32 on CPU); params are cast to it",
    "device_bandwidth_gbps": "peak memory bandwidth for the bandwidth bound "
                             "(default: known value for the device kind, "
                             "else omitted)",
    "seed": "seed of the random weights and inputs",
    "output": "JSON output path ('' to skip)",
    "check_greedy_identity": "also decode greedily with both decoders (real "
                             "acceptance) and compare tokens, and compare the "
                             "target's (γ+1)-token logits with one-token "
                             "calls: the temperature-0 exactness check for "
                             "this backend and dtype",
}


def _parser() -> argparse.ArgumentParser:
  """Every flag as text (None: `validate`'s default, shown in --help)."""
  p = argparse.ArgumentParser(prog="python -m tools.benchmarks.decode",
                              exit_on_error=False,
                              description=__doc__.split("\n")[0])
  for name, param in inspect.signature(validate).parameters.items():
    default = "" if param.default is None else f" (default {param.default})"
    if name == "check_greedy_identity":
      p.add_argument(f"--{name}", action="store_true", help=_HELP[name])
    else:
      p.add_argument(f"--{name}", default=None, help=_HELP[name] + default)
  return p


def parse_flags(argv: Optional[Sequence[str]] = None) -> BenchmarkConfig:
  """Parses and validates flags; raises BenchmarkFlagError (no compilation)."""
  try:
    args, rest = _parser().parse_known_args(sys.argv[1:] if argv is
                                            None else argv)
  except argparse.ArgumentError as e:
    raise BenchmarkFlagError(str(e)) from None
  if rest:
    raise BenchmarkFlagError(
        f"unexpected arguments {rest} (allowed: --flag=value only; see "
        "--help).")
  given = {k: v for k, v in vars(args).items() if v is not None}
  return validate(**given)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command; returns the exit status (2 on a bad flag)."""
  try:
    cfg = parse_flags(argv)
  except BenchmarkFlagError as e:
    print(f"{PROGRAM}: error: {e}", file=sys.stderr)
    return 2
  log = functools.partial(print, file=sys.stderr, flush=True)
  result = decode_measure.run_benchmark(cfg, log=log)
  print(format_report(result))
  common.write_result(cfg.output, result)
  return 0


# -- the console summary -------------------------------------------------------
# The benchmark's console summary: a few aligned tables of its JSON result.
def _header(r: Dict[str, Any]) -> List[str]:
  return [
      "SYNTHETIC ACCEPTANCE (timing only: draft tokens accepted i.i.d. with "
      "probability alpha)",
      f"backend {r['backend']} ({r['device_kind']}), jax {r['jax_version']}, "
      f"dtype {r['dtype']}, batch {r['batch_size']}, input "
      f"{r['input_length']}, decode {r['max_decode_length']} tokens",
      f"target {r['target']} ({r['target_config']['num_params'] / 1e6:.1f}M)"
      f", draft {r['draft']} ({r['draft_config']['num_params'] / 1e6:.1f}M)",
  ]


def _step_costs(r: Dict[str, Any]) -> List[str]:
  lines = [
      f"baseline            {r['baseline_ms_per_token']:9.3f} ms/token",
      f"target step (K=1)   {r['target_ms_per_step']:9.3f} ms",
      f"draft step (K=1)    {r['draft_ms_per_step']:9.3f} ms",
      f"cost coefficient c  {r['cost_coefficient_c']:9.4f}",
      f"start (encode)      target {r['target_start_ms']:.3f} ms, draft "
      f"{r['draft_start_ms']:.3f} ms",
      f"weights streamed    {r['baseline_effective_param_bandwidth_gbps']:9.1f}"
      f" GB/s effective ({r['target_decoder_param_bytes_per_token'] / 1e6:.0f}"
      " MB of decoder params per token)",
  ]
  if "baseline_bandwidth_bound_ms_per_token" in r:
    lines.append(
        f"bandwidth bound     {r['baseline_bandwidth_bound_ms_per_token']:9.4f}"
        f" ms/token at {r['device_bandwidth_gbps']:.0f} GB/s "
        f"(baseline is {r['baseline_to_bandwidth_bound_ratio']:.2f}x it)")
  return lines


def _cost_by_k(r: Dict[str, Any]) -> List[str]:
  lines = [
      "target decode_chunk cost by K (ratio to K=1):",
      "     K     ms/call   ratio"
  ]
  for k, ratio in r["target_cost_ratio_by_k"].items():
    lines.append(f"  {k:>4}  {r['target_ms_by_k'][k]:10.3f}  {ratio:6.2f}")
  return lines


def _iteration_split(r: Dict[str, Any]) -> List[str]:
  lines = [
      f"one speculative iteration (ms; alpha "
      f"{r['iteration_split_alpha']}):",
      "  gamma     draft    target     other     total"
  ]
  for g, s in r["iteration_split_ms"].items():
    lines.append(f"  {g:>5}  {s['draft_ms']:8.3f}  {s['target_ms']:8.3f}  "
                 f"{s['other_ms']:8.3f}  {s['total_ms']:8.3f}")
  return lines


def _speedups(r: Dict[str, Any]) -> List[str]:
  lines = [
      "speedup over the baseline (same tokens; efficiency = "
      "measured / theory):",
      "                          |  Theorem 3.8      | at realized "
      "tok/call | with K=γ+1 cost",
      "  alpha  gamma  tok/call  measured | theory  effic.  |  theory"
      "  effic.    |  theory  effic."
  ]
  for p in r["points"]:
    lines.append(
        f"  {p['alpha']:5.2f}  {p['gamma']:5d}  "
        f"{p['tokens_per_target_call']:8.2f}  {p['measured_speedup']:8.3f} |"
        f" {p['theoretical_speedup']:6.3f}  {p['efficiency']:6.3f}  |  "
        f"{p['theoretical_speedup_realized_acceptance']:6.3f}  "
        f"{p['efficiency_realized_acceptance']:6.3f}    |  "
        f"{p['theoretical_speedup_chunk_adjusted']:6.3f}  "
        f"{p['efficiency_chunk_adjusted']:6.3f}")
  return lines


def _greedy_identity(r: Dict[str, Any]) -> List[str]:
  if "greedy_identity" not in r:
    return []
  g = r["greedy_identity"]
  return [
      f"greedy identity (REAL acceptance, γ = {g['gamma']}, "
      f"alpha_hat {g['alpha_hat']:.3f}): {g['identical']}/"
      f"{g['examples']} rows identical; (γ+1)-token vs one-token logits "
      f"max |diff| {g['chunk_vs_step_max_abs_logit_diff']:.3g}, "
      f"argmax agreement {g['chunk_vs_step_argmax_agreement']:.3f}", ""
  ]


def format_report(r: Dict[str, Any]) -> str:
  """A readable multi-table summary of a `run_benchmark` result."""
  sections = [
      _header(r),
      _step_costs(r),
      _cost_by_k(r),
      _iteration_split(r),
      _speedups(r)
  ]
  lines = []
  for section in sections:
    lines += section + [""]
  lines += _greedy_identity(r)
  lines.append(f"compile time (excluded from timings): "
               f"{r['compile_time_s']:.1f} s")
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
