"""A CPU matmul for the few-row products of decoding (`cpu_matmul.cc`).

On XLA:CPU, a [M, D] x [D, N] product with 2 <= M <= 16 (a speculative
verification call feeds M = batch x (γ+1) rows) goes to a GEMM library that
repacks the whole weight matrix on every call: a 6-token decoder call costs
~2.5x a one-token call although it reads the same weights. Here each decoder
weight is packed once, when the model is prepared for decoding (`pack`,
`T5Model.prepared_for_decoding`), into panels of 16 columns [P, D, 16]; the
compiled kernel (XLA FFI) then streams every panel once per call with a
register tile of up to 8 rows (AVX-512; 4 with AVX2), so the call costs what its weights and FLOPs
cost; each tile prefetches its panels' streams ahead, so that on a
decoder streamed from memory the FLOPs of a few rows hide under the stream. Every output element is the same chain of fused multiply-adds in the
same order whatever the number of rows, so a row of a K-token call is
bit-identical to a one-token call on that row: greedy speculative decoding
and the greedy baseline agree exactly, not just within rounding.

`dense(x, kernel)` is the one entry point: a packed (3-D) kernel goes to the
compiled kernel when x has <= `MAX_ROWS` rows, else to an XLA einsum on the
packed layout; a plain 2-D kernel always goes to XLA's dot. Packing happens
only where the kernel can run (`packing_enabled`: float32, a single CPU
device, the library built), so accelerators and sharded programs keep XLA's
own dot.

The kernel is compiled once per machine with the system C++ compiler into a
cache directory (`SPECDEC_JAX_CACHE`, default `~/.cache/specdec_jax`):
`python -m specdec_jax.core.kernels` does it at install time (the README's
install commands) and says which path decoding will take; otherwise the first
use compiles it (~10 s). Each build records the library's size and
SHA-256 beside it (`libspecdec_cpu_<key>.json`); a library that does not
match its record, or has none, is rebuilt before it is loaded: loading a
truncated one (a full disk, a killed copy) is a SIGBUS, not an error.
Without a compiler, or with `SPECDEC_JAX_CPU_KERNEL=0` (or false, no, off:
`environment.flag`), nothing is packed and XLA's dot is used.
`SPECDEC_JAX_KERNEL_ISA=avx2` (or `portable`, `avx512`) caps the
instruction set the kernel uses (`instruction_set`), to compare the paths;
results are the same bits. A bad value of either, or a SPECDEC_JAX_CACHE
that is a file, is refused (`environment.BadEnvironment`), never a silent
fallback.
"""

import functools
import hashlib
import json
import logging
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import environment

MAX_ROWS = 64
TARGET_NAME = "specdec_packed_matmul"
_SOURCE = pathlib.Path(__file__).with_name("cpu_matmul.cc")
_ENV_SWITCH = "SPECDEC_JAX_CPU_KERNEL"
_ENV_ISA = "SPECDEC_JAX_KERNEL_ISA"  # Caps the instruction set (benchmarks).

log = logging.getLogger(__name__)
# The library `available` loaded (ctypes handle), for `instruction_set`.
_loaded: Dict[str, Any] = {}

# XLA:CPU only, for `decoding.loops`: the speculative loop runs its XLA
# dots (attention over K rows, small bookkeeping) on the calling thread. Its many small ops lose
# more to Eigen's thread-pool handoffs, next to the matmul kernel's own
# threads, than they gain: -14% per iteration on the shipped pair (γ = 3,
# interleaved in one process), while the baseline's one-row loop is faster
# with the pool and keeps it. Compiler options are per program, so each
# decoder gets its own best setting (README, "How it stays exact and fast").
#
# The speculative loops: XLA:CPU's default copy insertion copies every
# KV-cache array twice per call inside a while loop (the attention reads the
# cache that the same call then writes in place), 41 copies and 2.6 MB per
# iteration on the shipped 38M target; its region analysis proves the reads
# come first and inserts none (`tests/core/test_in_place_caches.py`). Same
# arithmetic, same tokens. The baseline keeps XLA's default: in place, its
# loop ran 6% slower on the main job (host B, interleaved; probably the
# copies had run beside the attention on Eigen's threads)
# (docs/results/2026-11-26-in-place-caches.md).
CPU_IN_PLACE_COMPILER_OPTIONS = {
    "xla_cpu_copy_insertion_use_region_analysis": True
}
CPU_BASELINE_COMPILER_OPTIONS: dict = {}
CPU_SPECULATIVE_COMPILER_OPTIONS = {
    "xla_cpu_multi_thread_eigen": False,
    **CPU_IN_PLACE_COMPILER_OPTIONS
}


