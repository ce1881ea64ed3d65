"""gin_reader.read_t5_config: a model gin file's T5Config without global gin."""

import sys

from conftest import REPO
import gin
import jax.numpy as jnp
import pytest

from specdec_jax.config import flag_utils
from specdec_jax import run  # noqa: F401  (registers `run`)  # pylint: disable=unused-import
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.core.models import T5Config
from tools import generate_model_gin

DEFAULT = T5Config()  # No gin bindings are live at import time.


def test_scopes_macros_and_includes(tmp_path):
  (tmp_path / "m.gin").write_text(
      "W = 24\n"
      "T5Config.emb_dim = 16\n"
      "T5Config.num_heads = 2\n"
      "target/T5Config.emb_dim = %W\n"
      "target/T5Config.mlp_activations = ('relu',)\n"
      "other.thing = @foo()\n")  # Other configurables: skipped.
  (tmp_path / "top.gin").write_text("include 'm.gin'\nW = 40\n")
  unscoped = gin_reader.read_t5_config(str(tmp_path / "m.gin"))
  assert (unscoped.emb_dim, unscoped.mlp_activations) == (16, ("gelu",
                                                               "linear"))
  config = gin_reader.read_t5_config("top.gin", scope="target",
                                     search_paths=[str(tmp_path)])
  # target/ overrides unscoped; a macro takes its last value, as in gin.
  assert (config.emb_dim, config.mlp_activations) == (40, ("relu",))
  assert config.num_heads == 2  # Unscoped, inherited under target/.
  assert config.head_dim == DEFAULT.head_dim  # Not bound: the default.
  assert gin_reader.t5_config_scopes("top.gin",
                                     [str(tmp_path)]) == {"", "target"}
  with pytest.raises(ValueError, match="nope.gin.*not found"):
    gin_reader.read_t5_config("nope.gin", search_paths=[str(tmp_path)])


def test_block_form_and_module_qualified_selector(tmp_path):
  path = tmp_path / "m.gin"
  path.write_text("from __gin__ import dynamic_registration\n"
                  "T5Config:\n"
                  "  emb_dim = 48\n"
                  "  dtype = 'bfloat16'\n"
                  "draft/network.T5Config.num_heads = 3\n")
  config = gin_reader.read_t5_config(str(path), scope="draft")
  assert (config.emb_dim, config.num_heads, config.dtype) == (48, 3,
                                                              jnp.bfloat16)


def test_repository_gin_folder_is_searched():
  small = gin_reader.read_t5_config("models/t5_1_1_small.gin")
  assert (small.emb_dim, small.dtype) == (512, jnp.bfloat16)  # %MODEL_DTYPE.


def test_global_gin_config_neither_used_nor_touched(tmp_path):
  path = tmp_path / "m.gin"
  path.write_text("T5Config.emb_dim = 16\nMODEL_DIR = 'mine'\n")
  gin.clear_config()
  try:
    gin.parse_config("T5Config.num_heads = 1\nMODEL_DIR = 'live'")
    config = gin_reader.read_t5_config(str(path))
    assert (config.emb_dim, config.num_heads) == (16, DEFAULT.num_heads)
    assert gin.query_parameter("T5Config.num_heads") == 1
    assert gin.query_parameter("%MODEL_DIR") == "live"
  finally:
    gin.clear_config()


@pytest.mark.parametrize("text,match", [
    ("T5Config.emb_dim = (\n", "EOF"),
    ("T5Config.emb_dim = $\n", "Unable to parse value"),
    ("T5Config.d_model = 512\n", r"unknown T5Config field\(s\) \['d_model'\]"),
    ("T5Config.emb_dim = 0\n", "emb_dim must be a positive integer"),
    ("T5Config.mlp_activations = 3\n", "invalid T5Config"),
    ("T5Config.emb_dim = %UNDEFINED\n", "macro %UNDEFINED is not defined"),
    ("X = %Y\nY = %X\nT5Config.emb_dim = %X\n", "in terms of itself"),
    ("T5Config.dtype = @jnp.bfloat16\n", "reference @jnp.bfloat16"),
    ("run.gamma = 3\n", "binds no T5Config unscoped"),
    ("draft/T5Config.emb_dim = 8\n", "binds no T5Config unscoped"),
    ("include 't.gin'\n", "include cycle"),
])
def test_errors_name_the_file(text, match, tmp_path):
  path = tmp_path / "t.gin"
  path.write_text(text)
  with pytest.raises(ValueError, match=match) as e:
    gin_reader.read_t5_config(str(path), search_paths=[str(tmp_path)])
  assert str(path) in str(e.value)


