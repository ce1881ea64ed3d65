"""The device check (`tools.device_check`, docs/usage/gpu.md).

* Its arithmetic: the paper's Table 2 rows read from the experiment files,
  Theorem 3.8's table, the verdicts (the exactness tests' arithmetic:
  tests/harness/test_exactness.py).
* What it runs without gin is what the gin files say: the T5 v1.1 shapes,
  the shipped pair's configs (model_config.json) and the main job's
  settings.
* A CPU-only setting on another backend is a one-line error.

End to end on the CPU (`scripts/device_check.sh --small`):
tests/e2e/test_device_check_e2e.py.
"""
import ast
import collections
import json
import os
import re
import subprocess
import sys

from conftest import REPO
from conftest import tiny_config
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.config import gin_reader
from specdec_jax.core.decoding import loops
from specdec_jax.core.decoding import programs
from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params
from specdec_jax.core.models import param_shapes
from specdec_jax.metrics import analysis
from specdec_jax.metrics import timing
from tools.device_check import cli
from tools.device_check import common
from tools.benchmarks import iteration_hlo
from tools.benchmarks import loop_overhead
from tools.device_check import env
from tools.device_check import kernel_profile
from tools.device_check import loop
from tools.device_check import paths
from tools.device_check import physics
from tools.device_check import pair_runs
from tools.device_check import pretrained_pair
from tools.device_check import stats
from tools.device_check import summary
from tools.device_check import travel


# ---------------------------------------------------------------------------
# Arithmetic.
# ---------------------------------------------------------------------------
def test_paper_rows_are_table_2():
  rows = stats.paper_rows()
  assert len(rows) == 12
  assert {(r["task"], r["draft"], r["temperature"]) for r in rows
         } == {(t, d, temp)
               for t in ("EnDe", "CNNDM")
               for d in ("small", "base", "large")
               for temp in (0.0, 1.0)}
  ende_small = [
      r for r in rows
      if (r["task"], r["draft"], r["temperature"]) == ("EnDe", "small", 0.0)
  ]
  assert ende_small == [{
      "task": "EnDe",
      "draft": "small",
      "temperature": 0.0,
      "gamma": 7,
      "alpha": 0.75,
      "speedup": 3.4,
      "source": "ende_small.gin"
  }]


def test_theorem_rows_use_each_drafts_c_and_the_call_cost():
  rows = [
      dict(task="EnDe", draft="small", temperature=0.0, gamma=3, alpha=0.7,
           speedup=2.0),
      dict(task="EnDe", draft="large", temperature=0.0, gamma=7, alpha=0.8,
           speedup=1.5),
  ]
  out = stats.theorem_rows(rows, {"small": 0.1}, {4: 1.2})
  theory = analysis.expected_speedup(0.7, 3, 0.1)
  assert out[0]["theorem_3_8"] == pytest.approx(theory)
  assert out[0]["paper_over_theorem"] == pytest.approx(2.0 / theory)
  assert out[0]["theorem_3_8_with_call_cost"] == pytest.approx(
      analysis.expected_speedup(0.7, 3, 0.1, call_cost=1.2))
  assert out[1]["c"] is None and out[1]["theorem_3_8"] is None
  assert stats.theorem_rows(
      rows, {"small": 0.1})[0]["theorem_3_8_with_call_cost"] is None


def test_table2_pairs_mix_the_paths_and_pick_each_rows_best():
  """The draft's path and the target's chosen apart (`run`'s
  TARGET_DECODE_PATH / DRAFT_DECODE_PATH): a draft fast on one path and a
  target whose verification call is cheap on another make the best pair."""
  rows = [
      dict(task="EnDe", draft="small", temperature=0.0, gamma=7, alpha=0.75,
           speedup=3.4),
      dict(task="CNNDM", draft="small", temperature=0.0, gamma=5, alpha=0.65,
           speedup=3.1),
  ]
  by_path = {
      "xla": {
          "ms": {
              "xxl": 4.0,
              "small": 0.5
          },
          "call_cost": {
              8: 1.0
          }
      },
      "fused": {
          "ms": {
              "xxl": 3.6,
              "small": 0.1
          },
          "call_cost": {
              8: 2.0
          }
      },
  }
  out = paths.table2_pairs(rows, by_path, "xxl")
  assert set(
      out["pairs"]) == {"xla+xla", "xla+fused", "fused+xla", "fused+fused"}
  mixed = out["pairs"]["xla+fused"][0]
  assert mixed["c"] == pytest.approx(0.1 / 4.0)
  assert mixed["theorem_3_8_with_call_cost"] == pytest.approx(
      analysis.expected_speedup(0.75, 7, 0.025, call_cost=1.0))
  # Against the target alone on its fastest path ('fused', 3.6 ms).
  assert mixed["against_fastest_target"] == pytest.approx(
      mixed["theorem_3_8_with_call_cost"] * 3.6 / 4.0)
  ende, cnndm = out["best"]
  # EnDe (γ 7, the call measured): the fused target's call costs 2 steps.
  assert ende["pair"] == "xla+fused"
  assert ende["of_paper"] == pytest.approx(ende["against_fastest_target"] / 3.4)
  # CNNDM (γ 5: no call measured) goes by c: the fused target is faster.
  assert cnndm["pair"] == "fused+fused"
  assert cnndm["against_fastest_target"] == pytest.approx(
      analysis.expected_speedup(0.65, 5, 0.1 / 3.6))


def test_rows_identical_tells_row_independent_paths_from_the_others():
  """The GPU check of what greedy identity rests on, per tile preset: on
  'fused' (CUDA or tensor cores, interpret mode here) a token's logits are
  the same bits in one-token calls and in one 4-token call; through XLA's
  dots on the CPU they are not; and each call's logits are XLA's path's
  to float32 rounding, argmax for argmax (a preset whose programs share
  a layer's stages through barriers, 'mma_persistent', among them)."""
  config = tiny_config(vocab_size=32, emb_dim=128, num_heads=2, head_dim=16,
                       mlp_dim=256, num_encoder_layers=1, num_decoder_layers=1)
  model = T5Model(config, init_params(config, jax.random.PRNGKey(0)))
  cache = timing.start(model, jnp.ones((1, 6), jnp.int32), max_len=8)
  fused = model.prepared_for_decoding("fused")
  for preset in ("default", "mma", "mma_persistent"):
    out = paths.rows_identical(fused, cache, 4, preset)
    vs_xla = out.pop("vs_xla_max_abs_diff")
    assert out.pop("logits_max_abs") > 1.0
    assert out == {
        "k": 4,
        "identical": True,
        "max_abs_diff": 0.0,
        "vs_xla_argmax_agree": 4
    }, preset
    assert 0 < vs_xla < 1e-4, preset
  xla = paths.rows_identical(model, cache, 4, "default")
  assert not xla["identical"] and xla["max_abs_diff"] > 0
  assert xla["vs_xla_max_abs_diff"] == 0.0