def _cache_dir() -> pathlib.Path:
  """Under `environment.cache_dir()` (BadEnvironment: SPECDEC_JAX_CACHE is
  a file)."""
  return pathlib.Path(environment.cache_dir()) / "kernels"


def switched_on() -> bool:
  """SPECDEC_JAX_CPU_KERNEL (`environment.flag`; BadEnvironment)."""
  return environment.flag(_ENV_SWITCH, True)


def _isa_cap() -> Optional[str]:
  """SPECDEC_JAX_KERNEL_ISA, or None (`environment.choice`)."""
  return environment.choice(_ENV_ISA, INSTRUCTION_SETS)


def check_environment() -> None:
  """Reads the kernel's variables (switch, cap, cache folder) now: a
  command refuses a bad one at its start, not at the first model.

  Raises:
    environment.BadEnvironment: naming the variable and what is allowed.
  """
  switched_on()
  _isa_cap()
  _cache_dir()


def _compiler() -> Optional[str]:
  return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _library_path(compiler: str) -> pathlib.Path:
  """Where the library for this source, jaxlib and compiler lives."""
  import jaxlib  # pylint: disable=g-import-not-at-top
  key = hashlib.sha256(_SOURCE.read_bytes() + jaxlib.__version__.encode() +
                       compiler.encode()).hexdigest()[:16]
  return _cache_dir() / f"libspecdec_cpu_{key}.so"


def _file_record(path: pathlib.Path) -> Dict[str, Any]:
  data = path.read_bytes()
  return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _record_path(library: pathlib.Path) -> pathlib.Path:
  return library.with_suffix(".json")


def _intact(library: pathlib.Path) -> bool:
  """Whether `library` is the file its build recorded (size and SHA-256).

  `ctypes` maps the file: a truncated library passes `dlopen`'s header
  checks and then kills the process with SIGBUS, so a cached file is
  checked against the record before it is loaded. Both must be regular
  files, the record small and the library its recorded size, before
  either is read (a FIFO there would block, /dev/zero never end).
  """
  try:
    record_path = _record_path(library)
    if _regular_size(record_path) > _MAX_RECORD_BYTES:
      return False
    record = json.loads(record_path.read_text())
    if (not isinstance(record, dict) or
        _regular_size(library) != record.get("bytes")):
      return False
    return record == _file_record(library)
  except (OSError, ValueError):
    return False


_MAX_RECORD_BYTES = 4096


def _regular_size(path: pathlib.Path) -> int:
  """`path`'s size; OSError unless it is a regular file (links followed)."""
  info = path.stat()
  if not stat.S_ISREG(info.st_mode):
    raise OSError(f"{path} is not a regular file")
  return info.st_size


def _write_record(library: pathlib.Path, record: Dict[str, Any]) -> None:
  """The record beside `library`, atomically (temporary file, rename)."""
  fd, tmp = tempfile.mkstemp(suffix=".json.tmp", dir=library.parent)
  with os.fdopen(fd, "w") as f:
    json.dump(record, f)
  os.replace(tmp, _record_path(library))


