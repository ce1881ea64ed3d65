"""The device check's kernel profile (`tools.device_check.kernel_profile`):
which trace lines count, the busy time's union, the per-step summary, and
a real trace on the CPU (no device plane: said, not invented).
"""
import types

import jax
import jax.numpy as jnp
import pytest

from tools.device_check import cli
from tools.device_check import common
from tools.device_check import kernel_profile
from tools.device_check import summary
from tools.device_check.kernel_profile import Kernel


def _plane(name, lines):
  return types.SimpleNamespace(
      name=name, lines=[
          types.SimpleNamespace(
              name=line, events=[
                  types.SimpleNamespace(name=n, start_ns=s, duration_ns=d)
                  for n, s, d in events
              ])
          for line, events in lines.items()
      ])


def test_only_the_device_planes_stream_lines_count():
  profile = types.SimpleNamespace(planes=[
      _plane("/host:CPU", {"python": [("host", 0, 99)]}),
      _plane("/device:CUSTOM:Megascale Trace", {"Stream #1": [("x", 0, 9)]}),
      _plane(
          "/device:GPU:0", {
              "Stream #13(Compute)": [("b", 30, 5), ("a", 10, 5)],
              "XLA Ops": [("a", 10, 5)],
              "Stream #14(MemcpyD2H)": [("MemcpyD2H", 20, 2)],
          }),
  ])
  assert kernel_profile.device_kernels(profile) == [
      Kernel("a", 10.0, 5.0),
      Kernel("MemcpyD2H", 20.0, 2.0),
      Kernel("b", 30.0, 5.0)
  ]
  # Streams named otherwise: every line but the derived ones.
  other = types.SimpleNamespace(planes=[
      _plane("/device:GPU:1", {
          "13": [("c", 5, 1)],
          "XLA Ops": [("c", 5, 1)],
          "Steps": [("0", 0, 9)]
      })
  ])
  assert kernel_profile.device_kernels(other) == [Kernel("c", 5.0, 1.0)]


def test_busy_time_is_the_union_of_overlapping_kernels():
  kernels = [
      Kernel("a", 0, 10),
      Kernel("b", 5, 10),
      Kernel("c", 6, 2),
      Kernel("d", 30, 5)
  ]
  assert kernel_profile.busy_ns(kernels) == 15 + 5
  assert kernel_profile.busy_ns([]) == 0


def test_summary_per_step_and_the_costliest_kernels_first(monkeypatch):
  monkeypatch.setattr(kernel_profile, "TOP", 2)
  # Two steps: each a 6 µs 'slow' kernel, two 1 µs 'fast' ones, and one
  # 0.5 µs 'tiny'; the steps 20 µs apart on the wall clock.
  kernels = []
  for step in range(2):
    t0 = step * 20_000
    kernels += [
        Kernel("slow", t0, 6000),
        Kernel("fast", t0 + 7000, 1000),
        Kernel("fast", t0 + 9000, 1000),
        Kernel("tiny", t0 + 11000, 500)
    ]
  r = kernel_profile.summarize(kernels, steps=2, wall_s=40e-6)
  assert r["kernels"] == 4 and r["kernel_us"] == pytest.approx(8.5)
  assert r["busy_us"] == pytest.approx(8.5)
  assert r["wall_us"] == pytest.approx(20.0)
  assert r["idle_share"] == pytest.approx(1 - 8.5 / 20)
  assert r["mean_kernel_us"] == pytest.approx(8.5 / 4)
  assert [t["name"] for t in r["top"]] == ["slow", "fast"]
  assert r["top"][1] == {
      "name": "fast",
      "per_step": 2.0,
      "us_per_step": 2.0,
      "mean_us": 1.0
  }
  assert r["rest_us"] == pytest.approx(0.5)
  # The gaps: 1 µs between kernels, and 8.5 µs from the first step's
  # last kernel to the second's first: the one over 5 µs (none after the
  # last kernel: the trace's end is not the device's).
  assert r["long_gaps"] == 0.5 and r["long_gap_us"] == pytest.approx(4.25)
  assert kernel_profile.summarize([], 2, 1.0)["kernels"] == 0


