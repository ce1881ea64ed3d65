"""The report's tree figure (tokens per target call against k) on a stub
sweep: tree runs at k = 1..4 at two temperatures and token verification at
the same γ, made from the fixture's metrics.json.

* The figure files are written, and only when there are several k.
* Its data are the runs' tokens per call: per series the points by k, the
  token-verification line at its value; the drawn lines hold those values.
"""
import json
import os
import shutil

import pytest

from specdec_jax import report
from specdec_jax.reporting import figures

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                       "results_small")
SOURCE = os.path.join(FIXTURE, "ende_xxl_small_g5_t0", "metrics.json")
# Tokens per call by (temperature, k); token verification's by temperature.
TREE = {
    0.0: {
        1: 2.9,
        2: 3.3,
        3: 3.5,
        4: 3.6
    },
    1.0: {
        1: 2.6,
        2: 3.0,
        3: 3.1,
        4: 3.3
    }
}
TOKEN = {0.0: 2.95, 1.0: 2.55}


def _write(root, name, **fields):
  with open(SOURCE) as f:
    metrics = json.load(f)
  metrics.update(gamma=4, **fields)
  (root / name).mkdir(parents=True)
  (root / name / "metrics.json").write_text(json.dumps(metrics))


def _stub_sweep(root, widths=(1, 2, 3, 4)):
  for temp, by_k in TREE.items():
    for k in widths:
      _write(root, f"tree_k{k}_t{temp:g}", temperature=temp, acceptance="tree",
             tree_width=k, draft_model=f"small tree k={k}",
             tokens_per_target_call=by_k[k])
    _write(root, f"token_t{temp:g}", temperature=temp, acceptance="token",
           draft_model="small", tokens_per_target_call=TOKEN[temp])
  return root


def test_the_series_hold_each_runs_tokens_per_call(tmp_path):
  runs = report.load_results(str(_stub_sweep(tmp_path / "sweep")))
  series = figures.tree_width_series(runs)
  task, target = runs[0]["task"], runs[0]["target_model"]
  assert sorted(series) == [(task, target, "small", 0.0, 4),
                            (task, target, "small", 1.0, 4)]
  for temp in TREE:
    got = series[(task, target, "small", temp, 4)]
    # pytest.approx takes flat sequences only (9.2 rejects nested ones).
    widths, tokens = zip(*got["points"])
    assert list(widths) == sorted(TREE[temp])
    assert list(tokens) == pytest.approx(
        [TREE[temp][k] for k in sorted(TREE[temp])])
    assert got["token"] == pytest.approx(TOKEN[temp])
  assert figures.has_several_tree_widths(runs)


def test_the_figure_draws_those_values(tmp_path):
  runs = report.load_results(str(_stub_sweep(tmp_path / "sweep")))
  fig = figures.render_tokens_per_call_vs_tree_width(runs)
  ax = fig.axes[0]
  lines = {l.get_label(): l for l in ax.lines}
  for temp in TREE:
    label = f"small, T={temp:g}, γ=4"
    assert list(lines[label].get_xdata()) == [1, 2, 3, 4]
    assert list(lines[label].get_ydata()) == pytest.approx(
        [TREE[temp][k] for k in (1, 2, 3, 4)])
    token = lines[f"token verification: {label}"]
    assert list(token.get_ydata()) == pytest.approx([TOKEN[temp]] * 2)
    assert token.get_color() == lines[label].get_color()
  assert ax.get_xlabel() == "k (draft branches per target call)"
  assert ax.get_ylabel() == "tokens per target call"


def test_the_report_writes_the_figure_for_a_sweep_over_k(tmp_path):
  root = _stub_sweep(tmp_path / "sweep")
  written = report.render_report(str(root), str(tmp_path / "out"))
  for fmt in ("png", "svg"):
    path = written[f"{report.TREE_FIGURE}.{fmt}"]
    with open(path, "rb") as f:
      head = f.read(8)
    assert head.startswith(b"\x89PNG" if fmt == "png" else b"<?xml")


def test_no_figure_without_several_tree_widths(tmp_path, caplog):
  root = _stub_sweep(tmp_path / "sweep", widths=(2,))
  caplog.set_level("INFO", logger=report.logger.name)
  written = report.render_report(str(root), str(tmp_path / "out"))
  assert not any(n.startswith(report.TREE_FIGURE) for n in written)
  assert f"skipping {report.TREE_FIGURE}" in caplog.text
  # Nor for the fixture's token runs alone.
  copy = tmp_path / "fixture"
  shutil.copytree(FIXTURE, copy)
  assert not figures.has_several_tree_widths(report.load_results(str(copy)))
