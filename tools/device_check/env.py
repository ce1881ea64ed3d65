"""The environment phase: what machine this is, and that the GPU path is
GPU-aware.

* versions (Python, JAX, jaxlib, Flax, ...), devices, `nvidia-smi`'s line;
* the two ceilings METHOD.md asks for (a device-to-device copy's bandwidth,
  counting bytes read and written; a bfloat16 matrix product's rate);
* the CPU-only parts stay on the CPU: `T5Model.prepared_for_decoding` packs
  for the CPU matmul kernel only on the CPU backend, the decoding loops
  pick their XLA:CPU compiler options only there, and a program compiled
  here with those options (as `timing` and speculative beam search pass
  them on every backend) compiles; which decode path models take here
  (`decode_paths.default_path`: 'packed' on one GPU, 'fused' opt-in) and the XLA:GPU
  options the loops get (`kernels.gpu.GPU_LOOP_OPTIONS`);
* `settings_errors`: a CPU-only setting given on another backend, or the
  full check on a CPU, is an error of one line (exit 2) before anything is
  measured.
"""
import importlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import kernels
from specdec_jax.core.decoding import loops
from specdec_jax.core.kernels import gpu
from tools.device_check import common
from tools.device_check import exactness

PACKAGES = ("jax", "jaxlib", "flax", "numpy", "scipy", "optax",
            "orbax-checkpoint", "tensorstore", "sentencepiece", "absl-py",
            "gin-config", "seqio", "tensorflow", "filelock")
# Environment settings that only the CPU backend reads.
CPU_ONLY_ENV = {
    "SPECDEC_JAX_KERNEL_ISA": "the CPU matmul kernel's instruction set",
}


def settings_errors(backend: str, mode: str,
                    environ: Mapping[str, str]) -> List[str]:
  """One line per setting that does not fit `backend` (none: []).

  Args:
    backend: `jax.default_backend()`.
    mode: 'full' or 'small'.
    environ: the environment (`os.environ`).
  """
  errors = []
  if mode == "full" and backend == "cpu":
    errors.append("the full check needs a GPU but JAX's backend is cpu "
                  "(allowed: --small on a CPU).")
  if backend != "cpu":
    for name, what in CPU_ONLY_ENV.items():
      if environ.get(name):
        errors.append(f"{name}={environ[name]!r} sets {what}, a CPU-only "
                      f"setting, but the backend is {backend} (allowed: "
                      "unset it).")
    flags = [
        f for f in environ.get("XLA_FLAGS", "").split()
        if f.startswith("--xla_cpu_")
    ]
    if flags:
      errors.append(f"XLA_FLAGS holds CPU-only flags {flags} but the backend "
                    f"is {backend} (allowed: no --xla_cpu_* flags).")
  return errors


def _versions() -> Dict[str, Optional[str]]:
  out: Dict[str, Optional[str]] = {"python": platform.python_version()}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def _nvidia_smi() -> Optional[str]:
  if not shutil.which("nvidia-smi"):
    return None
  query = ("--query-gpu=name,memory.total,driver_version,clocks.sm,"
           "clocks.max.sm,temperature.gpu,power.draw")
  done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"],
                        capture_output=True, text=True, check=False, timeout=20)
  return (done.stdout or done.stderr).strip()


def _median_seconds(fn, *args, repeats: int = 5) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def ceilings(small: bool) -> Dict[str, float]:
  """A copy's GB/s (read + written), a sum's (read only: what a decode
  step mostly does, reading weights and writing little) and a bfloat16
  product's TFLOP/s."""
  n = 1 << (20 if small else 28)  # float32 elements: 4 MiB or 1 GiB.
  x = jax.random.normal(jax.random.PRNGKey(0), (n,), jnp.float32)
  copy_s = _median_seconds(jax.jit(lambda v: v * 1.0001), x)
  read_s = _median_seconds(jax.jit(jnp.sum), x)
  d = 256 if small else 8192
  a = jax.random.normal(jax.random.PRNGKey(1), (d, d), jnp.bfloat16)
  b = jax.random.normal(jax.random.PRNGKey(2), (d, d), jnp.bfloat16)
  matmul_s = _median_seconds(jax.jit(jnp.matmul), a, b)
  return {
      "copy_gbps": 2 * 4 * n / copy_s / 1e9,
      "read_gbps": 4 * n / read_s / 1e9,
      "copy_bytes": 4 * n,
      "bf16_matmul_tflops": 2 * d**3 / matmul_s / 1e12,
      "matmul_size": d,
  }


def gpu_awareness() -> Dict[str, object]:
  """Whether the CPU-only parts stay off this backend (see the docstring)."""
  backend = jax.default_backend()
  path = exactness.tiny_models(16, 1, 0.9)[0].decode_path
  packed = path == "cpu_kernel"
  # `decoding.tree_loop` is also a function's name: the module by its name.
  tree_loop = importlib.import_module("specdec_jax.core.decoding.tree_loop")
  # The compiler options each loop gets here: XLA:CPU's on the CPU, none
  # on any other backend.
  cpu_variants = {
      name: sorted(o for o in program.options() if o.startswith("xla_cpu_"))
      for name, program in (("baseline_loop", loops.BASELINE_PROGRAM),
                            ("speculative_loop", loops.SPECULATIVE_PROGRAM),
                            ("tree_loop", tree_loop.TREE_PROGRAM))
  }
  try:
    fn = jax.jit(lambda v: v * 2.0,
                 compiler_options=kernels.CPU_SPECULATIVE_COMPILER_OPTIONS)
    jax.block_until_ready(fn(jnp.ones((4,))))
    options_compile = "ok"
  except Exception as e:  # pylint: disable=broad-except
    options_compile = f"{type(e).__name__}: {str(e).splitlines()[0]}"
  on_cpu = backend == "cpu"
  return {
      "backend": backend,
      "decode_path": path,
      "gpu_loop_options": gpu.GPU_LOOP_OPTIONS,
      "cpu_kernel_packed": packed,
      "cpu_compiler_option_programs": cpu_variants,
      "cpu_options_compile_here": options_compile,
      "ok": ((on_cpu or not packed) and
             (on_cpu or not any(cpu_variants.values())) and
             options_compile == "ok"),
  }


def run(s: common.Settings, record: common.Recorder,
        deadline: common.Deadline) -> bool:
  """The phase; True if the GPU path is GPU-aware (raises SettingsError on
  a setting that does not fit this backend)."""
  del deadline  # Seconds.
  backend = jax.default_backend()
  errors = settings_errors(backend, s.mode, os.environ)
  record.set("settings_errors", errors)
  if errors:
    raise common.SettingsError(errors[0])
  device = jax.devices()[0]
  memory = getattr(device, "memory_stats", lambda: None)() or {}
  record.set(
      "machine", {
          "backend": backend,
          "device_kind": str(device.device_kind),
          "device_count": jax.device_count(),
          "device_memory_bytes": memory.get("bytes_limit"),
          "nvidia_smi": _nvidia_smi(),
          "versions": _versions(),
          "executable": sys.executable,
          "default_matmul_precision": getattr(
              jax.config, "jax_default_matmul_precision", None),
          "env": {
              k: v
              for k, v in os.environ.items()
              if k.startswith(("JAX_", "XLA_", "SPECDEC_JAX_", "CUDA_"))
          },
      })
  common.log("env: ceilings (copy bandwidth, bf16 matmul rate)")
  record.set("ceilings", ceilings(s.mode == "small"))
  aware = gpu_awareness()
  record.set("gpu_awareness", aware)
  return bool(aware["ok"])
