"""One source of configuration: each run argument's gin macro is a property
of its `RunArguments` field, and gin/run.gin, the typo checks and the
generated docs are held to it."""
import dataclasses
import re

import pytest

from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import loading  # noqa: F401  # registers vocabulary
from specdec_jax.tools import generate_docs

from conftest import REPO

pytestmark = pytest.mark.usefixtures("clean_gin")
FIELDS = dataclasses.fields(arguments.RunArguments)


def _default(field: dataclasses.Field):
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


def test_every_field_names_its_own_macro():
  macros = [f.metadata.get("macro") for f in FIELDS]
  missing = [f.name for f, m in zip(FIELDS, macros) if not m]
  assert not missing, f"RunArguments fields without a macro: {missing}"
  assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", m) for m in macros), macros
  assert len(set(macros)) == len(macros)  # one argument per macro
  assert dict(arguments.MACROS) == {f.name: m for f, m in zip(FIELDS, macros)}


def test_run_gin_binds_every_field_to_its_macro_with_its_default():
  values, bindings = generate_docs.run_gin()
  bound = {arg: macro for conf, arg, macro in bindings if conf == "run"}
  assert bound == dict(arguments.MACROS)
  for field in FIELDS:
    if field.name == "output_dir":  # required: run.gin's is an example
      continue
    assert values[field.metadata["macro"]] == _default(field), field.name


def test_docs_generator_names_a_binding_to_another_macro(tmp_path):
  text = (REPO / "gin" / "run.gin").read_text(encoding="utf-8")
  bad = tmp_path / "run.gin"
  bad.write_text(
      text.replace("run.gamma = %GAMMA",
                   "run.gamma = %GAMA").replace("run.seed = %SEED\n", ""),
      encoding="utf-8")
  with pytest.raises(generate_docs.DocsError) as e:
    generate_docs.macro_rows(str(bad))
  assert ("RunArguments.gamma is set by %GAMMA, but gin/run.gin binds "
          "run.gamma = %GAMA") in str(e.value)
  assert "run.seed is not bound to %SEED in gin/run.gin" in str(e.value)


def test_docs_table_lists_every_macro_in_field_order():
  rows = generate_docs.macro_rows()
  run_rows = [(macro, binding)
              for macro, _, binding, _ in rows
              if binding.startswith("run.")]
  assert run_rows == [(m, f"run.{a}") for a, m in arguments.MACROS.items()]


def test_every_macro_passes_the_typo_check_and_a_typo_is_named():
  known = gin_reader.gin_file_macros(["run.gin"])
  assert set(arguments.MACROS.values()) <= known
  with pytest.raises(gin_utils.ConfigError) as e:
    gin_utils.parse_gin(["local_tiny.gin"], ["NUM_EXAMPLE=3"], finalize=False,
                        check_macros=True)
  assert str(e.value).startswith(
      "--gin.NUM_EXAMPLE=3: unknown gin macro 'NUM_EXAMPLE'")
  assert "did you mean NUM_EXAMPLES" in str(e.value)


def test_an_unknown_override_is_named_with_the_closest_arguments(tmp_path):
  gin_utils.parse_gin(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"],
                      finalize=False)
  with pytest.raises(gin_utils.ConfigError) as e:
    arguments.run_arguments(overrides={"gama": 3})
  message = str(e.value)
  assert message.startswith("Unknown run arguments ['gama']; did you mean "
                            "gamma")
  assert all(name in message for name in arguments.MACROS)


# ---------------------------------------------------------------------------
# Issue 37: every argument's declared type, TASK_KIND and the decode length
# are checked when the arguments are built, before anything is loaded.
# ---------------------------------------------------------------------------
@pytest.fixture
def tiny(tmp_path):
  gin_utils.parse_gin(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"],
                      finalize=False)


@pytest.mark.parametrize("name,value,allowed", [
    ("input_prefix", 5, "a string"),
    ("source_file", 5, "None or a string"),
    ("reference_file", 5, "None or a string"),
    ("target_checkpoint_path", 5, "None or a string"),
    ("draft_checkpoint_path", 2.5, "None or a string"),
    ("task_name", 5, "a string"),
    ("target_name", [1, 2], "a string"),
    ("draft_name", None, "a string"),
    ("split", 1, "a string"),
    ("mesh_shape", (1, "a"), "a tuple of integers"),
    ("lenience", True, "a number"),
    ("ngram_order", "3", "None or an integer"),
    ("prompt_lookup_max", 2.0, "an integer"),
])
def test_every_argument_has_its_declared_type(tiny, name, value, allowed):
  macro = arguments.MACROS[name]
  with pytest.raises(gin_utils.ConfigError) as e:
    arguments.run_arguments(overrides={name: value})
  assert str(e.value).startswith(f"{macro}={value!r} (run.{name}): allowed: "
                                 f"{allowed} (got {type(value).__name__})")


@pytest.mark.parametrize("gamma", [2.5, None, "x"])
def test_gamma_keeps_its_own_words(tiny, gamma):
  with pytest.raises(
      gin_utils.ConfigError,
      match=f"GAMMA={gamma!r}: allowed: an integer >= 1, or "
      "'auto'"):
    arguments.run_arguments(overrides={"gamma": gamma})


def test_every_default_has_its_declared_type(tiny):
  arguments.check_types(arguments.run_arguments())  # raises if not


def test_task_kind_is_checked_with_the_arguments(tiny):
  """Issue 37 (6): TASK_KIND='foo' failed after the whole decode."""
  with pytest.raises(
      gin_utils.ConfigError,
      match="TASK_KIND='foo': allowed: None .* 'translation', "
      "'summarization'"):
    arguments.run_arguments(overrides={"task_kind": "foo"})
  for kind in (None, "translation", "summarization"):
    assert arguments.run_arguments(overrides={
        "task_kind": kind
    }).task_kind == kind


@pytest.mark.parametrize("name", ["source_file", "reference_file"])
def test_data_files_on_gcs_are_named_as_local_only(tiny, name):
  macro = arguments.MACROS[name]
  with pytest.raises(gin_utils.ConfigError,
                     match=f"{macro}='gs://b/x.tsv': only local files"):
    arguments.run_arguments(overrides={name: "gs://b/x.tsv"})


def test_decode_length_is_bounded(tiny):
  """Issue 37 (3): 100000 target tokens ran silently for 13+ minutes."""
  most = arguments.MAX_DECODE_LENGTH
  with pytest.raises(
      gin_utils.ConfigError, match=r"TASK_FEATURE_LENGTHS\['targets'\]=100000: "
      f"allowed: an integer from 1 to {most}"):
    arguments.run_arguments(
        overrides={"task_feature_lengths": {
            "inputs": 64,
            "targets": 100000
        }})
  args = arguments.run_arguments(
      overrides={"task_feature_lengths": {
          "inputs": 64,
          "targets": most
      }})
  assert args.max_decode_length == most
