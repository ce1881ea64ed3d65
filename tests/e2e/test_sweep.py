"""The sweep command: expansion, bad specs, and loss-free resumption."""
import json
import os
import subprocess
import sys

import pytest

from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment.plan import make_decoders
from specdec_jax import sweep
from tools.benchmarks import soak

from conftest import REPO

# A cleared gin configuration before and after each test (conftest.py).
# End to end: marked slow, like every test in tests/e2e/.
pytestmark = [pytest.mark.usefixtures("clean_gin"), pytest.mark.slow]


def test_grid_expansion_and_yaml(tmp_path):
  points = sweep.parse_sweep_args(["GAMMA=1,2,3", "TEMPERATURE=0,0.5"])
  assert len(points) == 6
  assert {"GAMMA": 3, "TEMPERATURE": 0.5} in points
  spec = tmp_path / "s.yaml"
  spec.write_text("points:\n  - {gin_file: a.gin, GAMMA: 7}\n"
                  "  - {gin_file: b.gin, GAMMA: 5}\n"
                  "grid:\n  TEMPERATURE: [0.0, 1.0]\n")
  points = sweep.parse_sweep_args([str(spec)])
  assert len(points) == 4
  assert {"gin_file": "b.gin", "GAMMA": 5, "TEMPERATURE": 1.0} in points
  names = {sweep.point_name(p) for p in points}
  assert len(names) == 4
  # The shipped specs expand to the paper's grids.
  assert len(sweep.parse_sweep_args([str(REPO / "configs/table2.yaml")])) == 12
  assert len(sweep.parse_sweep_args([str(REPO / "configs/grid_ende.yaml")
                                    ])) == 72
  assert len(
      sweep.parse_sweep_args([str(REPO / "configs/gamma_temperature.yaml")
                             ])) == 24


@pytest.mark.parametrize("specs,message", [
    ([], "empty"),
    (["GAMMA="], "KEY=v1,v2"),
    (["missing.yaml"], "does not exist"),
])
def test_bad_specs(specs, message):
  with pytest.raises(sweep.SweepError, match=message):
    sweep.parse_sweep_args(specs)


def test_empty_yaml_grid(tmp_path):
  spec = tmp_path / "s.yaml"
  spec.write_text("grid:\n  GAMMA: []\n")
  with pytest.raises(sweep.SweepError, match="non-empty"):
    sweep.parse_sweep_args([str(spec)])


def test_unknown_binding_and_foreign_results_dir(tmp_path):
  with pytest.raises(sweep.SweepError, match="GAMMMA"):
    sweep.run_sweep([{"GAMMMA": 2}], str(tmp_path / "r"), ["local_tiny.gin"])
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(sweep.SweepError, match="not empty"):
    sweep.run_sweep([{"GAMMA": 2}], str(foreign), ["local_tiny.gin"])
  assert sorted(os.listdir(foreign)) == ["notes.txt"]
  corrupt = tmp_path / "corrupt"
  corrupt.mkdir()
  (corrupt / sweep.SWEEP_FILE).write_text("{not json")
  with pytest.raises(sweep.SweepError, match="corrupt"):
    sweep.run_sweep([{"GAMMA": 2}], str(corrupt), ["local_tiny.gin"])
  assert (corrupt / sweep.SWEEP_FILE).read_text() == "{not json"


@pytest.mark.parametrize(
    "points,expect",
    [
        # The bad value is the grid's last point: all are checked up front.
        ([{
            "GAMMA": 1
        }, {
            "GAMMA": 0
        }], ["point GAMMA=0", "GAMMA=0: allowed"]),
        ([{
            "TEMPERATURE": 0.0
        }, {
            "TEMPERATURE": float("inf")
        }], ["point TEMPERATURE=inf", "TEMPERATURE=inf", "finite"]),
        ([{
            "GAMMA": 1
        }, {
            "target/T5Config.vocab_size": 128,
            "draft/T5Config.vocab_size": 128
        }], ["vocab_size=128", "259 ids"]),
        ([{
            "GAMMA": 2
        }, {
            "run.gama": 2
        }], ["run.gama", "gama"]),
        ([{
            "GAMA": 2
        }], ["--sweep key 'GAMA'", "did you mean GAMMA"]),
    ])
def test_every_point_checked_before_any_model_load(points, expect, tmp_path,
                                                   no_load):
  results = tmp_path / "r"
  with pytest.raises(sweep.SweepError) as e:
    sweep.run_sweep(points, str(results), ["local_tiny.gin"], providers=no_load)
  for text in expect:
    assert text in str(e.value), (text, str(e.value))
  assert "In call to configurable" not in str(e.value)  # gin's note
  assert not results.exists()


