"""The GPU kernels' path ('fused', `kernels.gpu`) end to end on the CPU, in
Pallas' interpret mode: the device check's exactness phase (every decode
mode's greedy identity and chi-square, with its power check) and its
shipped-pair phase (the 38M target and distilled 1M draft, greedy
identical on the main job's first captions), run with `--path=fused` as
the GPU session runs them with its default path. Slow: interpret mode runs
each kernel program by program. The kernels one by one and the decoder
against XLA's path: tests/core/test_gpu_decode.py.
"""
import json
import os
import subprocess
import sys

import pytest

from tools.device_check import cli
from tools.device_check import common

from conftest import REPO

pytestmark = pytest.mark.slow


def _check(tmp_path, phase: str, *flags: str) -> dict:
  """`scripts/device_check.sh --small --path=fused --phases=<phase>
  <flags>`, the phase given the whole budget (the pretrained phase with
  every group took 1,066 s beside the suite's other worker in a clean
  clone, 2026-12-01); its report."""
  out = tmp_path / phase
  done = subprocess.run(
      [
          str(REPO / "scripts" / "device_check.sh"), "--small", "--path=fused",
          f"--phases={phase}", "--total_s=1900", *flags
      ], env={
          **os.environ, "PYTHON": sys.executable,
          "OUT": str(out),
          "DEVICE_CHECK_TIMEOUT_S": "2000"
      }, capture_output=True, text=True, timeout=2100, check=False)
  assert done.returncode == 0, done.stdout[-3000:]
  return json.loads((out / cli.RESULT_FILE).read_text())


def test_every_decode_mode_is_exact_on_the_fused_path(tmp_path):
  report = _check(tmp_path, "exactness")
  assert report["exactness"]["settings"]["decode_path"] == "fused"
  argmax = report["exactness"]["argmax_kernel"]
  assert argmax["ok"] and argmax["by_vocab"]["32128"]["agree"] == 8, argmax
  modes = report["exactness"]["modes"]
  assert set(modes) == {"token", "block", "tree", "beam"}
  for mode, entry in modes.items():
    greedy = entry["greedy"]
    assert "highest_precision" not in greedy, mode  # Identical at once.
    assert entry["ok"] and greedy["all_identical"], mode
    if mode != "beam":
      assert entry["distribution"]["passed"], mode
      assert entry["distribution"]["power_ok"], mode
  # Each mode drew its own samples (one run of this check on the CPU
  # scored block verification's draws equal to Algorithm 1's: not seen
  # again; the digests tell).
  digests = {
      m: modes[m]["distribution"]["samples_sha256"] for m in modes if m != "beam"
  }
  assert len(set(digests.values())) == 3, digests


def test_shipped_pair_is_greedy_identical_on_the_fused_path(tmp_path):
  # The groups that decode on the check's path: the profile (132 of 419 s
  # on a quiet host, 2026-12-01), the γ sweep and the mixed pairs (their
  # own paths, 'packed' and 'fused': the same work as the CPU path's e2e)
  # are tests/e2e/test_device_check_e2e.py's.
  report = _check(tmp_path, "pretrained",
                  "--pretrained_groups=by_options,by_tiles,by_path")
  assert "main_job_by_gamma" not in report["pretrained"]
  assert report["settings"]["pretrained_groups"] == (
      "by_options,by_tiles,by_path")
  report = report["pretrained"]
  assert report["pair"]["decode_path"] == "fused"
  identity = report["identity"]
  assert "highest_precision" not in identity
  assert identity["all_identical"] and identity["default_precision"][
      "identical"] == 3
  # The kernels' tokens are XLA's path's too.
  matches = report["matches_xla"]
  assert matches["identical"] == matches["examples"] == 3, matches
  # Their logits too, to float32's rounding (with the cache's relative-
  # position biases dropped in the kernel they were 0.15 apart).
  assert matches["logits_steps"] > 1, matches
  assert matches["logits_max_abs_diff"] < 1e-3, matches
  by_path = report["main_job_by_path"]
  assert set(by_path) == {"xla", "fused"}
  assert by_path["fused"]["1"]["speedup"] > 0
  assert by_path["fused"]["1"]["alpha"] > 0.5  # The draft agrees often.
  # The loops under an XLA:GPU option set, interleaved with the library's
  # own (on the CPU the same programs): identical, α as on 'fused'.
  options = report["main_job_by_options"]
  assert set(options) == {"current", "command_buffer_all"}, options
  for record in options.values():
    assert record["identity"]["identical"] == 3, record
    assert record["alpha"] == by_path["fused"]["1"]["alpha"]
  assert set(options["command_buffer_all"]["vs_current"]) == {
      "baseline", "speculative"
  }
  # The pair under each of --small's tile pairs, identical on 'fused'.
  tiles = report["main_job_by_tiles"]
  assert set(tiles) == set(common.SMALL.main_job_tiles), tiles
  for record in tiles.values():
    assert record["identity"]["all_identical"], record
