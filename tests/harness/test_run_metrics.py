"""metrics.json's one schema (`run_metrics.RunMetrics`): the generated
docs/usage/outputs.md table and the class agree, files of every earlier version load, bad values are
named; the report's run table reads it. No model, no
compilation."""
import dataclasses
import glob
import json
import os
import re

import pytest

from specdec_jax.reporting import tables
from specdec_jax import report
from specdec_jax.metrics import run_metrics
from specdec_jax import sweep
from specdec_jax.experiment import plan as plan_lib
from specdec_jax.experiment import runner
from specdec_jax.files import output_folder

from conftest import REPO
from report_helpers import MACHINE

FIXTURE = REPO / "tests" / "fixtures" / "results_small"
FIELDS = {f.name: f for f in dataclasses.fields(run_metrics.RunMetrics)}


def _outputs_table():
  """{key: (meaning, value, older files)} of docs/usage/outputs.md's
  metrics.json table (written by tools/generate_docs.py; tests/project/test_docs.py
  checks that the committed page is its output)."""
  text = (REPO / "docs" / "usage" / "outputs.md").read_text(encoding="utf-8")
  section = text.split("## metrics.json", 1)[1].split("\n## ")[0]
  rows = {}
  for line in section.splitlines():
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
    if len(cells) == 4 and re.fullmatch(r"`\w+`", cells[0]):
      rows[cells[0].strip("`")] = (cells[1], cells[2], cells[3])
  return rows


def _full_metrics(**changes):
  """A RunMetrics with every key set (a walltime run of today)."""
  values = dict(
      task="multi30k", target_model="11m", draft_model="1m", gamma=3,
      temperature=0.0, top_k=0, top_p=1.0, batch_size=1,
      alpha=0.6, alpha_beta=0.61, alpha_stderr=0.01, accepted_histogram=[
          3, 2, 1, 4
      ], num_examples=10, tokens_generated=100, tokens_generated_baseline=100,
      target_calls_baseline=100, target_calls_speculative=50,
      tokens_per_target_call=2.0, walltime_baseline_s=1.0,
      walltime_speculative_s=0.8, speedup=1.25, compile_time_s=3.0,
      target_step_s=1e-3, draft_step_s=1e-4, cost_coefficient_c=0.1,
      theoretical_speedup=1.6, verification_call_s=1.5e-3,
      verification_cost_ratio=1.5, theoretical_speedup_measured_call_cost=1.2,
      theory_tokens_per_call=2.2, theory_tokens_per_call_with_ends=2.1,
      efficiency_split={
          "sentence_ends": 0.95,
          "acceptance": 0.95,
          "output_lengths": 1.0,
          "time": 1.15
      }, fixed_cost_per_example_s={
          "baseline": 0.006,
          "speculative": 0.007
      }, marginal_baseline_overhead=0.95, marginal_iteration_overhead=1.05,
      greedy_outputs_identical=True, greedy_identical_examples=10, bleu={
          "baseline": 20.0,
          "speculative": 20.0
      }, random_weights=False, backend="cpu", device_kind="cpu", num_devices=1,
      machine=MACHINE, decode_paths={
          "target": "cpu_kernel",
          "draft": "packed"
      }, synthetic=False, num_examples_requested=10, inputs_length=64,
      inputs_truncated=0, longest_input_tokens=30, settings={
          "run": {
              "gamma": 3
          }
      }, drafter="model", drafter_settings={
          "drafter": "model"
      }, lenience=1.0, exact=True, adaptive_threshold=None, gamma_auto=None,
      guesses_per_target_call=3.0, per_iteration_gamma={
          "fixed_gamma_speedup": 1.3,
          "achieved_speedup": 1.3,
          "oracle_speedup": 1.7
      })
  values.update(changes)
  return run_metrics.RunMetrics(**values)


def test_outputs_table_and_dataclass_agree():
  table = _outputs_table()
  assert set(table) == set(FIELDS), (
      "docs/usage/outputs.md documents keys that are not RunMetrics fields: "
      f"{sorted(set(table) - set(FIELDS))}; fields not documented: "
      f"{sorted(set(FIELDS) - set(table))}")
  for name, (meaning, value, older) in table.items():
    field = FIELDS[name]
    assert meaning, name
    assert value == field.metadata["kind"].replace("|", "\\|"), name
    if field.default is dataclasses.MISSING:
      expected = "–"
    elif field.metadata["omit_none"]:
      expected = "absent"
    elif field.default is None:
      expected = "null"
    else:
      expected = json.dumps(field.default).replace("1.0", "1")
      expected = expected.strip('"')
      older = older.strip("`")
    assert older == expected, (name, older, expected)


def test_every_field_has_its_meaning_in_the_docstring():
  doc = run_metrics.RunMetrics.__doc__.split("Attributes:")[1]
  documented = set(re.findall(r"^    (\w+):", doc, re.MULTILINE))
  assert documented == set(FIELDS)