def test_base_binding_typo_and_unwritable_results_dir(tmp_path, no_load):
  with pytest.raises(sweep.SweepError, match=r"--gin.GAMA=3.*GAMMA"):
    sweep.run_sweep([{
        "GAMMA": 1
    }], str(tmp_path / "r"), ["local_tiny.gin"], ["GAMA=3"], providers=no_load)
  a_file = tmp_path / "file"
  a_file.write_text("mine")
  with pytest.raises(sweep.SweepError) as e:
    sweep.run_sweep([{
        "GAMMA": 1
    }], str(a_file), ["local_tiny.gin"], providers=no_load)
  assert f"--results_dir={str(a_file)!r}: not a writable directory" in str(
      e.value)
  assert a_file.read_text() == "mine"


def test_unread_macro_in_a_gin_file_is_refused(tmp_path, no_load):
  """Issue 37 (5): `GAMA = 3` in an experiment file ran with γ 5."""
  (tmp_path / "exp.gin").write_text("include 'local_tiny.gin'\nGAMA = 3\n")
  with pytest.raises(sweep.SweepError) as e:
    sweep.run_sweep([{
        "SEED": 1
    }], str(tmp_path / "r"), [str(tmp_path / "exp.gin")])
  assert "exp.gin:2: GAMA = ...: macro 'GAMA' is defined but nothing reads" \
      in str(e.value)
  assert "did you mean GAMMA?" in str(e.value)
  assert not (tmp_path / "r").exists()


def test_cli_error_is_one_line_without_traceback(tmp_path):
  proc = subprocess.run([
      sys.executable, "-m", "specdec_jax.sweep", "--gin_file=local_tiny.gin",
      "--sweep=NOT_A_MACRO=1,2", f"--results_dir={tmp_path / 'r'}"
  ], capture_output=True, text=True, cwd=REPO, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "NOT_A_MACRO" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "r").exists()


def test_killed_sweep_resumes_and_runs_each_point_once(tmp_path, monkeypatch):
  results = str(tmp_path / "results")
  base = ["local_tiny.gin"]
  bindings = [
      "NUM_EXAMPLES = 2", "TASK_FEATURE_LENGTHS = "
      "{'inputs': 32, 'targets': 8}"
  ]
  points = sweep.parse_sweep_args(["GAMMA=1,2", "TEMPERATURE=0,1"])
  calls, dying = [], [True]

  def decoders(plan, *args):  # each point builds its decoders once
    if dying[0] and len(calls) == 2:  # killed while running the third point
      raise KeyboardInterrupt
    calls.append(plan.args.output_dir)
    return make_decoders(plan, *args)

  counting = Providers(decoders=decoders)
  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(points, results, base, bindings, providers=counting)
  done_first = [d for d in calls]
  assert len(done_first) == 2
  snapshots = {
      d: open(os.path.join(d, "metrics.json")).read() for d in done_first
  }

  calls.clear()
  dying[0] = False
  # Compiled programs are dropped after each point (kept, a long sweep runs
  # out of memory mappings).
  cleared = []
  monkeypatch.setattr(sweep.jax, "clear_caches",
                      lambda: cleared.append(len(calls)))
  dirs = sweep.run_sweep(points, results, base, bindings, providers=counting)
  assert len(calls) == 2 and not set(calls) & set(done_first)
  assert cleared == [1, 2]
  assert sorted(dirs) == sorted(done_first + calls)
  for d in dirs:
    metrics = json.load(open(os.path.join(d, "metrics.json")))
    # Token identity is the exactness test at T = 0 only; null when sampled.
    if metrics["temperature"] > 0:
      assert metrics["greedy_outputs_identical"] is None
    else:
      assert metrics["greedy_outputs_identical"] is True
  for d, text in snapshots.items():  # finished points were not touched
    assert open(os.path.join(d, "metrics.json")).read() == text
  # A third run has nothing left to do.
  calls.clear()
  sweep.run_sweep(points, results, base, bindings, providers=counting)
  assert calls == []
  assert not [f for f in os.listdir(results) if f.startswith(".")]


def test_soak_script_points_are_the_gamma_seed_grid():
  """tools.benchmarks.soak built its points from
  itertools.product over an endless itertools.count(): product reads its
  inputs whole, and the script's memory grew without end before the first
  point (issue 37's soak run)."""
  assert soak.points(7) == [{
      "GAMMA": g,
      "SEED": s
  } for s, g in [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 1), (1, 2)]]
  assert len(soak.points(1000)) == 1000


def test_a_sweep_file_is_found_from_any_directory(tmp_path, monkeypatch):
  """The README's Regenerate command names configs/...yaml: from another
  directory it is the repository's (issue 44: it was looked up in the
  current directory only)."""
  monkeypatch.chdir(tmp_path)
  points = sweep.parse_sweep_args(["configs/table2_multi30k_distilled.yaml"])
  assert points and all(isinstance(p, dict) for p in points)
  with pytest.raises(sweep.SweepError, match="does not exist"):
    sweep.parse_sweep_args(["configs/no_such_sweep.yaml"])
