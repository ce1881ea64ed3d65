"""The report's results fixture (tests/fixtures/results_small), shared by
tests/harness/test_report.py and tests/e2e/test_report_e2e.py."""
import json
import os
import pathlib
import shutil

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "results_small")


def copy_fixture(tmp_path: pathlib.Path) -> pathlib.Path:
  """A writable copy of the fixture: tmp_path/results."""
  root = tmp_path / "results"
  shutil.copytree(FIXTURE, root)
  return root


def foreign_metrics(root: pathlib.Path) -> pathlib.Path:
  """One run's metrics.json replaced by another program's (a training
  run's loss and step): the path."""
  path = root / "ende_xxl_small_g3_t0" / "metrics.json"
  path.write_text(json.dumps({"loss": 1.23, "step": 1000}))
  return path
