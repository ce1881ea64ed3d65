"""The pretrained phase's groups, chosen on the device check's command
line (`--pretrained_groups`, `common.PRETRAINED_GROUPS`; the parent hands
them on: tests/tools/test_device_check.py). The groups' own measurements: tests/e2e/test_device_check_e2e.py (every group, the
CPU's path) and tests/e2e/test_gpu_decode_e2e.py (on 'fused').
"""

import numpy as np
import pytest

from tools.device_check import cli
from tools.device_check import common
from tools.device_check import gamma_sweep
from tools.device_check import pretrained_pair


def test_pretrained_groups_are_chosen_on_the_command_line(capsys):
  args = cli.parse_args(["--pretrained_groups=by_tiles,profile"])
  assert args.pretrained_groups == "profile,by_tiles"  # The phase's order.
  assert cli.settings_record(args)["pretrained_groups"] == "profile,by_tiles"
  chosen = common.settings_for("small", pretrained_groups=("by_path",))
  assert chosen.pretrained_groups == ("by_path",)
  for mode in ("full", "small"):
    assert common.settings_for(mode).pretrained_groups == (
        common.PRETRAINED_GROUPS)
  with pytest.raises(SystemExit):
    cli.parse_args(["--pretrained_groups=by_path,by_batch"])
  assert (
      "--pretrained_groups='by_path,by_batch': allowed: a "
      "comma-separated subset of profile,by_gamma,") in capsys.readouterr().err


@pytest.mark.parametrize("chosen",
                         [("by_options", "by_path"), common.PRETRAINED_GROUPS])
def test_the_pretrained_phase_measures_only_the_chosen_groups(
    chosen, monkeypatch):
  """Each chosen group writes main_job_<group>, in the phase's order; the
  others write nothing. A group that fails whole is its own error (the
  γ sweep here), not the phase's."""
  ran = []

  def stand_in(name, fails=False):

    def measure(*args):
      del args
      ran.append(name)
      if fails:
        raise RuntimeError(f"{name} broke")
      return {"measured": name}

    return measure

  for name in ("main_job_profile", "by_mixed_paths", "by_options", "by_tiles",
               "main_job_by_path"):
    monkeypatch.setattr(pretrained_pair, name, stand_in(name))
  monkeypatch.setattr(gamma_sweep, "by_gamma", stand_in("by_gamma", True))
  s = common.settings_for("small", pretrained_groups=chosen)
  record = common.Recorder(None)
  record.set("main_job", {"speedup": 1.5})
  pretrained_pair._groups(  # pylint: disable=protected-access
      s, record, None, None, np.zeros((3, 8), np.int32), common.Deadline(60.0))
  written = [k for k in record.data if k.startswith("main_job_")]
  assert written == [f"main_job_{g}" for g in chosen]
  assert len(ran) == len(chosen)
  if "by_gamma" in chosen:
    assert record.data["main_job_by_gamma"] == {
        "ok": False,
        "error": "RuntimeError: by_gamma broke"
    }
    assert record.data["main_job_by_path"] == {"measured": "main_job_by_path"}
