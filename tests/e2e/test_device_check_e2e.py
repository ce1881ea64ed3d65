"""The device check end to end on the CPU (its arithmetic and settings:
tests/benchmarks/test_device_check.py): `scripts/device_check.sh --small`
writes every phase, every exactness verdict holds, every number is finite.
"""
import json
import math
import os
import subprocess
import sys

import pytest

from specdec_jax.device_check import cli
from specdec_jax.device_check import common

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


def test_small_check_runs_end_to_end_on_the_cpu(tmp_path):
  out = tmp_path / "out"
  done = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "--small"],
                        env={
                            **os.environ, "PYTHON": sys.executable,
                            "OUT": str(out)
                        }, capture_output=True, text=True, timeout=600,
                        check=False)
  assert done.returncode == 0, done.stdout[-3000:]
  report = json.loads((out / cli.RESULT_FILE).read_text())
  log = (out / "device_check.log").read_text()
  for phase in common.PHASES:
    assert report["phases"][phase]["status"] == "ok", report["phases"]
    assert f"phase {phase}: ok in" in log
  assert report["verdicts"]["all_ok"] and report["mode"] == "small"
  assert report["env"]["gpu_awareness"]["ok"]
  modes = report["exactness"]["modes"]
  assert set(modes) == {"token", "block", "tree", "beam"}
  for mode, entry in modes.items():
    assert entry["ok"] and entry["greedy"]["identical"], mode
    if mode != "beam":
      assert entry["distribution"]["passes"], mode
      assert entry["distribution"]["wrong_target_fails"], mode
  assert report["pretrained"]["identity"]["all_identical"]
  assert report["pretrained"]["main_job"]["speedup"] > 0
  _finite(report["pretrained"]["main_job"], "main_job")
  physics = report["physics"]
  for key in ("steps", "call_cost_by_k", "tree_call_cost", "beam_call_cost"):
    _finite(physics[key], key)
  assert len(physics["table2"]) == 12
  for row in physics["table2"]:
    assert math.isfinite(row["theorem_3_8"]), row
  assert "all checks hold: True" in done.stdout
