"""The device check end to end on the CPU (its arithmetic and settings:
tests/tools/test_device_check.py): `scripts/device_check.sh --small`
writes every phase, every exactness verdict holds, every number is finite,
with gin, seqio and TensorFlow not importable (as on the GPU image).
"""
import json
import math
import os
import subprocess
import sys

import pytest

from tools.device_check import cli
from tools.device_check import common

from conftest import REPO

pytestmark = pytest.mark.slow


def _finite(value, where):
  if isinstance(value, dict):
    for k, v in value.items():
      _finite(v, f"{where}.{k}")
  elif isinstance(value, list):
    for i, v in enumerate(value):
      _finite(v, f"{where}[{i}]")
  elif isinstance(value, float) or value is None:
    assert value is not None and math.isfinite(value), where


def _without(names, folder):
  """A folder whose packages `names` fail to import (put before the
  environment's on PYTHONPATH): the GPU image has none of them."""
  for name in names:
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py"
    ).write_text(f"raise ImportError('{name} is not on the GPU image')\n")
  return folder


def test_small_check_runs_end_to_end_on_the_cpu(tmp_path):
  out = tmp_path / "out"
  absent = _without(("gin", "seqio", "tensorflow", "tensorflow_datasets"),
                    tmp_path / "absent")
  path = os.pathsep.join(
      [str(absent)] +
      [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
  done = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "--small"],
                        env={
                            **os.environ, "PYTHON": sys.executable,
                            "OUT": str(out),
                            "PYTHONPATH": path
                        }, capture_output=True, text=True, timeout=1700,
                        check=False)
  # The phases' statuses, then the summary's tail (its last line names
  # the checks that failed).
  phases = [line for line in done.stdout.splitlines() if "phase " in line]
  assert done.returncode == 0, "\n".join(phases + [done.stdout[-2000:]])
  report = json.loads((out / cli.RESULT_FILE).read_text())
  log = (out / "device_check.log").read_text()
  for phase in common.PHASES:
    assert report["phases"][phase]["status"] == "ok", report["phases"]
    assert f"phase {phase}: ok in" in log
  assert report["verdicts"]["all_ok"] and report["mode"] == "small"
  assert report["env"]["gpu_awareness"]["ok"]
  rates = report["env"]["ceilings"]
  assert rates["read_gbps"] > 0 and rates["copy_gbps"] > 0
  for path, models in report["paths"]["steps"].items():
    for name, m in models.items():
      assert 0 < m["read_floor_share"], (path, name)
  modes = report["exactness"]["modes"]
  assert set(modes) == {"token", "block", "tree", "beam"}
  for mode, entry in modes.items():
    assert entry["ok"] and entry["greedy"]["all_identical"], mode
    if mode != "beam":
      assert entry["distribution"]["passed"], mode
      assert entry["distribution"]["power_ok"], mode
  assert report["pretrained"]["identity"]["all_identical"]
  assert report["pretrained"]["main_job"]["speedup"] > 0
  _finite(report["pretrained"]["main_job"], "main_job")
  # Each model on a path of its own: the draft's fused kernels (interpret
  # mode here) with the target's packed ones, still identical.
  mixed = report["pretrained"]["main_job_by_mixed_paths"]["packed+fused"]
  assert mixed["identity"]["all_identical"], mixed
  assert mixed["1"]["speedup"] > 0
  # The main job at its γ, as a tree and with the shared-encoder draft on
  # that pair, in one set of rounds, each identical to the target alone.
  by_gamma = report["pretrained"]["main_job_by_gamma"]
  assert by_gamma["paths"] == "packed+fused", by_gamma
  assert set(
      by_gamma["runs"]) == {"gamma_3", "tree_2x3", "draft_shared_encoder_1m"}
  assert by_gamma["missing"] == []
  for name, m in by_gamma["runs"].items():
    assert m["identity"]["identical"] == m["identity"]["examples"] == 3, name
    assert m["speedup"] > 0 and m["tokens_per_target_call"] > 1, name
  assert by_gamma["runs"]["gamma_3"]["verification_call_cost"] > 0
  assert by_gamma["fastest"] in by_gamma["runs"]
  assert (
      "  main job by γ, tree and draft, target on packed, draft on fused: γ 3 "
      in done.stdout)
  assert report["verdicts"]["pretrained_identical_other_pairs"] is True
  # Each loop of the main job traced: no device plane here, said so, with
  # the iterations a caption its host waits would be read against.
  job_profile = report["pretrained"]["main_job_profile"]
  assert set(job_profile) == {
      "baseline", "speculative", "target_k1", "target_k4"
  }
  for name, r in job_profile.items():
    assert r["note"] == "no device activity in the trace", name
  assert job_profile["target_k4"]["k"] == 4
  assert (job_profile["baseline"]["iterations_per_caption"] >
          job_profile["speculative"]["iterations_per_caption"] > 0)
  # Stages apart by barriers: each program's count right (interpret mode
  # runs them one after another: the group's code, not the barriers).
  assert report["paths"]["barriers"]["all_held"] is True
  assert report["verdicts"]["barriers_held"] is True
  physics = report["physics"]
  for key in ("steps", "call_cost_by_k", "tree_call_cost", "beam_call_cost"):
    _finite(physics[key], key)
  # The paths phase's device profiles: every step traced, and on a CPU
  # no device plane, said so (not counted as none).
  profile = report["paths"]["profile"]
  assert set(profile) == {
      f"{m}:{p}" for m in ("small", "xxl") for p in ("xla", "packed", "fused")
  } | {"small:fused/default"}
  for name, r in profile.items():
    assert r == {"kernels": 0, "note": "no device activity in the trace"}, name
  assert "  profile small:fused: no device activity in the trace" in (
      done.stdout)
  # The loop phase: the split on both paths, the CPU's HLO counted.
  loop = report["loop"]
  assert set(loop["split"]) == set(loop["kernels"]) == {"cpu_kernel", "xla"}
  for path, split in loop["split"].items():
    _finite(split, f"loop.split.{path}")
    assert split["iteration_split_s"]["verification_call"] > 0, path
    kernels = loop["kernels"][path]
    assert kernels["body_by_part"]["target call"] > 0, path
    assert 0 < kernels["outside_model_calls"] < kernels["body"], path
    # Its start and finish (by part only where nothing came from the
    # compilation cache: its key leaves out the ops' source names).
    assert kernels["outside_loop"] > 0, path
  assert loop["main_job"]["over_theorem"] > 0
  assert "  loop on xla: iteration " in done.stdout
  assert len(physics["table2"]) == 12
  for row in physics["table2"]:
    assert math.isfinite(row["theorem_3_8"]), row
  assert "all checks hold: True" in done.stdout