def build(force: bool = False) -> pathlib.Path:
  """Compiles `cpu_matmul.cc` (if needed); returns the shared library path.

  A cached library is reused only if it matches its record (`_intact`);
  otherwise (truncated, changed, built before records existed) it is
  compiled again.

  Raises:
    RuntimeError: no C++ compiler, or the compilation failed (with its
      output).
  """
  compiler = _compiler()
  if compiler is None:
    raise RuntimeError("no C++ compiler found (set CXX, or install g++).")
  path = _library_path(compiler)
  if not force and path.exists():
    if _intact(path):
      return path
    log.warning("CPU matmul kernel %s: %s; rebuilding it.", path,
                ("it does not match its record"
                 if _record_path(path).exists() else "no record of its build"))
  path.parent.mkdir(parents=True, exist_ok=True)
  # Compile to a temporary name, then rename: concurrent builds (pytest
  # workers, several processes of one run) never load a half-written file.
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
  os.close(fd)
  cmd = [
      compiler, "-O3", "-std=c++17", "-shared", "-fPIC", "-fno-fast-math",
      "-ffp-contract=off", f"-I{jax.ffi.include_dir()}",
      str(_SOURCE), "-o", tmp
  ]
  result = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    os.unlink(tmp)
    raise RuntimeError(f"compiling {_SOURCE.name} failed:\n{' '.join(cmd)}\n"
                       f"{result.stderr[-4000:]}")
  record = _file_record(pathlib.Path(tmp))
  os.replace(tmp, path)
  # After the library: a reader between the two sees a mismatch and
  # rebuilds, never an unchecked file.
  _write_record(path, record)
  return path


@functools.lru_cache(maxsize=None)
def available() -> bool:
  """Whether the CPU kernel is built and registered (builds it if needed).

  Raises:
    environment.BadEnvironment: a bad SPECDEC_JAX_CPU_KERNEL,
      SPECDEC_JAX_KERNEL_ISA or SPECDEC_JAX_CACHE (refused, not a silent
      fallback to XLA's dot).
  """
  check_environment()
  if not switched_on():
    return False
  cap = _isa_cap()  # A benchmark comparing the paths.
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    library = ctypes.cdll.LoadLibrary(str(build()))
    _loaded["library"] = library
    if cap:
      library.SpecdecKernelIsa(INSTRUCTION_SETS.index(cap))
    jax.ffi.register_ffi_target(TARGET_NAME,
                                jax.ffi.pycapsule(library.SpecdecPackedMatmul),
                                platform="cpu")
    return True
  except (RuntimeError, OSError) as e:
    _loaded["error"] = str(e)
    log.warning("CPU matmul kernel unavailable, using XLA's dot: %s", e)
    return False


PANEL = 16  # Columns per packed panel (two AVX2 vectors); cpu_matmul.cc's.
# The kernel's instruction sets, widest last (`instruction_set`).
INSTRUCTION_SETS = ("portable", "avx2", "avx512")


def instruction_set(cap: Optional[str] = None) -> str:
  """The instruction set kernel calls use, after capping it at `cap`.

  Every path computes each element by the same chain of FMAs, so they agree
  bit for bit; tests and benchmarks compare them by capping (the cap holds
  for the whole process until changed). None only reads.

  Raises:
    ValueError: `cap` is not one of `INSTRUCTION_SETS`.
    RuntimeError: the kernel is not available.
  """
  if cap is not None and cap not in INSTRUCTION_SETS:
    raise ValueError(f"instruction set cap must be one of {INSTRUCTION_SETS}, "
                     f"got {cap!r}.")
  if not available():
    raise RuntimeError("the CPU kernel is not available.")
  request = -1 if cap is None else INSTRUCTION_SETS.index(cap)
  return INSTRUCTION_SETS[_loaded["library"].SpecdecKernelIsa(request)]


def packing_enabled(dtype=jnp.float32) -> bool:
  """Whether decoder weights of this dtype should be packed for the kernel.

  Decided on the host, once per model: float32, one CPU device (a sharded
  program keeps XLA's dot, which SPMD can partition), the library built.
  """
  return (jnp.dtype(dtype) == jnp.float32 and jax.default_backend() == "cpu" and
          jax.device_count() == 1 and available())


