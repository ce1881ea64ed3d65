"""The GPU kernels' grids and their cost model
(`tools.benchmarks.kernel_grid`): a compiled program's Triton calls read
from its text, the model's step, and the fit that finds its constants.
"""
import json

import pytest

from tools.benchmarks import gpu_aot
from tools.benchmarks import kernel_grid

# One Triton call as XLA:GPU prints it (cut from an H200 compile of the
# T5-small-shaped step, its IR elided).
_LINE = (
    '  %pallas_call.317 = (bf16[1,1,6,64]{3,2,1,0}, bf16[1,6,64,64]{3,2,1,0})'
    ' custom-call(%a, %b, %c, %d), custom_call_target="__gpu$xla.gpu.triton",'
    ' operand_layout_constraints={s32[1]{0}, bf16[1,1,512]{2,1,0}, '
    'bf16[512]{0}, bf16[6,3,512,64]{3,2,1,0}, f32[6,32]{1,0}}, '
    'output_to_operand_aliasing={{1}: (6, {})}, api_version=API_VERSION_TYPED'
    '_FFI, backend_config={debug = false, grid_x = 1 : i32, grid_y = 6 : i32,'
    ' grid_z = 2 : i32, ir = "...", name = "decode_self_attention", '
    'num_ctas = 1 : i32, num_stages = 2 : i32, num_warps = 4 : i32}')


def _call(name, programs, nbytes):
  return {"name": name, "programs": programs, "bytes": nbytes}


def test_a_triton_call_is_read_from_the_program_text():
  hlo = "\n".join(["  %fusion.1 = f32[8]{0} fusion(%x), kind=kLoop", _LINE])
  assert kernel_grid.triton_calls(hlo) == [{
      "name": "decode_self_attention",
      "programs": 12,
      "bytes": 4 + 1024 + 1024 + 6 * 3 * 512 * 64 * 2 + 6 * 32 * 4,
      "num_warps": 4,
      "num_stages": 2
  }]
  assert kernel_grid.triton_calls("  %f = f32[8]{0} fusion(%x)") == []


def test_a_gathered_table_counts_one_row_but_in_the_logits_kernel():
  table = "bf16[32128,512]"
  line = _LINE.replace("bf16[512]{0}", table + "{1,0}")
  (layer,) = kernel_grid.triton_calls(line, gathered=(table,))
  (full,) = kernel_grid.triton_calls(line)
  assert full["bytes"] - layer["bytes"] == 32128 * 512 * 2 - 512 * 2
  logits = line.replace('"decode_self_attention"', '"decode_rms_dense"')
  assert kernel_grid.triton_calls(
      logits, gathered=(table,))[0]["bytes"] == (full["bytes"])


def test_calls_by_kernel_give_each_programs_share():
  calls = [
      _call("attn", 6, 600),
      _call("dense", 16, 320),
      _call("attn", 6, 1200)
  ]
  assert kernel_grid.by_kernel(calls) == {
      "attn@6": {
          "calls": 2,
          "programs": 6,
          "bytes_per_program": 150.0
      },
      "dense@16": {
          "calls": 1,
          "programs": 16,
          "bytes_per_program": 20.0
      }
  }


def test_the_model_prices_the_widest_share_and_each_call():
  # 6 programs share 6 MB: 1 MB each at 10 GB/s is 0.1 ms; two calls at
  # 5 µs add 0.01 ms.
  calls = [_call("a", 6, 6e6), _call("b", 100, 1e5)]
  assert kernel_grid.predict_ms(
      calls, 10.0, 5.0) == pytest.approx((1e6 + 1e3) / 10e9 * 1e3 + 0.01)
  # More programs for the same bytes: less time.
  wider = [_call("a", 60, 6e6), _call("b", 100, 1e5)]
  assert kernel_grid.predict_ms(wider, 10.0,
                                5.0) < kernel_grid.predict_ms(calls, 10.0, 5.0)
  # But never faster than the GPU reads: 3.2 GB over 1000 programs is
  # 3.2 MB each (0.32 ms at 10 GB/s), 1 ms at 3200 GB/s.
  assert kernel_grid.predict_ms([_call("c", 1000, 3.2e9)], 10.0, 0.0,
                                3200.0) == pytest.approx(1.0)


def test_the_fit_finds_the_constants_that_made_the_steps():
  steps = []
  for programs, n, share in ((6, 10, 2e5), (12, 40, 5e4), (64, 150, 1e6)):
    calls = [_call("k", programs, share * programs)] * n
    steps.append((calls, kernel_grid.predict_ms(calls, 8.0, 3.0)))
  fitted = kernel_grid.fit(steps)
  assert fitted["program_gbps"] == pytest.approx(8.0)
  assert fitted["kernel_us"] == pytest.approx(3.0)
  assert fitted["predicted_ms"] == pytest.approx(fitted["measured_ms"])
  with pytest.raises(ValueError, match="1 steps; allowed: 2 or more"):
    kernel_grid.fit(steps[:1])
  # Steps that take less time the more bytes a program reads: no rate.
  with pytest.raises(ValueError, match="allowed: both > 0"):
    kernel_grid.fit([([_call("k", 1, 1e6)], 1.0), ([_call("k", 1, 2e6)], 0.5)])


def test_grids_fit_reads_the_checks_fused_steps_under_its_tiles(tmp_path):
  calls = {
      size: [_call("k", 6, b)] * n
      for size, b, n in (("small", 2e5, 50), ("xxl", 1.5e6, 150))
  }
  measured = {s: kernel_grid.predict_ms(c, 8.6, 2.9) for s, c in calls.items()}
  check = tmp_path / "device_check.json"
  check.write_text(
      json.dumps({
          "settings": {
              "tiles": "mma"
          },
          "paths": {
              "steps": {
                  "fused": {
                      s: {
                          "step_ms": ms
                      } for s, ms in measured.items()
                  }
              }
          }
      }))
  result = {
      "grids": {
          s: {
              "mma": {
                  "calls": c
              },
              "mma_split": {
                  "error": "x"
              }
          } for s, c in calls.items()
      }
  }
  fitted = gpu_aot.grids_fit(result, str(check))
  assert fitted["tiles"] == "mma" and fitted["sizes"] == ["small", "xxl"]
  assert fitted["program_gbps"] == pytest.approx(8.6)
  assert fitted["kernel_us"] == pytest.approx(2.9)
  result["grids_fit"] = fitted
  for size, c in calls.items():
    result["grids"][size]["mma"].update(by_kernel=kernel_grid.by_kernel(c),
                                        predicted_ms=measured[size])
  lines = gpu_aot.summary(result)
  assert (f"grids small mma: 50 Triton calls, 6 programs in the narrowest, "
          f"model {measured['small']:.3f} ms") in lines
  assert "grids small mma_split: x" in lines
  assert ("grids fit (mma, small, xxl): 8.6 GB/s a program, 2.90 µs a call; "
          "model/measured 1.00 1.00") in lines


def test_device_check_needs_the_grids_group(tmp_path):
  check = tmp_path / "c.json"
  check.write_text("{}")
  with pytest.raises(Exception, match="--device_check: invalid value"):
    gpu_aot.parse_args([f"--device_check={check}"])
  assert gpu_aot.parse_args(["--groups=grids",
                             f"--device_check={check}"]).groups == ["grids"]
  assert "grids" not in gpu_aot.parse_args([]).groups
