"""Issue 44: a progress line for every phase over ~2 s (`console`), and
PRICE_CALL_COST=False (walltime without pricing c, said in metrics.json
and the summary; a run's lines end to end: tests/e2e/test_run_e2e.py)."""
import logging
import time

from absl import logging as absl_logging
from conftest import REPO
import pytest

from specdec_jax.config import flag_utils
from specdec_jax import checkpoints
from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import compile_check
from specdec_jax.terminal import console
from specdec_jax.training import checkpointing


def _messages(caplog):
  return [r.getMessage() for r in caplog.records]


def test_phase_says_when_it_starts_how_it_goes_and_how_long_it_took(caplog):
  caplog.set_level("INFO")
  with console.phase("Pricing c", every_s=0.05):
    time.sleep(0.3)
  lines = _messages(caplog)
  assert lines[0] == "Pricing c"
  assert any(l.startswith("Pricing c: still running, ") for l in lines[1:-1])
  assert lines[-1].startswith("Pricing c: done in ")
  assert lines[-1].endswith(" s")


def test_phase_says_nothing_more_when_its_body_fails(caplog):
  caplog.set_level("INFO")
  with pytest.raises(ValueError):
    with console.phase("Loading", every_s=10):
      raise ValueError("bad")
  assert _messages(caplog) == ["Loading"]


def test_numbered_counts_k_of_n_with_each_ones_seconds(caplog):
  caplog.set_level("INFO")
  ran = []
  seconds = console.numbered([("a", lambda: ran.append("a")),
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


@pytest.mark.usefixtures("clean_gin")
def test_price_call_cost_must_be_a_bool():
  gin_utils.parse_gin(["local_tiny.gin"], ["PRICE_CALL_COST = 1"],
                      finalize=False)
  with pytest.raises(flag_utils.ConfigError,
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
