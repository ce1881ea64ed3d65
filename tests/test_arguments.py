"""One source of configuration: each run argument's gin macro is a property
of its `RunArguments` field, and gin/run.gin, the typo checks and the
generated docs are held to it."""
import dataclasses
import re

import pytest

from specdec_jax import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import loading  # noqa: F401  # registers vocabulary

from conftest import REPO
from conftest import load_script

pytestmark = pytest.mark.usefixtures("clean_gin")
FIELDS = dataclasses.fields(arguments.RunArguments)


@pytest.fixture(scope="module")
def generator():
  return load_script("generate_docs")


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


def test_run_gin_binds_every_field_to_its_macro_with_its_default(generator):
  values, bindings = generator.run_gin()
  bound = {arg: macro for conf, arg, macro in bindings if conf == "run"}
  assert bound == dict(arguments.MACROS)
  for field in FIELDS:
    if field.name == "output_dir":  # required: run.gin's is an example
      continue
    assert values[field.metadata["macro"]] == _default(field), field.name


def test_docs_generator_names_a_binding_to_another_macro(generator, tmp_path):
  text = (REPO / "gin" / "run.gin").read_text(encoding="utf-8")
  bad = tmp_path / "run.gin"
  bad.write_text(
      text.replace("run.gamma = %GAMMA",
                   "run.gamma = %GAMA").replace("run.seed = %SEED\n", ""),
      encoding="utf-8")
  with pytest.raises(generator.DocsError) as e:
    generator.macro_rows(str(bad))
  assert ("RunArguments.gamma is set by %GAMMA, but gin/run.gin binds "
          "run.gamma = %GAMA") in str(e.value)
  assert "run.seed is not bound to %SEED in gin/run.gin" in str(e.value)


def test_docs_table_lists_every_macro_in_field_order(generator):
  rows = generator.macro_rows()
  run_rows = [(macro, binding)
              for macro, _, binding, _ in rows
              if binding.startswith("run.")]
  assert run_rows == [(m, f"run.{a}") for a, m in arguments.MACROS.items()]


def test_every_macro_passes_the_typo_check_and_a_typo_is_named():
  known = gin_utils.gin_file_macros(["run.gin"])
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
