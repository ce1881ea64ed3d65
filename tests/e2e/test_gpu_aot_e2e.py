"""The GPU programs compiled here for an H200 (`tools.benchmarks.gpu_aot`).

Needs JAX's CUDA plugin, which the test environment does not have (in it,
every JAX process would try to start CUDA): `scripts/gpu_aot.sh pytest
tests/e2e/test_gpu_aot_e2e.py` runs this file in a virtual environment
that has it (CI does); elsewhere it skips, saying so. No GPU needed.
"""
import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import REPO
from specdec_jax.core.kernels import gpu_tiles

pytestmark = pytest.mark.slow


def _plugin() -> bool:
  return any(
      importlib.util.find_spec("jax_plugins") and importlib.util.find_spec(p)
      for p in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"))


_NEEDS_PLUGIN = pytest.mark.skipif(
    not _plugin(), reason="JAX's CUDA plugin is not installed: "
    "scripts/gpu_aot.sh pytest tests/e2e/test_gpu_aot_e2e.py runs this file "
    "with it (no GPU needed)")


def _compiled(tmp_path, *flags, timeout=600):
  """`gpu_aot --small` with `flags` in a fresh process: its JSON."""
  out = tmp_path / "aot.json"
  run = subprocess.run([
      sys.executable, "-m", "tools.benchmarks.gpu_aot", "--small", *flags,
      f"--output={out}"
  ], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(out.read_text())


@_NEEDS_PLUGIN
def test_fused_layers_compile_for_an_h200_in_six_triton_kernels(tmp_path):
  """Compiled by XLA:GPU and Triton for sm_90 in a fresh process (the
  plugin registers only before JAX's backends start): the 'fused' path
  launches 6 Triton kernels per decoder layer per step, fewer than XLA's
  path, and each tile preset reaches Triton."""
  result = _compiled(tmp_path, "--groups=layers,tiles", "--paths=xla,fused")
  assert result["device"] == "NVIDIA H200"
  fused, xla = result["layers"]["fused"], result["layers"]["xla"]
  per_layer = (fused["layers_2"]["triton_calls"] -
               fused["layers_1"]["triton_calls"])
  assert per_layer == 6 and fused["per_decoder_layer"] == 6, fused
  assert xla["layers_2"]["triton_calls"] == 0
  assert xla["per_decoder_layer"] > fused["per_decoder_layer"], xla
  for name, preset in gpu_tiles.TILE_PRESETS.items():
    assert result["tiles"][name]["num_warps"] == [preset.num_warps], name
    assert result["tiles"][name]["spills"] == {}, name  # At one token.


# The loops compiled under the presets asserted on below, not under every
# preset that runs layers together (8: with the layers and tiles in the
# same process it ran past 600 s on a 2-vCPU host, 2026-12-01).
_LOOP_PRESETS = ("mma_layer", "mma_layer_fold", "mma_persistent",
                 "tall_mma_persistent_prefetch")


@_NEEDS_PLUGIN
def test_the_shipped_pairs_loops_compile_for_an_h200(tmp_path):
  """An iteration of the shipped pair's speculative loop spends one kernel
  on its statistics, and on 'fused' has no loop or branch inside; under
  the presets that run layers together, fewer kernels."""
  result = _compiled(tmp_path, "--groups=loops", "--paths=xla,fused",
                     f"--presets={','.join(_LOOP_PRESETS)}")
  assert result["device"] == "NVIDIA H200"
  assert {k for k in result["loops"]["shipped"] if "@" in k
         } == {f"fused@{p}" for p in _LOOP_PRESETS}
  for path, loops_and_branches in (("xla", (1, 1)), ("fused", (0, 0))):
    spec = result["loops"]["shipped"][path]["speculative"]
    assert spec["body_by_part"].get("statistics") == 1, (path, spec)
    # On a GPU's path the draft steps are unrolled, its catch-up no branch.
    assert (spec["nested_loops"],
            len(spec["conditionals"])) == loops_and_branches, (path, spec)
  # The emit is the buffer's select (`loops.emit_verdict`: no stacked
  # window, no scatter, no EOS reduction: each a kernel of its own); `done`
  # and the loop's test are one kernel, and the test computation none
  # (`loops.until_done`), in both loops.
  spec = result["loops"]["shipped"]["fused"]["speculative"]
  assert spec["body_by_part"]["emit"] == 1, spec
  for loop in ("baseline", "speculative"):
    assert result["loops"]["shipped"]["fused"][loop]["condition"] == 0, loop
  # Each kernel outside the model calls named (`outside_model_call_kernels`).
  named = spec["outside_model_call_kernels"]
  assert len(named) == spec["outside_model_calls"], named
  assert [k.split(" -> ")[0] for k in named if k.startswith("emit:")
         ] == ["emit: emit/jit(_where)/select_n"], named
  # The shipped draft's two layers as one kernel (`Tiles.layer_bytes`):
  # Triton compiles it for an H200 without spills, and an iteration
  # launches 2 x 6 - 1 kernels fewer per draft step; in steps 2..γ the
  # kernel also takes the argmax of the last step's logits and gathers the
  # embedding (XLA: a reduce and a gather each), but the catch-up's row of
  # logits is then selected by a kernel of its own (XLA fuses it into the
  # argmax otherwise).
  fused = result["loops"]["shipped"]["fused"]["speculative"]
  one = result["loops"]["shipped"]["fused@mma_layer"]["speculative"]
  assert one["spills"] == {}, one
  assert fused["body"] - one["body"] == (2 * 6 - 1) * 3 + 2 * 2 - 1, (
      fused["body"], one["body"])
  # And the 38M target's 8 layers in three kernels each (`Tiles.
  # fold_bytes`), their partial sums added once in XLA before the logits:
  # 3 kernels fewer a layer, one more a call, in both loops; and in the
  # baseline the embedding's gather in the kernel too (in the speculative
  # loop XLA fuses it with the chunk's tokens).
  for loop, unfolded, gather in (("speculative", one, 0), (
      "baseline", result["loops"]["shipped"]["fused"]["baseline"], 1)):
    folded = result["loops"]["shipped"]["fused@mma_layer_fold"][loop]
    assert folded["spills"] == {}, folded
    assert unfolded["body"] - folded["body"] == 3 * 8 - 1 + gather, (
        loop, unfolded["body"], folded["body"])
  # Layers over the whole GPU apart by barriers (`Tiles.programs`): the
  # target's 8 layers a kernel each, the draft's two one kernel; Triton
  # compiles the barriers' atomics for an H200 (the draft's steps that
  # take the last one's argmax spill 8 B a thread; with `Tiles.prefetch`
  # the float32 target's blocks held across barriers spill nothing), and
  # an iteration launches under a third of the kernels of the six a layer.
  for preset in ("mma_persistent", "tall_mma_persistent_prefetch"):
    for loop in ("baseline", "speculative"):
      many = result["loops"]["shipped"][f"fused@{preset}"][loop]
      assert all(store <= 16 for store, _ in many["spills"].values()), many
      six = result["loops"]["shipped"]["fused"][loop]["body"]
      assert 3 * many["body"] < six, (many["body"], six)
      # The barriers' counters carried in the caches: no copy a call (the
      # speculative loop's one copy is not theirs).
      copies = many["body_by_part"].get("copies", 0)
      assert copies == (loop == "speculative"), (preset, loop, many)


@_NEEDS_PLUGIN
def test_prefetched_weights_are_loaded_before_each_barrier(tmp_path):
  """`Tiles.prefetch` in the PTX XLA gives ptxas (`ptx_barriers`): in each
  run of layers of the small decoder's one-token and 8-token calls a
  program issues loads for the next stage before every barrier (its
  weights; before an attention its biases or the encoder's keys), and
  none without it; nothing spills."""
  result = _compiled(
      tmp_path, "--groups=barriers",
      "--presets=tall_mma_persistent,tall_mma_persistent_prefetch",
      timeout=300)["barriers"]
  for preset, prefetch in (("tall_mma_persistent", False),
                           ("tall_mma_persistent_prefetch", True)):
    assert set(result[preset]) == {"k_1", "k_8"}, result[preset]
    for call, r in result[preset].items():
      assert r["spills"] == {} and r["loads"], (preset, call, r)
      for kernel, counts in r["loads"].items():
        assert [c > 0 for c in counts
               ] == [prefetch] * len(counts), (preset, call, kernel, counts)


@_NEEDS_PLUGIN
def test_grids_read_each_triton_calls_programs(tmp_path):
  """The grids group reads the programs of every Triton call of the fused
  step: one program per head in the attention kernels (the tiny model's
  2), and with the projections split out (`Tiles.split_heads`) a kernel
  more per attention sublayer, with more programs than heads."""
  grids = _compiled(tmp_path, "--groups=grids", "--presets=mma,mma_split",
                    timeout=300)["grids"]["small"]
  one = grids["mma"]["by_kernel"]
  assert sum(r["calls"] for r in one.values()) == 6 + 1, one  # A layer's
  # six, the logits'.
  assert one["decode_self_attention@2"]["calls"] == 1
  assert one["decode_cross_attention@2"]["calls"] == 1
  split = grids["mma_split"]["by_kernel"]
  heads = [r["programs"] for n, r in split.items() if "head_projection" in n]
  assert sum(r["calls"] for r in split.values()) == 6 + 1 + 2, split
  assert max(heads) > 2, split
  for g in grids.values():
    assert all(r["bytes_per_program"] > 0 for r in g["by_kernel"].values())
    assert g["predicted_ms"] > 0
