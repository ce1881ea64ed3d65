"""The decode benchmark (`tools.benchmarks.decode`): synthetic acceptance,
flag errors, gin files (its JSON end to end:
tests/e2e/test_benchmarking_e2e.py).

No timing is asserted beyond positivity (the machine may be shared).
"""
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import gin
import pytest

from specdec_jax.core import decoding
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils  # noqa: F401  # registers T5Config
from specdec_jax.files.io_utils import GIN_DIR
from tools.benchmarks import common
from tools.benchmarks import decode
from tools.benchmarks import synthetic

ROWS = 20_000

GAMMA = 5


def _accepted(alpha, gamma, seed=0):
  """n for ROWS iterations of γ <= GAMMA guesses at acceptance rate alpha."""
  mask = np.asarray(
      synthetic.synthetic_accept(jax.random.PRNGKey(seed), (ROWS, GAMMA),
                                 alpha=np.float32(alpha)))
  assert mask.dtype == bool and mask.shape == (ROWS, GAMMA)
  return np.asarray(
      decoding.sampling.leading_accepted(jnp.asarray(mask[:, :gamma])))


@pytest.mark.parametrize("alpha,gamma", [(0.5, 3), (0.8, 5), (0.9, 1)])
def test_synthetic_accept_mean_matches_truncated_bernoulli_runs(alpha, gamma):
  n = _accepted(alpha, gamma)
  mean, var = synthetic.expected_accepted(alpha, gamma)
  # Closed form: E[n] = sum_{k=1..γ} α^k.
  assert mean == pytest.approx(sum(alpha**k for k in range(1, gamma + 1)))
  assert n.dtype == np.int32 and n.min() >= 0 and n.max() <= gamma
  assert abs(n.mean() - mean) < 5 * math.sqrt(var / ROWS)


def test_synthetic_accept_extremes():
  assert np.all(_accepted(1.0, 3) == 3)
  assert np.all(_accepted(0.0, 3) == 0)


@pytest.mark.parametrize("flag,value", [
    ("--alphas", "0.5,1.5"),
    ("--alphas", "abc"),
    ("--gammas", "0"),
    ("--gammas", "1,2.5"),
    ("--batch_size", "0"),
    ("--max_decode_length", "-3"),
    ("--repeats", "x"),
    ("--dtype", "float16"),
    ("--target", "gigantic"),
    ("--draft", "/no/such/file.gin"),
    ("--device_bandwidth_gbps", "-1"),
    ("--chunk_sizes", "1,,2"),
])
def test_bad_flags_error_before_running(flag, value, monkeypatch, capsys):

  def fail(*args, **kwargs):
    raise AssertionError("run_benchmark must not be reached")

  monkeypatch.setattr(decode.decode_measure, "run_benchmark", fail)
  with pytest.raises(common.BenchmarkFlagError) as e:
    decode.parse_flags([flag, value])
  message = str(e.value)
  assert flag in message and "allowed" in message
  assert decode.main([flag, value]) == 2
  err = capsys.readouterr().err
  assert flag in err and "error" in err


def test_vocab_mismatch_is_a_flag_error():
  with pytest.raises(common.BenchmarkFlagError, match="--draft"):
    decode.parse_flags(["--target", "small", "--draft", "tiny"])


def test_gin_file_config(tmp_path):
  """Includes from the file's folder and gin/; --dtype wins over the file's."""
  (tmp_path / "layers.gin").write_text("T5Config.num_encoder_layers = 2\n")
  gin_file = tmp_path / "t5_1_1_test.gin"
  gin_file.write_text(
      "include 'models/t5_1_1_small.gin'\n"  # From the repository's gin/.
      "include 'layers.gin'\n"  # Next to this file.
      "T5Config.vocab_size = 128\n"
      "T5Config.emb_dim = 48\n"
      "T5Config.num_heads = 3\n"
      "T5Config.head_dim = 16\n"
      "T5Config.mlp_dim = 96\n"
      "T5Config.num_decoder_layers = 3\n"
      "T5Config.dtype = 'bfloat16'\n"
      "run.gamma = 3\n"  # Other configurables' bindings are skipped.
      "train.num_steps = 10\n")
  cfg = decode.parse_flags(
      ["--target",
       str(gin_file), "--draft", "mini", "--dtype", "float32"])
  t = cfg.target_config
  assert (t.emb_dim, t.num_heads, t.head_dim, t.mlp_dim, t.num_encoder_layers,
          t.num_decoder_layers) == (48, 3, 16, 96, 2, 3)
  assert t.mlp_activations == ("gelu", "linear")  # From t5_1_1_small.gin.
  assert t.dtype == jnp.float32  # --dtype wins over the file's.
  assert cfg.target == str(gin_file)
  assert not cfg.warnings


