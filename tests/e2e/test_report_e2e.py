"""The report command in a fresh process (the rest: tests/harness/
test_report.py): a bad results folder is one line on stderr, exit 2,
nothing written."""
import os
import subprocess
import sys

import pytest

from conftest import REPO
from report_helpers import copy_fixture
from report_helpers import foreign_metrics

pytestmark = pytest.mark.slow


def test_subprocess_cli_refuses_a_foreign_metrics_json(tmp_path):
  root = copy_fixture(tmp_path)
  bad = foreign_metrics(root)
  env = dict(os.environ)
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-m", "specdec_jax.report",
                         str(root)], capture_output=True, text=True, cwd=REPO,
                        env=env, timeout=60)
  assert proc.returncode == 2
  assert proc.stdout == ""
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and str(bad) in lines[0], proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (root / "report").exists()