def test_idle_gaps_are_the_holes_in_the_busy_time():
  kernels = [
      Kernel("a", 0, 10),
      Kernel("b", 5, 10),
      Kernel("c", 40, 5),
      Kernel("d", 41, 1),
      Kernel("e", 45, 5)
  ]
  assert kernel_profile.idle_gaps_ns(kernels) == [25]
  assert kernel_profile.idle_gaps_ns(list(reversed(kernels))) == [25]
  assert kernel_profile.idle_gaps_ns([]) == []


def test_a_cpu_trace_has_no_device_plane_and_says_so():
  f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
  x = jnp.ones((64, 64))
  r = kernel_profile.profile(lambda _: f(x), calls=2, steps_per_call=3)
  assert r == {"kernels": 0, "note": "no device activity in the trace"}
  with pytest.raises(ValueError, match="calls 0, steps_per_call 3"):
    kernel_profile.profile(lambda _: f(x), calls=0, steps_per_call=3)


def test_the_summary_line_names_the_costliest_kernels():
  line = summary._profile_line(
      "small:fused", {
          "kernels": 55.0,
          "busy_us": 300.0,
          "wall_us": 600.0,
          "idle_share": 0.5,
          "mean_kernel_us": 5.45,
          "top": [{
              "name": "decode_rms_dense",
              "per_step": 16.0,
              "mean_us": 10.0
          }]
      })
  assert line == ("  profile small:fused: 55 kernels a step, busy 300.0 of "
                  "600.0 µs (50% idle), mean kernel 5.5 µs; top µs: "
                  "decode_rms_dense 16x10.0")
  caption = {
      "kernels": 900.0,
      "busy_us": 3000.0,
      "wall_us": 5000.0,
      "idle_share": 0.4,
      "mean_kernel_us": 3.3,
      "long_gaps": 12.5,
      "long_gap_us": 1500.0,
      "long_gap_over_us": 5.0,
      "iterations_per_caption": 10.2,
      "top": []
  }
  assert summary._profile_line("main job baseline", caption, "caption") == (
      "  profile main job baseline: 900 kernels a caption, busy 3000.0 of "
      "5000.0 µs (40% idle), 12.5 waits over 5 µs (1500.0 µs) to 10.2 "
      "iterations, mean kernel 3.3 µs; top µs: ")
  assert summary._profile_line("small:xla", {
      "kernels": 0,
      "note": "none"
  }) == ("  profile small:xla: none")


def test_paths_groups_are_chosen_on_the_command_line(capsys):
  args = cli.parse_args(["--paths_groups=tiles,profile"])
  assert args.paths_groups == "profile,tiles"  # In the phase's order.
  assert cli.settings_record(args)["paths_groups"] == "profile,tiles"
  assert common.settings_for("full", None,
                             ("profile",)).paths_groups == ("profile",)
  assert "option_sets" not in common.FULL.paths_groups
  assert common.SMALL.paths_groups == common.PATHS_GROUPS
  with pytest.raises(SystemExit):
    cli.parse_args(["--paths_groups=steps,gaps"])
  assert ("--paths_groups='steps,gaps': allowed: a comma-separated subset "
          "of steps,profile,barriers,tiles,option_sets,kernels.") in (
              capsys.readouterr().err)


def test_tile_presets_are_chosen_on_the_command_line(capsys):
  args = cli.parse_args(["--tile_presets=tall_mma_split,mma_split"])
  assert args.tile_presets == "mma_split,tall_mma_split"  # Presets' order.
  assert cli.settings_record(args)["tile_presets"] == "mma_split,tall_mma_split"
  s = common.settings_for("full", None, None, ("mma", "deep_mma_split"))
  assert s.tile_presets == s.tile_call_presets == ("mma", "deep_mma_split")
  assert common.settings_for("full").tile_presets == common.FULL.tile_presets
  with pytest.raises(SystemExit):
    cli.parse_args(["--tile_presets=mma,bogus"])
  assert "--tile_presets='mma,bogus': allowed: a comma-separated subset of " \
      "default," in capsys.readouterr().err