@pytest.mark.parametrize("dtype", ["%MODEL_DTYPE", "@jnp.bfloat16"])
def test_gin_file_dtype_need_not_resolve(dtype, tmp_path):
  """A dtype from outside the file (macro, reference): --dtype decides."""
  gin_file = tmp_path / "m.gin"
  gin_file.write_text("T5Config.vocab_size = 128\n"
                      f"T5Config.dtype = {dtype}\n")
  cfg = decode.parse_flags(
      ["--target",
       str(gin_file), "--draft", "mini", "--dtype", "bfloat16"])
  assert cfg.target_config.dtype == jnp.bfloat16
  assert cfg.target_config.vocab_size == 128


@pytest.mark.parametrize("text,reason", [
    ("from __gin__ import dynamic_registration\n"
     "include 't5x/examples/t5/t5_1_1/base.gin'\n"
     "network.T5Config.emb_dim = 48\n", "t5x/examples/t5/t5_1_1/base.gin"),
    ("T5Config.emb_dim = (\n", "EOF"),
    ("T5Config.d_model = 512\n", "d_model"),
    ("T5Config.emb_dim = 0\n", "emb_dim"),
    ("T5Config.emb_dim = %UNDEFINED\n", "UNDEFINED"),
    ("T5Config.mlp_activations = 3\n", "T5Config"),
    ("run.gamma = 3\n", "binds no T5Config"),
])
def test_bad_gin_file_is_a_flag_error(text, reason, tmp_path, monkeypatch,
                                      capsys):

  def fail(*args, **kwargs):
    raise AssertionError("run_benchmark must not be reached")

  monkeypatch.setattr(decode.decode_measure, "run_benchmark", fail)
  path = tmp_path / "t.gin"
  path.write_text(text)
  with pytest.raises(common.BenchmarkFlagError) as e:
    common.resolve_model_config(str(path), "model")
  message = str(e.value)
  assert "--model" in message and str(path) in message
  assert "allowed" in message and reason in message
  assert decode.main(["--target", str(path)]) == 2
  assert "--target" in capsys.readouterr().err


def test_gin_file_scopes(tmp_path):
  gin_file = tmp_path / "pair.gin"
  gin_file.write_text("T5Config.vocab_size = 128\n"
                      "T5Config.num_heads = 2\n"
                      "target/T5Config.emb_dim = 64\n"
                      "draft/T5Config.emb_dim = 16\n")
  target, scope = gin_reader.read_t5_config_for_role(gin_file, role="target")
  assert scope == "target"
  draft, _ = gin_reader.read_t5_config_for_role(gin_file, role="draft")
  assert (target.emb_dim, draft.emb_dim) == (64, 16)
  assert target.num_heads == draft.num_heads == 2  # Unscoped base.
  only_draft = tmp_path / "draft_only.gin"
  only_draft.write_text("draft/T5Config.emb_dim = 24\n"
                        "draft/T5Config.vocab_size = 128\n")
  config, scope = gin_reader.read_t5_config_for_role(only_draft, role="target")
  assert (config.emb_dim, scope) == (24, "draft")  # The file's only scope.
  _, _, warnings = common.resolve_model_config(str(only_draft), "target")
  assert warnings and "draft/" in warnings[0]
  # Bound under both role scopes only: ambiguous for another role.
  both = tmp_path / "both.gin"
  both.write_text("target/T5Config.emb_dim = 8\n"
                  "draft/T5Config.emb_dim = 4\n")
  with pytest.raises(common.BenchmarkFlagError, match="binds both"):
    common.resolve_model_config(str(both), "model")


def test_target_and_draft_files_do_not_leak_into_each_other():
  """Both files bind unscoped T5Config; gin's global config plays no part."""
  gin.clear_config()
  try:
    gin.parse_config("T5Config.num_heads = 1")  # A caller's live config.
    cfg = decode.parse_flags(["--target", "small", "--draft", "xsmall"])
    assert (cfg.target_config.emb_dim, cfg.draft_config.emb_dim) == (512, 256)
    assert (cfg.target_config.num_encoder_layers,
            cfg.draft_config.num_encoder_layers) == (8, 4)
    assert (cfg.target_config.num_heads, cfg.draft_config.num_heads) == (6, 4)
    assert gin.query_parameter("T5Config.num_heads") == 1
  finally:
    gin.clear_config()


