"""The report's tables, from `loading.load_results`' runs: Table 2 (the
paper's layout, best draft starred, then every run with its drafter,
lenience and §3.5's bound; Markdown and CSV) and Table 4 (measured vs
Theorem 3.8 and Equation (1)).
"""
import collections
import csv
import io
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from specdec_jax.metrics import analysis
from specdec_jax.metrics import run_metrics

# T5 model sizes, smallest first, to order drafts as in the paper's tables.
_SIZE_ORDER = ("tiny", "mini", "small", "base", "large", "xl", "xxl")


def size_key(name: str) -> Tuple[int, str]:
  low = name.lower()
  for i, size in sorted(enumerate(_SIZE_ORDER), key=lambda t: -len(t[1])):
    if low == size or low.endswith(("-" + size, "_" + size, "." + size)):
      return (i, low)
  return (len(_SIZE_ORDER), low)


def row_sort_key(m: Mapping[str, Any]):
  return (m["task"], m["target_model"], m["temperature"],
          size_key(m["draft_model"]), m["gamma"], m["run_name"])


def quality(m: Mapping[str, Any]) -> Optional[Tuple[str, float, float]]:
  """(metric name, baseline, speculative) or None if the run has none."""
  if m.get("bleu") is not None:
    return ("BLEU", float(m["bleu"]["baseline"]),
            float(m["bleu"]["speculative"]))
  if m.get("rouge") is not None:
    base, spec = m["rouge"]["baseline"], m["rouge"]["speculative"]
    for key in ("rougeLsum", "rougeL"):
      if key in base and key in spec:
        return ("ROUGE-L", float(base[key]), float(spec[key]))
    key = sorted(set(base) & set(spec))[0] if set(base) & set(spec) else None
    if key is not None:
      return (key, float(base[key]), float(spec[key]))
  return None


def measured_tokens_per_call(m: Mapping[str, Any]) -> Optional[float]:
  """A run's tokens per target call: its own key, else tokens generated over
  speculative target calls (metrics.json of earlier versions), else None."""
  if m.get("tokens_per_target_call") is not None:
    return float(m["tokens_per_target_call"])
  if m.get("target_calls_speculative") and m.get("tokens_generated"):
    return m["tokens_generated"] / m["target_calls_speculative"]
  return None