def test_median_ratio():
  assert stats.median_ratio([2, 6, 3], [1, 2, 3]) == 2.0
  with pytest.raises(ValueError):
    stats.median_ratio([1], [1, 2])


def _report(**exactness_ok):
  modes = {
      m: {
          "ok": ok,
          "greedy": {
              "default_precision": {
                  "examples": 4,
                  "identical": 4,
                  "mismatches": []
              }
          }
      } for m, ok in exactness_ok.items()
  }
  return {
      "mode": "small",
      "phases": {
          p: {
              "status": "ok",
              "seconds": 1.0
          } for p in common.PHASES
      },
      "env": {
          "gpu_awareness": {
              "ok": True
          },
          "machine": {
              "device_kind": "cpu"
          }
      },
      "exactness": {
          "all_ok": all(exactness_ok.values()),
          "modes": modes
      },
      "pretrained": {
          "identity": {
              "all_identical": True,
              "default_precision": {
                  "examples": 3,
                  "identical": 3
              }
          },
          "main_job": {
              "speedup": 1.5,
              "theorem_3_8": 2.0,
              "alpha": 0.9,
              "c": 0.05
          }
      },
      "physics": {
          "ok": True
      },
  }


def test_verdicts_and_summary():
  good = _report(token=True, beam=True)
  v = summary.verdicts(good)
  assert v["all_ok"] and v["pretrained_identical_count"] == "3/3"
  assert v["exactness_token"] and v["main_job_speedup"] == 1.5
  text = summary.format_summary({**good, "verdicts": v})
  assert "greedy identical 3/3; main job speedup 1.50x" in text
  assert text.splitlines()[-1] == "all checks hold: True"
  bad = _report(token=True, beam=False)
  assert not summary.verdicts(bad)["all_ok"]
  bad = _report(token=True)
  bad["phases"]["physics"]["status"] = "timed out"
  assert not summary.verdicts(bad)["all_ok"]
  assert summary.format_summary(bad).splitlines()[-1] == (
      "all checks hold: False (failed: phases_ok)")
  bad = _report(token=True, beam=False)
  assert summary.format_summary(bad).splitlines()[-1] == (
      "all checks hold: False (failed: exactness_all_modes, exactness_beam)")


def test_summary_names_the_ceilings_when_measured():
  report = _report(token=True)
  assert not any(
      line.startswith("ceilings")
      for line in summary.format_summary(report).splitlines())
  report["env"] = {
      "ceilings": {
          "copy_gbps": 3230.4,
          "read_gbps": 4012.6,
          "bf16_matmul_tflops": 701.2
      }
  }
  assert ("ceilings: copy 3230 GB/s, read 4013 GB/s (a sum), bf16 matmul "
          "701 TFLOP/s") in summary.format_summary(report).splitlines()


def test_summary_gives_a_calls_handover_when_measured():
  report = _report(token=True)
  assert "handover" not in summary.format_summary(report)
  report["pretrained"]["handover"] = {
      "pytrees_us": 481.4,
      "bound_us": 122.6,
      "saved_us": 358.8,
      "calls": 200
  }
  assert ("a call's handover (the host's part): 481 us as pytrees, 123 us "
          "bound") in summary.format_summary(report).splitlines()


def test_summary_survives_a_failed_physics_step_group():
  """A physics phase whose first group failed records {'ok': False,
  'error': ...} as its steps: the summary printed a traceback (KeyError
  'c') instead of its last line."""
  report = _report(token=True)
  report["physics"]["steps"] = {"ok": False, "error": "RuntimeError: x"}
  assert summary.format_summary(report).splitlines()[-1] == (
      "all checks hold: True")


