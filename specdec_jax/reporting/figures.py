"""The report's figures: speedup vs γ with Theorem 3.8's curves, α per
draft and temperature, and tokens per target call against the tree width k
(matplotlib's object API on the Agg canvas: no pyplot state).
"""
import collections
import io
import re
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from specdec_jax.experiment import decode_modes
from specdec_jax.metrics import analysis
from specdec_jax.reporting import tables

# Figures are rendered at this resolution (text metrics depend on it).
DPI = 100


def new_figure(width: float, height: float):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, height), dpi=DPI)
  FigureCanvasAgg(fig)
  return fig


def figure_bytes(fig, fmt: str) -> bytes:
  buf = io.BytesIO()
  kwargs = {"metadata": {"Date": None}} if fmt == "svg" else {}
  fig.savefig(buf, format=fmt, bbox_inches="tight", **kwargs)
  return buf.getvalue()


def finish_panel(ax, xlabel: str, ylabel: str, title: str, *, bottom: float,
                 legend_columns: int) -> None:
  """A line panel's axes: integer x ticks, labels, title, the y axis from
  `bottom`, a light grid, and the legend below the axes, off the data."""
  from matplotlib.ticker import MaxNLocator
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.set_ylim(bottom=bottom)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14),
            ncol=legend_columns, frameon=False)


def _series(runs):
  """Groups runs into (task, target, draft, temperature) series."""
  series = collections.OrderedDict()
  for r in sorted(runs, key=tables.row_sort_key):
    series.setdefault(
        (r["task"], r["target_model"], r["draft_model"], r["temperature"]),
        []).append(r)
  return series


def call_cost_by_gamma(runs: Sequence[Dict[str, Any]]):
  """γ -> the (γ+1)-token call in target steps, interpolated from the runs'
  `verification_cost_ratio` (K = 1: one step); None when none priced it."""
  measured = collections.defaultdict(list)
  for r in runs:
    if r.get("verification_cost_ratio") is not None:
      measured[int(r["gamma"]) + 1].append(float(r["verification_cost_ratio"]))
  if not measured:
    return None
  ks = np.array([1.0] + sorted(measured))
  ratios = np.array([1.0] + [float(np.mean(measured[k])) for k in ks[1:]])
  slope = max(0.0, (ratios[-1] - ratios[-2]) / (ks[-1] - ks[-2]))

  def cost(gamma):
    k = np.asarray(gamma, np.float64) + 1
    return np.where(k <= ks[-1], np.interp(k, ks, ratios),
                    ratios[-1] + slope * (k - ks[-1]))

  return cost


def render_speedup_vs_gamma(runs: Sequence[Dict[str, Any]]):
  """Measured speedup per γ, a panel per (task, target), a series per
  (draft, temperature) with Theorem 3.8 at its α, c and measured call cost
  (△: its best γ) and at the ideal call cost of one step (dotted)."""
  series = _series(runs)
  panels = sorted({(k[0], k[1]) for k in series})
  import matplotlib  # pylint: disable=g-import-not-at-top
  drafts = sorted({r["draft_model"] for r in runs}, key=tables.size_key)
  colors = {
      d: matplotlib.colormaps["tab10"](i % 10) for i, d in enumerate(drafts)
  }
  temps = sorted({k[3] for k in series})
  styles = ["-", "--", "-.", (0, (5, 1))]
  markers = ["o", "s", "D", "P", "X", "v"]
  fig = new_figure(5.2 * len(panels), 4.4)
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, (task, target) in zip(axes, panels):
    keys = [k for k in series if (k[0], k[1]) == (task, target)]
    gmax = max(max(r["gamma"] for r in series[k]) for k in keys)
    grid = np.linspace(1, min(max(gmax + 2, 8), 32), 200)
    tops = [max(r["speedup"] for k in keys for r in series[k])]
    for k in keys:
      tops.append(
          _speedup_series(ax, series[k], grid, colors[k[2]],
                          styles[temps.index(k[3]) % len(styles)],
                          markers[temps.index(k[3]) % len(markers)]))
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    finish_panel(ax, "γ (draft tokens per target call)", "walltime speedup (×)",
                 f"{task}: M_p = {target}", bottom=0, legend_columns=2)
    ax.set_ylim(0, 1.25 * max(tops))
  fig.suptitle(
      "Speedup vs γ: measured (markers) and Theorem 3.8 (lines, △ = best γ)",
      fontsize=9)
  return fig


