"""The report's tree figure: tokens per target call against the tree width
k (ACCEPTANCE='tree'), one line per (task, target, draft, temperature, γ),
drawn when a sweep has tree runs at several TREE_WIDTH values.

Token verification at the same γ (same task, target, draft and
temperature), when the sweep has it, is drawn as a dotted horizontal line
of the same colour: what k branches buy over one path.
"""
import re
from typing import Any, Dict, List, Sequence, Tuple

from specdec_jax.experiment import decode_modes
from specdec_jax.reporting import figures
from specdec_jax.reporting import tables

# `walltime.draft_label`'s suffix of a tree run: "<draft> tree k=3".
_TREE_SUFFIX = re.compile(r" tree k=\d+$")

SeriesKey = Tuple[str, str, str, float, int]  # task, target, draft, T, γ


def _key(run: Dict[str, Any]) -> SeriesKey:
  return (run["task"], run["target_model"],
          _TREE_SUFFIX.sub("", run["draft_model"]), float(run["temperature"]),
          int(run["gamma"]))


def tree_width_series(
    runs: Sequence[Dict[str, Any]]) -> Dict[SeriesKey, Dict[str, Any]]:
  """The figure's data: per (task, target, draft without its ' tree k=…',
  temperature, γ) with tree runs, {'points': [(k, tokens per target
  call)] by k (several runs of one k: their mean), 'token': token
  verification's tokens per call at that key, or None}.

  Runs without tokens per call (neither the key nor the counts) are left
  out.
  """
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
  """Tokens per target call against k (`tree_width_series`), one panel
  per (task, target): a line with markers per (draft, temperature, γ);
  token verification at the same γ dotted in the same colour."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  series = tree_width_series(runs)
  panels = sorted({k[:2] for k in series})
  cmap = matplotlib.colormaps["tab10"]
  fig = figures.new_figure(5.2 * len(panels), 4.2)
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
    figures.finish_panel(ax, "k (draft branches per target call)",
                         "tokens per target call",
                         f"{panel[0]}: M_p = {panel[1]}", bottom=1,
                         legend_columns=1)
  fig.suptitle(
      "Tree verification: tokens per target call vs k (dotted: "
      "token verification at the same γ)", fontsize=10)
  return fig
