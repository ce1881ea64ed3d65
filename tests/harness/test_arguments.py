"""One source of configuration: each run argument's gin macro is a property
of its `RunArguments` field, each component setting's of its component's
field (a decode mode's, a drafter's), and gin/run.gin, the typo checks and
the generated docs are held to them. One rule refuses a setting of a
component the run did not choose."""
import dataclasses
import re

import pytest
from run_helpers import arguments_with
from run_helpers import certify_arguments

from specdec_jax.config import flag_utils
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import loading  # noqa: F401  # registers vocabulary
from specdec_jax.experiment import plan as plan_lib
from tools import generate_docs

from conftest import REPO
from conftest import tiny_config

pytestmark = pytest.mark.usefixtures("clean_gin")
FIELDS = dataclasses.fields(arguments.RunArguments)
COMPONENTS = ("decode_mode", "drafting")


def _default(field: dataclasses.Field):
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


def _settings():
  """[(configurable, field)] of every run argument and component setting
  that names a macro (`arguments.DOCUMENTED`'s classes)."""
  out = []
  for name, (obj, _) in arguments.DOCUMENTED.items():
    if isinstance(obj, type):
      out += [
          (name, f) for f in dataclasses.fields(obj) if "macro" in f.metadata
      ]
  return out


def test_every_field_names_its_own_macro():
  missing = [
      f.name
      for f in FIELDS
      if "macro" not in f.metadata and f.name not in COMPONENTS
  ]
  assert not missing, f"RunArguments fields without a macro: {missing}"
  assert dict(arguments.MACROS) == {
      f.name: f.metadata["macro"] for f in FIELDS if f.name not in COMPONENTS
  }
  macros = {}
  for _, field in _settings():
    assert re.fullmatch(r"[A-Z][A-Z0-9_]*", field.metadata["macro"])
    # A macro several components read (ADAPTIVE_THRESHOLD) has one default.
    macros.setdefault(field.metadata["macro"], set()).add(repr(_default(field)))
  assert all(len(d) == 1 for d in macros.values()), macros
  # Every macro a user knows, none lost: the run arguments', and those
  # that were run arguments before the components owned them.
  assert set(macros) - set(arguments.MACROS.values()) == {
      "LENIENCE", "TREE_WIDTH", "TREE_WITHOUT_REPLACEMENT", "BEAM_SIZE",
      "BEAM_ALPHA", "BEAM_WIDTH", "BEAM_ROWS", "ADAPTIVE_THRESHOLD",
      "NGRAM_ORDER", "PROMPT_LOOKUP_MAX", "INNER_DRAFTER", "INNER_GAMMA"
  }


def test_run_gin_binds_every_setting_to_its_macro_with_its_default():
  values, bindings = generate_docs.run_gin()
  bound = {(conf, arg): macro for conf, arg, macro in bindings}
  for conf, field in _settings():
    macro = field.metadata["macro"]
    assert bound.get((conf, field.name)) == macro, (conf, field.name)
    if field.name != "output_dir":  # required: run.gin's is an example
      assert values[macro] == _default(field), field.name
  assert bound[("decode_mode", "acceptance")] == "ACCEPTANCE"
  assert bound[("decode_mode", "decode")] == "DECODE"
  assert bound[("drafter", "name")] == "DRAFTER"


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


def test_docs_table_lists_every_macro():
  rows = generate_docs.macro_rows()
  run_rows = [(macro, binding)
              for macro, _, binding, _ in rows
              if binding.startswith("run.")]
  assert run_rows == [(m, f"run.{a}") for a, m in arguments.MACROS.items()]
  listed = {macro for macro, _, _, meaning in rows if meaning}
  assert {f.metadata["macro"] for _, f in _settings()} <= listed
  assert {"ACCEPTANCE", "DECODE", "DRAFTER"} <= listed


def test_every_macro_passes_the_typo_check_and_a_typo_is_named():
  known = gin_reader.gin_file_macros(["run.gin"])
  assert set(arguments.MACROS.values()) <= known
  with pytest.raises(flag_utils.ConfigError) as e:
    gin_utils.parse_gin(["local_tiny.gin"], ["NUM_EXAMPLE=3"], finalize=False,
                        check_macros=True)
  assert str(e.value).startswith(
      "--gin.NUM_EXAMPLE=3: unknown gin macro 'NUM_EXAMPLE'")
  assert "did you mean NUM_EXAMPLES" in str(e.value)