def test_summary_shows_each_decode_path():
  report = _report(token=True)
  report["paths"] = {
      "ok": True,
      "steps": {
          "fused": {
              "xxl": {
                  "step_ms": 3.0,
                  "floor_share": 0.9
              },
              "small": {
                  "step_ms": 0.1,
                  "floor_share": 0.25,
                  "c": 0.033
              }
          }
      },
      "kernels": {
          "fused": {
              "per_decoder_layer": 6
          }
      },
      "option_sets": {
          "vs_reference": {
              "xla/default": 1.0,
              "fused/default": 0.3
          }
      },
  }
  report["pretrained"]["main_job_by_path"] = {
      "fused": {
          "1": {
              "speedup": 1.9,
              "batch_factor": 1.0
          },
          "8": {
              "skipped": "time cap"
          }
      },
      "xla": {
          "8": {
              "speedup": 1.19,
              "alpha": 0.9,
              "batch_factor": 0.877,
              "free_loop_speedup": 1.474
          }
      }
  }
  report["pretrained"]["main_job_by_options"] = {
      "current": {
          "speedup": 1.5
      },
      "command_buffer_all": {
          "speedup": 1.4,
          "alpha": 0.9,
          "identity": {
              "examples": 60,
              "identical": 60
          },
          "vs_current": {
              "baseline": 1.3,
              "speculative": 1.2
          }
      }
  }
  report["pretrained"]["main_job_by_tiles"] = {
      "mma_layer": {
          "identity": {
              "default_precision": {
                  "examples": 60,
                  "identical": 60
              }
          },
          "1": {
              "speedup": 2.1,
              "alpha": 0.6984
          },
          "8": {
              "error": "RuntimeError: x"
          },
          "compile_s": 41.4
      },
      "mma_layer_fold": {
          "skipped": "time cap"
      },
      "mma_split+mma_persistent": {
          "ok": False,
          "error": "XlaRuntimeError: ptxas failed"
      }
  }
  report["pretrained"]["main_job_by_mixed_paths"] = {
      "packed+fused": {
          "identity": {
              "default_precision": {
                  "examples": 60,
                  "identical": 59
              }
          },
          "1": {
              "speedup": 1.7,
              "alpha": 0.9
          }
      },
      "xla+fused": {
          "skipped": "time cap"
      }
  }
  report["paths"]["steps"]["fused"]["xxl"].update(call_k=8, call_cost=1.04)
  report["paths"]["table2_pairs"] = {
      "best": [{
          "task": "EnDe",
          "draft": "small",
          "temperature": 0.0,
          "gamma": 7,
          "paper": 3.4,
          "pair": "xla+fused",
          "against_fastest_target": 3.0,
          "of_paper": 3.0 / 3.4
      }]
  }
  report["paths"]["tiles"] = {
      "rows_identical": {
          "default": {
              "k": 8,
              "identical": True,
              "max_abs_diff": 0.0,
              "vs_xla_max_abs_diff": 0.012,
              "vs_xla_argmax_agree": 7,
              "logits_max_abs": 4.5
          },
          "mma": {
              "k": 8,
              "identical": False,
              "max_abs_diff": 1e-3
          },
          "mma_split": {
              "ok": False,
              "error": "RuntimeError: x"
          },
      },
      "ms": {
          "small/mma_split": 0.6,
          "small/deep_mma_split": 0.4,
          "xxl/mma_split": 10.5,
          "xxl@k8/mma_split": 13.0
      },
      "skipped": ["xxl/deep_mma_split", "xxl@k8/deep_mma_split"]
  }
  report["paths"]["barriers"] = {
      "passes": 64,
      "held": {
          "p8/n64": True,
          "p8/n0": True,
          "p128/n64": True,
          "p128/n0": True
      },
      "all_held": True,
      "us_per_barrier": {
          "8": 0.8,
          "128": 1.25
      }
  }
  report["exactness"]["argmax_kernel"] = {
      "ok": False,
      "by_vocab": {
          "8000": {
              "rows": 8,
              "agree": 8
          },
          "32128": {
              "rows": 8,
              "agree": 7
          }
      }
  }
  text = summary.format_summary(report)
  assert ("argmax kernel: V 8000 8/8 rows as jnp.argmax, V 32128 7/8 rows as "
          "jnp.argmax") in text
  assert ("tiles: a token's logits the same bits in one-token calls and in "
          "one call: default yes, 0.012 from xla's of 4.5, argmax 7/8 (k 8), "
          "mma NO (k 8), mma_split error "
          "(RuntimeError: x) (k ?)") in text
  assert ("fused   kernels/layer 6: xxl 3.000 ms (90% of floor), small "
          "0.100 ms (25% of floor, c 0.033)") in text
  assert "fused   target's 8-token call: 1.04 steps" in text
  assert ("best pair EnDe  small T=0 γ=7: xla+fused (target+draft path) "
          "Theorem 3.8 3.00x over the fastest target alone, 0.88 of the "
          "paper's 3.4x") in text
  assert "option_sets: fused/default 0.30 xla/default 1.00" in text
  assert ("tiles small (ms): deep_mma_split 0.400, mma_split 0.600\n"
          "  tiles xxl (ms): mma_split 10.500\n"
          "  tiles xxl@k8 (ms): mma_split 13.000\n"
          "  tiles not compiled in time: xxl/deep_mma_split, "
          "xxl@k8/deep_mma_split") in text
  assert "main job on fused: batch 1 1.90x, batch 8 skipped (time cap)" in text
  # Rows waiting for a batch's slowest are named only where they cost.
  assert ("main job on xla: batch 8 1.19x (α 0.90, rows waiting 0.88, a free "
          "loop 1.47x)") in text
  assert ("barriers (64 a kernel): 128 programs 1.25 µs, 8 programs 0.80 µs "
          "each; held in 4/4 kernels") in text
  assert summary.verdicts(report)["barriers_held"] is True
  assert "main job on fused, tiles mma_layer_fold: skipped (time cap)" in text
  assert ("main job on fused, tiles mma_split+mma_persistent: XlaRuntimeError:"
          " ptxas failed") in text
  assert ("main job target on packed, draft on fused: identity 59/60, batch "
          "1 1.70x (α 0.90)") in text
  assert "main job target on xla, draft on fused: skipped (time cap)" in text
  # Identity records without a verdict ('default_precision' only) count
  # as unmeasured; one that did not hold fails the check.
  assert summary.verdicts(report)["pretrained_identical_other_pairs"] is None
  mixed = report["pretrained"]["main_job_by_mixed_paths"]["packed+fused"]
  mixed["identity"]["all_identical"] = False
  assert summary.verdicts(report)["pretrained_identical_other_pairs"] is False
  assert summary.verdicts(report)["all_ok"] is False
  mixed["identity"]["all_identical"] = True
  assert summary.verdicts(report)["pretrained_identical_other_pairs"] is True
  assert ("main job on fused, tiles mma_layer: identity 60/60, batch 1 "
          "2.10x (α 0.70), batch 8 -x (compiled in 41 s)") in text
  assert ("main job, options command_buffer_all: identity 60/60, batch 1 "
          "1.40x (α 0.90) (current's 1.50x); baseline 1.30x, speculative "
          "1.20x as fast as under the current options") in text


def test_launch_ops_counts_the_programs_steps_not_fused_ops():
  hlo = """HloModule m, entry_computation_layout={()->f32[]}

%fused_add (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %a = f32[4]{0} add(f32[4]{0} %p, f32[4]{0} %p)
}

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %x, f32[] %y)
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %v = f32[4]{0} get-tuple-element((s32[], f32[4]{0}) %t), index=1
  %f = f32[4]{0} fusion(f32[4]{0} %v), kind=kLoop, calls=%fused_add
  %g = f32[4]{0} custom-call(f32[4]{0} %f), custom_call_target="t"
  %c = f32[4]{0} copy(f32[4]{0} %g)
  ROOT %r = (s32[], f32[4]{0}) tuple(s32[] %i, f32[4]{0} %c)
}

ENTRY %main () -> f32[] {
  %w = (s32[], f32[4]) while((s32[], f32[4]) %init), condition=%c, body=%body
  ROOT %out = f32[] reduce(f32[4] %x, f32[] %z), dimensions={0}, to_apply=%sum
}
"""
  assert paths.launch_ops(hlo) == {
      "fusion": 1,
      "custom-call": 1,
      "copy": 1,
      "reduce": 1
  }


_GPU_LIKE_HLO = """HloModule m, entry_computation_layout={()->f32[]}

%fused_verify (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %a = f32[4]{0} add(f32[4]{0} %p, f32[4]{0} %p), metadata={op_name="jit(f)/while/body/verify/add"}
}

%command_buffer (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  %e = f32[4]{0} fusion(f32[4]{0} %q), kind=kLoop, calls=%fused_verify, metadata={op_name="jit(f)/while/body/emit/select"}
  ROOT %s = f32[4]{0} fusion(f32[4]{0} %e), kind=kLoop, calls=%fused_verify, metadata={op_name="jit(f)/while/body/statistics/add"}
}

%draft_body (d: f32[4]) -> f32[4] {
  ROOT %d = f32[4]{0} parameter(0)
}

%catch_up_two (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %k1 = f32[4]{0} fusion(f32[4]{0} %x), kind=kLoop, calls=%fused_verify, metadata={op_name="jit(f)/while/body/propose/add"}
  ROOT %k2 = f32[4]{0} fusion(f32[4]{0} %k1), kind=kLoop, calls=%fused_verify, metadata={op_name="jit(f)/while/body/propose/mul"}
}

%catch_up_one (y: f32[4]) -> f32[4] {
  %y = f32[4]{0} parameter(0)
  ROOT %k3 = f32[4]{0} fusion(f32[4]{0} %y), kind=kLoop, calls=%fused_verify, metadata={op_name="jit(f)/while/body/propose/add"}
}

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]{0}) parameter(0)
  ROOT %done = pred[] fusion((s32[], f32[4]{0}) %c), kind=kLoop, calls=%fused_verify
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %v = f32[4]{0} get-tuple-element((s32[], f32[4]{0}) %t), index=1
  %g = f32[4]{0} custom-call(f32[4]{0} %v), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/while/body/verify/dot_general"}
  %f = f32[4]{0} fusion(f32[4]{0} %g), kind=kLoop, calls=%fused_verify
  %a = f32[4]{0} fusion(f32[4]{0} %f), kind=kLoop, calls=%fused_verify, metadata={op_name="jit(f)/while/body/acceptance/lt"}
  %w = f32[4]{0} while(f32[4]{0} %a), condition=%cond, body=%draft_body
  %cb = f32[4]{0} call(f32[4]{0} %w), to_apply=%command_buffer
  %lag = f32[4]{0} conditional(pred[] %p, f32[4]{0} %cb, f32[4]{0} %cb), true_computation=%catch_up_two, false_computation=%catch_up_one
  %cs = (f32[4]{0}, f32[4]{0}) copy-start(f32[4]{0} %cb)
  %cd = f32[4]{0} copy-done((f32[4]{0}, f32[4]{0}) %cs)
  ROOT %r = (s32[], f32[4]{0}) tuple(s32[] %i, f32[4]{0} %cd)
}

ENTRY %main () -> f32[] {
  %enc = f32[4]{0} fusion(f32[4]{0} %e0), kind=kLoop, calls=%fused_verify, metadata={op_name="jit(f)/start/Transformer.encode/add"}
  %w = (s32[], f32[4]) while((s32[], f32[4]) %init), condition=%cond, body=%body
  ROOT %out = f32[] reduce(f32[4] %x, f32[] %z), dimensions={0}, to_apply=%sum
}
"""