def test_round_trip_and_quality_key():
  metrics = _full_metrics()
  written = metrics.to_dict()
  assert "rouge" not in written and written["bleu"]["baseline"] == 20.0
  assert run_metrics.load(json.dumps(written)) == metrics
  # Tree verification's keys only where ACCEPTANCE='tree', beam search's
  # only where DECODE='beam'.
  tree_keys = ("tree_width", "tree_without_replacement")
  beam_keys = ("beam_size", "beam_alpha", "beam_width", "beam_rows",
               "steps_per_target_call")
  # Keys written only when set: PRICE_CALL_COST=False's, SPECULATION's
  # ('off' / 'auto').
  # ... and T > 0's test of the quality difference.
  unpriced_keys = ("call_cost_priced", "speculation", "auto", "quality_noise")
  assert list(written) == [
      f for f in FIELDS if f != "rouge" and f not in tree_keys and
      f not in beam_keys and f not in unpriced_keys
  ]
  assert written["decode"] == "sample"
  beam = _full_metrics(decode="beam", beam_size=4, beam_alpha=0.6, beam_width=8,
                       beam_rows=16, steps_per_target_call=2.5,
                       cost_coefficient_c=None, theoretical_speedup=None)
  written_beam = beam.to_dict()
  assert [written_beam[k] for k in beam_keys] == [4, 0.6, 8, 16, 2.5]
  assert written_beam["cost_coefficient_c"] is None  # not priced: null
  assert run_metrics.load(json.dumps(written_beam)) == beam
  with pytest.raises(run_metrics.MetricsError, match="beam_width"):
    run_metrics.RunMetrics.from_dict({**written_beam, "beam_width": 0})
  tree = _full_metrics(acceptance="tree", tree_width=3,
                       tree_without_replacement=False)
  written = tree.to_dict()
  assert (written["tree_width"], written["tree_without_replacement"]) == (3,
                                                                          False)
  assert run_metrics.load(json.dumps(written)) == tree
  with pytest.raises(run_metrics.MetricsError, match="tree_width"):
    run_metrics.RunMetrics.from_dict({**written, "tree_width": 0})


def test_the_report_leaves_beam_runs_out(tmp_path):
  """DECODE='beam' runs have no c and no Theorem 3.8, which every report
  table prints: loaded, then left out (a sampled run beside one stays)."""
  beam = _full_metrics(decode="beam", beam_size=4, beam_alpha=0.6, beam_width=4,
                       beam_rows=8, steps_per_target_call=1.5,
                       cost_coefficient_c=None, theoretical_speedup=None)
  for name, metrics in (("beam", beam), ("sample", _full_metrics())):
    (tmp_path / name).mkdir()
    (tmp_path / name / "metrics.json").write_text(json.dumps(metrics.to_dict()))
  runs = report.load_results(str(tmp_path))
  assert [r["run_name"] for r in runs] == ["sample"]


def test_the_report_leaves_runs_that_switched_modes_out(tmp_path):
  """SPECULATION='auto' runs that switched between batches have no single
  c or theory: left out (one that kept its choice stays)."""
  kept = {"choice": {"label": "token γ=3"}, "switches": []}
  switched = {**kept, "switches": [{"after_batch": 4}]}
  for name, auto in (("kept", kept), ("switched", switched)):
    (tmp_path / name).mkdir()
    record = {**_full_metrics().to_dict(), "speculation": "auto", "auto": auto}
    (tmp_path / name / "metrics.json").write_text(json.dumps(record))
  assert [r["run_name"] for r in report.load_results(str(tmp_path))] == ["kept"]


def test_files_of_earlier_versions_load_with_defaults():
  oldest = {
      "task": "ende",
      "target_model": "xxl",
      "draft_model": "small",
      "gamma": 5,
      "temperature": 0,
      "alpha": 0.7,
      "num_examples": 4,
      "tokens_generated": 40,
      "target_calls_baseline": 40,
      "target_calls_speculative": 12,
      "walltime_baseline_s": 2,
      "walltime_speculative_s": 1.0,
      "speedup": 2,
      "cost_coefficient_c": 0.02,
      "theoretical_speedup": 2.5
  }
  metrics = run_metrics.RunMetrics.from_dict(oldest)
  assert (metrics.drafter, metrics.lenience, metrics.exact) == ("model", 1.0,
                                                                True)
  assert metrics.per_iteration_gamma is None and metrics.top_p == 1.0
  assert metrics.temperature == 0.0 and isinstance(metrics.temperature, float)
  assert metrics.walltime_baseline_s == 2.0 and metrics.speedup == 2.0
  paths = sorted(glob.glob(str(FIXTURE / "*" / "metrics.json")))
  assert len(paths) == 8
  for root in ("outputs/multi30k/*/metrics.json",
               "outputs/multi30k/*/*/metrics.json"):
    paths += sorted(glob.glob(str(REPO / root)))
  for path in paths:  # the trained pair's runs, where this checkout has them
    with open(path, encoding="utf-8") as f:
      run_metrics.load(f.read())