def test_an_unknown_override_is_named_with_the_closest_arguments(tmp_path):
  gin_utils.parse_gin(["local_tiny.gin"], [f"OUTPUT_DIR = '{tmp_path}'"],
                      finalize=False)
  with pytest.raises(flag_utils.ConfigError) as e:
    arguments.run_arguments(overrides={"gama": 3})
  message = str(e.value)
  assert message.startswith("Unknown run arguments ['gama']; did you mean "
                            "gamma")
  assert all(name in message for name in arguments.MACROS)


# ---------------------------------------------------------------------------
# Issue 37: every argument's declared type, TASK_KIND and the decode length
# are checked when the arguments are built, before anything is loaded.
# ---------------------------------------------------------------------------
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
])
def test_every_argument_has_its_declared_type(tiny, name, value, allowed):
  macro = arguments.MACROS[name]
  with pytest.raises(flag_utils.ConfigError) as e:
    arguments.run_arguments(overrides={name: value})
  assert str(e.value).startswith(f"{macro}={value!r} (run.{name}): allowed: "
                                 f"{allowed} (got {type(value).__name__})")


@pytest.mark.parametrize(
    "bindings,where,allowed",
    [
        (["LENIENCE = True"], "TokenMode.lenience", "a number"),
        (["DRAFTER = 'ngram'", "NGRAM_ORDER = '3'", "NGRAM_CORPUS = 'c.txt'"
         ], "NGramSpec.order", "None or an integer"),
        (["DRAFTER = 'prompt_lookup'", "PROMPT_LOOKUP_MAX = 2.0"
         ], "PromptLookupSpec.max_ngram", "an integer"),
        ([
            "DRAFTER = 'hierarchical'", "INNER_DRAFTER = 'ngram'",
            "NGRAM_ORDER = 2.0", "NGRAM_CORPUS = 'c.txt'"
        ], "NGramSpec.order", "None or an integer"),  # the inner drafter's
        (["DECODE = 'beam'", "BEAM_WIDTH = '8'"
         ], "BeamMode.width", "None or an integer"),
    ])
def test_every_component_setting_has_its_declared_type(tiny, bindings, where,
                                                       allowed):
  macro, value = bindings[-1 if "CORPUS" not in bindings[-1] else -2].split(
      " = ")
  with pytest.raises(flag_utils.ConfigError) as e:
    arguments_with(*bindings)
  assert str(e.value).startswith(f"{macro}={value} ({where}): allowed: "
                                 f"{allowed}"), str(e.value)


# ---------------------------------------------------------------------------
# Issue 57: components own their settings, injected as T5X does; one rule
# refuses a setting of a component the run did not choose.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bindings,refused",
    [
        (["TREE_WIDTH = 3"], "TREE_WIDTH=3 with ACCEPTANCE='token': only "
         "ACCEPTANCE='tree' reads it; allowed: TREE_WIDTH=1 (its default), or "
         "ACCEPTANCE='tree'."),
        (["BEAM_SIZE = 2", "ACCEPTANCE = 'block'"
         ], "BEAM_SIZE=2 with ACCEPTANCE='block': only DECODE='beam' reads it"),
        (["LENIENCE = 0.5", "DECODE = 'beam'"],
         "LENIENCE=0.5 with DECODE='beam': only ACCEPTANCE='token' reads it"),
        (["PROMPT_LOOKUP_MAX = 5"], "PROMPT_LOOKUP_MAX=5 with DRAFTER='model': "
         "only DRAFTER 'prompt_lookup' or 'hierarchical' read it"),
        (["ADAPTIVE_THRESHOLD = 0.5", "DRAFTER = 'hierarchical'"
         ], "ADAPTIVE_THRESHOLD=0.5 with DRAFTER='hierarchical': only DRAFTER "
         "'model', 'unigram', 'bigram', 'ngram' or 'shared_encoder' read it"),
        # Not through its macro: the component's own binding, refused too.
        (["BeamMode.alpha = 0.0"], "BEAM_ALPHA=0.0 with ACCEPTANCE='token'"),
        # An injected mode is the run's choice.
        (["run.decode_mode = @BlockMode()", "TREE_WIDTH = 2"
         ], "TREE_WIDTH=2 with ACCEPTANCE='block'"),
    ])
def test_a_setting_of_a_component_not_chosen_is_refused(tiny, bindings,
                                                        refused):
  """One rule for every component: each pairwise check it replaced
  (`_check_tree`, the beam macros' `check_unused`, the modes' "exact
  only") would let some of these pass or name them differently."""
  with pytest.raises(flag_utils.ConfigError) as e:
    arguments_with(*bindings)
  assert str(e.value).startswith(refused), str(e.value)


