"""Tests for specdec_jax.report on the tiny fixture in fixtures/results_small
(the command in a fresh process: tests/e2e/test_report_e2e.py)."""
import csv
import io
import json
import os
import shutil

from matplotlib.transforms import Bbox
import numpy as np
import pytest

from specdec_jax.metrics import analysis
from specdec_jax import report
from specdec_jax.reporting import tables
from specdec_jax.reporting import figures
from specdec_jax.reporting import trace as trace_lib

from report_helpers import FIXTURE
from report_helpers import MACHINE
from report_helpers import as_t5x_row
from report_helpers import copy_fixture
from report_helpers import foreign_metrics

ALL_OUTPUTS = [
    "table2.md", "table2.csv", "table4.md", "speedup_vs_gamma.png",
    "speedup_vs_gamma.svg", "alpha_by_draft.png", "alpha_by_draft.svg",
    "example_trace.html", "example_trace.png", "timeline.png", "timeline.svg"
]


def _fixture_metrics():
  out = {}
  for name in sorted(os.listdir(FIXTURE)):
    path = os.path.join(FIXTURE, name, "metrics.json")
    if os.path.isfile(path):
      with open(path) as f:
        out[name] = json.load(f)
  return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
  """Copy of the fixture rendered once via the CLI with the default output."""
  root = tmp_path_factory.mktemp("report") / "results"
  shutil.copytree(FIXTURE, root)
  assert report.main([str(root)]) == 0
  return root, root / "report"


def _read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _snapshot(directory):
  """{relative path: bytes} of every file under directory."""
  out = {}
  for dirpath, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = f.read()
  return out