def test_iteration_kernels_count_gpu_fusions_custom_calls_and_command_buffers():
  """The loop phase's kernel count on GPU-shaped HLO (the CPU's: the e2e
  check): fusions and custom calls by their source's part, a command
  buffer's kernels in its place, an async copy once, the condition's, a
  conditional's larger branch (its kernels were left out before)."""
  counts = iteration_hlo.iteration_kernels(_GPU_LIKE_HLO)
  assert counts["body_by_part"] == {
      "target call": 2,
      "draft propose": 2,  # The conditional's larger branch.
      "acceptance": 1,
      "emit": 1,
      "statistics": 1,
      "copies": 1
  }
  assert counts["body"] == 8 and counts["condition"] == 1
  assert counts["conditionals"] == [[2, 1]]
  assert counts["nested_loops"] == 1
  # The draft's loop: no kernel in its body, its test's fusion each step.
  assert counts["nested"] == [{
      "body": 0,
      "body_by_part": {},
      "condition": 1,
      "nested": [],
      "conditionals": []
  }]
  assert counts["outside_model_calls"] == 5  # 4 in the body + the test
  # Each named by its part, its JAX op after the loop's scope and its type
  # (the body's, then the test's), so a reader finds it in the loops' code.
  named = counts["outside_model_call_kernels"]
  assert len(named) == 5 and named[:4] == [
      "acceptance: acceptance/lt -> f32[4]", "emit: emit/select -> f32[4]",
      "statistics: statistics/add -> f32[4]", "copies: %cs -> (f32[4], f32[4])"
  ]
  # Once a decode, around the loop: the start's kernel and the output's.
  assert counts["outside_loop"] == 2
  assert counts["outside_loop_by_part"] == {"start": 1, "loop bookkeeping": 1}
  with pytest.raises(ValueError, match="no while loop"):
    iteration_hlo.iteration_kernels("ENTRY %main () -> f32[] {\n"
                                    "  ROOT %x = f32[] constant(0)\n}\n")


def test_iteration_kernels_find_the_loop_inside_a_call():
  """XLA:CPU from JAX 0.12 wraps the loop in a `call` of the entry (its
  device check found no loop); the loop counted is the same."""
  entry_line = ("  %w = (s32[], f32[4]) while((s32[], f32[4]) %init), "
                "condition=%cond, body=%body")
  assert entry_line in _GPU_LIKE_HLO
  wrapped = _GPU_LIKE_HLO.replace(
      entry_line,
      "  %w = (s32[], f32[4]) call((s32[], f32[4]) %init), to_apply=%wrap"
  ).replace(
      "\nENTRY", "\n%wrap (i: (s32[], f32[4])) -> (s32[], f32[4]) {\n"
      "  %i = (s32[], f32[4]) parameter(0)\n"
      "  ROOT %v = (s32[], f32[4]) while((s32[], f32[4]) %i), "
      "condition=%cond, body=%body\n}\n\nENTRY")
  assert iteration_hlo.iteration_kernels(
      wrapped) == iteration_hlo.iteration_kernels(_GPU_LIKE_HLO)


def _split_medians(short=8, long=40):
  """Synthetic `loop_overhead.programs` medians (seconds) and iterations:
  one sentence, 16 calls per timed part."""
  med = {
      "t1": 16e-3,
      "tv": 24e-3,
      "d1": 4e-3,
      "propose": 16e-3,
      "iteration": 48e-3,
      ("base", 0, short): 10e-3,
      ("base", 0, long): 42e-3,
      ("spec", 0, short): 8e-3,
      ("spec", 0, long): 28e-3,
  }
  return med, {(0, short): 3, (0, long): 11}


def test_loop_split_against_theorem_3_8():
  """Theorem 3.8 at the split's own tokens per iteration, c and call cost,
  and the seconds of an iteration in no model call."""
  med, iterations = _split_medians()
  split = loop_overhead.breakdown(med, iterations, gamma=3, short=8, long=40,
                                  fixed=False)
  assert "fixed_split_s" not in split
  np.testing.assert_allclose(split["speculative_per_iteration_s"], 2.5e-3)
  np.testing.assert_allclose(split["iteration_split_s"]["while_loop"], -0.5e-3)
  out = loop.against_theorem(split)
  # 4 tokens an iteration / (3 c + call cost) = 4 / (3 * 0.25 + 1.5).
  np.testing.assert_allclose(out["theorem_3_8_at_measured"], 4 / 2.25)
  # γ d1 + tv = 0.75 + 1.5 ms of model calls in 2.5 ms.
  np.testing.assert_allclose(out["not_in_model_calls_s"], 0.25e-3)
  np.testing.assert_allclose(out["not_in_model_calls_share"], 0.1)
  # What the loops alone cost: the baseline's overhead over the
  # speculative loop's.
  np.testing.assert_allclose(
      out["marginal_over_theorem"],
      split["baseline_loop_overhead"] / split["speculative_loop_overhead"])