def _speedup_series(ax, runs, grid, color, style, marker) -> float:
  """One series' points and curves on `ax`; the highest value that should
  stay in view (the points and the measured-cost curve, not the ideal)."""
  alpha = float(np.mean([r["alpha"] for r in runs]))
  c = float(np.mean([r["cost_coefficient_c"] for r in runs]))
  draft, temp = runs[0]["draft_model"], tables.fmt_temp(runs[0]["temperature"])
  ideal = analysis.expected_speedup(alpha, grid, c)
  cost = call_cost_by_gamma(runs)
  gammas = np.arange(1, int(grid[-1]) + 1)
  best = analysis.optimal_gamma(alpha, c, int(grid[-1]),
                                None if cost is None else cost(gammas))
  if cost is None:
    ax.plot(
        grid, ideal, style, color=color, lw=1.3, alpha=0.8,
        label=f"Thm 3.8, ideal call: {draft}, T={temp} "
        f"(α={alpha:.2f}, c={c:.3f})")
    top = float(np.max(ideal))
  else:
    curve = analysis.expected_speedup(alpha, grid, c, call_cost=cost(grid))
    ax.plot(
        grid, curve, style, color=color, lw=1.5,
        label=f"Thm 3.8, measured call: {draft}, T={temp} "
        f"(α={alpha:.2f}, c={c:.3f})")
    ax.plot(grid, ideal, ":", color=color, lw=0.9, alpha=0.6,
            label=f"ideal (call = 1 step): {draft}, T={temp}")
    top = float(np.max(curve))
  ax.plot([best], [
      analysis.expected_speedup(alpha, best, c,
                                call_cost=1.0 if cost is None else cost(best))
  ], "^", color=color, ms=7, mfc="none")
  pts = sorted(runs, key=lambda r: r["gamma"])
  ax.plot([r["gamma"] for r in pts], [r["speedup"] for r in pts], marker,
          color=color, ms=6.5, mec="black", mew=0.6, ls="none",
          label=f"measured: {draft}, T={temp}")
  return top


def render_alpha_by_draft(runs: Sequence[Dict[str, Any]]):
  """Bars of the mean α per (task, draft) and temperature (error bars: the
  range; diamonds: alpha_beta), labels and legend above every mark."""
  series = _series(runs)
  groups = sorted({(k[0], k[1], k[2]) for k in series}, key=lambda g:
                  (g[0], g[1], tables.size_key(g[2])))
  temps = sorted({k[3] for k in series})
  multi_target = len({g[1] for g in groups}) > 1
  import matplotlib
  cmap = matplotlib.colormaps["Blues"]
  width = 0.8 / len(temps)
  fig = new_figure(max(4.5, 1.3 * len(groups) * max(1,
                                                    len(temps) / 2) + 2), 3.8)
  ax = fig.subplots()
  beta_labelled = False
  temp_labelled = set()
  for j, temp in enumerate(temps):
    color = cmap(0.45 + 0.5 * j / max(1, len(temps) - 1))
    for i, (task, target, draft) in enumerate(groups):
      pts = series.get((task, target, draft, temp))
      if not pts:
        continue
      alphas = [r["alpha"] for r in pts]
      x = i - 0.4 + width * (j + 0.5)
      mean = float(np.mean(alphas))
      yerr = [[mean - min(alphas)], [max(alphas) - mean]]
      ax.bar(
          x, mean, width * 0.92, color=color, edgecolor="black", lw=0.5,
          yerr=yerr if len(alphas) > 1 else None, capsize=3,
          label=None if temp in temp_labelled else f"T={tables.fmt_temp(temp)}")
      temp_labelled.add(temp)
      betas = [r["alpha_beta"] for r in pts if r.get("alpha_beta") is not None]
      top = max(alphas) if len(alphas) > 1 else mean  # the error bar's cap
      if betas:
        ax.plot([x], [np.mean(betas)], "D", color="black", ms=4,
                label=None if beta_labelled else "Σ min(p, q) (Cor. 3.6)")
        beta_labelled = True
        top = max(top, float(np.mean(betas)) + 0.015)  # the diamond's top
      ax.text(x, top + 0.025, f"{mean:.2f}", ha="center", va="bottom",
              fontsize=8)
  ax.set_xticks(range(len(groups)))
  ax.set_xticklabels([
      f"{task}\n{draft}" + (f" → {target}" if multi_target else "")
      for task, target, draft in groups
  ])
  # Bars and labels end below 1.1; the legend lives in the band above.
  ax.set_ylim(0, 1.3)
  ax.set_yticks(np.linspace(0, 1, 6))
  ax.set_ylabel("α (acceptance rate)")
  ax.set_title("α per draft model M_q and temperature")
  ax.grid(axis="y", alpha=0.3)
  ax.legend(fontsize=8, loc="upper center", ncol=len(temps) + 1)
  return fig


