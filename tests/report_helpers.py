"""The report's results fixture (tests/fixtures/results_small), shared by
tests/harness/test_report.py and tests/e2e/test_report_e2e.py."""
import json
import os
import pathlib
import shutil

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "results_small")

# metrics.json's `machine` of a 2-CPU Zen 3 CPU run (price_cache's fields).
MACHINE = {
    "host": "vm",
    "cpu": "vendor_id: AuthenticAMD; cpu family: 25; model: 1",
    "cpus": 2,
    "backend": "cpu",
    "device_kind": "cpu",
    "devices": 1,
    "jax": "0.10.2",
    "cpu_kernel": "avx2"
}


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


def as_t5x_row(old: dict) -> dict:
  """An older walltime predictions.jsonl row (the fixtures') in the layout
  `run` writes since issue 58, T5X's: `inputs` an object of
  *_pretokenized texts, `prediction` the speculative text, ours in `aux`;
  the same values, none added but the target calls (one per accepted
  count)."""
  aux = {
      "index": old["index"],
      "baseline": old["baseline"],
      "target_calls": len(old["accepted_counts"]),
      "accepted_counts": old["accepted_counts"],
      "trace": old["trace"]
  }
  if "timeline" in old:  # recorded by older runs only
    aux["timeline"] = old["timeline"]
  return {
      "inputs": {
          "inputs_pretokenized": old["input"],
          "targets_pretokenized": old["reference"]
      },
      "prediction": old["speculative"],
      "aux": aux
  }
