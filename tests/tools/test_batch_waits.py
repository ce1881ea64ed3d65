"""tools/benchmarks/batch_waits.py: each row's tokens and calls read from a
run's predictions.jsonl, each batch size's factor, and the runs and flags
it refuses (a real run's factor: tests/e2e/test_run_e2e.py)."""
import json
import pathlib

import pytest

from tools.benchmarks import batch_waits
from tools.benchmarks import common

from report_helpers import FIXTURE


def _call(accepted, token):
  return {
      "draft_tokens": ["a"] * 3,
      "num_accepted": accepted,
      "target_token": token
  }


def _write_run(folder, traces, identical=True):
  rows = [{
      "prediction": "x",
      "aux": {
          "index": i,
          "target_calls": len(trace) if trace else 1,
          "trace": trace
      }
  } for i, trace in enumerate(traces)]
  (folder / "predictions.jsonl").write_text("".join(
      json.dumps(r) + "\n" for r in rows))
  # A real run's metrics.json (the report's fixture), at T = 0 with
  # identical outputs or sampled.
  metrics = json.loads((pathlib.Path(FIXTURE) / "ende_xxl_small_g3_t0" /
                        "metrics.json").read_text())
  metrics.update(temperature=0.0 if identical else 1.0,
                 greedy_outputs_identical=identical if identical else None)
  (folder / "metrics.json").write_text(json.dumps(metrics))
  return str(folder / "predictions.jsonl")


def test_rows_tokens_and_calls_and_each_batch_sizes_factor(tmp_path, capsys):
  # Row 0: 3 + " x", then 1 + EOS: 6 tokens in 2 calls. Row 1: EOS among
  # the first call's kept guesses: 2 tokens in 1 call. Row 2: 4 tokens.
  path = _write_run(
      tmp_path,
      [[_call(3, "x"), _call(1, "</s>")], [_call(2, None)], [_call(3, "</s>")]])
  assert batch_waits.read_run(path) == ([6, 2, 4], [2, 1, 1])
  out = batch_waits.main([
      f"--predictions={path}", "--batch_sizes=1,2",
      f"--output={tmp_path / 'w.json'}"
  ])
  one, two = out["by_batch_size"]
  assert one["batch_factor"] == 1.0
  # Batches [6, 2] and [4]: 10 baseline iterations, 3 speculative ones.
  assert (two["baseline_iterations"], two["speculative_iterations"]) == (10, 3)
  assert two["batch_factor"] == pytest.approx((4 / 3) / (12 / 10))
  assert json.loads((tmp_path / "w.json").read_text()) == out
  # Shortest first: batches [2, 4] and [6] (calls [1, 1] and [2]).
  _, two = batch_waits.batch_table([6, 2, 4], [2, 1, 1], [1, 2], True)
  assert (two["baseline_iterations"], two["speculative_iterations"]) == (10, 3)
  _, two = batch_waits.batch_table([6, 2, 4, 3], [1, 1, 3, 1], [1, 2], True)
  assert (two["baseline_iterations"], two["speculative_iterations"]) == (9, 4)
  assert "batch   2: iterations 10 (target alone) / 3" in capsys.readouterr(
  ).out


def test_each_rows_calls_replayed_at_other_gammas(tmp_path, capsys):
  # The fixture's run is at γ 3. Row 0 kept 3 (the target's token unseen),
  # then 1 before EOS; row 1 ended inside its guesses; row 2 kept 3, then
  # EOS. At γ 1: 3, 1 and 2 calls.
  path = _write_run(
      tmp_path,
      [[_call(3, "x"), _call(1, "</s>")], [_call(2, None)], [_call(3, "</s>")]])
  assert [
      batch_waits.row_counts(row) for row in batch_waits.read_rows(path)[1]
  ] == [[3, 1], [2], [3]]
  out = batch_waits.main(
      [f"--predictions={path}", "--batch_sizes=1,2", "--gammas=1,3"])
  assert out["gamma"] == 3
  # Its own γ: its own table; γ 1: batches [3, 1] and [2], 5 iterations.
  assert out["replayed_by_gamma"]["3"] == out["by_batch_size"]
  one, two = out["replayed_by_gamma"]["1"]
  assert one["speculative_iterations"] == 3 + 1 + 2
  assert two["speculative_iterations"] == 5
  assert two["batch_factor"] == pytest.approx((6 / 5) / (12 / 10))
  assert "γ 1 (replayed from γ 3): batch 1 1.000, batch 2 1.000" in (
      capsys.readouterr().out)
  with pytest.raises(common.BenchmarkFlagError, match="--gammas"):
    batch_waits.main([f"--predictions={path}", "--gammas=0"])
  with pytest.raises(common.BenchmarkFlagError, match="not with --by_length"):
    batch_waits.main([f"--predictions={path}", "--gammas=2", "--by_length"])