# `walltime.draft_label`'s suffix of a tree run: "<draft> tree k=3".
_TREE_SUFFIX = re.compile(r" tree k=\d+$")

SeriesKey = Tuple[str, str, str, float, int]  # task, target, draft, T, γ


def _key(run: Dict[str, Any]) -> SeriesKey:
  return (run["task"], run["target_model"],
          _TREE_SUFFIX.sub("", run["draft_model"]), float(run["temperature"]),
          int(run["gamma"]))


def tree_width_series(
    runs: Sequence[Dict[str, Any]]) -> Dict[SeriesKey, Dict[str, Any]]:
  """Per (task, target, draft without ' tree k=…', temperature, γ) with
  tree runs: {'points': [(k, mean tokens per target call)] by k, 'token':
  token verification's at that key, or None}."""
  tree: Dict[SeriesKey, Dict[int, List[float]]] = {}
  token: Dict[SeriesKey, List[float]] = {}
  for run in runs:
    value = tables.measured_tokens_per_call(run)
    if value is None:
      continue
    mode = decode_modes.of_metrics(run)
    if mode.branches and run.get("tree_width") is not None:
      tree.setdefault(_key(run), {}).setdefault(int(run["tree_width"]),
                                                []).append(value)
    elif mode is decode_modes.TOKEN:
      token.setdefault(_key(run), []).append(value)
  return {
      key: {
          "points": [(k, sum(v) / len(v)) for k, v in sorted(by_k.items())],
          "token": (sum(token[key]) / len(token[key]) if key in token else None)
      } for key, by_k in sorted(tree.items())
  }


def has_several_tree_widths(runs: Sequence[Dict[str, Any]]) -> bool:
  """Whether the runs hold tree runs at two or more TREE_WIDTH values."""
  return len(
      {k for s in tree_width_series(runs).values() for k, _ in s["points"]}) > 1


def render_tokens_per_call_vs_tree_width(runs: Sequence[Dict[str, Any]]):
  """Tokens per target call against k (`tree_width_series`), a line per
  (draft, temperature, γ), token verification at that γ dotted."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  series = tree_width_series(runs)
  panels = sorted({k[:2] for k in series})
  cmap = matplotlib.colormaps["tab10"]
  fig = new_figure(5.2 * len(panels), 4.2)
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, panel in zip(axes, panels):
    keys = [k for k in series if k[:2] == panel]
    for i, key in enumerate(keys):
      _, _, draft, temp, gamma = key
      color = cmap(i % 10)
      ks, values = zip(*series[key]["points"])
      label = f"{draft}, T={tables.fmt_temp(temp)}, γ={gamma}"
      ax.plot(ks, values, "o-", color=color, lw=1.5, ms=6, label=label)
      if series[key]["token"] is not None:
        ax.axhline(series[key]["token"], color=color, lw=1.0, ls=":",
                   label=f"token verification: {label}")
    finish_panel(ax, "k (draft branches per target call)",
                 "tokens per target call", f"{panel[0]}: M_p = {panel[1]}",
                 bottom=1, legend_columns=1)
  fig.suptitle(
      "Tree verification: tokens per target call vs k (dotted: "
      "token verification at the same γ)", fontsize=10)
  return fig
