"""The GPU programs compiled here for an H200 (`tools.benchmarks.gpu_aot`).

The flags, the missing plugin's message and the summary; the compile
itself: tests/e2e/test_gpu_aot_e2e.py.
"""
import importlib.util
import json
import os
import types

import pytest

from tools.benchmarks import common
from tools.benchmarks import gpu_aot


@pytest.mark.parametrize("argv, flag, value", [
    (["--groups=layers,kernels"], "--groups", "'kernels'"),
    (["--groups="], "--groups", "''"),
    (["--paths=xla,cpu_kernel"], "--paths", "'cpu_kernel'"),
    (["--presets=mma,huge"], "--presets", "'huge'"),
    (["--gamma=0"], "--gamma", "0"),
    (["--call_sizes=xxl,huge"], "--call_sizes", "'huge'"),
    (["--target_config=/no/such/file.txtpb"
     ], "--target_config", "'/no/such/file.txtpb'"),
])
def test_bad_flags_name_the_flag_the_value_and_what_is_allowed(
    argv, flag, value):
  with pytest.raises(common.BenchmarkFlagError) as e:
    gpu_aot.parse_args(argv)
  assert f"{flag}: invalid value {value}" in str(e.value)
  assert "allowed" in str(e.value)


def test_without_the_cuda_plugin_the_error_says_what_to_install(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(RuntimeError, match=r"run scripts/gpu_aot\.sh"):
    gpu_aot.gpu_device(gpu_aot.H200)


def test_the_tiles_group_compiles_each_call_size(monkeypatch):
  """`--call_sizes`: each size's one- and (γ+1)-token target calls per
  preset, after the small draft's (γ+1)-token call."""
  compiled = []

  def step(config, path, device, k):
    compiled.append((config.emb_dim, k))
    return {"spills": {}}

  monkeypatch.setattr(gpu_aot, "_step", step)
  monkeypatch.setattr(gpu_aot.paths, "abstract_model", lambda *a: None)
  monkeypatch.setattr(gpu_aot.paths, "loop_hlo", lambda *a, **k: "")
  monkeypatch.setattr(gpu_aot.paths, "kernel_counts", lambda hlo: {})
  out = gpu_aot.tiles(
      gpu_aot.parse_args(["--presets=mma", "--call_sizes=base,xxl"]), None)
  assert list(out["mma"]["calls"]) == [
      "small/k_8", "base/k_1", "base/k_8", "xxl/k_1", "xxl/k_8"
  ]
  assert compiled == [(512, 8), (768, 1), (768, 8), (4096, 1), (4096, 8)]


def test_summary_reads_layers_and_loops():
  loop = {"body": 10, "condition": 1, "outside_model_calls": 4, "nested": []}
  result = {
      "layers": {
          "fused": {
              "per_decoder_layer": 6,
              "fixed": 7
          }
      },
      "loops": {
          "shipped": {
              "gamma": 3,
              "max_decode_length": 48,
              "fused": {
                  "baseline": {
                      **loop, "body": 5,
                      "outside_loop": 56
                  },
                  "speculative": {
                      **loop, "outside_loop": 100,
                      "nested": [{
                          "body": 20,
                          "condition": 1
                      }],
                      "conditionals": [[7, 5]]
                  },
              },
              "xla": {
                  "baseline": {
                      "error": "XlaRuntimeError: refused"
                  },
                  "speculative": loop
              },
          }
      },
  }
  assert gpu_aot.summary(result) == [
      "fused   6 kernels/decoder layer + 7 fixed per step (T5-small-shaped)",
      "shipped fused: baseline 6 kernels/iteration; speculative 11 (4 "
      "outside the model calls) + 21 per draft step; a branch (7 or 5 "
      "kernels); once a decode 56 / 100",
      "shipped xla: XlaRuntimeError: refused",
  ]


def test_compiles_report_the_kernels_whose_registers_spilled(capfd):
  """ptxas' warnings come as XLA INFO lines on fd 2: kept off the terminal,
  read into `spills`; other lines pass."""

  def compile_():
    os.write(
        2, b"I1129 02:40:56.293020   29481 subprocess_compilation.cc:349] "
        b"ptxas warning : Registers are spilled to local memory in function "
        b"'decode_self_attention', 656 bytes spill stores, 532 bytes spill "
        b"loads\nI1129 02:40:57.1 other.cc:1] noise\nE1129 a real error\n")
    return {"kernels": 3}

  out = gpu_aot._timed(compile_)
  assert out["spills"] == {"decode_self_attention": [656, 532]}
  assert out["kernels"] == 3 and out["compile_s"] >= 0
  err = capfd.readouterr().err
  assert "E1129 a real error" in err and "noise" not in err


def test_a_refused_program_is_a_result_not_a_crash():

  def refused():
    raise ValueError("Triton refused\nmore lines")

  assert gpu_aot._timed(refused) == {"error": "ValueError: Triton refused"}


def test_summary_names_each_presets_spills_and_refused_calls():
  """A preset's line: its calls' spills, then each call Triton or XLA
  refused (an XXL call over the GPU's shared memory was left out)."""
  result = {
      "tiles": {
          "fold": {
              "spills": {
                  "decode_layers": [8, 8]
              },
              "calls": {
                  "small/k_8": {
                      "spills": {}
                  },
                  "xxl/k_1": {
                      "error": "JaxRuntimeError: RESOURCE_EXHAUSTED"
                  },
              }
          },
          "split": {
              "spills": {},
              "calls": {
                  "xxl/k_8": {
                      "spills": {}
                  }
              }
          },
      }
  }
  assert gpu_aot.summary(result) == [
      "tiles fold: spills small/k_1 decode_layers 8 B; xxl/k_1 "
      "JaxRuntimeError: RESOURCE_EXHAUSTED",
      "tiles split: no spills",
  ]


def test_summary_reads_the_barriers_loads():
  """A line per preset and call: the barriers with loads issued before
  them, of all the runs' barriers, or the compile's error."""
  result = {
      "barriers": {
          "tall_mma_persistent_prefetch": {
              "k_1": {
                  "loads": {
                      "a.ptx:decode_layers": [0, 4, 2],
                      "b.ptx:decode_layers": [0, 4]
                  }
              },
              "k_8": {
                  "error": "XlaRuntimeError: refused"
              },
          }
      }
  }
  assert gpu_aot.summary(result) == [
      "barriers tall_mma_persistent_prefetch k_1: 3 of 5 with loads issued "
      "before them (10 loads)",
      "barriers tall_mma_persistent_prefetch k_8: XlaRuntimeError: refused",
  ]


def test_each_group_is_written_before_the_next_and_gin_read_first(
    tmp_path, monkeypatch):
  """A group's minutes of compiles survive a later group's crash; the
  loops group's gin files are read before any group compiles."""
  output = tmp_path / "aot.json"
  monkeypatch.setattr(gpu_aot, "gpu_device",
                      lambda config: types.SimpleNamespace(device_kind="H200"))
  ran = []

  def layers(f, device):
    ran.append("layers")
    return {"xla": {"per_decoder_layer": 26, "fixed": 8}}

  def crashes(f, device):
    raise RuntimeError("a later group's crash")

  monkeypatch.setattr(gpu_aot, "_RUN", {"layers": layers, "sizes": crashes})
  with pytest.raises(RuntimeError, match="later group"):
    gpu_aot._body(["--groups=layers,sizes", f"--output={output}"])
  assert json.loads(output.read_text())["layers"]["xla"]["fixed"] == 8

  def no_gin(*args, **kwargs):
    raise ImportError("reading a gin file needs gin-config")

  monkeypatch.setattr(gpu_aot.gin_reader, "read_t5_config", no_gin)
  with pytest.raises(ImportError, match="gin-config"):
    gpu_aot._body(["--groups=layers,loops", "--small"])
  assert ran == ["layers"]  # Nothing compiled the second time.
