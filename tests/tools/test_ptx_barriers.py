"""The loads a run of layers' programs issue before each barrier, read from
PTX (`tools.benchmarks.ptx_barriers`); from PTX that XLA compiled for an
H200: tests/e2e/test_gpu_aot_e2e.py."""
import pytest

from tools.benchmarks import ptx_barriers

# Two stages of a kernel as Triton writes them: a stage's loads and
# store, then (the second time) the next stage's weights, then the arrival
# and the spin's read of the counter; the give-up's exchange is no add.
_STAGE = """\
\tmov.u16 %rs1, 0x0; @%p1 ld.global.b16 { %rs1 }, [ %rd1 + 0 ];
\t@%p2 st.global.b16 [ %rd2 + 0 ], { %rs1 };
{prefetch}\tbar.sync 0;
\tmov.u32 %r1, 0x0; @%p3 atom.global.gpu.acq_rel.add.u32 %r1, [ %rd3 + 0 ], %r2;
$L__BB0_4:
\tmov.u32 %r3, 0x0; @%p3 atom.global.gpu.acq_rel.add.u32 %r3, [ %rd3 + 0 ], %r4;
\t@%p4 bra $L__BB0_4;
\tmov.u32 %r5, 0x0; @%p3 atom.global.gpu.acq_rel.exch.b32 %r5, [ %rd3 + 0 ], %r6;
"""
_WEIGHTS = ("\tmov.u32 %r7, 0x0; ld.global.v4.b32 { %r7, %r8, %r9, %r10 }, "
            "[ %rd4 + 0 ];\n") * 3


def _kernel(name, *prefetched):
  return f".visible .entry {name}(\n" + "".join(
      _STAGE.replace("{prefetch}", _WEIGHTS if p else "") for p in prefetched)


def test_loads_between_a_stages_stores_and_its_barrier_are_counted():
  """The next stage's weights loaded before a barrier are counted; the
  stage's own loads (before its store) and the spin's reads are not."""
  body = _kernel("decode_layers", False, True)
  assert ptx_barriers.loads_at_barriers(body) == [0, 3]
  with pytest.raises(ValueError, match="5 acquire-release adds"):
    ptx_barriers.loads_at_barriers(body + _STAGE.splitlines()[3])


def test_only_the_runs_of_layers_are_read(tmp_path):
  """Of a file's kernels, those named decode_layers*; files not PTX, and
  kernels without barriers, are left out."""
  ptx = (_kernel("decode_layers", True) + _kernel("decode_rms_dense", True) +
         _kernel("decode_layers_1", False, True) +
         ".visible .entry decode_layers_2(\n\tret;\n")
  (tmp_path / "module_0001.jit_loop.9.ptx").write_text(ptx)
  (tmp_path / "module_0001.jit_loop.txt").write_text(_kernel("decode_layers"))
  assert set(ptx_barriers.kernels(ptx)) == {
      "decode_layers", "decode_layers_1", "decode_layers_2"
  }
  assert ptx_barriers.dumped(str(tmp_path)) == {
      "module_0001.jit_loop.9.ptx:decode_layers": [3],
      "module_0001.jit_loop.9.ptx:decode_layers_1": [0, 3],
  }


def test_a_dump_without_ptx_is_an_error_not_no_barriers(tmp_path):
  """JAX 0.11's XLA writes no PTX for a deviceless compile: an empty
  reading would say a kernel has no barriers."""
  (tmp_path / "module_0001.jit_loop.txt").write_text(_kernel("decode_layers"))
  with pytest.raises(ValueError, match="no PTX in XLA's dump"):
    ptx_barriers.dumped(str(tmp_path))