def test_pilot_sized_windows_against_all_rows(tmp_path, capsys):
  """`auto`'s pilot replays a batch's slowest from its few rows: each
  window of n consecutive rows against all rows. Rows of 2 tokens at γ 1
  (the baseline's rows end together): A, C and D take 1 call, B 2. All
  4 at batch 2: mean 1.25 over E[most of 2 of 4] = 1 + 1/2, 0.833."""
  counts, tokens = [[1], [0, 0], [1], [1]], [2, 2, 2, 2]
  two, three, four = batch_waits.pilot_windows(counts, tokens, 1, [1, 2], 2,
                                               [2, 3, 4])
  full = 1.25 / 1.5
  # n = 2: [A, B] 1.5 / 2 and [C, D] 1; γ 2 the same (A's guess kept all
  # 1: its next position unseen, counted right).
  assert (two["rows"], two["windows"]) == (2, 2)
  assert two["mean_error"] == pytest.approx(
      (abs(0.75 - full) + abs(1.0 - full)) / 2)
  assert two["mean_error_monotone"] == two["mean_error"]  # already so
  assert two["windows_worse"] == 0
  # n = 3: one window [A, B, C], 4/3 over E[most of 2 of 3] = 1 + 2/3.
  assert three["windows"] == 1
  assert three["mean_error"] == pytest.approx(abs((4 / 3) / (5 / 3) - full))
  assert four["windows"] == 1 and four["mean_error"] == pytest.approx(0.0)
  path = _write_run(
      tmp_path,
      [[_call(3, "x"), _call(1, "</s>")], [_call(2, None)], [_call(3, "</s>")]])
  out = batch_waits.main([
      f"--predictions={path}", "--batch_sizes=2", "--gammas=1,3",
      "--pilot_rows=2"
  ])
  assert [w["rows"] for w in out["pilot_windows"]] == [2]
  assert "pilots of 2 rows (1 windows)" in capsys.readouterr().out
  for flags in (["--pilot_rows=2"], ["--gammas=1", "--pilot_rows=2"],
                ["--batch_sizes=8", "--gammas=1", "--pilot_rows=0"]):
    with pytest.raises(common.BenchmarkFlagError, match="--pilot_rows"):
      batch_waits.main([f"--predictions={path}", *flags])


def test_sampled_runs_trees_and_bad_flags_are_refused(tmp_path):
  sampled = tmp_path / "s"
  sampled.mkdir()
  path = _write_run(sampled, [[_call(3, "x")]], identical=False)
  with pytest.raises(ValueError, match="T=1.0 with greedy_outputs_identical"):
    batch_waits.read_run(path)
  tree = tmp_path / "t"
  tree.mkdir()
  with pytest.raises(ValueError, match="example 0: no trace"):
    batch_waits.read_run(_write_run(tree, [None]))
  alone = tmp_path / "alone"
  alone.mkdir()
  (alone / "predictions.jsonl").write_text("")
  with pytest.raises(ValueError, match="metrics.json does not read"):
    batch_waits.read_run(str(alone / "predictions.jsonl"))
  with pytest.raises(common.BenchmarkFlagError,
                     match=r"--batch_sizes: invalid value '8,0'"):
    batch_waits.main([f"--predictions={path}", "--batch_sizes=8,0"])
  with pytest.raises(common.BenchmarkFlagError, match="--predictions"):
    batch_waits.main([f"--predictions={tmp_path / 'none.jsonl'}"])
