"""A stand-in C++ compiler for the CPU kernel's cache, shared by the quick
and the end-to-end integrity tests (tests/harness/test_integrity.py,
tests/e2e/test_integrity_e2e.py).

`fake_compiler(tmp_path, monkeypatch)` points SPECDEC_JAX_CACHE at a fresh
folder and CXX at a script that copies a good library into place (fast)
and counts its calls, which `builds(tmp_path)` reads back.
"""
import pathlib

import pytest

from specdec_jax.core import kernels


def fake_compiler(tmp_path: pathlib.Path, monkeypatch) -> pathlib.Path:
  """A cache dir whose 'compiler' copies a good library (fast) and counts
  its calls in `builds.txt`; skips where no C++ compiler is found."""
  compiler = kernels._compiler()  # pylint: disable=protected-access
  if compiler is None:
    pytest.skip("no C++ compiler: the CPU kernel is never built here.")
  good = tmp_path / "good.so"
  good.write_bytes(kernels.build().read_bytes())
  fake = tmp_path / "fake-cxx"
  fake.write_text("#!/bin/sh\n"
                  f"echo build >> {tmp_path / 'builds.txt'}\n"
                  'while [ $# -gt 0 ]; do\n'
                  f'  if [ "$1" = -o ]; then cp {good} "$2"; exit 0; fi\n'
                  "  shift\n"
                  "done\n"
                  "exit 1\n")
  fake.chmod(0o755)
  cache = tmp_path / "cache"
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(cache))
  monkeypatch.setenv("CXX", str(fake))
  return tmp_path


def builds(root: pathlib.Path) -> int:
  """How many times the fake compiler ran."""
  path = root / "builds.txt"
  return len(path.read_text().splitlines()) if path.exists() else 0