def pack(kernel: jax.Array) -> jax.Array:
  """[D, N] -> panels [ceil(N/16), D, 16] (zero columns past N)."""
  d_size, n_size = kernel.shape
  panels = -(-n_size // PANEL)
  padded = jnp.pad(kernel, ((0, 0), (0, panels * PANEL - n_size)))
  return padded.reshape(d_size, panels, PANEL).transpose(1, 0, 2)


def unpack(panels: jax.Array, n_size: int) -> jax.Array:
  """The inverse of `pack`: [P, D, 16] -> [D, n_size]."""
  num_panels, d_size, _ = panels.shape
  return panels.transpose(1, 0, 2).reshape(d_size,
                                           num_panels * PANEL)[:, :n_size]


def _einsum_packed(x2d, panels, n_size):
  y = jnp.einsum("md,pdr->mpr", x2d, panels)
  return y.reshape(x2d.shape[0], -1)[:, :n_size]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _packed_matmul(x2d, panels, n_size):
  """[M, D] @ packed [P, D, 16] -> [M, n_size] by the compiled kernel."""
  call = jax.ffi.ffi_call(
      TARGET_NAME, jax.ShapeDtypeStruct((x2d.shape[0], n_size), jnp.float32),
      vmap_method="sequential")
  return call(x2d, panels)


def _packed_matmul_fwd(x2d, panels, n_size):
  return _packed_matmul(x2d, panels, n_size), (x2d, panels)


def _packed_matmul_bwd(n_size, residuals, grad):
  x2d, panels = residuals
  return jax.vjp(lambda a, b: _einsum_packed(a, b, n_size), x2d,
                 panels)[1](grad)


_packed_matmul.defvjp(_packed_matmul_fwd, _packed_matmul_bwd)


def dense(x: jax.Array, kernel: jax.Array, n_size: int) -> jax.Array:
  """x [..., D] @ kernel -> [..., n_size] (see the module docstring).

  Args:
    x: [..., D] inputs.
    kernel: [D, n_size] (T5X's layout) or its `pack`ed form
      [ceil(n_size/16), D, 16].
    n_size: output features (static).
  """
  if kernel.ndim == 2:
    return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
  lead = x.shape[:-1]
  x2d = x.reshape(-1, x.shape[-1])
  if x2d.shape[0] <= MAX_ROWS and x.dtype == jnp.float32 and available():
    y = _packed_matmul(x2d, kernel, n_size)
  else:  # Long inputs (cross-attention keys, teacher forcing).
    y = _einsum_packed(x2d, kernel.astype(x.dtype), n_size)
  return y.reshape(*lead, n_size)


def main() -> int:
  """`python -m specdec_jax.core.kernels`: build now and report the decode
  path. Exit 2: a bad variable (one line); 1: built but not loadable; 0:
  built and loaded, switched off, or no compiler (XLA's dot, correct)."""
  try:
    check_environment()
  except environment.BadEnvironment as e:
    print(f"specdec_jax.core.kernels: error: {e}", file=sys.stderr)
    return 2
  try:
    path = build(force="--force" in sys.argv)
  except RuntimeError as e:
    print(f"specdec_jax: CPU matmul kernel NOT built ({e}); decoding on CPU "
          "uses XLA's dot (correct, slower verification calls).")
    return 0
  if not switched_on():
    print(f"specdec_jax: CPU matmul kernel built: {path}; switched off "
          f"({_ENV_SWITCH}={os.environ.get(_ENV_SWITCH)!r}): decoding uses "
          "XLA's dot.")
    return 0
  if not available():
    print(
        f"specdec_jax.core.kernels: error: the CPU matmul kernel {path} "
        f"was built but cannot be loaded ({_loaded.get('error')}); "
        "decoding would use XLA's dot.", file=sys.stderr)
    return 1
  print(f"specdec_jax: CPU matmul kernel built: {path} ({instruction_set()})")
  return 0
