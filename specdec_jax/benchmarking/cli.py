"""The benchmark's command line (absl flags): `scripts/benchmark_decode.py`.

Flags are parsed into a fresh `flags.FlagValues` on every call, not into
absl's global FLAGS, so that `main` can run several times in one process
(tests) and next to other entry points' flags. Each flag arrives as text and
is checked by `config.validate`, the one check shared with Python callers:
a bad value prints one line naming the flag, the value and what is allowed,
and exits 2 before anything is built or compiled.
"""
import functools
import inspect
import sys
from typing import Any, Dict, List, Optional, Sequence

from absl import flags

from specdec_jax.benchmarking import config as config_lib
from specdec_jax.benchmarking import measure
from specdec_jax.config import flag_utils
from specdec_jax.files import io_utils

PROGRAM = "benchmark_decode"
_DESCRIPTION = (
    "Decode benchmark: baseline vs speculative walltime (synthetic "
    "acceptance), target cost vs chunk size, cost coefficient c, iteration "
    "split, Theorem 3.8 efficiency.")


def _defaults():
  """{flag: default}: `config.validate`'s keyword defaults, the one home of
  the benchmark's defaults."""
  params = inspect.signature(config_lib.validate).parameters
  return {name: p.default for name, p in params.items()}


def define_flags() -> flags.FlagValues:
  """A new FlagValues holding the benchmark's flags (text until validated)."""
  fv = flag_utils.new_flag_values()
  sizes = ", ".join(config_lib.MODEL_SIZES)
  defaults = _defaults()

  def define(name, help_text):  # A text flag, checked by `validate`.
    default = defaults[name]
    flags.DEFINE_string(name, None if default is None else str(default),
                        help_text, flag_values=fv)

  define("target", f"target model: a size ({sizes}) or a gin file")
  define("draft", f"draft model: a size ({sizes}) or a gin file")
  define("alphas", "synthetic acceptance rates, comma-separated in [0, 1]")
  define("gammas", "draft tokens per iteration, comma-separated ints >= 1")
  define("chunk_sizes", "K values of the target cost curve (1 is always added)")
  define("batch_size", "rows decoded together")
  define("input_length", "encoder input tokens per row")
  define("max_decode_length",
         "tokens generated per row (eos never stops a row)")
  define(
      "fill_length", "decoder cache fill for per-call timings "
      "(default max_decode_length // 2)")
  define("repeats", "timed runs (median)")
  define("inner_steps", "calls per timed program for per-call costs")
  define("temperature", "sampling temperature of both decoders (0 = greedy)")
  define(
      "dtype", "float32 or bfloat16 (default: bfloat16 on "
      "accelerators, float32 on CPU); params are cast to it")
  define(
      "device_bandwidth_gbps",
      "peak memory bandwidth for the bandwidth bound (default: known "
      "value for the device kind, else omitted)")
  define("seed", "seed of the random weights and inputs")
  define("output", "JSON output path ('' to skip)")
  flags.DEFINE_boolean(
      "check_greedy_identity", defaults["check_greedy_identity"],
      "also decode greedily with both decoders (real acceptance) and compare "
      "tokens, and compare the target's (γ+1)-token logits with one-token "
      "calls: the temperature-0 exactness check for this backend and dtype",
      flag_values=fv)
  return fv


def _parse(argv: Sequence[str]) -> flags.FlagValues:
  """Parses argv (without the program name) into a new FlagValues."""
  fv = define_flags()
  try:
    rest = flag_utils.parse_flag_values(fv, PROGRAM, argv)
  except flag_utils.ConfigError as e:
    raise config_lib.BenchmarkFlagError(str(e)) from None
  if rest:
    raise config_lib.BenchmarkFlagError(
        f"unexpected arguments {rest} (allowed: --flag=value only; see "
        "--help).")
  return fv


def _validate(fv: flags.FlagValues) -> config_lib.BenchmarkConfig:
  names = inspect.signature(config_lib.validate).parameters
  return config_lib.validate(**{name: fv[name].value for name in names})


def parse_flags(
    argv: Optional[Sequence[str]] = None) -> config_lib.BenchmarkConfig:
  """Parses and validates flags; raises BenchmarkFlagError (no compilation)."""
  return _validate(_parse(sys.argv[1:] if argv is None else argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point; returns the exit status (2 on a bad flag)."""
  try:
    fv = _parse(sys.argv[1:] if argv is None else argv)
    if fv.help:
      print(
          flag_utils.flags_help(fv, f"{PROGRAM} [--flag=value ...]",
                                _DESCRIPTION))
      return 0
    cfg = _validate(fv)
  except config_lib.BenchmarkFlagError as e:
    print(f"{PROGRAM}: error: {e}", file=sys.stderr)
    return 2
  log = functools.partial(print, file=sys.stderr, flush=True)
  result = measure.run_benchmark(cfg, log=log)
  print(format_report(result))
  if cfg.output:
    io_utils.write_json(cfg.output, result)
    print(f"wrote {cfg.output}")
  return 0


# -- formatting ----------------------------------------------------------------
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
      f"alpha_hat {g['alpha_hat']:.3f}): {g['rows_identical']}/"
      f"{g['rows']} rows identical; (γ+1)-token vs one-token logits "
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