@pytest.mark.parametrize("timeout,args,default", [("abc", ["--small"], 1560),
                                                  ("0", ["--small"], 1560),
                                                  ("-5", [], 480),
                                                  ("1e3", [], 480)])
def test_a_bad_timeout_is_one_line_before_anything_runs(timeout, args, default,
                                                        tmp_path):
  """DEVICE_CHECK_TIMEOUT_S=abc gave coreutils' "invalid time interval",
  rc 125. The error names the default: 480 s, 1560 s with --small."""
  out = tmp_path / "out"
  done = subprocess.run(
      [str(REPO / "scripts" / "device_check.sh"), *args], env={
          **os.environ, "PYTHON": sys.executable,
          "OUT": str(out),
          "DEVICE_CHECK_TIMEOUT_S": timeout
      }, capture_output=True, text=True, timeout=60, check=False)
  assert done.returncode == 2, done.stderr
  assert done.stderr.splitlines() == [
      f"device_check: error: DEVICE_CHECK_TIMEOUT_S='{timeout}': allowed: a "
      f"number of seconds > 0 (unset: {default})."
  ]
  assert not out.exists()


@pytest.mark.parametrize("inside", [False, True])
def test_an_out_that_is_a_file_is_one_line(inside, tmp_path):
  a_file = tmp_path / "f"
  a_file.write_text("mine")
  out = a_file / "sub" if inside else a_file
  done = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "--small"],
                        env={
                            **os.environ, "PYTHON": sys.executable,
                            "OUT": str(out)
                        }, capture_output=True, text=True, timeout=60,
                        check=False)
  assert done.returncode == 2, done.stderr
  assert len(done.stderr.splitlines()) == 1, done.stderr
  assert done.stderr.startswith(f"device_check: error: OUT='{out}' is not a")
  assert a_file.read_text() == "mine"


def test_a_refused_second_check_keeps_the_first_ones_log(tmp_path):
  """A check refused at start (another holds OUT) exits 2 and leaves the
  log of the check in OUT as it was."""
  from specdec_jax.files import output_folder  # pylint: disable=g-import-not-at-top
  out = tmp_path / "out"
  out.mkdir()
  (out / "device_check.log").write_text("the first check's log\n")
  with output_folder.hold(str(out), "device_check", "--out"):
    done = subprocess.run(
        [str(REPO / "scripts" / "device_check.sh"), "--small"], env={
            **os.environ, "PYTHON": sys.executable,
            "OUT": str(out)
        }, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 2, done.stdout
  assert "is in use by device_check" in done.stdout
  assert (out / "device_check.log").read_text() == "the first check's log\n"
  assert sorted(os.listdir(out)) == ["device_check.log"]