def test_loop_summary_line_and_the_main_jobs_ratio():
  report = _report(token=True)
  report["pretrained"]["main_job"].update(speedup=1.30, theorem_3_8=2.18,
                                          theorem_3_8_with_call_cost=1.95)
  med, iterations = _split_medians()
  split = loop_overhead.breakdown(med, iterations, gamma=3, short=8, long=40,
                                  fixed=False)
  report["loop"] = {
      "ok": True,
      "split": {
          "fused": {
              **split,
              **loop.against_theorem(split)
          },
          "xla": {
              "skipped": "time cap"
          }
      },
      "kernels": {
          "fused": {
              "outside_model_calls": 34,
              "condition": 1,
              "outside_loop": 100
          }
      },
      "main_job": summary.main_job_against_theorem(report)
  }
  job = report["loop"]["main_job"]
  np.testing.assert_allclose(job["over_theorem"], 1.30 / 2.18)
  np.testing.assert_allclose(job["over_theorem_with_call_cost"], 1.30 / 1.95)
  text = summary.format_summary(report)
  assert ("  loop on fused: iteration 2.500 ms = propose 1.000 + verify 1.500"
          " + bookkeeping 0.500 + while -0.500; not in model calls 0.250 ms "
          "(10%), 34 kernels (condition 1), once a decode 100; marginal "
          "1.60x = 0.90 of "
          "Theorem 3.8 (1.78x)") in text
  assert "loop on xla" not in text
  assert "  main job 1.30x = 0.60 of Theorem 3.8 (2.18x), 0.67 with the call " \
         "cost" in text
  assert summary.verdicts(report)["loop_complete"] is True
  del report["pretrained"]
  assert summary.main_job_against_theorem(report) == {
      "skipped": "no main job measured (the pretrained phase)"
  }


def _fake_child(ran, handed=None):
  """A stand-in for `cli._child`: appends (name, cap_s) to `ran` and
  (name, mode, the flags handed on) to `handed`."""

  def child(name, mode, cap_s, forwarded=()):
    ran.append((name, cap_s))
    if handed is not None:
      handed.append((name, mode, list(forwarded)))
    return {
        "record": {
            "ok": True
        },
        "status": {
            "status": "ok",
            "exit_code": 0,
            "cap_s": cap_s,
            "seconds": 0.0,
            "error": None
        }
    }

  return child


def test_the_parent_hands_each_phase_the_flags_it_was_given(
    monkeypatch, tmp_path):
  handed = []
  monkeypatch.setattr(cli, "_child", _fake_child([], handed))
  args = cli.parse_args([
      "--small", "--phases=env,pretrained", "--path=fused", "--tiles=mma",
      "--pretrained_groups=by_path,by_options", f"--out={tmp_path}"
  ])
  assert cli.orchestrate(args) == 0
  flags = [
      "--path", "fused", "--tiles", "mma", "--pretrained_groups",
      "by_options,by_path"
  ]
  assert handed == [("env", "small", flags), ("pretrained", "small", flags)]
  report = json.loads((tmp_path / cli.RESULT_FILE).read_text())
  assert report["settings"]["pretrained_groups"] == "by_options,by_path"
  # Nothing chosen: nothing handed on (each phase takes the mode's own).
  handed.clear()
  cli.orchestrate(
      cli.parse_args(
          ["--small", "--phases=env", f"--out={tmp_path}", "--overwrite"]))
  assert handed == [("env", "small", [])]


@pytest.mark.parametrize("total_s,runs", [(25.0, False), (40.0, True)])
def test_the_loop_phase_is_skipped_with_a_line_when_time_is_short(
    total_s, runs, monkeypatch, tmp_path, capsys):
  """It needs 30 s (`common.MIN_PHASE_S`) where the others need 15 s: what
  is left goes to the physics after it."""
  ran = []
  monkeypatch.setattr(cli, "_child", _fake_child(ran))
  args = cli.parse_args([
      "--small", "--phases=loop,physics", f"--total_s={total_s}",
      f"--out={tmp_path}"
  ])
  code = cli.orchestrate(args)
  report = json.loads((tmp_path / cli.RESULT_FILE).read_text())
  assert [name for name, _ in ran
         ] == (["loop", "physics"] if runs else ["physics"])
  if runs:
    assert code == 0 and report["loop"]["main_job"] == {
        "skipped": "no main job measured (the pretrained phase)"
    }
  else:
    assert code == 1 and report["phases"]["loop"]["status"] == "skipped (time)"
    assert "loop" not in report
    assert ("phase loop: skipped, 25 s left (it needs 30 s)"
            in capsys.readouterr().err)
  assert common.PHASES.index("loop") == common.PHASES.index("physics") - 1


def test_decode_path_setting_reaches_every_phase(capsys):
  assert common.settings_for("full").decode_path is None
  assert common.settings_for("small", "fused").decode_path == "fused"
  args = cli.parse_args(["--small", "--path=fused"])
  assert cli.settings_record(args)["path"] == "fused"
  with pytest.raises(SystemExit):
    cli.parse_args(["--path=triton"])
  err = capsys.readouterr().err
  assert "--path='triton': allowed: xla, cpu_kernel, packed, fused" in err
  assert cli.settings_record(
      args)["tiles"] == common.CHECKED_TILES == "mma_split"
  args = cli.parse_args(["--small", "--tiles=default"])
  assert cli.settings_record(args)["tiles"] == "default"
  with pytest.raises(SystemExit):
    cli.parse_args(["--tiles=huge"])
  assert "--tiles='huge': allowed: default, wide" in capsys.readouterr().err
  for preset in (common.FULL, common.SMALL):
    assert set(preset.option_sets) <= set(gpu.GPU_OPTION_SETS)
    assert set(preset.main_job_option_sets) <= set(gpu.GPU_OPTION_SETS)
    assert set(preset.tile_presets) <= set(gpu_tiles.TILE_PRESETS)
    assert set(preset.tile_call_presets) <= set(preset.tile_presets)
    assert "xla" in preset.paths and "fused" in preset.paths
  assert common.FULL.main_job_batches == (1, 8)


def test_interleaved_rounds_rotate_the_decoders_and_stop_at_the_deadline():
  calls = []

  def decoder(name):

    def decode(batch, rng):
      del rng
      calls.append(name)
      return np.asarray(batch) + len(name)

    return decode

  batches = [np.zeros((1, 2), np.int32)] * 2
  names = ("a", "bb", "ccc")
  times, outs = pair_runs.interleaved({n: decoder(n) for n in names}, batches, 3,
                                      common.Deadline(60.0))
  # One untimed caption each, then every caption per decoder per round,
  # the first decoder of each round rotating.
  assert calls == ["a", "bb", "ccc"] + [
      n for first in range(3) for n in (names[first:] + names[:first])
      for _ in batches
  ]
  assert {n: len(t) for n, t in times.items()} == {n: 3 for n in names}
  assert [int(o[0, 0]) for o in outs["ccc"]] == [3, 3]
  calls.clear()
  times, _ = pair_runs.interleaved({"a": decoder("a")}, batches, 5,
                                   common.Deadline(0.0))
  assert len(times["a"]) == 1  # A first round always; no time for more.


