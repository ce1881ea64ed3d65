"""The device check's verdicts and its last lines (what a run's output shows).

`verdicts` reads the merged report (`cli.orchestrate`'s device_check.json)
into a few booleans and numbers; `format_summary` prints them as a short
table, the part of the log that the device tool's reply always carries.
"""
from typing import Any, Dict, List, Optional

from specdec_jax.metrics import overheads


def _get(report: Dict[str, Any], *keys: str) -> Any:
  node: Any = report
  for key in keys:
    if not isinstance(node, dict) or key not in node:
      return None
    node = node[key]
  return node


def _identity(report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
  """The pair's identity counts: at 'highest' precision if it was needed."""
  same = _get(report, "pretrained", "identity")
  if not same:
    return None
  return same.get("highest_precision") or same.get("default_precision")


def verdicts(report: Dict[str, Any]) -> Dict[str, Any]:
  """Booleans (None: not measured) and the headline numbers."""
  out: Dict[str, Any] = {
      "gpu_aware": _get(report, "env", "gpu_awareness", "ok"),
      "exactness_all_modes": _get(report, "exactness", "all_ok"),
  }
  for mode, entry in (_get(report, "exactness", "modes") or {}).items():
    out[f"exactness_{mode}"] = entry.get("ok")
  same = _identity(report)
  out["pretrained_identical"] = _get(report, "pretrained", "identity",
                                     "all_identical")
  out["pretrained_identical_count"] = (f"{same['identical']}/{same['examples']}"
                                       if same else None)
  out["pretrained_identical_other_pairs"] = _other_pairs_identical(report)
  # Only where the group ran: None (not measured) else.
  out["barriers_held"] = _get(report, "paths", "barriers", "all_held")
  out["main_job_speedup"] = _get(report, "pretrained", "main_job", "speedup")
  out["physics_complete"] = _get(report, "physics", "ok")
  out["paths_complete"] = _get(report, "paths", "ok")
  out["loop_complete"] = _get(report, "loop", "ok")
  statuses = [p.get("status") for p in report.get("phases", {}).values()]
  out["phases_ok"] = bool(statuses) and all(s == "ok" for s in statuses)
  # A phase that ran but did not finish is not ok (phases_ok); a check of
  # a phase not run is None and not counted.
  out["all_ok"] = all(v is not False for v in out.values())
  return out


def _other_pairs_identical(report: Dict[str, Any]) -> Optional[bool]:
  """Whether the shipped pair's greedy identity held under every other
  tile preset and mixed pair it ran under (None: none ran)."""
  found = [
      r["identity"]["all_identical"]
      for key in ("main_job_by_tiles", "main_job_by_mixed_paths")
      for r in (_get(report, "pretrained", key) or {}).values()
      if "all_identical" in (r.get("identity") or {})
  ]
  runs = _get(report, "pretrained", "main_job_by_gamma", "runs") or {}
  found += [identical_on_every_caption(r) for r in runs.values()]
  return all(found) if found else None


def identical_on_every_caption(run: Dict[str, Any]) -> bool:
  """Whether a main job's run (`gamma_sweep`'s) decoded the target alone's
  tokens on every caption (its last round's `pair_runs.identity`)."""
  return run["identity"]["identical"] == run["identity"]["examples"]


def main_job_against_theorem(report: Dict[str, Any]) -> Dict[str, Any]:
  """The ratio issue 56 quotes (0.6 on an H200: 1.30x against 2.18x): the
  pretrained phase's main-job speedup ÷ its Theorem 3.8 at the measured α
  and c, without and with the measured call cost (the loop phase's record,
  `loop.main_job`); {'skipped': why} when it was not measured."""
  job = _get(report, "pretrained", "main_job") or {}
  if not isinstance(job.get("speedup"), (int, float)):
    return {"skipped": "no main job measured (the pretrained phase)"}
  return {
      "speedup": job["speedup"],
      "theorem_3_8": job["theorem_3_8"],
      "theorem_3_8_with_call_cost": job["theorem_3_8_with_call_cost"],
      "over_theorem": job["speedup"] / job["theorem_3_8"],
      "over_theorem_with_call_cost": job["speedup"] /
                                     job["theorem_3_8_with_call_cost"],
  }


def _num(x: Any, fmt: str = "{:.3g}") -> str:
  return "-" if x is None else fmt.format(x)


def _exactness_lines(report: Dict[str, Any]) -> List[str]:
  lines = []
  argmax = _get(report, "exactness", "argmax_kernel")
  if argmax:
    agree = argmax.get("by_vocab") or {}
    lines.append("  argmax kernel: " + (", ".join(
        f"V {v} {r['agree']}/{r['rows']} rows as jnp.argmax"
        for v, r in agree.items()) or f"error ({argmax.get('error')})"))
  for mode, e in (_get(report, "exactness", "modes") or {}).items():
    if "skipped" in e:
      lines.append(f"  {mode:6s} skipped ({e['skipped']})")
      continue
    g = e["greedy"].get("highest_precision") or e["greedy"]["default_precision"]
    text = f"  {mode:6s} {'ok' if e['ok'] else 'FAILED'}: greedy "
    text += f"{g['identical']}/{g['examples']} identical"
    if "highest_precision" in e["greedy"]:
      text += " (at 'highest' precision only)"
    d = e.get("distribution")
    if d:
      text += (f"; chi-square p {_num(d['test']['p_value'])} vs "
               f"target, {_num(d['power_check']['p_value'])} vs "
               "wrong target")
    lines.append(text)
  return lines


def _physics_lines(report: Dict[str, Any]) -> List[str]:
  p = report.get("physics") or {}
  steps = p.get("steps") or {}
  lines = []
  if "c" in steps:  # Else the group failed: its error is in the phase line.
    c = ", ".join(f"{d} {v:.3f}" for d, v in steps["c"].items())
    lines.append(f"  target step {steps['target_step_ms']:.3f} ms "
                 f"({steps['target_effective_gbps']:.0f} GB/s of decoder "
                 f"weights); c: {c}")
  ratio = _get(p, "call_cost_by_k", "ratio")
  if ratio:
    lines.append("  K-token call in steps: " +
                 " ".join(f"{k}:{v:.2f}" for k, v in ratio.items()))
  tree = _get(p, "tree_call_cost", "by_width")
  if tree:
    lines.append("  tree call in steps: " +
                 " ".join(f"k={k} ({t['nodes']} nodes):{t['steps']:.2f}"
                          for k, t in tree.items()))
  beam = p.get("beam_call_cost") or {}
  if "beam_steps" in beam:
    lines.append(f"  speculative-beam call: {beam['beam_steps']:.2f} beam "
                 f"steps (beam {beam['beam_size']}, γ {beam['gamma']})")
  for row in p.get("table2") or []:
    lines.append(
        f"  Table 2 {row['task']:5s} {row['draft']:5s} T={row['temperature']:g}"
        f" γ={row['gamma']} α={row['alpha']:.2f}: paper {row['speedup']:.1f}x,"
        f" Theorem 3.8 {_num(row['theorem_3_8'], '{:.2f}')}x "
        f"(with call cost {_num(row['theorem_3_8_with_call_cost'], '{:.2f}')}"
        "x)")
  return lines


def _paths_lines(report: Dict[str, Any]) -> List[str]:
  """Per decode path: each model's step, its memory-floor share and c,
  the target's verification call in steps; kernels a decoder layer; per
  Table 2 row the best (target, draft) pair of paths; the option sets and
  tiles against the default; the main job at each batch size."""
  p = report.get("paths") or {}
  lines = []
  for path, models in (p.get("steps") or {}).items():
    if not isinstance(models, dict):
      continue
    kernels = _get(p, "kernels", path, "per_decoder_layer")
    lines.append(
        f"  {path:7s} kernels/layer {_num(kernels, '{}')}: " + ", ".join(
            f"{name} {m['step_ms']:.3f} ms ({m['floor_share']:.0%} of floor" +
            (f", c {m['c']:.3f})" if "c" in m else ")")
            for name, m in models.items()))
    target = next((m for m in models.values() if "call_cost" in m), None)
    if target:
      lines.append(f"  {path:7s} target's {target['call_k']}-token call: "
                   f"{target['call_cost']:.2f} steps")
  for row in _get(p, "table2_pairs", "best") or []:
    if row["task"] != "EnDe":  # Issue 56's rows (every row: the JSON).
      continue
    lines.append(
        f"  best pair {row['task']:5s} {row['draft']:5s} "
        f"T={row['temperature']:g} γ={row['gamma']}: {row['pair']} (target+"
        f"draft path) Theorem 3.8 {row['against_fastest_target']:.2f}x over "
        f"the fastest target alone, {row['of_paper']:.2f} of the paper's "
        f"{row['paper']:.1f}x")
  identical = _get(p, "tiles", "rows_identical") or {}
  if identical:
    lines.append("  tiles: a token's logits the same bits in one-token "
                 "calls and in one call: " +
                 ", ".join(f"{n} {_identical_word(r)} (k {r.get('k', '?')})"
                           for n, r in identical.items()))
  for name, r in (p.get("profile") or {}).items():
    if isinstance(r, dict):
      lines.append(_profile_line(name, r))
  if isinstance(p.get("barriers"), dict) and "held" in p["barriers"]:
    lines.append(_barriers_line(p["barriers"]))
  ratios = _get(p, "option_sets", "vs_reference") or {}
  if ratios:
    lines.append("  option_sets: " + " ".join(
        f"{k} {v:.2f}" for k, v in sorted(ratios.items(), key=lambda x: x[1])))
  lines.extend(_tiles_lines(p.get("tiles") or {}))
  for path, by_batch in (_get(report, "pretrained", "main_job_by_path") or
                         {}).items():
    lines.append(f"  main job on {path}: " +
                 ", ".join(_main_job_word(b, r) for b, r in by_batch.items()))
  options = _get(report, "pretrained", "main_job_by_options") or {}
  for name, r in options.items():
    if name != "current" and isinstance(r, dict) and "vs_current" in r:
      lines.append(_options_line(name, r, options.get("current") or {}))
  for pair, r in (_get(report, "pretrained", "main_job_by_mixed_paths") or
                  {}).items():
    target, draft = pair.split("+")
    lines.append(_pair_line(f"target on {target}, draft on {draft}", r))
  for preset, r in (_get(report, "pretrained", "main_job_by_tiles") or
                    {}).items():
    lines.append(_pair_line(f"on fused, tiles {preset}", r))
  by_gamma = _get(report, "pretrained", "main_job_by_gamma") or {}
  if by_gamma:
    lines.append(_gamma_line(by_gamma))
  return lines


def _gamma_line(r: Dict[str, Any]) -> str:
  """'main job by γ, tree and draft, target on packed, draft on fused:
  γ 3 1.59x (α 0.90, call 1.09 steps, Thm 3.8 2.33x), ..., tree 2x4
  1.70x (α 0.88, 3.40 tokens a call); identity 60/60, ...; fastest tree
  2x4' (or why it was not measured)."""
  if "runs" not in r:
    return f"  main job by γ, tree and draft: {r.get('skipped') or r.get('error')}"
  target, draft = r["paths"].split("+")
  # γ, trees, then drafts (the report's JSON sorts its keys).
  runs = sorted(
      r["runs"].items(), key=lambda x:
      (("gamma", "tree", "draft").index(x[0].split("_")[0]), x[1].get(
          "gamma", 0), x[0]))
  words = [_run_word(name, m) for name, m in runs]
  same = [
      f"{m['identity']['identical']}/{m['identity']['examples']}"
      for _, m in runs
  ]
  fastest = _run_label(r["fastest"]) if r["fastest"] else "none identical"
  if r.get("missing"):
    fastest += f" (drafts not here: {', '.join(r['missing'])})"
  return (
      f"  main job by γ, tree and draft, target on {target}, draft on {draft}: "
      + ", ".join(words) + f"; identity {', '.join(same)}; fastest {fastest}")


def _run_label(name: str) -> str:
  """'γ 3' for 'gamma_3', 'tree 2x4' for 'tree_2x4', 'draft x' for
  'draft_x'."""
  kind, value = name.split("_", 1)
  return f"γ {value}" if kind == "gamma" else f"{kind} {value}"


def _run_word(name: str, m: Dict[str, Any]) -> str:
  """A run's speedup and α; a γ's call cost and Theorem 3.8 too, a
  tree's tokens a call."""
  head = f"{_run_label(name)} {m['speedup']:.2f}x (α {m['alpha']:.2f}, "
  if "verification_call_cost" in m:
    return head + (f"call {m['verification_call_cost']:.2f} steps, Thm 3.8 "
                   f"{m['theorem_3_8_with_call_cost']:.2f}x)")
  return head + f"{m['tokens_per_target_call']:.2f} tokens a call)"


def _barriers_line(r: Dict[str, Any]) -> str:
  """'barriers: 128 programs 1.20 µs each, 8 programs 0.80 µs; held 4/4'."""
  costs = ", ".join(f"{p} programs {us:.2f} µs" for p, us in sorted(
      r.get("us_per_barrier", {}).items(), key=lambda x: -int(x[0])))
  held = r["held"]
  return (f"  barriers ({r['passes']} a kernel): {costs or 'not timed'} "
          f"each; held in {sum(held.values())}/{len(held)} kernels")


def _tiles_lines(tiles: Dict[str, Any]) -> List[str]:
  """Per model (the small draft's step, the target's, its K-token call),
  each tile preset's ms, fastest first; the variants not compiled in
  time."""
  by_model: Dict[str, List[str]] = {}
  for name, ms in sorted((tiles.get("ms") or {}).items(), key=lambda x: x[1]):
    model, preset = name.split("/", 1)
    by_model.setdefault(model, []).append(f"{preset} {ms:.3f}")
  lines = [
      f"  tiles {model} (ms): " + ", ".join(words)
      for model, words in by_model.items()
  ]
  if tiles.get("skipped"):
    lines.append("  tiles not compiled in time: " + ", ".join(tiles["skipped"]))
  return lines


def _pair_line(label: str, r: Dict[str, Any]) -> str:
  """A pair's identity and main job ({'identity', batch: main job} or
  {'skipped'}) as `  main job <label>: ...`."""
  if "skipped" in r:
    return f"  main job {label}: skipped ({r['skipped']})"
  if "error" in r:  # its decoders did not compile
    return f"  main job {label}: {r['error']}"
  same = (r.get("identity") or {}).get("default_precision") or {}
  compiled = (f" (compiled in {r['compile_s']:.0f} s)" if isinstance(
      r.get("compile_s"), (int, float)) else "")
  return (f"  main job {label}: identity "
          f"{same.get('identical', '?')}/{same.get('examples', '?')}, " +
          ", ".join(_main_job_word(b, m) for b, m in r.items() if b.isdigit()) +
          compiled)


def _options_line(name: str, r: Dict[str, Any], current: Dict[str, Any]) -> str:
  """A main job under an XLA:GPU option set against the library's own."""
  same = r.get("identity") or {}
  vs = r["vs_current"]
  return (f"  main job, options {name}: identity {same.get('identical', '?')}/"
          f"{same.get('examples', '?')}, {_main_job_word('1', r)} "
          f"(current's {_num(current.get('speedup'), '{:.2f}')}x); "
          f"baseline {vs['baseline']:.2f}x, speculative "
          f"{vs['speculative']:.2f}x as fast as under the current options")


def _main_job_word(batch: str, r: Dict[str, Any]) -> str:
  """'batch 1 1.90x (α 0.70)': a main job's speedup and, where measured,
  its α (under tiles whose kernel takes the draft's argmax, the check that
  it fed the argmax: identity holds whatever it fed), below 1, what
  waiting for a batch's slowest row cost (`pair_runs.batch_factor`), and
  what a loop that cost nothing would reach (`pair_runs.free_loop`)."""
  if "skipped" in r:
    return f"batch {batch} skipped ({r['skipped']})"
  alpha, rows = r.get("alpha"), r.get("batch_factor")
  free = r.get("free_loop_speedup")
  words = ([] if alpha is None else [f"α {alpha:.2f}"]) + (
      [f"rows waiting {rows:.2f}"] if overheads.batch_waits_show(rows) else
      []) + ([] if free is None else [f"a free loop {free:.2f}x"])
  return (f"batch {batch} {_num(r.get('speedup'), '{:.2f}')}x" +
          (f" ({', '.join(words)})" if words else ""))


def _profile_line(name: str, r: Dict[str, Any], unit: str = "step") -> str:
  """A device profile (`kernel_profile.summarize`, per `unit`) in one
  line: its kernels, busy and wall µs, idle share, the host's waits (with
  a loop's iterations a `unit`, when given) and the three costliest
  kernels."""
  if not r.get("kernels"):
    return f"  profile {name}: {r.get('note') or r.get('error') or '?'}"
  top = ", ".join(f"{t['name'][:40]} {t['per_step']:.0f}x{t['mean_us']:.1f}"
                  for t in r["top"][:3])
  waits = ""
  if "long_gaps" in r:
    waits = (f", {r['long_gaps']:.1f} waits over {r['long_gap_over_us']:g} "
             f"µs ({r['long_gap_us']:.1f} µs)")
    if "iterations_per_caption" in r:
      waits += f" to {r['iterations_per_caption']:.1f} iterations"
  return (f"  profile {name}: {r['kernels']:.0f} kernels a {unit}, busy "
          f"{r['busy_us']:.1f} of {r['wall_us']:.1f} µs ({r['idle_share']:.0%}"
          f" idle){waits}, mean kernel {r['mean_kernel_us']:.1f} µs; top µs: "
          f"{top}")


def _identical_word(r: Dict[str, Any]) -> str:
  """'yes', 'NO', or the error a preset's rows check ended in."""
  if "identical" not in r:
    return f"error ({r.get('error', '?')})"
  word = "yes" if r["identical"] else "NO"
  if "vs_xla_max_abs_diff" in r:  # Checks from 2026-11-30 on.
    word += (f", {r['vs_xla_max_abs_diff']:.3g} from xla's of "
             f"{r['logits_max_abs']:.3g}, argmax {r['vs_xla_argmax_agree']}/"
             f"{r['k']}")
  return word


def _loop_lines(report: Dict[str, Any]) -> List[str]:
  """Per path: an iteration part by part, its seconds in no model call,
  its kernels in no model call, the marginal speedup against Theorem 3.8;
  each main job loop's device profile a caption; then the main job's
  ratio."""
  p = report.get("loop") or {}
  lines = []
  kernels = p.get("kernels") or {}
  for path, r in (p.get("split") or {}).items():
    if not isinstance(r, dict) or "iteration_split_s" not in r:
      continue
    parts = r["iteration_split_s"]
    k = kernels.get(path) or {}
    lines.append(
        f"  loop on {path}: iteration "
        f"{1e3 * r['speculative_per_iteration_s']:.3f} ms = propose "
        f"{1e3 * parts['draft_propose']:.3f} + verify "
        f"{1e3 * parts['verification_call']:.3f} + bookkeeping "
        f"{1e3 * parts['bookkeeping']:.3f} + while "
        f"{1e3 * parts['while_loop']:.3f}; not in model calls "
        f"{1e3 * r['not_in_model_calls_s']:.3f} ms "
        f"({r['not_in_model_calls_share']:.0%}), "
        f"{_num(k.get('outside_model_calls'), '{}')} kernels "
        f"(condition {_num(k.get('condition'), '{}')}), once a decode "
        f"{_num(k.get('outside_loop'), '{}')}; marginal "
        f"{r['marginal_speedup']:.2f}x = {r['marginal_over_theorem']:.2f} of "
        f"Theorem 3.8 ({r['theorem_3_8_at_measured']:.2f}x)")
  for name, r in (_get(report, "pretrained", "main_job_profile") or {}).items():
    if isinstance(r, dict):
      unit = "call" if name.startswith("target_k") else "caption"
      lines.append(_profile_line(f"main job {name}", r, unit=unit))
  job = p.get("main_job") or {}
  if "over_theorem" in job:
    lines.append(f"  main job {job['speedup']:.2f}x = "
                 f"{job['over_theorem']:.2f} of Theorem 3.8 "
                 f"({job['theorem_3_8']:.2f}x), "
                 f"{job['over_theorem_with_call_cost']:.2f} with the call cost")
  return lines


def format_summary(report: Dict[str, Any]) -> str:
  """The report's last lines: phases, verdicts, headline numbers."""
  machine = _get(report, "env", "machine") or {}
  lines = [
      f"device_check ({report.get('mode')}) on "
      f"{machine.get('device_kind', '?')}, jax "
      f"{_get(machine, 'versions', 'jax') or '?'}, tiles "
      f"{_get(report, 'settings', 'tiles') or '?'}"
  ]
  for name, status in report.get("phases", {}).items():
    extra = f": {status['error']}" if status.get("error") else ""
    lines.append(f"phase {name:10s} {status.get('status')} "
                 f"({_num(status.get('seconds'), '{:.1f}')} s){extra}")
  rates = _get(report, "env", "ceilings") or {}
  if "read_gbps" in rates:
    lines.append(f"ceilings: copy {rates['copy_gbps']:.0f} GB/s, read "
                 f"{rates['read_gbps']:.0f} GB/s (a sum), bf16 matmul "
                 f"{rates['bf16_matmul_tflops']:.0f} TFLOP/s")
  lines += _exactness_lines(report)
  v = report.get("verdicts") or verdicts(report)
  job = _get(report, "pretrained", "main_job") or {}
  if v.get("pretrained_identical_count"):
    lines.append(
        f"shipped pair: greedy identical {v['pretrained_identical_count']}; "
        f"main job speedup {_num(job.get('speedup'), '{:.2f}')}x (Theorem 3.8"
        f" {_num(job.get('theorem_3_8'), '{:.2f}')}x), α "
        f"{_num(job.get('alpha'), '{:.3f}')}, c {_num(job.get('c'))}")
  handover = _get(report, "pretrained", "handover") or {}
  if "bound_us" in handover:
    lines.append(f"a call's handover (the host's part): "
                 f"{handover['pytrees_us']:.0f} us as pytrees, "
                 f"{handover['bound_us']:.0f} us bound")
  lines += _paths_lines(report)
  lines += _loop_lines(report)
  lines += _physics_lines(report)
  # The failed checks named on the last line: a run's tail is often all
  # that is seen of it (a test's message, a CI log).
  failed = [k for k, x in v.items() if x is False and k != "all_ok"]
  lines.append(f"all checks hold: {v.get('all_ok')}" +
               (f" (failed: {', '.join(failed)})" if failed else ""))
  return "\n".join(lines)
