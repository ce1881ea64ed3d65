"""Issue 44: a progress line for every phase over ~2 s (`progress`), and
PRICE_CALL_COST=False (walltime without pricing c, said in metrics.json
and the summary)."""
import json
import logging
import time

from absl import logging as absl_logging
import pytest

from conftest import REPO
from specdec_jax import checkpoints
from specdec_jax.config import gin_utils
from specdec_jax.terminal import progress
from specdec_jax import run as run_lib
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_check
from specdec_jax.training import checkpointing
from specdec_jax.experiment import summary
from specdec_jax.reporting import loading as report_loading


def _messages(caplog):
  return [r.getMessage() for r in caplog.records]


def test_phase_says_when_it_starts_how_it_goes_and_how_long_it_took(caplog):
  caplog.set_level("INFO")
  with progress.phase("Pricing c", every_s=0.05):
    time.sleep(0.3)
  lines = _messages(caplog)
  assert lines[0] == "Pricing c"
  assert any(l.startswith("Pricing c: still running, ") for l in lines[1:-1])
  assert lines[-1].startswith("Pricing c: done in ")
  assert lines[-1].endswith(" s")


def test_phase_says_nothing_more_when_its_body_fails(caplog):
  caplog.set_level("INFO")
  with pytest.raises(ValueError):
    with progress.phase("Loading", every_s=10):
      raise ValueError("bad")
  assert _messages(caplog) == ["Loading"]


def test_numbered_counts_k_of_n_with_each_ones_seconds(caplog):
  caplog.set_level("INFO")
  ran = []
  seconds = progress.numbered([("a", lambda: ran.append("a")),
                               ("b", lambda: ran.append("b"))])
  assert ran == ["a", "b"] and len(seconds) == 2
  lines = _messages(caplog)
  assert lines[0].startswith("compiled 1/2 (a) in ")
  assert lines[1].startswith("compiled 2/2 (b) in ")


def test_checkpoint_read_is_one_line_with_size_and_seconds(caplog):
  caplog.set_level("INFO")
  folder = REPO / "pretrained" / "multi30k" / "draft_1m"
  checkpoints.load_model(str(folder), prepared=False)
  read = [l for l in _messages(caplog) if l.startswith("Read checkpoint ")]
  assert len(read) == 1
  assert "checkpoint_1800" in read[0] and " arrays, " in read[0]
  assert " MB, in " in read[0]


def _run_tiny(tmp_path, *bindings):
  gin_utils.parse_gin(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{tmp_path}'", "NUM_EXAMPLES = 3",
      "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 8}", *bindings
  ], finalize=False)
  return run_lib.run()


@pytest.mark.slow
@pytest.mark.usefixtures("clean_gin")
def test_run_says_what_it_compiles_pilots_and_prices(tmp_path, caplog):
  caplog.set_level("INFO")
  metrics = _run_tiny(tmp_path, "GAMMA = 'auto'", "BATCH_SIZE = 3")
  lines = _messages(caplog)
  # Every decoder program, counted, with its seconds.
  compiled = [l for l in lines if l.startswith("compiled ")]
  assert compiled and all(" in " in l for l in compiled)
  n = len(compiled)
  assert compiled[0].startswith(f"compiled 1/{n} (the baseline decoder, ")
  assert compiled[-1].startswith(f"compiled {n}/{n} (the speculative decoder")
  # The pilot with its sample size, then its pricing, each with seconds.
  assert ("GAMMA='auto': pilot decode of the first 3 examples (1 batches, "
          "γ=4; compiling first): done in ") in "\n".join(lines)
  assert any(
      l.startswith("GAMMA='auto': pricing c") and ": done in " in l
      for l in lines)
  # The run's own pricing of c.
  assert any(l.startswith("Pricing c") and ": done in " in l for l in lines)
  assert metrics["cost_coefficient_c"] is not None
  assert "call_cost_priced" not in metrics


@pytest.mark.slow
@pytest.mark.usefixtures("clean_gin")
def test_price_call_cost_false_skips_pricing_and_says_so(tmp_path, caplog):
  caplog.set_level("INFO")
  metrics = _run_tiny(tmp_path, "PRICE_CALL_COST = False")
  assert not any(l.startswith("Pricing c") for l in _messages(caplog))
  written = json.loads((tmp_path / "metrics.json").read_text())
  assert written["call_cost_priced"] is False
  for key in ("cost_coefficient_c", "target_step_s", "draft_step_s",
              "theoretical_speedup", "theoretical_speedup_measured_call_cost",
              "verification_call_s", "per_iteration_gamma"):
    assert written[key] is None, key
  assert written["speedup"] > 0 and written["greedy_outputs_identical"]
  line = summary.summary_lines(metrics, arguments.run_arguments())[1]
  assert "no theory: PRICE_CALL_COST=False skipped pricing c" in line
  # The same decode: a re-run with pricing replaces it without OVERWRITE.
  assert "price_call_cost" not in written["settings"]["run"]
  # `report` leaves it out (its tables need c), saying why.
  with pytest.raises(report_loading.ReportError,
                     match=r"only PRICE_CALL_COST=False runs \(1\)"):
    report_loading.load_results(str(tmp_path))


@pytest.mark.usefixtures("clean_gin")
def test_price_call_cost_must_be_a_bool():
  gin_utils.parse_gin(["local_tiny.gin"], ["PRICE_CALL_COST = 1"],
                      finalize=False)
  with pytest.raises(gin_utils.ConfigError,
                     match=r"PRICE_CALL_COST=1 .*allowed: True or False"):
    arguments.run_arguments()


def test_compile_concurrently_says_k_of_n_as_each_program_ends(caplog):
  """COMPILE_TOPOLOGY's programs compile side by side; each one's end is a
  line with the count so far and its own seconds."""
  caplog.set_level(logging.INFO)
  out = compile_check.compile_concurrently(
      {
          "baseline": lambda: 1,
          "speculative": lambda: 2
      }, workers=2)
  assert out == {"baseline": 1, "speculative": 2}
  lines = [
      r.getMessage() for r in caplog.records if "compiled" in r.getMessage()
  ]
  assert len(lines) == 2
  assert {line.split(" (")[0] for line in lines
         } == {"compiled 1/2", "compiled 2/2"}
  assert any("(speculative)" in line for line in lines)


def test_quiet_absl_puts_the_absl_level_back_as_it_was():
  """Orbax's INFO lines are hidden while a checkpoint is written, and the
  absl logger's own level (NOTSET: follow the root) comes back as it was,
  so that later progress lines are not silenced."""
  logger = absl_logging.get_absl_logger()
  before = logger.level
  logger.setLevel(logging.NOTSET)
  root = logging.getLogger()
  root_level = root.level
  root.setLevel(logging.INFO)
  try:
    with checkpointing.quiet_absl():
      assert not logger.isEnabledFor(logging.INFO)
    assert logger.level == logging.NOTSET and logger.isEnabledFor(logging.INFO)
  finally:
    logger.setLevel(before)
    root.setLevel(root_level)