@pytest.mark.parametrize("dtype", ["%MODEL_DTYPE", "@jnp.bfloat16"])
def test_allow_unresolved_dtype(dtype, tmp_path):
  path = tmp_path / "m.gin"
  path.write_text(f"T5Config.emb_dim = 16\nT5Config.dtype = {dtype}\n")
  config = gin_reader.read_t5_config(str(path), allow_unresolved_dtype=True)
  assert (config.emb_dim, config.dtype) == (16, DEFAULT.dtype)
  # Only the dtype: other fields must still resolve.
  path.write_text("T5Config.emb_dim = %EMB\nT5Config.dtype = %MODEL_DTYPE\n")
  with pytest.raises(ValueError, match="%EMB"):
    gin_reader.read_t5_config(str(path), allow_unresolved_dtype=True)


# ---------------------------------------------------------------------------
# Macro names (issue 13): a typo in --gin.NAME=VALUE must not pass silently.
# ---------------------------------------------------------------------------
def test_file_macros_include_definitions_references_and_includes(tmp_path):
  (tmp_path / "inc.gin").write_text("A = 1\nrun.x = %B\n")
  (tmp_path / "top.gin").write_text("include 'inc.gin'\nC = {'k': %D}\n")
  assert gin_reader.gin_file_macros(["top.gin"],
                                    [str(tmp_path)]) == {"A", "B", "C", "D"}
  assert {"GAMMA", "TEMPERATURE", "OUTPUT_DIR",
          "OVERWRITE"} <= (gin_reader.gin_file_macros(["local_tiny.gin"]))


@pytest.mark.parametrize(
    "binding,suggestion",
    [
        ("GAMA=3", "GAMMA"),
        ("gamma=3", "GAMMA"),  # case: still the closest
        ("TEMPERATUR=1.0", "TEMPERATURE"),
    ])
def test_unknown_macro_names_binding_and_closest(binding, suggestion):
  known = gin_reader.gin_file_macros(["local_tiny.gin"])
  with pytest.raises(flag_utils.ConfigError) as e:
    gin_utils.check_macro_bindings([binding], known)
  message = str(e.value)
  assert message.startswith(f"--gin.{binding}: unknown gin macro")
  assert f"did you mean {suggestion}" in message
  assert "known macros: " in message and "NUM_EXAMPLES" in message


def test_known_and_full_bindings_pass():
  known = gin_reader.gin_file_macros(["local_tiny.gin"])
  gin_utils.check_macro_bindings(
      [
          "GAMMA=3",
          "run.top_k = 2",
          "target/T5Config.emb_dim = 8",
          # A new macro is fine when another binding uses it.
          "MY_GAMMA = 2",
          "run.gamma = %MY_GAMMA"
      ],
      known)


def test_parse_gin_rejects_typo_before_touching_gin():
  gin.clear_config()
  try:
    with pytest.raises(flag_utils.ConfigError, match="GAMA.*GAMMA"):
      gin_utils.parse_gin(["local_tiny.gin"], ["GAMA=3"], finalize=False,
                          check_macros=True)
    # Not parsed: gin holds no binding for run.gamma yet.
    with pytest.raises(ValueError):
      gin.query_parameter("run.gamma")
  finally:
    gin.clear_config()


def test_parse_gin_silences_gin_lookup_noise(caplog):
  gin.clear_config()
  try:
    caplog.set_level("INFO")
    gin_utils.parse_gin(["local_tiny.gin"], [], finalize=False)
    assert "Path not found" not in caplog.text
    assert "system_path_file_exists" not in caplog.text
  finally:
    gin.clear_config()


# ---------------------------------------------------------------------------
# Model sizes written once: the scoped copies are generated.
# ---------------------------------------------------------------------------
def test_scoped_model_files_are_the_generators_output():
  assert not generate_model_gin.stale(), (
      "run `python -m tools.generate_model_gin` and commit the result")
  # Every scoped copy of an unscoped file is generated; only the two tiny
  # smoke-test models (different for each role) are written by hand.
  models = REPO / "gin" / "models"
  for role in ("target", "draft"):
    copies = {
        p.stem
        for p in (models / role).glob("*.gin")
        if (models / p.name).exists()
    }
    assert copies == set(generate_model_gin.SCOPED[role]), role
    assert {p.stem for p in (models / role).glob("*.gin")} - copies == {"tiny"}