def test_the_main_jobs_profile_traces_each_loop_per_caption(monkeypatch):
  decoded = []
  monkeypatch.setattr(
      pretrained_pair, "_decoders", lambda t, d, n:
      (lambda b, rng: decoded.append(
          ("baseline", len(b))), lambda b, rng: decoded.append(
              ("speculative", len(b)))))
  monkeypatch.setattr(
      pretrained_pair, "_target_calls", lambda s, t, inputs, tokens: {
          "target_k4": (lambda _: decoded.append(("k4", int(tokens))), 8, {
              "k": 4
          })
      })
  monkeypatch.setattr(
      kernel_profile, "profile", lambda fn, calls, steps_per_call: (fn(0), {
          "kernels": 0,
          "steps": steps_per_call
      })[1])
  batches = [np.zeros((1, 2), np.int32)] * 4
  job = {"tokens_generated": 40, "tokens_per_target_call": 2.5}
  r = pretrained_pair.main_job_profile(common.SMALL, None, None, batches, job,
                                       common.Deadline(60.0))
  assert r == {
      "baseline": {
          "kernels": 0,
          "steps": 4,
          "iterations_per_caption": 10.0
      },
      "speculative": {
          "kernels": 0,
          "steps": 4,
          "iterations_per_caption": 4.0
      },
      "target_k4": {
          "kernels": 0,
          "steps": 8,
          "k": 4
      }
  }
  assert decoded == ([("baseline", 1)] * 4 + [("speculative", 1)] * 4 +
                     [("k4", 10)])
  r = pretrained_pair.main_job_profile(common.SMALL, None, None, batches, {},
                                       common.Deadline(0.0))
  assert r == {
      name: {
          "skipped": "time cap"
      } for name in ("baseline", "speculative", "target_k4")
  }


def test_gpu_loop_options_swap_only_the_gpus_for_loops_built_inside():
  program = loops.BASELINE_PROGRAM
  own = program.options("gpu")
  with programs.gpu_loop_options({"xla_gpu_graph_min_graph_size": 1}):
    assert program.options("gpu") == {"xla_gpu_graph_min_graph_size": 1}
    assert program.options("cpu") == loops.BASELINE_PROGRAM.cpu_options
    inside = program.jitted("gpu")
  assert program.options("gpu") == own
  assert program.jitted("gpu") is not inside


def test_main_job_batches_leave_out_a_partial_batch():
  inputs = np.arange(20).reshape(10, 2)
  assert [b.shape for b in pair_runs.batched(inputs, 4)] == [(4, 2)] * 2
  assert len(pair_runs.batched(inputs, 1)) == 10


def test_a_free_loop_keeps_the_sentence_ends_acceptance_and_batch():
  # α 0.5, γ 3: Equation (1) gives 1.875 tokens a call; the job made 1.5.
  job = {
      "alpha": 0.5,
      "gamma": 3,
      "tokens_per_target_call": 1.5,
      "theorem_3_8_with_call_cost": 2.0,
      "batch_factor": 0.9,
      "speedup": 1.08
  }
  out = pair_runs.free_loop(job)
  assert out["free_loop_speedup"] == pytest.approx(2.0 * 1.5 / 1.875 * 0.9)
  assert out["loop_share"] == pytest.approx(1.08 / 1.44)


def test_main_job_batch_factor_counts_each_batchs_slowest_row():
  out = collections.namedtuple("out", "target_calls")
  # Two batches of two captions: the baseline's 10+12 and 9+9 tokens, the
  # speculative loop's 3+6 and 3+3 calls.
  base = [out(np.array([10, 12])), out(np.array([9, 9]))]
  spec = [out(np.array([3, 6])), out(np.array([3, 3]))]
  assert pair_runs.batch_factor(base, spec) == pytest.approx(
      (15 / 9) / (40 / 21))
  one = [out(np.array([c])) for c in (10, 12, 9, 9)]
  assert pair_runs.batch_factor(
      one, [out(np.array([c])) for c in (3, 6, 3, 3)]) == 1.0


# ---------------------------------------------------------------------------
# What runs without gin is what the gin files say.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["small", "base", "large", "xl", "xxl"])
def test_t5_sizes_are_the_gin_files(size):
  assert common.t5_size(size) == gin_reader.read_t5_config(
      f"models/t5_1_1_{size}.gin")


@pytest.mark.parametrize("role,directory", [("target", pair_runs.TARGET_DIR),
                                            ("draft", pair_runs.DRAFT_DIR)])
def test_shipped_pair_configs_are_the_main_jobs(role, directory):
  ckpt = os.path.join(directory, os.listdir(directory)[0])
  with open(os.path.join(ckpt, "model_config.json"), encoding="utf-8") as f:
    fields = json.load(f)
  assert T5Config(**fields) == gin_reader.read_t5_config(
      "pretrained_multi30k.gin", scope=role)


def test_main_job_settings_are_the_gin_files():
  text = (REPO / "gin" / "pretrained_multi30k.gin").read_text()
  macros = dict(re.findall(r"^(\w+) = (.+)$", text, flags=re.M))
  pair = pair_runs
  assert REPO / macros["TARGET_CHECKPOINT_PATH"].strip("'") == pair.TARGET_DIR
  assert REPO / macros["DRAFT_CHECKPOINT_PATH"].strip("'") == pair.DRAFT_DIR
  assert REPO / macros["SPM_MODEL_PATH"].strip("'") == pair.SPM_MODEL
  assert REPO / macros["SOURCE_FILE"].strip("'") == pair.SOURCE_FILE
  assert int(macros["GAMMA"]) == pair.GAMMA
  assert float(macros["TEMPERATURE"]) == 0.0
  assert int(macros["NUM_EXAMPLES"]) == common.FULL.examples
  assert macros["TASK_FEATURE_LENGTHS"] == (
      f"{{'inputs': {common.FULL.input_length}, 'targets': "
      f"{common.FULL.max_decode_length}}}")
  run_gin = (REPO / "gin" / "run.gin").read_text()
  assert re.search(r"^BATCH_SIZE = 1$", run_gin, flags=re.M)


def test_captions_are_encoded_as_the_main_job_encodes_them():
  from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
  from specdec_jax.data import vocab  # pylint: disable=g-import-not-at-top
  pair = pair_runs
  sources = [s for s, _ in tasks.read_parallel_text(pair.SOURCE_FILE)]
  expected = tasks.encode_batch(vocab.SentencePieceFile(str(pair.SPM_MODEL)),
                                sources, 64)
  inputs = pair.encode_captions(len(sources), 64)
  assert inputs.dtype == np.int32 and len(inputs) == 60
  np.testing.assert_array_equal(inputs, expected)


def test_device_params_are_the_models_tree_in_the_storage_dtype():
  config = common.t5_size("xxl", tiny=True)
  params = common.device_params(config, 0, jnp.bfloat16)["params"]
  shapes = param_shapes(config)["params"]
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      shapes)
  for leaf, shape in zip(jax.tree_util.tree_leaves(params),
                         jax.tree_util.tree_leaves(shapes)):
    assert leaf.shape == shape.shape and leaf.dtype == jnp.bfloat16
    assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
  assert bool(jnp.all(params["decoder"]["decoder_norm"]["scale"] == 1))


