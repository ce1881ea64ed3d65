"""The check's verdicts and its last lines (what the run's output shows).

`verdicts` reads the merged report (`cli.orchestrate`'s device_check.json)
into a few booleans and numbers; `format_summary` prints them as a short
table, the part of the log that the device tool's reply always carries.
"""
from typing import Any, Dict, List, Optional


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
  out["main_job_speedup"] = _get(report, "pretrained", "main_job", "speedup")
  out["physics_complete"] = _get(report, "physics", "ok")
  statuses = [p.get("status") for p in report.get("phases", {}).values()]
  out["phases_ok"] = bool(statuses) and all(s == "ok" for s in statuses)
  # A phase that ran but did not finish is not ok (phases_ok); a check of
  # a phase not run is None and not counted.
  out["all_ok"] = all(v is not False for v in out.values())
  return out


def _num(x: Any, fmt: str = "{:.3g}") -> str:
  return "-" if x is None else fmt.format(x)


def _exactness_lines(report: Dict[str, Any]) -> List[str]:
  lines = []
  for mode, e in (_get(report, "exactness", "modes") or {}).items():
    if "skipped" in e:
      lines.append(f"  {mode:6s} skipped ({e['skipped']})")
      continue
    g = e["greedy"].get("highest_precision") or e["greedy"]["default_precision"]
    text = f"  {mode:6s} {'ok' if e['ok'] else 'FAILED'}: greedy "
    text += f"{g['rows_identical']}/{g['rows']} identical"
    if "highest_precision" in e["greedy"]:
      text += " (at 'highest' precision only)"
    d = e.get("distribution")
    if d:
      text += (f"; chi-square p {_num(d['against_target']['p_value'])} vs "
               f"target, {_num(d['against_wrong_target']['p_value'])} vs "
               "wrong target")
    lines.append(text)
  return lines


def _physics_lines(report: Dict[str, Any]) -> List[str]:
  p = report.get("physics") or {}
  steps = p.get("steps") or {}
  lines = []
  if steps:
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


def format_summary(report: Dict[str, Any]) -> str:
  """The report's last lines: phases, verdicts, headline numbers."""
  machine = _get(report, "env", "machine") or {}
  lines = [
      f"device_check ({report.get('mode')}) on "
      f"{machine.get('device_kind', '?')}, jax "
      f"{_get(machine, 'versions', 'jax') or '?'}"
  ]
  for name, status in report.get("phases", {}).items():
    extra = f": {status['error']}" if status.get("error") else ""
    lines.append(f"phase {name:10s} {status.get('status')} "
                 f"({_num(status.get('seconds'), '{:.1f}')} s){extra}")
  lines += _exactness_lines(report)
  v = report.get("verdicts") or verdicts(report)
  job = _get(report, "pretrained", "main_job") or {}
  if v.get("pretrained_identical_count"):
    lines.append(
        f"shipped pair: greedy identical {v['pretrained_identical_count']}; "
        f"main job speedup {_num(job.get('speedup'), '{:.2f}')}x (Theorem 3.8"
        f" {_num(job.get('theorem_3_8'), '{:.2f}')}x), α "
        f"{_num(job.get('alpha'), '{:.3f}')}, c {_num(job.get('c'))}")
  lines += _physics_lines(report)
  lines.append(f"all checks hold: {v.get('all_ok')}")
  return "\n".join(lines)
