"""The benchmark's console summary: a few aligned tables of its JSON result."""
from typing import Any, Dict, List


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
