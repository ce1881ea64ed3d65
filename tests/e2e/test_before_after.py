"""Issues 36 and 43's restructurings changed no output: `run` and `sweep`
write what the code before them wrote (tests/fixtures/before_issue36/ and
before_issue43/, each with a README), in the layout and words of today
(issue 58: T5X's predictions rows, named theories and α), mapped here
from the fixtures' value by value."""
import json
import pathlib
import re

import pytest

from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.experiment import arguments
from specdec_jax.experiment import summary

from report_helpers import as_t5x_row

BEFORE = pathlib.Path(__file__).parents[1] / "fixtures" / "before_issue36"
BEFORE_43 = pathlib.Path(__file__).parents[1] / "fixtures" / "before_issue43"
# metrics.json keys that are seconds, or computed from seconds.
MEASURED = ("walltime_baseline_s", "walltime_speculative_s", "speedup",
            "compile_time_s", "target_step_s", "draft_step_s",
            "cost_coefficient_c", "theoretical_speedup", "verification_call_s",
            "verification_cost_ratio", "theoretical_speedup_measured_call_cost",
            "per_iteration_gamma", "iteration_overhead", "baseline_overhead",
            "efficiency_split", "fixed_cost_per_example_s",
            "marginal_baseline_overhead", "marginal_iteration_overhead")

# metrics.json keys added after the fixtures were written: issue 32's overheads, issue 35's DECODE (every run says
# whether it sampled or searched beams), issue 58's test of a T > 0 quality
# difference, the decode path each model ran on, the machine that ran it.
ADDED = ("iteration_overhead", "baseline_overhead", "decode",
         "theory_tokens_per_call", "theory_tokens_per_call_with_ends",
         "efficiency_split", "fixed_cost_per_example_s",
         "marginal_baseline_overhead", "marginal_iteration_overhead",
         "quality_noise", "decode_paths", "machine")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


def _lines(rows):
  """predictions.jsonl's text of `rows`, as `run` writes it."""
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _same_results(before: pathlib.Path, after: pathlib.Path) -> None:
  text = (before / "predictions.jsonl").read_text(encoding="utf-8")
  old_rows = [json.loads(line) for line in text.splitlines()]
  assert _lines(old_rows) == text  # read back whole: nothing lost here
  assert (after / "predictions.jsonl").read_text(encoding="utf-8") == _lines(
      [as_t5x_row(r) for r in old_rows])
  old = json.loads((before / "metrics.json").read_text())
  new = json.loads((after / "metrics.json").read_text())
  # Keys added since (issue 32's overheads) and nothing else.
  assert sorted(set(new) - set(ADDED)) == sorted(set(old) - set(ADDED))
  assert set(old) <= set(new)
  for key in old:
    if key not in MEASURED:
      # Statistics of probabilities (alpha_beta: a float32 sum) move in
      # the 8th digit between CPUs (vector widths, the kernel's path).
      if isinstance(old[key], float):
        assert new[key] == pytest.approx(old[key], rel=1e-6), key
      else:
        assert new[key] == old[key], key


def _numbers_masked(lines):
  return [re.sub(r"\d+(\.\d+)?", "N", line) for line in lines]


def _reworded(lines, sampled: bool):
  """The fixture's summary in issue 58's words: α named as outputs.md
  defines it, and at T > 0 the quality line's note on sampling noise."""
  out = []
  for line in lines:
    line = line.replace("(share of draft tokens accepted)",
                        "(kept guesses / acceptance trials)")
    if sampled and line.startswith("quality: BLEU "):
      line += ("; T > 0: different samples of the same distribution, so "
               "they differ by sampling noise (paired bootstrap over the 12 "
               "examples: p = 0.5)")
    out.append(line)
  return out


def _moved_tests(text: str) -> str:
  """`text` with tests/test_x.py at its folder since the tests moved into
  folders by layer (the summary names the test file that checks a rule)."""
  tests = pathlib.Path(__file__).resolve().parents[1]
  return re.sub(
      r"tests/(test_\w+\.py)", lambda m: str(
          next(tests.glob(f"*/{m.group(1)}")).relative_to(tests.parent)), text)


def _run_as_before(before: pathlib.Path, out: pathlib.Path, bindings) -> None:
  """local_tiny.gin with `bindings` into `out`: the results and the summary
  lines (numbers aside) are `before`'s."""
  gin_utils.parse_gin(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'", *bindings],
                      finalize=False)
  metrics = run_lib.run()
  _same_results(before, out)
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  old = _moved_tests(
      (before / "stdout.txt").read_text().replace(f"/tmp/before/{before.name}",
                                                  str(out))).splitlines()
  # Sampled: the head line says T > 0 (a beam run says "beam search").
  old = _reworded(old, sampled=re.search(r", T=(?!0\b)", old[0]) is not None)
  # "slower"/"faster" follows the measured speedup; the rest is the same.
  assert _numbers_masked(lines[2:]) == _numbers_masked(old[2:])
  assert lines[0] == old[0]
  assert lines[1].split(":")[0] == old[1].split(":")[0]
  tail = "; alpha" if "; alpha" in old[1] else "; "
  assert lines[1][lines[1].index(tail):] == old[1][old[1].index(tail):]
  return metrics


def _check_noise(metrics):
  """T > 0: the BLEU difference tested (sacrebleu's paired bootstrap)."""
  noise = metrics["quality_noise"]
  assert noise["difference"] == pytest.approx(metrics["bleu"]["speculative"] -
                                              metrics["bleu"]["baseline"])
  assert 0 < noise["p_value"] <= 1 and noise["resamples"] == 1000


def test_main_job_shape_writes_what_it_wrote(tmp_path):
  _check_noise(
      _run_as_before(BEFORE / "tiny", tmp_path / "tiny",
                     ["TEMPERATURE = 1.0", "ACCEPTANCE = 'block'"]))


def test_a_tree_run_writes_what_it_wrote(tmp_path):
  _check_noise(
      _run_as_before(
          BEFORE_43 / "tree", tmp_path / "tree",
          ["TEMPERATURE = 1.0", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"]))


def test_a_beam_run_writes_what_it_wrote(tmp_path):
  assert "quality_noise" not in _run_as_before(
      BEFORE_43 / "beam", tmp_path / "beam",
      ["DECODE = 'beam'", "BEAM_SIZE = 2"])


def test_sweep_writes_what_it_wrote(tmp_path):
  points = sweep.parse_sweep_args(["GAMMA=1,3", "DRAFTER=model,bigram"])
  results = tmp_path / "sweep"
  sweep.run_sweep(
      points, str(results), ["local_tiny.gin"],
      ["NGRAM_CORPUS = 'configs/data/tiny_en_de.tsv'", "NUM_EXAMPLES = 4"])
  names = sorted(p.name for p in (BEFORE / "sweep").iterdir())
  assert len(names) == 4
  for name in names:
    _same_results(BEFORE / "sweep" / name, results / name)
