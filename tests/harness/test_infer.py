"""MODE='infer': the speculative decoder only, T5X's prediction rows (a run
end to end: tests/e2e/test_run_e2e.py)."""
import pytest

from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_infer_is_a_mode_and_beams_may_infer():
  args = arguments.RunArguments(output_dir="/tmp/unused", mode="infer",
                                decode="beam", beam_size=2)
  assert args.mode == "infer"
  with pytest.raises(gin_utils.ConfigError, match="MODE='alph'"):
    arguments.RunArguments(output_dir="/tmp/unused", mode="alph")
