"""`core.environment`: one reading of every SPECDEC_* variable."""
import os

import pytest

from specdec_jax.core import environment


@pytest.mark.parametrize("text,expected", [("1", True), ("true", True),
                                           ("TRUE", True), ("yes", True),
                                           ("on", True), ("0", False),
                                           ("false", False), ("False", False),
                                           ("no", False), ("off", False),
                                           (" 0 ", False)])
def test_flag_reads_both_spellings(text, expected):
  assert environment.flag("X", not expected, {"X": text}) is expected


@pytest.mark.parametrize("default", [True, False])
def test_flag_unset_or_empty_is_its_default(default):
  assert environment.flag("X", default, {}) is default
  assert environment.flag("X", default, {"X": ""}) is default


@pytest.mark.parametrize("text", ["2", "disable", "nope", "-1"])
def test_flag_refuses_anything_else_naming_it(text):
  with pytest.raises(environment.BadEnvironment) as e:
    environment.flag("SPECDEC_X", True, {"SPECDEC_X": text})
  assert f"SPECDEC_X={text!r}" in str(e.value)
  assert "allowed" in str(e.value)


@pytest.mark.parametrize("text", ["abc", "-1", "0", "nan", "inf", "-inf"])
def test_seconds_refuses_non_positive_or_non_finite(text):
  with pytest.raises(environment.BadEnvironment, match="SPECDEC_S="):
    environment.seconds("SPECDEC_S", 5.0, {"SPECDEC_S": text})


def test_seconds_reads_a_number_and_defaults():
  assert environment.seconds("S", 5.0, {"S": "2.5"}) == 2.5
  assert environment.seconds("S", 5.0, {}) == 5.0


def test_choice():
  assert environment.choice("C", ("a", "b"), {"C": "b"}) == "b"
  assert environment.choice("C", ("a", "b"), {"C": ""}) is None
  with pytest.raises(environment.BadEnvironment, match="C='avx9000'"):
    environment.choice("C", ("a", "b"), {"C": "avx9000"})


def test_cache_dir_empty_is_the_default_not_the_current_folder():
  home = os.path.expanduser(os.path.join("~", ".cache", "specdec_jax"))
  assert environment.cache_dir({environment.CACHE: ""}) == home
  assert environment.cache_dir({}) == home


def test_cache_dir_is_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  expected = str(tmp_path / "rel")
  assert environment.cache_dir({environment.CACHE: "rel"}) == expected


def test_cache_dir_refuses_a_file_or_a_path_under_one(tmp_path):
  file = tmp_path / "f"
  file.write_text("x")
  for value in (str(file), str(file / "under")):
    with pytest.raises(environment.BadEnvironment, match="a file"):
      environment.cache_dir({environment.CACHE: value})