# ---------------------------------------------------------------------------
# Settings.
# ---------------------------------------------------------------------------
def test_cpu_only_settings_are_one_line_errors_off_the_cpu():
  environ = {
      "SPECDEC_JAX_KERNEL_ISA": "avx2",
      "XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_dump_to=x"
  }
  assert env.settings_errors("cpu", "small", environ) == []
  errors = env.settings_errors("gpu", "full", environ)
  assert len(errors) == 2 and all("\n" not in e for e in errors)
  assert "SPECDEC_JAX_KERNEL_ISA='avx2'" in errors[0] and "CPU-only" in errors[0]
  assert "--xla_cpu_enable_fast_math=false" in errors[1]
  assert env.settings_errors("gpu", "full",
                             {"XLA_FLAGS": "--xla_dump_to=x"}) == []
  (full_on_cpu,) = env.settings_errors("cpu", "full", {})
  assert "needs a GPU" in full_on_cpu and "--small" in full_on_cpu


def test_command_line_rejects_unknown_phases(capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(["--phases=env,warp"])
  assert "allowed: a comma-separated subset" in capsys.readouterr().err
  assert cli.parse_args(["--phases=physics,env"]).phases == ["env", "physics"]


def test_preflight_names_what_the_check_reads():
  assert travel.is_needed("pretrained/multi30k/target_38m/checkpoint_1/x")
  assert travel.is_needed("tools/device_check/cli.py")
  assert not travel.is_needed("tools/benchmarks/decode.py")
  assert not travel.is_needed("pretrained/multi30k/target")
  folders = travel.by_folder({"a/b/c/d": 3, "a/b/c/e": 4, "x": 1})
  assert folders == [("a/b/c", 7), ("x", 1)]
  # What goes aside is nothing the check reads.
  for path in travel.ASIDE:
    assert not travel.is_needed(path), path


def test_every_module_the_check_imports_travels():
  """`travel.NEEDED` holds every module of this repository that the
  check's phases import (a call that left one behind would fail there)."""
  listed = subprocess.run([
      sys.executable, "-c", "import importlib, pkgutil, sys\n"
      "import tools.device_check as dc\n"
      "for m in pkgutil.iter_modules(dc.__path__):\n"
      "  importlib.import_module('tools.device_check.' + m.name)\n"
      "print('\\n'.join(getattr(m, '__file__', None) or '' "
      "for m in list(sys.modules.values())))"
  ], cwd=REPO, capture_output=True, text=True, check=True, env={
      **os.environ, "JAX_PLATFORMS": "cpu"
  }).stdout.split()
  ours = [
      os.path.relpath(f, REPO)
      for f in listed
      if f.startswith(str(REPO)) and "site-packages" not in f
  ]
  assert "tools/device_check/gamma_sweep.py" in ours
  assert [f for f in ours if not travel.is_needed(f)] == []


def test_the_tree_without_what_goes_aside_fits_a_device_call():
  """What a device call sends after `--aside` is under the 64 MiB limit,
  with 1 MiB to spare (a tree that grew past it fails here, not in a GPU
  session's minutes)."""
  files = travel.sizes(str(REPO), travel.travelling_files(str(REPO)))
  sent = sum(size for f, size in files.items() if not travel.is_aside(f))
  assert sent <= travel.LIMIT_BYTES - 2**20, sent / 2**20


def test_aside_and_back_move_the_unread_paths_out_and_in(tmp_path, capsys):
  root, folder = tmp_path / "repo", tmp_path / "aside"
  for f in ("big/ckpt/a", "tests/t.py", "keep/k.py"):
    (root / f).parent.mkdir(parents=True, exist_ok=True)
    (root / f).write_text(f)
  subprocess.run(["git", "init", "-q", str(root)], check=True)
  paths = ("big/ckpt", "tests", "absent")
  assert travel.aside(str(folder), str(root), paths) == 0
  assert not (root / "big" / "ckpt").exists() and not (root / "tests").exists()
  assert (folder / "big" / "ckpt" / "a").read_text() == "big/ckpt/a"
  out = capsys.readouterr().out
  assert "aside: moved 2 paths" in out and "travels: 1 files" in out
  # A second aside into the same folder would mix two calls' paths.
  (root / "tests").mkdir()
  assert travel.aside(str(folder), str(root), paths) == 2
  assert (folder / "tests" / "t.py").exists()
  # Back refuses to overwrite, then returns everything once the way is
  # clear.
  assert travel.back(str(folder), str(root), paths) == 2
  (root / "tests").rmdir()
  assert travel.back(str(folder), str(root), paths) == 0
  for f in ("big/ckpt/a", "tests/t.py", "keep/k.py"):
    assert (root / f).read_text() == f
  assert not folder.exists()  # Nothing left behind.


def test_greedy_identity_is_repeated_at_highest_precision_only_if_needed():
  """Both phases' identity: a mismatch at the default matmul precision is
  checked again at 'highest', and the verdict is the last one's."""
  records = [{
      "examples": 2,
      "identical": 1,
      "mismatches": [{
          "index": 1,
          "position": 4
      }]
  }, {
      "examples": 2,
      "identical": 2,
      "mismatches": []
  }]
  precisions = []

  def check():
    precisions.append(jax.config.jax_default_matmul_precision)
    return records[len(precisions) - 1]

  out = common.at_highest_if_needed(check)
  assert precisions[1] == "highest" and len(precisions) == 2
  assert out["default_precision"]["identical"] == 1
  assert out["highest_precision"]["identical"] == 2 and out["all_identical"]
  same = common.at_highest_if_needed(lambda: records[1])
  assert "highest_precision" not in same and same["all_identical"]


# ---------------------------------------------------------------------------
# The GPU image has no gin, seqio or TensorFlow.
# ---------------------------------------------------------------------------
ABSENT_ON_THE_GPU_IMAGE = ("gin", "seqio", "tensorflow", "tensorflow_datasets")
# Functions the device check never calls whose imports are not followed
# (module -> function names): gin's parser, imported where a gin file is read.
NOT_CALLED = {
    "specdec_jax.config.gin_reader": ("_gin_parser",),
    # The benchmarks' sentences (the loop phase reads the captions itself).
    "tools.benchmarks.common": ("sentences",),
}


def _imports(source: str, module: str, package: str) -> set:
  """Every module `source` (module `module`) imports: at its top, in its
  classes and in its functions (a lazy import runs when the function is
  called; those of `NOT_CALLED` are left out). `package`: for relative
  imports."""
  found, stack = set(), list(ast.parse(source).body)
  while stack:
    node = stack.pop()
    if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and
        node.name in NOT_CALLED.get(module, ())):
      continue
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      found |= {base} | {f"{base}.{a.name}" for a in node.names}
    stack += list(ast.iter_child_nodes(node))
  return found


def _file_of(module: str):
  """The repository file of `module` (a package: its __init__.py), or None
  outside the repository."""
  path = REPO.joinpath(*module.split("."))
  for candidate in (path.with_suffix(".py"), path / "__init__.py"):
    if candidate.is_file():
      return candidate
  return None