class TestRender:

  def test_all_files_written_and_non_empty(self, rendered):
    _, out = rendered
    assert sorted(os.listdir(out)) == sorted(ALL_OUTPUTS)  # No temp files.
    for name in ALL_OUTPUTS:
      assert (out / name).stat().st_size > 0, name
    for name in ALL_OUTPUTS:
      data = (out / name).read_bytes()
      if name.endswith(".png"):
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), name
      elif name.endswith(".svg"):
        assert b"<svg" in data[:2000], name

  def test_table2_csv_matches_fixture(self, rendered):
    _, out = rendered
    rows = _read_csv(out / "table2.csv")
    metrics = _fixture_metrics()
    assert len(rows) == len(metrics) == 8
    for row in rows:
      m = metrics[row["run_name"]]
      assert row["task"] == m["task"] == "ende"
      assert row["draft_model"] == m["draft_model"]
      assert int(row["gamma"]) == m["gamma"]
      assert float(row["temperature"]) == m["temperature"]
      for key in ("alpha", "alpha_beta", "speedup", "theoretical_speedup",
                  "cost_coefficient_c"):
        assert float(row[key]) == m[key], key
      assert row["quality_metric"] == "BLEU"
      assert float(row["quality_baseline"]) == m["bleu"]["baseline"]
      assert float(row["quality_speculative"]) == m["bleu"]["speculative"]

  def test_starred_row_is_best(self, rendered):
    _, out = rendered
    rows = _read_csv(out / "table2.csv")
    for temp in ("0.0", "1.0"):
      group = [r for r in rows if r["temperature"] == temp]
      starred = [r for r in group if r["starred"] == "1"]
      assert len(starred) == 1
      assert float(starred[0]["speedup"]) == max(
          float(r["speedup"]) for r in group)
    # Hand-checked against the fixture: T=0 best is small at gamma=7,
    # T=1 best is base (gamma=5).
    best = {
        r["temperature"]: (r["draft_model"], r["gamma"])
        for r in rows
        if r["starred"] == "1"
    }
    assert best == {"0.0": ("small", "7"), "1.0": ("base", "5")}
    # One best-gamma row per (draft, temperature).
    assert sorted(
        (r["draft_model"], r["temperature"], r["gamma"])
        for r in rows
        if r["best_gamma_for_draft"] == "1") == [("base", "0.0", "7"),
                                                 ("base", "1.0", "5"),
                                                 ("small", "0.0", "7"),
                                                 ("small", "1.0", "5")]

  def test_table2_md(self, rendered):
    _, out = rendered
    text = (out / "table2.md").read_text()
    summary = text.split("## All sweep points")[0]
    lines = [l for l in summary.splitlines() if l.startswith("| ende")]
    assert len(lines) == 4
    # Paper layout: TASK | M_q | TEMP | gamma | alpha | ... | SPEED | ...
    # The fixture predates the measured call cost: those cells are '–'.
    metrics = _fixture_metrics()
    small = metrics["ende_xxl_small_g7_t0"]
    tokens = small["tokens_generated"] / small["target_calls_speculative"]
    assert (f"| ende | small ⋆ † | 0 | 7 | 0.75 | 0.020 | – | {tokens:.2f} | "
            "2.98X | 3.16X | – | – | BLEU | 26.94 | 26.94 | – |") in lines
    base = metrics["ende_xxl_base_g5_t1"]
    tokens = base["tokens_generated"] / base["target_calls_speculative"]
    assert (f"| ende | base ⋆ † | 1 | 5 | 0.72 | "
            f"{base['cost_coefficient_c']:.3f} | – | {tokens:.2f} | 2.26X | "
            "2.36X | – | – | BLEU | 24.31 | 24.38 | – |") in lines
    assert sum("⋆" in l for l in lines) == 2
    # Issue 58: each theory column named as the summary and the log name
    # its formula, α as outputs.md defines it.
    assert ("| TASK | M_q | TEMP | γ | α | c | CALL COST | TOKENS/CALL | "
            "SPEED | THM 3.8 AT CALL COST 1 | THM 3.8 AT MEASURED CALL COST | "
            "EFFICIENCY |") in text
    assert ('THM 3.8 AT CALL COST 1 is "Theorem 3.8 at call cost 1 (the '
            'paper\'s ideal)"') in text
    assert ('THM 3.8 AT MEASURED CALL COST is "Theorem 3.8 at the measured '
            'call cost"') in text
    assert "α is the run's kept guesses / acceptance trials" in text
    assert "at TEMP > 0 they are different samples" in text

  def test_table2_shows_the_measured_call_cost_and_efficiency(self):
    m = dict(_fixture_metrics()["ende_xxl_small_g7_t0"], run_name="r",
             verification_cost_ratio=1.25,
             theoretical_speedup_measured_call_cost=2.5,
             greedy_identical_examples=7, num_examples=8)
    md, csv_text = tables.render_table2([m])
    row = [
        l for l in md.split("## All sweep points")[0].splitlines()
        if l.startswith("| ende")
    ]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert cells[6] == "1.25" and cells[10] == "2.50X"
    assert cells[11] == f"{m['speedup'] / 2.5:.2f}"  # SPEED / THEORY.
    assert cells[-1] == "7/8"
    record = list(csv.DictReader(io.StringIO(csv_text)))[0]
    assert float(record["verification_cost_ratio"]) == 1.25
    assert int(record["greedy_identical_examples"]) == 7

  def test_table2_gives_the_quality_difference_its_p_value(self):
    """Issue 58: at T > 0 the speculative cell carries the paired
    bootstrap's p (metrics.json's quality_noise), the CSV too."""
    m = dict(
        _fixture_metrics()["ende_xxl_base_g5_t1"], run_name="r", quality_noise={
            "metric": "bleu",
            "difference": 0.07,
            "p_value": 0.8125,
            "resamples": 1000
        })
    md, csv_text = tables.render_table2([m])
    assert "| BLEU | 24.31 | 24.38 (p 0.81) | – |" in md
    record = list(csv.DictReader(io.StringIO(csv_text)))[0]
    assert float(record["quality_p_value"]) == 0.8125

  def test_table4_md(self, rendered):
    _, out = rendered
    text = (out / "table4.md").read_text()
    m = _fixture_metrics()["ende_xxl_small_g7_t0"]
    theory = analysis.expected_speedup(m["alpha"], m["gamma"],
                                       m["cost_coefficient_c"])
    tokens = m["tokens_generated"] / m["target_calls_speculative"]
    row = (f"| ende | small † | 0 | 7 | 0.750 | 0.020 | {tokens:.2f} | "
           f"{analysis.expected_tokens_per_iteration(0.75, 7):.2f} | "
           f"{m['speedup']:.2f}X | {theory:.2f}X | "
           f"{m['speedup'] / theory:.2f} |")
    assert row in text
    assert "Inconsistencies" not in text  # Fixture matches Theorem 3.8.

  def test_trace_html(self, rendered):
    _, out = rendered
    text = (out / "example_trace.html").read_text()
    assert '<span class="acc"> Das</span>' in text
    assert '<del class="rej"> schön</del>' in text
    assert '<span class="tgt"> wunder</span>' in text
    assert '<span class="tgt">&lt;/s&gt;</span>' in text
    assert text.count('<div class="line">') == 4

  def test_trace_from_t5x_rows_is_the_trace_from_older_rows(
      self, rendered, tmp_path):
    """Issue 58: `run` writes T5X's rows (`inputs` an object, `prediction`,
    `aux`); the report draws the same example from them as from the older
    rows of the fixture, and still reads those."""
    _, out = rendered
    root = copy_fixture(tmp_path)
    path = root / "ende_xxl_small_g5_t0" / "predictions.jsonl"
    rows = [
        as_t5x_row(json.loads(line)) for line in path.read_text().splitlines()
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = report.render_report(str(root), str(tmp_path / "new"))
    for name in ("example_trace.html", "example_trace.png", "timeline.png"):
      assert (tmp_path / "new" / name).read_bytes() == (out /
                                                        name).read_bytes(), name
    assert len(written) == len(ALL_OUTPUTS)
    rows[0]["aux"] = [1]  # not T5X's: named
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(report.ReportError,
                       match=r"predictions.jsonl:1: 'aux' must be an object"):
      report.render_report(str(root), str(tmp_path / "bad"))

  def test_load_results_skips_report_dir(self, rendered):
    root, _ = rendered
    runs = report.load_results(str(root))
    assert len(runs) == 8
    with_preds = [r["run_name"] for r in runs if r["predictions_path"]]
    assert with_preds == ["ende_xxl_small_g5_t0"]

  def test_trace_lines(self):
    lines = trace_lib.trace_lines([
        {
            "draft_tokens": ["▁a", "▁b", "▁c"],
            "num_accepted": 1,
            "target_token": "▁x"
        },
        {
            "draft_tokens": ["▁d"],
            "num_accepted": 1,
            "target_token": None
        },
    ])
    assert lines == [("", [" a"], [" b", " c"], " x"), (" a x", [" d"], [], "")]


def test_trace_figure_cuts_a_long_prefix_at_a_word_and_names_the_target():
  """Issue 58: a clipped prefix starts at a whole word ('…lauen Hemd' read
  as another word), and at T = 0 the target's token is its argmax, not a
  sample (both in the PNG's legend and the HTML)."""
  words = [
      f"▁{w}" for w in "Ein Mann in einem blauen Hemd fährt auf der "
      "Straße entlang .".split()
  ]
  trace = [{
      "draft_tokens": words,
      "num_accepted": len(words),
      "target_token": "</s>"
  }, {
      "draft_tokens": ["▁x"],
      "num_accepted": 0,
      "target_token": "▁y"
  }]
  run = {
      "task": "t",
      "target_model": "p",
      "draft_model": "q",
      "gamma": 3,
      "run_name": "r"
  }
  for temperature, words_shown in ((0.0, "target's token (argmax)"),
                                   (1.0, "target sample")):
    run["temperature"] = temperature
    fig = trace_lib.render_trace_png({"trace": trace}, run, prefix_chars=30)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert words_shown in texts
    clipped = [t for t in texts if t.startswith("…")]
    assert clipped == ["… der Straße entlang .</s>"]
  html = trace_lib.render_trace_html({"trace": trace},
                                     dict(run, temperature=0.0))
  assert "its argmax, T = 0" in html and "sampled" not in html


class TestRougeTable:

  def test_rouge_quality_and_star(self):
    base = dict(
        task="cnndm", target_model="xxl", gamma=5, temperature=0.0,
        num_examples=4, tokens_generated=100, target_calls_baseline=100,
        target_calls_speculative=40, walltime_baseline_s=4.0,
        walltime_speculative_s=2.0, cost_coefficient_c=0.02,
        theoretical_speedup=2.0, rouge={
            "baseline": {
                "rouge1": 40.0,
                "rouge2": 18.0,
                "rougeLsum": 37.5
            },
            "speculative": {
                "rouge1": 40.0,
                "rouge2": 18.0,
                "rougeLsum": 37.5
            }
        }, predictions_path=None)
    runs = [
        dict(base, draft_model="small", alpha=0.65, speedup=2.1, run_name="a"),
        dict(base, draft_model="base", alpha=0.73, speedup=2.3, run_name="b")
    ]
    assert tables.quality(runs[0]) == ("ROUGE-L", 37.5, 37.5)
    md, text = tables.render_table2(runs)
    assert ("| cnndm | base ⋆ | 0 | 5 | 0.73 | 0.020 | – | 2.50 | 2.30X | "
            "2.00X |") in md
    assert "ROUGE-L | 37.50 | 37.50" in md
    rows = list(csv.DictReader(text.splitlines()))
    assert [r["draft_model"] for r in rows] == ["small", "base"]  # By size.
    assert [r["starred"] for r in rows] == ["0", "1"]


def _corrupt(root):
  path = root / "ende_xxl_base_g5_t0" / "metrics.json"
  path.write_text('{"task": "ende", "gamma": 5,')  # Truncated JSON.
  return path


def _list_json(root):
  path = root / "ende_xxl_small_g3_t0" / "metrics.json"
  path.write_text("[1, 2, 3]")
  return path


def _bad_alpha(root):
  path = root / "ende_xxl_base_g7_t0" / "metrics.json"
  m = json.loads(path.read_text())
  m["alpha"] = 1.5
  path.write_text(json.dumps(m))
  return path


def _bad_predictions(root):
  path = root / "ende_xxl_small_g5_t0" / "predictions.jsonl"
  path.write_text(path.read_text().splitlines()[0] + "\n{not json\n")
  return path


def _bad_predictions_elsewhere(root):
  """A corrupt predictions.jsonl in a run that is not the example's
  (issue 26: it was skipped, though the docstring says it stops)."""
  path = root / "ende_xxl_base_g3_t0" / "predictions.jsonl"
  path.write_text("{not json\n")
  return path


class TestBadInput:

  @pytest.mark.parametrize("make_bad,expect", [
      (_corrupt, "not valid JSON"),
      (foreign_metrics, "missing required keys"),
      (_list_json, "expected a JSON object"),
      (_bad_alpha, "'alpha' must be a number in [0, 1], got 1.5"),
      (_bad_predictions, "not valid JSON"),
      (_bad_predictions_elsewhere, "not valid JSON"),
  ])
  def test_bad_file_exit_2_nothing_written(self, tmp_path, capsys, make_bad,
                                           expect):
    root = copy_fixture(tmp_path)
    bad = make_bad(root)
    # An existing output dir with an old report must stay untouched.
    out = tmp_path / "out"
    out.mkdir()
    (out / "table2.md").write_text("old")
    before = _snapshot(root), _snapshot(out)
    assert report.main([str(root), "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # Progress lines may precede it; the error itself is one (last) line.
    errors = [l for l in err.splitlines() if l.startswith("report: error: ")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    assert str(bad) in errors[0] and expect in errors[0]
    assert (_snapshot(root), _snapshot(out)) == before
    # With the default output dir, nothing is created.
    assert report.main([str(root)]) == 2
    assert not (root / "report").exists()

  def test_missing_dir(self, tmp_path, capsys):
    missing = tmp_path / "nope"
    assert report.main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: results directory does not exist" in err
    assert not missing.exists()

  def test_empty_dir(self, tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    assert report.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert f"{empty}: no run directories with a metrics.json found\n" in err
    assert os.listdir(empty) == ["sub"]

  def test_infer_folders_are_named(self, tmp_path, capsys):
    """A sweep of MODE='infer' points: the error says what is there and
    why the report cannot tabulate it."""
    for name in ("g2", "g3"):
      (tmp_path / name).mkdir()
      (tmp_path / name / "infer.json").write_text("{}")
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (f"{tmp_path}: no run directories with a metrics.json found; 2 "
            "infer.json (MODE='infer'), which have no speedup to tabulate "
            "(MODE='walltime' writes metrics.json, 'alpha' alpha.json: "
            "Table 3)") in err


def _alpha_json(folder, **changes):
  """An alpha.json as MODE='alpha' writes it (its keys the table reads)."""
  record = dict(task="ende", target_model="xxl", draft_model="small",
                temperature=1.0, top_k=0, top_p=1.0, alpha_beta=0.7123,
                alpha_beta_stderr=0.0114, num_positions=800, num_examples=20)
  record.update(changes)
  folder.mkdir(parents=True)
  (folder / "alpha.json").write_text(json.dumps(record))


def test_alpha_runs_alone_make_table3(tmp_path):
  """The paper's Table 3 from MODE='alpha' points: one row per (task,
  M_p, M_q, T), drafts by size, then temperature."""
  root = tmp_path / "alphas"
  _alpha_json(root / "large_t1", draft_model="large", alpha_beta=0.8)
  _alpha_json(root / "small_t0", temperature=0.0, alpha_beta=0.75)
  _alpha_json(root / "small_t1")
  _alpha_json(root / "small_topp", top_p=0.9, top_k=40, alpha_beta=0.69)
  written = report.render_report(str(root))
  assert sorted(written) == ["table3.md"]
  rows = [
      l for l in (root / "report" / "table3.md").read_text().splitlines()
      if l.startswith("| ende")
  ]
  assert rows == [
      "| ende | xxl | small | 0 | – | 0.750 | 0.011 | 800 | 20 | small_t0 |",
      "| ende | xxl | small | 1 | – | 0.712 | 0.011 | 800 | 20 | small_t1 |",
      "| ende | xxl | small | 1 | top-k 40, top-p 0.9 | 0.690 | 0.011 | 800 | "
      "20 | small_topp |",
      "| ende | xxl | large | 1 | – | 0.800 | 0.011 | 800 | 20 | large_t1 |",
  ]
  _alpha_json(root / "bad", alpha_beta="high")
  with pytest.raises(report.ReportError,
                     match=r"bad/alpha\.json: not an alpha.json"):
    report.render_report(str(root))


def test_alpha_runs_beside_walltime_runs_add_table3(tmp_path):
  root = copy_fixture(tmp_path)
  _alpha_json(root / "alpha_small")
  written = report.render_report(str(root), str(tmp_path / "out"))
  assert sorted(written) == sorted(ALL_OUTPUTS + ["table3.md"])
  assert "| ende | xxl | small | 1 | – | 0.712 |" in (tmp_path / "out" /
                                                      "table3.md").read_text()


def test_skips_absent_figures(tmp_path, caplog):
  """Without predictions.jsonl, the trace and timeline are skipped, logged."""
  root = tmp_path / "results"
  run = root / "only"
  run.mkdir(parents=True)
  shutil.copy(os.path.join(FIXTURE, "ende_xxl_small_g5_t0", "metrics.json"),
              run / "metrics.json")
  caplog.set_level("INFO", logger=report.logger.name)
  written = report.render_report(str(root), str(tmp_path / "out"))
  assert sorted(written) == sorted(
      n for n in ALL_OUTPUTS if not n.startswith(("example_trace", "timeline")))
  assert "skipping example_trace" in caplog.text
  assert "skipping timeline" in caplog.text
  for path in written.values():
    assert os.path.getsize(path) > 0


def test_alpha_json_from_alpha_mode_is_merged(tmp_path):
  root = copy_fixture(tmp_path)
  run_dir = sorted(
      d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))[0]
  with open(os.path.join(root, run_dir, "alpha.json"), "w") as f:
    json.dump({"alpha_beta": 0.6543, "alpha_beta_stderr": 0.01}, f)
  out = tmp_path / "out"
  report.render_report(str(root), str(out))
  rows = {r["run_name"]: r for r in _read_csv(str(out / "table2.csv"))}
  assert float(rows[run_dir]["alpha_sampled"]) == pytest.approx(0.6543)
  assert sum(1 for r in rows.values() if r["alpha_sampled"]) == 1
  with open(os.path.join(root, run_dir, "alpha.json"), "w") as f:
    f.write("[1, 2]")
  assert report.main([str(root), "--output_dir", str(tmp_path / "out2")]) == 2
  assert not (tmp_path / "out2").exists()


# ----------------------------------------------------------------------------
# Figures that explain themselves (issue 13).
# ----------------------------------------------------------------------------


def _vary_alphas(root):
  """Sweep points of one (draft, T) with different α: real error bars."""
  for name, alpha in (("ende_xxl_small_g3_t0", 0.70), ("ende_xxl_small_g7_t0",
                                                       0.80),
                      ("ende_xxl_base_g3_t0", 0.86), ("ende_xxl_base_g7_t0",
                                                      0.74)):
    path = root / name / "metrics.json"
    m = json.loads(path.read_text())
    m["alpha"] = alpha
    path.write_text(json.dumps(m))


def test_speedup_vs_gamma_tells_temperatures_apart():
  runs = report.load_results(FIXTURE)
  fig = figures.render_speedup_vs_gamma(runs)
  ax = fig.axes[0]
  measured = {
      l.get_label(): l for l in ax.lines if l.get_label().startswith("measured")
  }
  assert sorted(measured) == [
      "measured: base, T=0", "measured: base, T=1", "measured: small, T=0",
      "measured: small, T=1"
  ]
  for draft in ("small", "base"):
    t0, t1 = (measured[f"measured: {draft}, T={t}"] for t in (0, 1))
    assert t0.get_marker() != t1.get_marker()
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert set(measured) <= set(legend)


def test_speedup_vs_gamma_draws_theorem_3_8_at_the_measured_call_cost(tmp_path):
  """Issue 58: the curve a γ is chosen from prices the (γ+1)-token call as
  measured; the ideal (a call as cheap as one step) is dotted, labelled,
  and left out of the axis range, so it cannot suggest a far too large γ."""
  root = copy_fixture(tmp_path)
  for path in root.glob("*/metrics.json"):
    m = json.loads(path.read_text())
    m["verification_cost_ratio"] = 1.0 + 0.15 * m["gamma"]  # a CPU-like call
    path.write_text(json.dumps(m))
  runs = report.load_results(str(root))
  ax = figures.render_speedup_vs_gamma(runs).axes[0]
  lines = {l.get_label(): l for l in ax.lines}
  name = "small, T=0"
  measured = lines[f"Thm 3.8, measured call: {name} (α=0.75, c=0.020)"]
  ideal = lines[f"ideal (call = 1 step): {name}"]
  assert ideal.get_linestyle() == ":" and measured.get_linestyle() == "-"
  assert max(measured.get_ydata()) < max(ideal.get_ydata())
  # The axis fits the points and the measured-cost curves, not the ideal.
  in_view = [r["speedup"] for r in runs] + [
      max(l.get_ydata())
      for label, l in lines.items()
      if label.startswith("Thm 3.8, measured call")
  ]
  assert ax.get_ylim()[1] == pytest.approx(1.25 * max(in_view))
  small = [
      r for r in runs if r["draft_model"] == "small" and r["temperature"] == 0
  ]
  alpha = np.mean([r["alpha"] for r in small])
  gammas = np.arange(1, 10)
  expected = gammas[np.argmax(
      analysis.expected_speedup(alpha, gammas, 0.02,
                                call_cost=1 + 0.15 * gammas))]
  best = [
      l.get_xdata()[0]
      for l in ax.lines
      if l.get_marker() == "^" and l.get_color() == measured.get_color()
  ]
  assert expected in best  # (T = 1 has its own)
  assert expected < analysis.optimal_gamma(alpha, 0.02)


def test_alpha_labels_clear_error_bars_and_diamonds(tmp_path):
  root = copy_fixture(tmp_path)
  _vary_alphas(root)
  fig = figures.render_alpha_by_draft(report.load_results(str(root)))
  ax = fig.axes[0]
  renderer = fig.canvas.get_renderer()
  marks = []
  for container in ax.containers:
    errorbar = getattr(container, "errorbar", None)
    if errorbar is not None:
      _, caps, bars = errorbar.lines
      marks += list(caps) + list(bars)
  assert len(marks) >= 4  # two bars with error bars
  marks += [l for l in ax.lines if l.get_marker() == "D"]
  labels = [t for t in ax.texts if t.get_text()[:2] == "0."]
  assert len(labels) == 4

  def extent(mark):
    if hasattr(mark, "get_segments"):  # the vertical error lines
      points = ax.transData.transform(np.concatenate(mark.get_segments()))
      return Bbox([points.min(0), points.max(0)])
    return mark.get_window_extent(renderer)

  for text in labels:
    box = text.get_window_extent(renderer)
    for mark in marks:
      assert not box.overlaps(extent(mark)), (text.get_text(), mark)


def test_piece_escapes_unprintable_tokens():
  assert trace_lib.piece("▁a") == " a"
  assert trace_lib.piece("a\nb\tc") == "a\\nb\\tc"
  assert trace_lib.piece("\u200b") == "\\u200b"  # zero-width space
  assert trace_lib.piece("\u00a0") == "\\xa0"  # no-break space
  assert trace_lib.piece("\ufffd") == "\\ufffd"  # undecodable byte
  assert trace_lib.piece("\u0301e") == "\\u0301e"  # leading combining mark
  assert trace_lib.piece("e\u0301") == "e\u0301"  # é, composed: kept
  assert trace_lib.piece("\\n") == "\\\\n"  # a literal backslash-n
  assert trace_lib.piece("Straße</s>") == "Straße</s>"
  has_glyph = trace_lib.font_has_glyph_fn()
  assert trace_lib.escape_missing_glyphs("a中", has_glyph) == "a\\u4e2d"


def _predictions_without_timeline(root):
  """The g5 T=0 base run (α 0.80, above small's 0.75) gets predictions in
  today's format: no measured timeline, step times in metrics.json."""
  src = root / "ende_xxl_small_g5_t0" / "predictions.jsonl"
  rows = [json.loads(l) for l in src.read_text().splitlines()]
  plain = dict(
      rows[0], index=0, accepted_counts=[0, 0], trace=[{
          "draft_tokens": ["▁a", "▁b"],
          "num_accepted": 0,
          "target_token": "▁c"
      }] * 2)
  rich = dict(
      rows[0], index=1, accepted_counts=[2, 1], trace=[{
          "draft_tokens": ["▁Das", "\u200b"],
          "num_accepted": 2,
          "target_token": "\n"
      }, {
          "draft_tokens": ["▁Haus", "\ufffd"],
          "num_accepted": 1,
          "target_token": "</s>"
      }])
  run_dir = root / "ende_xxl_base_g5_t0"
  with open(run_dir / "predictions.jsonl", "w", encoding="utf-8") as f:
    for row in (plain, rich):
      row.pop("timeline", None)
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  m = json.loads((run_dir / "metrics.json").read_text())
  m.update(draft_step_s=0.0008, target_step_s=0.04)
  (run_dir / "metrics.json").write_text(json.dumps(m))
  return run_dir


def test_example_trace_is_most_informative_and_timeline_modeled(tmp_path):
  root = copy_fixture(tmp_path)
  _predictions_without_timeline(root)
  out = tmp_path / "out"
  written = report.render_report(str(root), str(out))
  assert sorted(written) == sorted(ALL_OUTPUTS)
  page = (out / "example_trace.html").read_text()
  # Highest α run; in it the example with accepted and rejected guesses.
  assert "run ende_xxl_base_g5_t0, example 1" in page
  assert "\\u200b" in page and "\u200b" not in page
  assert "\\ufffd" in page and "\\n" in page
  # The timeline is modeled from accepted_counts and the step times.
  events = trace_lib.example_timeline({"accepted_counts": [2, 1]}, {
      "gamma": 5,
      "draft_step_s": 0.001,
      "target_step_s": 0.01
  })
  assert [e["kind"] for e in events] == (["draft"] * 5 + ["target"]) * 2
  assert events[-1]["end_s"] == pytest.approx(2 * (5 * 0.001 + 0.01))
  # An explicit choice still wins.
  report.render_report(str(root), str(tmp_path / "out2"),
                       example_run="ende_xxl_small_g5_t0")
  assert "run ende_xxl_small_g5_t0, example 0" in (
      tmp_path / "out2" / "example_trace.html").read_text()


def test_timeline_counts_no_token_after_the_output_ends():
  """The last call of a row that ended inside its kept guesses (trace's
  target_token null) added its guesses only: the timeline once labelled
  it +n+1 and counted one token too many."""
  row = {
      "accepted_counts": [2, 1],
      "trace": [{
          "draft_tokens": ["▁Ein", "▁Hund"],
          "num_accepted": 2,
          "target_token": "▁rennt"
      }, {
          "draft_tokens": ["</s>", "."],
          "num_accepted": 1,
          "target_token": None
      }]
  }
  assert trace_lib.call_tokens(row, 2) == [3, 1]
  # Without a trace (a tree's row): kept guesses + 1 a call.
  assert trace_lib.call_tokens({"accepted_counts": [2, 1]}, 2) == [3, 2]
  assert trace_lib.call_tokens({"accepted_counts": [2]}, 2) is None
  fig = trace_lib.render_timeline(
      row, {
          "gamma": 2,
          "draft_step_s": 0.001,
          "target_step_s": 0.01,
          "task": "t",
          "draft_model": "q",
          "target_model": "p"
      })
  ax = fig.axes[0]
  assert [t.get_text() for t in ax.texts] == ["+3", "+1"]
  assert "2 target calls, 4 tokens" in ax.get_title()


def test_example_index_out_of_range_is_named(tmp_path):
  """Issue 37: --example_index=999 said "no trace" instead of "no such
  example"; an index that exists still draws its trace."""
  root = copy_fixture(tmp_path)
  with pytest.raises(
      report.ReportError, match=r"--example_index=999: no such example in .*; "
      r"allowed: 0 to \d+\."):
    report.render_report(str(root), str(tmp_path / "out"), example_index=999)
  report.render_report(str(root), str(tmp_path / "out2"), example_index=0)
  assert ", example 0" in (tmp_path / "out2" / "example_trace.html").read_text()


def _with_machine(root, name, **changes):
  path = root / name / "metrics.json"
  metrics = json.loads(path.read_text())
  metrics["machine"] = {**MACHINE, **changes}
  path.write_text(json.dumps(metrics))


def test_table2_names_the_machines_and_warns_when_they_differ(tmp_path):
  root = copy_fixture(tmp_path)
  names = sorted(
      n for n in os.listdir(root) if (root / n / "metrics.json").is_file())
  for name in names:
    _with_machine(root, name)
  assert report.main([str(root)]) == 0
  text = (root / "report" / "table2.md").read_text()
  assert (f"Measured on: vendor_id: AuthenticAMD; cpu family: 25; model: 1, "
          f"2 CPUs, CPU kernel avx2, JAX 0.10.2 ({len(names)} runs).\n") in text
  assert "more than one machine" not in text
  _with_machine(root, names[0], cpu_kernel="avx512", cpus=4)
  out = tmp_path / "out"
  assert report.main([str(root), "--output_dir", str(out)]) == 0
  text = (out / "table2.md").read_text()
  assert ", 4 CPUs, CPU kernel avx512, JAX 0.10.2 (1 run)" in text
  assert f"CPU kernel avx2, JAX 0.10.2 ({len(names) - 1} runs)" in text
  assert "more than one machine: their speedups do not compare." in text
  machines = {r["run_name"]: r["machine"] for r in _read_csv(out / "table2.csv")}
  assert ", 4 CPUs, CPU kernel avx512" in machines[names[0]]
  assert all(", 2 CPUs, CPU kernel avx2" in machines[n] for n in names[1:])
  path = root / names[1] / "metrics.json"
  metrics = json.loads(path.read_text())
  del metrics["machine"]
  path.write_text(json.dumps(metrics))
  assert report.main([str(root), "--output_dir", str(tmp_path / "out2")]) == 0
  assert "; not recorded (1 run)." in (tmp_path / "out2" /
                                       "table2.md").read_text()
  rows = _read_csv(tmp_path / "out2" / "table2.csv")
  assert [r["machine"] for r in rows if r["run_name"] == names[1]] == [""]
