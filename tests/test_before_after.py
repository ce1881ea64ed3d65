"""Issue 36's restructuring changed no output: `run` and `sweep` write what
the code before it wrote (tests/fixtures/before_issue36/README.md)."""
import json
import pathlib
import re

import pytest

from specdec_jax import gin_utils
from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.experiment import arguments
from specdec_jax.experiment import summary

BEFORE = pathlib.Path(__file__).parent / "fixtures" / "before_issue36"
# metrics.json keys that are seconds, or computed from seconds.
MEASURED = ("walltime_baseline_s", "walltime_speculative_s", "speedup",
            "compile_time_s", "target_step_s", "draft_step_s",
            "cost_coefficient_c", "theoretical_speedup", "verification_call_s",
            "verification_cost_ratio", "theoretical_speedup_measured_call_cost",
            "per_iteration_gamma")

# metrics.json keys added after the fixtures were written: issue 32's overheads, issue 35's DECODE (every run says
# whether it sampled or searched beams).
ADDED = ("iteration_overhead", "baseline_overhead", "decode",
         "theory_tokens_per_call", "theory_tokens_per_call_with_ends",
         "efficiency_split", "fixed_cost_per_example_s",
         "marginal_baseline_overhead", "marginal_iteration_overhead")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


def _same_results(before: pathlib.Path, after: pathlib.Path) -> None:
  assert (after / "predictions.jsonl").read_bytes() == (
      before / "predictions.jsonl").read_bytes()
  old = json.loads((before / "metrics.json").read_text())
  new = json.loads((after / "metrics.json").read_text())
  # Keys added since (issue 32's overheads) and nothing else.
  assert sorted(set(new) - set(ADDED)) == sorted(old)
  for key in old:
    if key not in MEASURED:
      assert new[key] == old[key], key


def _numbers_masked(lines):
  return [re.sub(r"\d+(\.\d+)?", "N", line) for line in lines]


def test_main_job_shape_writes_what_it_wrote(tmp_path):
  out = tmp_path / "tiny"
  gin_utils.parse_gin(
      ["local_tiny.gin"],
      [f"OUTPUT_DIR = '{out}'", "TEMPERATURE = 1.0", "ACCEPTANCE = 'block'"],
      finalize=False)
  metrics = run_lib.run()
  _same_results(BEFORE / "tiny", out)
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  old = (BEFORE / "tiny" / "stdout.txt").read_text().replace(
      "/tmp/before/tiny", str(out)).splitlines()
  # "slower"/"faster" follows the measured speedup; the rest is the same.
  assert _numbers_masked(lines[2:]) == _numbers_masked(old[2:])
  assert lines[0] == old[0]
  assert lines[1].split(":")[0] == old[1].split(":")[0]
  assert lines[1][lines[1].index("; alpha"):] == old[1][old[1].index("; alpha"
                                                                    ):]


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