def third_party_imports(modules) -> dict:
  """{top-level name outside the repository: the chain of repository
  modules that imports it}, following every import of the repository's own
  modules (and their packages' __init__) from `modules`."""
  todo, seen, outside = [(m, (m,)) for m in modules], set(), {}
  while todo:
    module, chain = todo.pop()
    parts = module.split(".")
    todo += [(".".join(parts[:i]), chain) for i in range(1, len(parts))]
    path = _file_of(module)
    if path is None:
      if parts[0] not in ("specdec_jax", "tools"):
        outside.setdefault(parts[0], chain)
      continue
    if path in seen:
      continue
    seen.add(path)
    package = module if path.name == "__init__.py" else module.rpartition(
        ".")[0]
    todo += [
        (m, chain + (m,))
        for m in _imports(path.read_text(encoding="utf-8"), module, package)
    ]
  return outside


def test_the_device_check_imports_no_gin_seqio_or_tensorflow():
  """It runs on the GPU image with only the repository on the path (issue
  57: `checkpoints` reading a model_config.json imported gin_reader, and
  with it gin, so the pretrained phase could not start there). The
  end-to-end run with them made unimportable:
  tests/e2e/test_device_check_e2e.py."""
  phases = [f"tools.device_check.{m}" for m in ("cli", *cli._MODULES.values())]  # pylint: disable=protected-access
  outside = third_party_imports(["tools.device_check.__main__", *phases])
  assert "jax" in outside and "numpy" in outside  # the walk reached them
  found = [
      " <- ".join(reversed(chain))
      for name, chain in sorted(outside.items())
      if name in ABSENT_ON_THE_GPU_IMAGE
  ]
  assert not found, "\n".join(found)


def test_the_import_walk_sees_imports_in_functions_and_behind_modules():
  source = ("import os\nfrom . import sibling\ntry:\n  import gin\n"
            "except ImportError:\n  pass\ndef f():\n  import seqio\n"
            "def _gin_parser():\n  import tensorflow\n")
  found = _imports(source, "specdec_jax.config.gin_reader",
                   "specdec_jax.config")
  assert {"os", "gin", "seqio", "specdec_jax.config.sibling"} <= found
  assert "tensorflow" not in found  # NOT_CALLED
  # specdec_jax.config.gin_utils imports gin at its top.
  assert "gin" in third_party_imports(["specdec_jax.config.gin_utils"])


def test_each_call_loop_is_traced_under_the_tiles_in_force():
  """The `tiles` group timed one program for every preset: each variant
  jitted the same function, whose trace jit had cached under the first
  preset. Each `call_loop_with` is a program of its own (lowered for
  CUDA here: Triton's warps per program are the preset's)."""
  model = paths.abstract_model(common.t5_size("small", tiny=True), "fused")
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  cache = jax.eval_shape(lambda m, e: m.start(e, 16), model.unpacked(), tokens)
  fill = jax.ShapeDtypeStruct((1,), jnp.int32)

  def warps():
    with gpu.lowering_for_gpu():
      text = physics.call_loop_with(
          {}).trace(model, cache, fill, k=1,
                    steps=2).lower(lowering_platforms=("cuda",)).as_text()
    return set(re.findall(r"num_warps = (\d+)", text))

  assert warps() == {str(gpu_tiles.Tiles().num_warps)}
  for name in ("wide", "narrow"):
    with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS[name]):
      assert warps() == {str(gpu_tiles.TILE_PRESETS[name].num_warps)}, name


def test_folds_nothing_weighs_a_models_layer_against_the_presets(monkeypatch):
  """A preset that folds layers up to some bytes (`Tiles.fold_bytes`)
  computes a target whose layers weigh more as its unfolded twin: not
  timed twice. Layers at or under the threshold, and presets that fold
  nothing, are timed."""
  config = tiny_config()
  model = T5Model(config, init_params(config, jax.random.PRNGKey(0)))
  layer = model.params["params"]["decoder"]["layers_0"]
  weight_bytes = sum(
      x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(layer))
  presets = dict(gpu_tiles.TILE_PRESETS,
                 under=gpu_tiles.Tiles(fold_bytes=weight_bytes - 1),
                 at=gpu_tiles.Tiles(fold_bytes=weight_bytes))
  monkeypatch.setattr(gpu_tiles, "TILE_PRESETS", presets)
  assert paths.folds_nothing(model, "under")
  assert not paths.folds_nothing(model, "at")
  assert not paths.folds_nothing(model, "mma")
  assert not paths.folds_nothing(model, "mma_fold")  # 64 MiB: a tiny layer
  # The tiles group leaves the target out under both, and under a preset
  # that spreads layers over many programs (for small models).
  assert [
      paths.target_skips(model, p)
      for p in ("under", "at", "mma", "mma_persistent", "tall_mma_persistent")
  ] == [True, False, False, True, True]


class _Bench:
  """`physics.Bench.time`'s shape: 1 ms for each variant it is given."""

  def __init__(self):
    self.timed = None

  def time(self, fns):
    self.timed = list(fns)
    return {"ms": {n: 1.0 for n in fns}}


def _failing(_):
  raise ValueError("no tiles\nsecond line")


def test_timed_variants_time_what_compiled_before_the_deadline():
  variants = {"a": lambda _: jnp.ones(2), "b": _failing, "c": jnp.ones}
  b = _Bench()
  out = paths._timed_variants(b, variants, "a", common.Deadline(100.0))
  assert b.timed == ["a", "c"] and out["skipped"] == []
  assert out["errors"] == {"b": "ValueError: no tiles"}
  assert set(out["compile_s"]) == {"a", "b", "c"}
  assert out["vs_reference"] == {"a": 1.0, "c": 1.0}
  # No time left: nothing compiled or timed, every variant named skipped.
  b = _Bench()
  out = paths._timed_variants(b, variants, "a", common.Deadline(1.0))
  assert b.timed is None and "ms" not in out
  assert out["skipped"] == ["a", "b", "c"]


def test_main_job_tiles_name_a_preset_or_a_pair_of_them():
  """`common.tiles_pair`: 'p' for both models, 'a+b' the target's and the
  draft's; anything else refused naming the setting and what is allowed
  (checked by `settings_for`, before any phase)."""
  presets = gpu_tiles.TILE_PRESETS
  assert common.tiles_pair("mma_split") == (presets["mma_split"],) * 2
  assert common.tiles_pair("mma_split+mma_persistent") == (
      presets["mma_split"], presets["mma_persistent"])
  for bad in ("huge", "mma_split+huge", "mma+mma+mma"):
    with pytest.raises(
        ValueError, match=f"main_job_tiles: '{re.escape(bad)}'"
        "; allowed: a preset or 'target's\\+draft's'"):
      common.tiles_pair(bad)
  for mode in ("full", "small"):
    assert any("+" in n for n in common.settings_for(mode).main_job_tiles)
