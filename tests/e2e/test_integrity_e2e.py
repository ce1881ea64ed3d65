"""Integrity of what the harness reads back from disk, end to end (issue
42; the rest: tests/harness/test_integrity.py): a truncated cached CPU
kernel does not crash a fresh process, `train` refuses to resume with
another vocabulary of the same size, a corrupt compilation cache entry is
named once and written again, and the compilation cache is locked between
processes.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from specdec_jax import checkpoints
from specdec_jax import train as train_lib
from specdec_jax.checkpoints import digests
from specdec_jax.core import kernels
from specdec_jax.core.models import T5Config
from specdec_jax.data import vocab as vocabulary
from specdec_jax.files import compilation_cache
from specdec_jax.training import checkpointing

from conftest import REPO
import kernel_helpers

pytestmark = pytest.mark.slow


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
  return kernel_helpers.fake_compiler(tmp_path, monkeypatch)


def _env(**extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.update(extra)
  return env


def test_truncated_kernel_does_not_crash_the_process(kernel_cache):
  path = kernels.build()
  size = path.stat().st_size
  code = ("from specdec_jax.core import kernels; "
          "print('available', kernels.available())")
  for command in ([sys.executable, "-c",
                   code], [sys.executable, "-m", "specdec_jax.core.kernels"]):
    with open(path, "r+b") as f:
      f.truncate(size // 2)  # ELF headers intact: loading it is a SIGBUS.
    done = subprocess.run(command, capture_output=True, text=True, env=_env(),
                          cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert path.stat().st_size == size
  assert "available True" in subprocess.run([sys.executable, "-c", code],
                                            capture_output=True, text=True,
                                            env=_env(), cwd=REPO, timeout=300,
                                            check=True).stdout
  assert kernel_helpers.builds(kernel_cache) == 3


def _corpus(path, words, n=60):
  lines = [
      f"{words[i % len(words)]} {words[(3 * i) % len(words)]} {i}"
      for i in range(n)
  ]
  path.write_text("\n".join(lines) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def two_vocabularies(tmp_path_factory):
  """Two T5-style SentencePiece models of the same size, other pieces."""
  root = tmp_path_factory.mktemp("vocab")
  out = []
  for name, words in (("a", ["dog", "cat", "man", "runs", "sits", "red"]),
                      ("b", ["hund", "katze", "mann", "lauft", "rot",
                             "sitzt"])):
    corpus = _corpus(root / f"{name}.txt", words)
    out.append(vocabulary.train_sentencepiece(corpus, root / name, 30))
  sizes = [vocabulary.load_sentencepiece(p).get_piece_size() for p in out]
  assert sizes == [30, 30]
  return root, out


def _train_kwargs(root, model_dir, spm):
  return dict(
      model_dir=str(model_dir), num_steps=0, spm_model_path=spm,
      model_config=T5Config(vocab_size=128, emb_dim=8, num_heads=1, head_dim=4,
                            mlp_dim=8, num_encoder_layers=1,
                            num_decoder_layers=1),
      source_file=str(root / "a.txt"), reference_file=str(root / "b.txt"),
      batch_size=2, eval_num_examples=0)


def test_resume_refuses_another_vocabulary(tmp_path, two_vocabularies):
  root, (spm_a, spm_b) = two_vocabularies
  model_dir = tmp_path / "model"
  train_lib.train(**_train_kwargs(root, model_dir, spm_a))
  assert [s for s, _ in checkpoints.list_checkpoints(str(model_dir))] == [0]
  config_gin = model_dir / "config.gin"
  config_gin.write_text("# the first run's record\n")
  with pytest.raises(ValueError) as e:
    train_lib.train(**_train_kwargs(root, model_dir, spm_b))
  message = str(e.value)
  assert spm_b in message and os.path.basename(spm_a) in message
  assert config_gin.read_text() == "# the first run's record\n"
  # The same vocabulary resumes.
  result = train_lib.train(**_train_kwargs(root, model_dir, spm_a))
  assert result.start_step == 0
  record = json.loads((model_dir / checkpointing.VOCABULARY_FILE).read_text())
  assert record["sha256"] == digests.digest(pathlib.Path(spm_a).read_bytes())


_JIT = ("import jax, jax.numpy as jnp\n"
        "from specdec_jax.files import compilation_cache\n"
        "compilation_cache.enable()\n"
        "print(jax.jit(lambda x: x * 2 + 1)(jnp.arange(3.0)))\n")


def _jit_run(folder):
  return subprocess.run([sys.executable, "-c", _JIT], capture_output=True,
                        text=True, env=_env(JAX_COMPILATION_CACHE_DIR=folder),
                        cwd=REPO, timeout=300, check=True)


def test_corrupt_compilation_cache_is_named_and_repaired(tmp_path):
  folder = str(tmp_path / "jax-cache")
  _jit_run(folder)
  entries = sorted(pathlib.Path(folder).glob("*-cache"))
  assert len(entries) >= 2
  for entry in entries:
    entry.write_bytes(b"garbage")
  err = _jit_run(folder).stderr
  lines = [line for line in err.splitlines() if "compilation cache" in line]
  assert len(lines) == 1, err
  assert folder in lines[0] and "rm -rf" in lines[0]
  assert all(e.stat().st_size > 100 for e in entries)  # Written again.
  assert "compilation cache" not in _jit_run(folder).stderr


def test_the_compilation_cache_works_without_filelock(tmp_path):
  """An environment without filelock (the device check's small mode, run
  in a GPU image's packages, turns the cache on): JAX refuses a size
  limit there; every read and write failed, and each run named a valid
  entry unreadable."""
  folder = str(tmp_path / "jax-cache")
  script = "import sys; sys.modules['filelock'] = None\n" + _JIT

  def run():
    err = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, env=_env(JAX_COMPILATION_CACHE_DIR=folder),
                         cwd=REPO, timeout=300, check=True).stderr
    assert "compilation cache" not in err, err
    return {
        e.name: e.stat().st_mtime_ns
        for e in pathlib.Path(folder).glob("*-cache")
    }

  written = run()
  assert len(written) >= 2
  assert run() == written  # Read back: neither removed nor written again.


def test_the_compilation_cache_is_locked_between_processes():
  """A size limit turns on JAX's file lock for every read and write of the
  cache folder: a process never reads an entry another is still writing
  (XLA aborted on one in a warm CI run's two workers)."""
  script = ("import jax; from jax._src import compilation_cache as cc\n"
            "from specdec_jax.files import compilation_cache\n"
            "compilation_cache.enable()\n"
            "jax.jit(lambda x: x + 1)(1.0)\n"
            "print(jax.config.jax_compilation_cache_max_size,"
            " cc._cache.eviction_enabled)")
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMP")}
  env["JAX_COMPILATION_CACHE_DIR"] = os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                                    "")
  done = subprocess.run([sys.executable, "-c", script], env={
      k: v for k, v in env.items() if v
  }, capture_output=True, text=True, timeout=120, check=True)
  size, locked = done.stdout.split()
  assert int(size) == compilation_cache.MAX_SIZE_BYTES > 0
  assert locked == "True"