def test_experiment_gin_file_as_target_and_draft():
  """local_tiny.gin includes run.gin (run.* bindings) and both tiny models."""
  cfg = decode.parse_flags(
      ["--target", "gin/local_tiny.gin", "--draft", "gin/local_tiny.gin"])
  for role, config in (("target", cfg.target_config), ("draft",
                                                       cfg.draft_config)):
    expected = gin_reader.read_t5_config(f"models/{role}/tiny.gin", scope=role)
    assert config == expected.replace(dtype=config.dtype), role
  assert cfg.target_config.emb_dim != cfg.draft_config.emb_dim


@pytest.mark.parametrize("size", list(common.MODEL_SIZES))
def test_size_names_are_gin_files(size):
  path = GIN_DIR / common.MODEL_SIZES[size]
  assert path.is_file(), path
  config, label, warnings = common.resolve_model_config(size, "target")
  assert (label, warnings) == (size, [])
  # Read under target/, an unscoped file gives its unscoped bindings.
  assert config == gin_reader.read_t5_config(str(path))
  for role in ("target", "draft"):  # The scoped copies, where there are.
    scoped = GIN_DIR / "models" / role / path.name
    if scoped.exists():
      assert config == gin_reader.read_t5_config_for_role(scoped,
                                                          role)[0], scoped


def test_t5_1_1_sizes_match_t5x():
  """T5X's t5_1_1/{small,xxl}.gin hyperparameters."""
  assert common.MODEL_SIZES["small"] == "models/t5_1_1_small.gin"
  fields = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim",
            "num_encoder_layers", "num_decoder_layers", "mlp_activations",
            "logits_via_embedding")
  published = {
      "small": (32128, 512, 6, 64, 1024, 8, 8, ("gelu", "linear"), False),
      "xxl": (32128, 4096, 64, 64, 10240, 24, 24, ("gelu", "linear"), False),
  }
  for size, values in published.items():
    config, _, _ = common.resolve_model_config(size, "target")
    assert tuple(getattr(config, f) for f in fields) == values, size


def test_the_summary_reads_the_greedy_identity_record():
  """--check_greedy_identity's line reads `exactness.greedy_identity`'s
  keys (it read the old `rows_identical` and crashed after the run)."""
  record = {
      "gamma": 3,
      "alpha_hat": 0.5,
      "examples": 2,
      "identical": 1,
      "mismatches": [{
          "index": 1,
          "position": 4
      }],
      "chunk_vs_step_max_abs_logit_diff": 0.0,
      "chunk_vs_step_argmax_agreement": 1.0
  }
  [line, _] = decode._greedy_identity({"greedy_identity": record})  # pylint: disable=protected-access
  assert "1/2 rows identical" in line


_LSCPU = """Architecture:             x86_64
Vendor ID:                AuthenticAMD
  Model name:             AMD EPYC
    CPU family:           25
    Model:                {model}
    Stepping:             1
    Flags:                fpu sse2 avx2 fma {wide}
Caches (sum of all):
  L3:                     32 MiB (1 instance)
L3 cache:                 32 MiB (1 instance)
"""


@pytest.mark.parametrize("model,wide", [(1, ""), (17, "avx512f avx512bw")])
def test_the_host_record_tells_processor_kinds_of_one_name_apart(
    model, wide, monkeypatch):
  """A benchmark's host record names the processor's kind, not only the
  model name that a Zen 3 and a Zen 4 share."""
  lscpu = _LSCPU.format(model=model, wide=wide)
  monkeypatch.setattr(
      common.subprocess, "run",
      lambda *a, **k: types.SimpleNamespace(stdout=lscpu, returncode=0))
  info = common.host()
  assert {
      k: info[k] for k in ("Vendor ID", "CPU family", "Model", "Model name",
                          "Stepping", "L3 cache")
  } == {
      "Vendor ID": "AuthenticAMD",
      "CPU family": "25",
      "Model": str(model),
      "Model name": "AMD EPYC",
      "Stepping": "1",
      "L3 cache": "32 MiB (1 instance)"
  }
  assert info["AVX-512"] is bool(wide)