def test_the_settings_of_the_chosen_components_are_theirs():
  tree = fresh_arguments("ACCEPTANCE = 'tree'", "TREE_WIDTH = 3")
  assert tree.decode_mode == decode_modes.TreeMode(width=3)
  args = fresh_arguments("DRAFTER = 'hierarchical'", "INNER_DRAFTER = 'bigram'",
                         "NGRAM_CORPUS = 'c.txt'", "INNER_GAMMA = 2")
  assert args.drafting.inner_gamma == 2
  assert args.drafting.inner_spec.ngram_order() == 2
  # NGRAM_CORPUS is the run's (an experiment file names it for all its
  # points): never refused.
  assert fresh_arguments("NGRAM_CORPUS = 'c.txt'").drafting.name == "model"


def fresh_arguments(*bindings):
  """local_tiny.gin's arguments with `bindings`, gin cleared first."""
  return certify_arguments(list(bindings))


def _record(args):
  config = tiny_config(vocab_size=300)

  class Vocab:
    vocab_size = 300

  return plan_lib.settings_record(args, decode_modes.mode_of(args), config,
                                  config, Vocab())["run"]


@pytest.mark.parametrize("macros,injected", [
    (["ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"
     ], ["run.decode_mode = @TreeMode()", "TreeMode.width = 2"]),
    (["DECODE = 'beam'", "BEAM_SIZE = 2", "GAMMA = 2"
     ], ["run.decode_mode = @BeamMode()", "BeamMode.size = 2", "GAMMA = 2"]),
    (["DRAFTER = 'ngram'", "NGRAM_ORDER = 4", "NGRAM_CORPUS = 'c.txt'"], [
        "run.drafting = @NGramSpec()", "NGramSpec.order = 4",
        "NGRAM_CORPUS = 'c.txt'"
    ]),
])
def test_a_component_injected_as_in_t5x_is_the_same_run(macros, injected):
  """`run.decode_mode = @TreeMode()` in an experiment file: the same
  arguments and settings record as the macros users know."""
  records = []
  for bindings in (macros, injected):
    args = fresh_arguments(*bindings)
    records.append((args, _record(args)))
  assert records[0] == records[1]


def test_the_settings_record_keeps_the_flat_keys():
  """metrics.json's `settings` (the OVERWRITE rule compares it across
  versions): the components' settings under the run arguments' names, each
  only where the run differs from the runs before it existed."""
  paper = _record(fresh_arguments())
  assert not {
      "acceptance", "decode", "tree_width", "lenience", "drafter",
      "ngram_corpus", "speculation"
  } & set(paper)
  assert {
      k: v
      for k, v in _record(
          fresh_arguments("ACCEPTANCE = 'tree'", "TREE_WIDTH = 2")).items()
      if k not in paper
  } == {
      "acceptance": "tree",
      "tree_width": 2,
      "tree_without_replacement": True
  }
  lenient = _record(fresh_arguments("LENIENCE = 0.5", "NGRAM_CORPUS = 'c.txt'"))
  assert {
      k: v for k, v in lenient.items() if k not in paper
  } == {
      "drafter": "model",
      "ngram_corpus": "c.txt",
      "ngram_order": None,
      "prompt_lookup_max": 3,
      "inner_drafter": "prompt_lookup",
      "inner_gamma": 4,
      "adaptive_threshold": None,
      "lenience": 0.5
  }


@pytest.mark.parametrize("gamma", [2.5, None, "x"])
def test_gamma_keeps_its_own_words(tiny, gamma):
  with pytest.raises(
      flag_utils.ConfigError,
      match=f"GAMMA={gamma!r}: allowed: an integer >= 1, or "
      "'auto'"):
    arguments.run_arguments(overrides={"gamma": gamma})


def test_every_default_has_its_declared_type(tiny):
  arguments.check_types(arguments.run_arguments())  # raises if not


def test_task_kind_is_checked_with_the_arguments(tiny):
  """Issue 37 (6): TASK_KIND='foo' failed after the whole decode."""
  with pytest.raises(
      flag_utils.ConfigError,
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
  with pytest.raises(flag_utils.ConfigError,
                     match=f"{macro}='gs://b/x.tsv': only local files"):
    arguments.run_arguments(overrides={name: "gs://b/x.tsv"})


def test_decode_length_is_bounded(tiny):
  """Issue 37 (3): 100000 target tokens ran silently for 13+ minutes."""
  most = arguments.MAX_DECODE_LENGTH
  with pytest.raises(
      flag_utils.ConfigError,
      match=r"TASK_FEATURE_LENGTHS\['targets'\]=100000: "
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