def test_model_gin_generator_scopes_bindings_and_macros(tmp_path):
  (tmp_path / "m.gin").write_text(
      "# A model.\nMODEL_DTYPE = 'bfloat16'\nT5Config.emb_dim = 8  # note\n"
      "T5Config.dtype = %MODEL_DTYPE\n")
  text = generate_model_gin.scoped_text("m", "draft", str(tmp_path))
  assert text.endswith("DRAFT_DTYPE = 'bfloat16'\ndraft/T5Config.emb_dim = 8"
                       "  # note\ndraft/T5Config.dtype = %DRAFT_DTYPE\n")
  gin_file = tmp_path / "draft.gin"
  gin_file.write_text(text)
  assert gin_reader.read_t5_config(str(gin_file), "draft").emb_dim == 8
  (tmp_path / "bad.gin").write_text("include 'x.gin'\nT5Config.emb_dim = 8\n")
  with pytest.raises(generate_model_gin.ModelGinError, match=r"bad.gin:1: "
                     r"\"include 'x.gin'\""):
    generate_model_gin.scoped_text("bad", "target", str(tmp_path))


# ---------------------------------------------------------------------------
# Issue 37 (5): a macro that nothing reads is an error, in files too; and
# messages that name what the user typed.
# ---------------------------------------------------------------------------
def test_unused_macro_in_a_file_is_named_with_its_line(tmp_path):
  """`GAMA = 3` in an experiment file ran with γ 5 (the default)."""
  (tmp_path / "exp.gin").write_text("include 'local_tiny.gin'\n"
                                    "NUM_EXAMPLES = 2\nGAMA = 3\n")
  gin.clear_config()
  try:
    with pytest.raises(flag_utils.ConfigError) as e:
      gin_utils.parse_gin(["exp.gin"], [], [str(tmp_path)], finalize=False)
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'exp.gin'}:3: GAMA = ...: macro "
                              "'GAMA' is defined but nothing reads it")
    assert "did you mean GAMMA?" in message
    with pytest.raises(ValueError):  # refused before gin parsed anything
      gin.query_parameter("run.gamma")
  finally:
    gin.clear_config()


def test_unused_macro_binding_is_refused_without_check_macros():
  """`train --gin.NUM_STEP=3` trained all steps: every caller refuses it,
  not only those asking `check_macros` (which names the known macros)."""
  with pytest.raises(
      flag_utils.ConfigError,
      match=r"--gin.NUM_EXAMPLE=3: macro 'NUM_EXAMPLE' is "
      "defined but nothing reads it.*did you mean NUM_EXAMPLES"):
    gin_utils.check_unused_macros(["local_tiny.gin"], ["NUM_EXAMPLE=3"])
  # Read by a binding: fine.
  gin_utils.check_unused_macros(["local_tiny.gin"],
                                ["MY_GAMMA = 2", "run.gamma = %MY_GAMMA"])
  gin_utils.check_unused_macros(["local_tiny.gin"], ["COMPILE_TOPOLOGY='v4-8'"])


def test_macros_that_code_reads_are_declared():
  """A macro read with gin.query_parameter has no `%NAME` in any binding:
  without its name in MACROS_READ_BY_CODE it would be refused as unread."""
  calls = [(path.name, line.strip())
           for path in sorted((REPO / "specdec_jax").rglob("*.py"))
           for line in path.read_text().splitlines()
           if "query_parameter(" in line and not line.strip().startswith("#")]
  undeclared = [(name, line)
                for name, line in calls
                if not any(m in line for m in gin_utils.MACROS_READ_BY_CODE)]
  assert not undeclared, undeclared


def test_every_shipped_top_level_gin_file_reads_all_its_macros():
  files = [
      p.relative_to(REPO / "gin").as_posix()
      for p in sorted((REPO / "gin").glob("*.gin")) +
      sorted((REPO / "gin" / "train").glob("*.gin"))
  ]
  assert len(files) > 20
  for name in files:
    gin_utils.check_unused_macros([name], [])


@pytest.mark.parametrize("binding,token",
                         [("GAMMA=x", "x"),
                          ("train.learning_rate=float('nan')", "float")])
def test_unparsable_value_is_named_without_ast_objects(binding, token):
  with pytest.raises(flag_utils.ConfigError) as e:
    gin_utils.check_unused_macros(["local_tiny.gin"], [binding])
  message = str(e.value)
  assert "ast." not in message and "object at 0x" not in message
  assert f"'{token}' is not a gin value" in message
  assert "a string needs quotes" in message


def test_binary_gin_file_is_named(tmp_path):
  (tmp_path / "bad.gin").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
  with pytest.raises(
      ValueError, match=f"{tmp_path / 'bad.gin'}: not a gin "
      "file: not UTF-8 text"):
    gin_utils.parse_gin([str(tmp_path / "bad.gin")], [], finalize=False)


def test_without_gin_config_reading_a_gin_file_says_what_to_install(
    monkeypatch):
  """From the repository's root, `import gin` without gin-config finds the
  gin/ folder and fails obscurely (the GPU image: gpu_aot's loops)."""
  monkeypatch.setitem(sys.modules, "gin", None)
  with pytest.raises(ImportError, match="pip install gin-config"):
    gin_reader.read_t5_config("models/multi30k_target_38m.gin")