def annotate_best(runs: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Sorted copies of the runs, marking per (task, target, temperature) each
  draft's fastest (`best_gamma_for_draft`) and the fastest (`starred`)."""
  rows = [
      dict(m, best_gamma_for_draft=False, starred=False, **_drafting(m))
      for m in sorted(runs, key=row_sort_key)
  ]
  groups = collections.defaultdict(list)
  drafts = collections.defaultdict(list)
  for r in rows:
    group = (r["task"], r["target_model"], r["temperature"])
    groups[group].append(r)
    drafts[group + (r["draft_model"],)].append(r)
  for runs_ in drafts.values():
    max(runs_, key=lambda r: r["speedup"])["best_gamma_for_draft"] = True
  for group in groups.values():
    max(group, key=lambda r: r["speedup"])["starred"] = True
  return rows


def fmt_temp(t: float) -> str:
  return f"{t:g}"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = [
      "| " + " | ".join(header) + " |",
      "|" + "|".join("---" for _ in header) + "|"
  ]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def _drafting(r: Mapping[str, Any]) -> Dict[str, Any]:
  """A run's drafter, lenience, exactness and §3.5's bound (older files,
  which lack the keys, ran the draft model exactly)."""
  bound = r.get("per_iteration_gamma") or {}
  return dict(drafter=r.get("drafter") or "model",
              lenience=1.0 if r.get("lenience") is None else r["lenience"],
              exact=r.get("exact") is not False,
              **{k: bound.get(k) for k in _BOUND_KEYS})


_BOUND_KEYS = ("fixed_gamma_speedup", "achieved_speedup", "oracle_speedup")
_DRAFTING_HEADER = [
    "DRAFTER", "LENIENCE", "PER-ITERATION γ (FIXED / ACHIEVED / ORACLE)"
]


def _table2_md_rows(rows, multi_target: bool,
                    drafting: bool = False) -> List[List[str]]:
  """Table 2's cells; with `drafting`, DRAFTER, LENIENCE and the bound too."""
  out = []
  for r in rows:
    q = quality(r)
    theory = r.get("theoretical_speedup_measured_call_cost")
    draft = r["draft_model"] + (" ⋆" if r["starred"] else "")
    if r.get("synthetic"):
      draft += " †"
    cells = [r["task"]]
    if multi_target:
      cells.append(_target_name(r))
    cells += [
        draft,
        fmt_temp(r["temperature"]),
        str(r["gamma"]),
        f"{r['alpha']:.2f}",
        f"{r['cost_coefficient_c']:.3f}",
        _optional(r.get("verification_cost_ratio"), "{:.2f}"),
        _optional(measured_tokens_per_call(r), "{:.2f}"),
        f"{r['speedup']:.2f}X",
        f"{r['theoretical_speedup']:.2f}X",
        _optional(theory, "{:.2f}X"),
        _optional(r["speedup"] / theory if theory else None, "{:.2f}"),
    ]
    p = _p_value(r)
    cells += ([
        q[0], f"{q[1]:.2f}", f"{q[2]:.2f}" +
        ("" if p is None else f" (p {p:.2f})")
    ] if q else ["–"] * 3)
    # Examples identical to the target's at T = 0.
    same = r.get("greedy_identical_examples")
    cells.append("–" if same is None else f"{same}/{r['num_examples']}")
    if drafting:
      bound = [r[k] for k in _BOUND_KEYS]
      cells += [
          r["drafter"],
          f"{r['lenience']:g}" + ("" if r["exact"] else " (not exact)"),
          "–" if None in bound else " / ".join(f"{x:.2f}X" for x in bound)
      ]
    out.append(cells)
  return out


def _p_value(r: Mapping[str, Any]) -> Optional[float]:
  """metrics.json's paired-bootstrap p of the quality difference (T > 0
  with BLEU), or None."""
  return (r.get("quality_noise") or {}).get("p_value")


def _optional(value: Optional[float], fmt: str) -> str:
  return "–" if value is None else fmt.format(value)


_UNNAMED = "unnamed (TARGET_NAME unset)"


def _target_name(r: Mapping[str, Any]) -> str:
  return r.get("target_model") or _UNNAMED


def _machine(r: Mapping[str, Any]) -> Optional[str]:
  """metrics.json's `machine` in a few words (None: not recorded)."""
  m = r.get("machine")
  if not m:
    return None
  if m.get("backend") == "cpu":
    kernel = m.get("cpu_kernel")
    return (f"{m.get('cpu')}, {m.get('cpus')} CPUs, CPU kernel "
            f"{kernel if kernel else 'off'}, JAX {m.get('jax')}")
  return f"{m.get('devices')} x {m.get('device_kind')}, JAX {m.get('jax')}"


def _machines_line(rows: Sequence[Mapping[str, Any]]) -> List[str]:
  """The machines the runs were measured on, as a paragraph ([] if no run
  recorded one): speedups measured on different machines do not compare."""
  counts = collections.Counter(_machine(r) for r in rows)
  recorded = sorted((k, n) for k, n in counts.items() if k is not None)
  if not recorded:
    return []

  def runs(n: int) -> str:
    return f"({n} run{'' if n == 1 else 's'})"

  named = "; ".join(f"{k} {runs(n)}" for k, n in recorded)
  if None in counts:
    named += f"; not recorded {runs(counts[None])}"
  warning = (" The runs come from more than one machine: their speedups do "
             "not compare." if len(counts) > 1 else "")
  return [f"Measured on: {named}.{warning}", ""]


def _table2_md(rows: Sequence[Dict[str, Any]]) -> str:
  """table2.md of `annotate_best`'s rows."""
  multi_target = len({r["target_model"] for r in rows}) > 1
  header = ["TASK"] + (["M_p"] if multi_target else []) + [
      "M_q", "TEMP", "γ", "α", "c", "CALL COST", "TOKENS/CALL", "SPEED", _IDEAL,
      _MEASURED, "EFFICIENCY", "METRIC", "BASELINE", "SPECULATIVE",
      "GREEDY IDENTICAL"
  ]
  targets = ", ".join(sorted({_target_name(r) for r in rows}))
  md = [
      "# Table 2: speculative decoding speedup",
      "",
      f"Target model(s) M_p: {targets}. One row per (task, M_q, TEMP) at the "
      "draft's best measured γ; ⋆ marks the best draft per (task, M_p, TEMP) "
      "(highest SPEED). SPEED is the measured walltime improvement over "
      "standard decoding; α is the run's kept guesses / acceptance trials "
      "(metrics.json's alpha, as `run`'s summary prints it). At the run's "
      f"α and c, {_IDEAL} is \"{run_metrics.IDEAL_THEORY_NAME}\" (a "
      "(γ+1)-token target call costing one step, as the theorem assumes) "
      f"and {_MEASURED} is \"{run_metrics.MEASURED_THEORY_NAME}\" (the "
      "CALL COST measured: that call / one step, interleaved; "
      "ACCEPTANCE='tree': "
      f"\"{run_metrics.TREE_THEORY_NAME}\"); EFFICIENCY is SPEED / "
      f"{_MEASURED}. TOKENS/CALL: tokens per target call. METRIC compares "
      "baseline and speculative outputs (BLEU or ROUGE-Lsum); at TEMP > 0 "
      "they are different samples of the same distribution, so they differ "
      "by sampling noise (p: sacrebleu's paired bootstrap over the "
      "examples, metrics.json's quality_noise). GREEDY IDENTICAL: examples "
      "whose speculative tokens equal the target's (T = 0).",
      "",
      *_machines_line(rows),
      _md_table(
          header,
          _table2_md_rows([r for r in rows if r["best_gamma_for_draft"]],
                          multi_target)),
      "## All sweep points",
      "",
      "DRAFTER: what guessed (DRAFTER); LENIENCE: Appendix A.5's l (1: "
      "exact); PER-ITERATION γ: §3.5's bound, Theorem 3.8's cost model on "
      "the run's own target calls, drafting γ every call / the guesses made "
      "(adaptive γ) / exactly the guesses kept (the oracle).",
      "",
      _md_table(header + _DRAFTING_HEADER,
                _table2_md_rows(rows, multi_target, drafting=True)),
  ]
  if any(r.get("synthetic") for r in rows):
    md += ["† synthetic run (not real model measurements).", ""]
  return "\n".join(md)


# The theory columns; the caption gives each its name (`run_metrics`).
_IDEAL = "THM 3.8 AT CALL COST 1"
_MEASURED = "THM 3.8 AT MEASURED CALL COST"

_CSV_FIELDS = [
    "task", "target_model", "draft_model", "temperature", "gamma", "alpha",
    "alpha_beta", "alpha_sampled", "speedup", "theoretical_speedup",
    "cost_coefficient_c", "verification_cost_ratio",
    "theoretical_speedup_measured_call_cost", "tokens_per_target_call",
    "greedy_identical_examples", "quality_metric", "quality_baseline",
    "quality_speculative", "quality_p_value", "best_gamma_for_draft", "starred",
    "synthetic", "drafter", "lenience", "exact", *_BOUND_KEYS, "run_name",
    "machine"
]


def _table2_csv(rows: Sequence[Dict[str, Any]]) -> str:
  """table2.csv: every run of `annotate_best`, one line each (`machine`:
  `_machine`'s words, empty when not recorded)."""
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(_CSV_FIELDS)
  for r in rows:
    q = quality(r) or ("", "", "")
    rec = dict(r, tokens_per_target_call=measured_tokens_per_call(r),
               quality_metric=q[0], quality_baseline=q[1],
               quality_speculative=q[2], quality_p_value=_p_value(r),
               synthetic=bool(r.get("synthetic")), machine=_machine(r))
    writer.writerow([
        "" if rec.get(f) is None else
        (int(rec[f]) if isinstance(rec[f], bool) else rec[f])
        for f in _CSV_FIELDS
    ])
  return buf.getvalue()


def render_table2(runs: Sequence[Dict[str, Any]]) -> Tuple[str, str]:
  """Returns (table2.md, table2.csv) texts."""
  rows = annotate_best(runs)
  return _table2_md(rows), _table2_csv(rows)


def render_table4(runs: Sequence[Dict[str, Any]]) -> str:
  """Returns table4.md: measured vs theoretical (Theorem 3.8, Eq. (1))."""
  rows = sorted(runs, key=row_sort_key)
  compared = analysis.theory_vs_measured([
      dict(r, tokens_per_target_call=measured_tokens_per_call(r)) for r in rows
  ])
  table = []
  notes = []
  for orig, r in zip(rows, compared):
    tpc = r.get("tokens_per_target_call")
    table.append([
        r["task"], r["draft_model"] + (" †" if r.get("synthetic") else ""),
        fmt_temp(r["temperature"]),
        str(r["gamma"]), f"{r['alpha']:.3f}", f"{r['cost_coefficient_c']:.3f}",
        "–" if tpc is None else f"{tpc:.2f}",
        f"{r['expected_tokens_per_call']:.2f}", f"{r['speedup']:.2f}X",
        f"{r['theoretical_speedup']:.2f}X", f"{r['speedup_ratio']:.2f}"
    ])
    recomputed = r["theoretical_speedup"]
    recorded = orig["theoretical_speedup"]
    if abs(recorded - recomputed) > 1e-2 * recomputed:
      notes.append(f"- {r['run_name']}: metrics.json records theoretical "
                   f"speedup {recorded:.3f}, but its α, γ, c give "
                   f"{recomputed:.3f}.")
  header = [
      "TASK", "M_q", "TEMP", "γ", "α", "c", "TOKENS/CALL", "E[TOKENS/CALL]",
      "SPEED", _IDEAL, "SPEED/THM 3.8"
  ]
  md = [
      "# Table 4: measured vs theoretical",
      "",
      "TOKENS/CALL: measured tokens per speculative target-model call; "
      "E[TOKENS/CALL]: Equation (1), (1 − α^(γ+1)) / (1 − α), at α = kept "
      "guesses / acceptance trials. SPEED: measured walltime improvement; "
      f"{_IDEAL}: \"{run_metrics.IDEAL_THEORY_NAME}\", "
      "(1 − α^(γ+1)) / ((1 − α)(γc + 1)), recomputed from each run's α, γ "
      "and c.",
      "",
      _md_table(header, table),
  ]
  if notes:
    md += ["Inconsistencies:", ""] + notes + [""]
  if any(r.get("synthetic") for r in rows):
    md += ["† synthetic run (not real model measurements).", ""]
  return "\n".join(md)


def _sampling(a: Mapping[str, Any]) -> str:
  """A run's top-k / top-p in words ('–': neither)."""
  parts = []
  if a.get("top_k"):
    parts.append(f"top-k {a['top_k']}")
  if a.get("top_p") is not None and a["top_p"] < 1:
    parts.append(f"top-p {a['top_p']:g}")
  return ", ".join(parts) or "–"


def render_table3(alphas: Sequence[Mapping[str, Any]]) -> str:
  """table3.md, the paper's Table 3: α per (task, M_p, M_q, temperature)
  from MODE='alpha' runs (alpha.json: Corollary 3.6's mean β over the
  positions of target samples, with its standard error)."""

  def order(a):  # plain sampling before top-k / top-p at each temperature
    return (a["task"], size_key(_target_name(a)), size_key(a["draft_model"]),
            a["temperature"], _sampling(a) != "–", _sampling(a), a["run_name"])

  rows = sorted(alphas, key=order)
  table = [[
      a["task"],
      _target_name(a), a["draft_model"],
      fmt_temp(a["temperature"]),
      _sampling(a), f"{a['alpha_beta']:.3f}",
      _optional(a.get("alpha_beta_stderr"), "{:.3f}"),
      str(a["num_positions"]),
      str(a["num_examples"]), a["run_name"]
  ] for a in rows]
  header = [
      "TASK", "M_p", "M_q", "TEMP", "TOP-K / TOP-P", "α", "± STD. ERR.",
      "POSITIONS", "EXAMPLES", "RUN"
  ]
  return "\n".join([
      "# Table 3: α per draft and temperature",
      "",
      "α = E[β], β = Σ_x min(p(x), q(x)) (Corollary 3.6), averaged over "
      "the positions of samples from the target (MODE='alpha', alpha.json's "
      "`alpha_beta`); ± its standard error over the examples. No walltimes: "
      "cheap enough for many (task, draft, temperature) settings.",
      "",
      _md_table(header, table),
  ])