@pytest.mark.parametrize("changes,expect", [
    ({
        "lenience": 0
    }, "key 'lenience' must be a number in (0, 1], got 0"),
    ({
        "drafter": ""
    }, "key 'drafter' must be a non-empty string"),
    ({
        "per_iteration_gamma": {
            "oracle_speedup": 1.0
        }
    }, "key 'per_iteration_gamma' must be {\"fixed_gamma_speedup\""),
    ({
        "accepted_histogram": [1, -2]
    }, "key 'accepted_histogram' must be a list of integers >= 0"),
    ({
        "exact": "yes"
    }, "key 'exact' must be true or false, got 'yes'"),
    ({
        "gamma": 2.5
    }, "key 'gamma' must be an integer >= 1, got 2.5"),
])
def test_bad_values_are_named(changes, expect):
  data = dict(_full_metrics().to_dict(), **changes)
  with pytest.raises(run_metrics.MetricsError) as e:
    run_metrics.RunMetrics.from_dict(data)
  assert expect in str(e.value)
  del data["speedup"]
  with pytest.raises(run_metrics.MetricsError,
                     match="missing required keys: speedup"):
    run_metrics.RunMetrics.from_dict(data)


def test_report_run_table_shows_drafter_lenience_and_bound():
  runs = report.load_results(str(FIXTURE))  # files from before the keys
  new = dict(
      runs[0],
      **_full_metrics(task="ende", target_model="xxl",
                      draft_model="small l=0.5", lenience=0.5, exact=False,
                      drafter="bigram").to_dict(), run_name="lenient")
  md, text = tables.render_table2(runs + [new])
  everything = md.split("## All sweep points")[1]
  assert "| DRAFTER | LENIENCE | PER-ITERATION γ (FIXED / ACHIEVED / ORACLE) |" \
      in everything
  rows = [l for l in everything.splitlines() if l.startswith("| ende")]
  assert len(rows) == 9
  assert sum(l.endswith("| model | 1 | – |") for l in rows) == 8
  assert any(
      l.endswith("| bigram | 0.5 (not exact) | 1.30X / 1.30X / 1.70X |")
      for l in rows)
  header, *lines = text.splitlines()
  assert header.split(",")[-8:] == [
      "drafter", "lenience", "exact", "fixed_gamma_speedup", "achieved_speedup",
      "oracle_speedup", "run_name", "machine"
  ]
  assert sum(",model,1.0,1,,,," in l for l in lines) == 8
  assert any(",bigram,0.5,0,1.3,1.3,1.7,lenient" in l for l in lines)


def test_sweep_takes_a_written_metrics_json_as_done(tmp_path):
  point = tmp_path / "p"
  point.mkdir()
  assert not sweep.is_done(str(point))
  (point / "metrics.json").write_text('{"task": "ende", "gamma": 5,')
  assert not sweep.is_done(str(point))  # cut short: decoded again
  (point / "metrics.json").write_text(json.dumps(_full_metrics().to_dict()))
  assert sweep.is_done(str(point))
  alpha = tmp_path / "a"
  alpha.mkdir()
  (alpha / "alpha.json").write_text(json.dumps({"alpha_beta": 0.5}))
  assert sweep.is_done(str(alpha))
  # MODE='infer' (a finished infer point was decoded again by a re-run).
  infer = tmp_path / "i"
  infer.mkdir()
  (infer / "infer.json").write_text('{"mode": "infer"')
  assert not sweep.is_done(str(infer))
  (infer / "infer.json").write_text(json.dumps({"mode": "infer"}))
  assert sweep.is_done(str(infer))


def test_settings_of_earlier_versions_are_the_same_settings(tmp_path):
  """Earlier runs recorded a dtype as "<class 'numpy.float32'>" and the
  vocabulary file as resolved from the current directory: re-running the
  same settings into their OUTPUT_DIR is still allowed."""
  spm = "pretrained/multi30k/multi30k.model"
  new = {
      "run": {
          "gamma": 6
      },
      "target": {
          "dtype": "float32",
          "emb_dim": 8
      },
      "draft": {
          "dtype": "bfloat16",
          "emb_dim": 4
      },
      "vocabulary": {
          "file": os.path.join(str(REPO), spm),
          "size": 8000
      }
  }
  old = json.loads(json.dumps(new))
  old["target"]["dtype"] = "<class 'numpy.float32'>"
  old["draft"]["dtype"] = "<class 'ml_dtypes.bfloat16'>"
  old["vocabulary"]["file"] = spm
  assert plan_lib.comparable(old) == plan_lib.comparable(new)
  (tmp_path / "metrics.json").write_text(json.dumps({"settings": old}))
  # The check takes the folder's lock for the run; this test is not one.
  runner.check_output_dir(str(tmp_path), new, overwrite=False).release()
  old["run"]["gamma"] = 7
  (tmp_path / "metrics.json").write_text(json.dumps({"settings": old}))
  with pytest.raises(output_folder.FolderError, match="run.gamma: 7 -> 6"):
    runner.check_output_dir(str(tmp_path), new, overwrite=False)
