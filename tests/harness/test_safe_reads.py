"""Files read safely, caches validated, variables parsed one way (issue 59).

* Defect 2 and its weak spots: a FIFO, a link to /dev/zero, a folder or an
  oversized file where the project reads a cache entry, a results file, a
  DIGESTS.json or an NGRAM_CORPUS is refused with one line naming it and
  what it is (`io_utils.read_bytes`), never read: a FIFO blocked its
  reader until killed, /dev/zero filled the memory.
* Defect 1 and "auto accepts absurd cached numbers": every value of an
  `auto-prices` / `auto-pilots` entry is checked like an input
  (`price_cache.check_prices`, `check_pilots`); a bad one is a miss with
  one warning naming the file and the value.
* Defect 12 and the variables' weak spots: an empty SPECDEC_JAX_CACHE is
  the default folder, not the current one; switches read 0/1/true/false;
  bad values are `environment.BadEnvironment` (one line, exit 2).
* The compilation cache's folder that is a file or read-only: one line, the
  cache off for the run; an entry that is a FIFO or a link to /dev/zero: a
  miss, removed.

A read that would block is bounded by an alarm (`file_helpers.no_hang`):
on the old code these tests fail instead of hanging the suite.
"""
import json
import os
import tempfile

from file_helpers import KINDS
from file_helpers import no_hang
from file_helpers import special
import pytest

from specdec_jax import checkpoints
from specdec_jax import report
from specdec_jax import run as run_lib
from specdec_jax.checkpoints import digests
from specdec_jax.core import environment
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import price_cache
from specdec_jax.files import compilation_cache
from specdec_jax.files import io_utils
from specdec_jax.terminal import console

HOME_CACHE = os.path.expanduser(os.path.join("~", ".cache", "specdec_jax"))


# ---------------------------------------------------------------------------
# The one reading helper.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_read_bytes_refuses_what_is_not_a_regular_file(tmp_path, kind):
  path = special(tmp_path / "entry.json", kind)
  with no_hang(), pytest.raises(io_utils.RefusedFile) as e:
    io_utils.read_text(path)
  assert str(e.value) == (f"{path}: {KINDS[kind]}, not a regular file; "
                          "not read")
  assert isinstance(e.value, OSError)


def test_read_bytes_bounds_the_size_and_follows_links_to_files(tmp_path):
  data = tmp_path / "data.json"
  data.write_bytes(b"x" * 100)
  link = tmp_path / "link.json"
  link.symlink_to(data)
  assert io_utils.read_bytes(link) == b"x" * 100
  with pytest.raises(io_utils.RefusedFile,
                     match="100 bytes, over the 99-byte limit"):
    io_utils.read_bytes(data, max_bytes=99)
  assert io_utils.read_bytes(data, max_bytes=None) == b"x" * 100
  with pytest.raises(FileNotFoundError):
    io_utils.read_bytes(tmp_path / "missing")
  with io_utils.open_text(str(data)) as f:
    assert f.read() == "x" * 100


# ---------------------------------------------------------------------------
# Where the project reads them: caches, results, checkpoints, the corpus.
# ---------------------------------------------------------------------------
@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(environment.CACHE, str(tmp_path / "cache"))
  monkeypatch.delenv(price_cache.ENV_OFF, raising=False)
  warned = []
  monkeypatch.setattr(price_cache.logging, "warning",
                      lambda text, *args: warned.append(text % args))
  return warned


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_an_auto_cache_entry_that_is_special_is_a_miss(cache_dir, kind):
  fields = {"machine": {"host": "h"}, "call_ks": [1, 2]}
  os.makedirs(price_cache.folder(price_cache.PRICES))
  path = special(price_cache.path(fields), kind)
  with no_hang():
    assert price_cache.load(fields) is None
  (line,) = cache_dir
  assert path in line and KINDS[kind] in line


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_digests_json_that_is_special_is_refused_not_unverified(
    tmp_path, kind):
  folder = tmp_path / "checkpoint_1"
  folder.mkdir()
  path = special(folder / digests.MANIFEST_FILE, kind)
  for read in (digests.verify_manifest, digests.vocabulary_record):
    with no_hang(), pytest.raises(checkpoints.CheckpointError) as e:
      read(str(folder))
    assert f"{path}: {KINDS[kind]}, not a regular file" in str(e.value)
    assert "allowed" in str(e.value).lower()


def test_an_ngram_corpus_that_is_a_fifo_says_so(tmp_path):
  path = special(tmp_path / "corpus.txt", "fifo")
  with no_hang(), pytest.raises(ValueError) as e:
    drafter_registry.read_corpus(path, vocab=None, vocab_size=10)
  assert str(e.value).startswith(f"NGRAM_CORPUS={path!r}: a FIFO, not a "
                                 "regular file")
  with pytest.raises(ValueError, match="no such file"):
    drafter_registry.read_corpus(str(tmp_path / "none.txt"), None, 10)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_results_file_that_is_special_is_named_by_the_report(tmp_path, kind):
  run = tmp_path / "results" / "run"
  run.mkdir(parents=True)
  path = special(run / "metrics.json", kind)
  with no_hang(), pytest.raises(report.ReportError) as e:
    report.load_results(str(tmp_path / "results"))
  assert str(e.value).startswith(f"{path}: cannot read ({KINDS[kind]}")
  predictions = special(tmp_path / "predictions.jsonl", kind)
  with no_hang(), pytest.raises(report.ReportError, match=KINDS[kind]):
    list(report.iter_predictions(predictions))


# ---------------------------------------------------------------------------
# The compilation cache.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_compilation_cache_entry_that_is_special_is_a_miss(
    tmp_path, kind, capsys):
  from jax._src import lru_cache  # pylint: disable=g-import-not-at-top
  assert compilation_cache.atomic_writes()
  cache = lru_cache.LRUCache(str(tmp_path), max_size=1 << 20)
  entry = special(tmp_path / "jit_f-ab12-cache", kind)
  compilation_cache._told_refused.clear()  # pylint: disable=protected-access
  with no_hang():
    assert cache.get("jit_f-ab12") is None
  assert not os.path.lexists(entry)  # removed: the next put writes it
  assert f"{entry}: {KINDS[kind]}" in capsys.readouterr().err
  cache.put("jit_f-ab12", b"program")
  assert cache.get("jit_f-ab12") == b"program"


@pytest.fixture
def jax_cache_config(monkeypatch):
  """Restores what `enable` changes in this process's JAX config."""
  import jax  # pylint: disable=g-import-not-at-top
  names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir")
  before = {n: getattr(jax.config, n) for n in names}
  monkeypatch.delenv(compilation_cache.ENV_OFF, raising=False)
  yield jax.config
  for name, value in before.items():
    jax.config.update(name, value)


def test_a_compilation_cache_folder_that_is_a_file_is_one_line(
    tmp_path, monkeypatch, capsys, jax_cache_config):
  folder = tmp_path / "jax-cache"
  folder.write_text("not a folder")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(folder))
  assert compilation_cache.enable() == ""
  assert not jax_cache_config.jax_enable_compilation_cache
  (line,) = capsys.readouterr().err.splitlines()
  assert line == (f"specdec_jax: the compilation cache is off for this run: "
                  f"{folder} is a file, not a folder. (Or turn it off: "
                  "SPECDEC_JAX_COMPILATION_CACHE=0.)")


def test_a_read_only_compilation_cache_folder_is_one_line(
    tmp_path, monkeypatch, capsys, jax_cache_config):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))

  def read_only(*args, **kwargs):  # (chmod does not stop root)
    raise PermissionError(13, "Permission denied")

  monkeypatch.setattr(tempfile, "mkstemp", read_only)
  assert compilation_cache.enable() == ""
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith("specdec_jax: the compilation cache is off for this "
                         f"run: {tmp_path} is not a writable directory: "
                         "Permission denied")


# ---------------------------------------------------------------------------
# The variables.
# ---------------------------------------------------------------------------
def test_an_empty_cache_variable_is_the_default_folder(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv(environment.CACHE, "")
  assert price_cache.folder(price_cache.PILOTS) == os.path.join(
      HOME_CACHE, "auto-pilots")
  assert compilation_cache.cache_dir() == os.path.join(HOME_CACHE,
                                                       "jax-compilation-cache")


def test_a_cache_variable_that_is_a_file_is_refused(tmp_path, monkeypatch):
  file = tmp_path / "file"
  file.write_text("x")
  monkeypatch.setenv(environment.CACHE, str(file))
  for read in (compilation_cache.check_environment,
               lambda: price_cache.folder(price_cache.PRICES)):
    with pytest.raises(environment.BadEnvironment, match="a file"):
      read()


@pytest.mark.parametrize("text,on", [("false", False), ("no", False),
                                     ("0", False), ("true", True), ("", True)])
def test_the_cache_switches_read_both_spellings(monkeypatch, text, on,
                                                jax_cache_config):
  monkeypatch.setenv(price_cache.ENV_OFF, text)
  monkeypatch.setenv(compilation_cache.ENV_OFF, text)
  assert price_cache.enabled() is on
  if not on:
    assert compilation_cache.enable() == ""


@pytest.mark.parametrize("name,value", [
    ("SPECDEC_JAX_PRICE_CACHE", "maybe"),
    ("SPECDEC_JAX_COMPILATION_CACHE", "disable"),
    ("SPECDEC_JAX_CPU_KERNEL", "2"),
    ("SPECDEC_JAX_KERNEL_ISA", "avx9000"),
])
def test_a_bad_variable_is_refused_at_the_start(monkeypatch, name, value):
  monkeypatch.setenv(name, value)
  with pytest.raises(environment.BadEnvironment) as e:
    compilation_cache.enable()  # every command's start, before loading
  assert str(e.value).startswith(f"{name}={value!r}: allowed")


def test_the_gcs_timeout_is_read_by_the_environment_parser(monkeypatch):
  monkeypatch.setenv(io_utils.TIMEOUT_ENV, "nan")
  with pytest.raises(environment.BadEnvironment, match="SPECDEC_GCS_TIMEOUT_S"):
    io_utils.remote_timeout_s()


def test_the_commands_report_a_bad_variable_in_one_line(monkeypatch, capsys):

  def bad():
    raise environment.BadEnvironment("SPECDEC_X='y': allowed: 1 or 0.")

  assert console.run_cli("run", bad, run_lib.BAD_INPUT) == 2
  monkeypatch.setattr(report, "render_report", lambda *a, **k: bad())
  assert report.main(["results"]) == 2
  lines = capsys.readouterr().err.splitlines()
  assert "run: error: SPECDEC_X='y': allowed: 1 or 0." in lines
  assert "report: error: SPECDEC_X='y': allowed: 1 or 0." in lines


# ---------------------------------------------------------------------------
# Cached numbers, checked like inputs.
# ---------------------------------------------------------------------------
KS = (1, 2, 4)
TREE = {"gamma": 3, "widths": [2], "nodes": [1, 7]}


def _prices():
  """A price entry as `price_cache.measure_prices` writes it."""
  return {
      "target_step_s": 0.004,
      "call_cost_by_k": {
          "1": 1.0,
          "2": 1.1,
          "4": 1.3
      },
      "cost_coefficient_c": 0.05,
      "tree_call_cost_by_nodes": {
          "1": 1.0,
          "7": 1.6
      },
      "cost_coefficient_by_tree_width": {
          "2": 0.1
      },
  }


PILOTS = {"token": ["token", 3, None, True], "tree": ["tree", 3, 2, False]}


def _pilots():
  """A pilot entry as `pilots.pilots_for` writes it."""
  common = {
      "gamma": 3,
      "examples": 8,
      "batches": 2,
      "batches_read": 2,
      "input_width": 16,
      "acceptance_trials": 40,
      "alpha": 0.6,
      "alpha_interval": [0.5, 0.7],
      "mean_output_tokens": 12.5,
      "output_lengths": [12, 13] * 4,
  }
  return {
      "records": {
          "token": {
              **common, "tree_width": None,
              "baseline_s": 2.0,
              "speculative_s": 1.0,
              "speedup": 2.0
          },
          "tree": {
              **common, "tree_width": 2,
              "first_depth": 0.7,
              "deeper": 0.6,
              "first_depth_by_width": [0.6, 0.7]
          },
      },
      "batches": 2,
      "inputs": "abc123",
  }


def test_valid_cached_entries_pass():
  price_cache.check_prices(_prices(), KS, TREE)
  price_cache.check_prices(
      {
          k: v
          for k, v in _prices().items()
          if k not in ("cost_coefficient_c", "cost_coefficient_by_tree_width")
      }, KS, TREE, target_only=True)
  price_cache.check_prices(
      {
          k: v
          for k, v in _prices().items()
          if not k.startswith(("tree", "cost_coefficient_by"))
      }, KS)
  # Trees alone (GAMMA / TREE_WIDTH 'auto' on a tree run): no chain's c.
  price_cache.check_prices(
      {
          k: v for k, v in _prices().items() if k != "cost_coefficient_c"
      }, (), TREE)
  price_cache.check_pilots(_pilots(), PILOTS)


def _edit(entry, path, value):
  """`entry` with the value at `path` (keys) replaced; `...`: deleted."""
  *parents, last = path
  node = entry
  for key in parents:
    node = node[key]
  if value is Ellipsis:
    del node[last]
  else:
    node[last] = value
  return entry


@pytest.mark.parametrize("path,value,named", [
    (("cost_coefficient_c",), "cheap", "cost_coefficient_c='cheap'"),
    (("cost_coefficient_c",), -0.1, "cost_coefficient_c=-0.1"),
    (("cost_coefficient_c",), float("nan"), "cost_coefficient_c=nan"),
    (("call_cost_by_k",), ..., "call_cost_by_k is missing"),
    (("call_cost_by_k", "4"), ..., "call_cost_by_k has no cost of 4"),
    (("call_cost_by_k", "2"), float("inf"), "call_cost_by_k['2']=inf"),
    (("call_cost_by_k", "2"), 0.0, "call_cost_by_k['2']=0.0"),
    (("call_cost_by_k", "x"), 1.0, "call_cost_by_k key 'x'"),
    (("call_cost_by_k", "1"), 0.5, "call_cost_by_k['1']=0.5"),
    (("target_step_s",), True, "target_step_s=True"),
    (("tree_call_cost_by_nodes", "7"), -1, "tree_call_cost_by_nodes['7']=-1"),
    (("cost_coefficient_by_tree_width",), ...,
     "cost_coefficient_by_tree_width is missing"),
])
def test_a_bad_cached_price_is_named(path, value, named):
  with pytest.raises(price_cache.BadEntry) as e:
    price_cache.check_prices(_edit(_prices(), path, value), KS, TREE)
  assert str(e.value).startswith(named)


@pytest.mark.parametrize("path,value,named", [
    (("records", "token", "mean_output_tokens"), float("nan"),
     "records['token'].mean_output_tokens=nan"),
    (("records", "token", "alpha"), 5, "records['token'].alpha=5"),
    (("records", "token", "speedup"), 1000.0, "records['token'].speedup=1000"),
    (("records", "token", "speculative_s"), ...,
     "records['token'].speculative_s is missing"),
    (("records", "token", "gamma"), 4, "records['token'].gamma, tree_width"),
    (("records", "token", "output_lengths"), [3, -1],
     "records['token'].output_lengths[1]=-1"),
    (("records", "tree", "deeper"), -0.2, "records['tree'].deeper=-0.2"),
    (("records", "tree", "first_depth_by_width"), [0.5, "x"],
     "records['tree'].first_depth_by_width[1]='x'"),
    (("records", "tree"), ..., "records['tree'] is missing"),
    (("batches",), "two", "batches='two'"),
    (("inputs",), None, "inputs=None"),
])
def test_a_bad_cached_pilot_is_named(path, value, named):
  with pytest.raises(price_cache.BadEntry) as e:
    price_cache.check_pilots(_edit(_pilots(), path, value), PILOTS)
  assert str(e.value).startswith(named)


def test_a_bad_entry_is_a_miss_with_one_warning_and_is_rewritten(cache_dir):
  fields = {"machine": {"host": "h"}, "call_ks": list(KS)}

  def check(entry):
    price_cache.check_prices(entry, KS, TREE)

  price_cache.store(fields, _edit(_prices(), ("cost_coefficient_c",), "cheap"))
  assert price_cache.load(fields) is not None  # unchecked: as stored
  assert price_cache.load(fields, check=check) is None
  (line,) = cache_dir
  assert price_cache.path(fields) in line
  assert "cost_coefficient_c='cheap'" in line
  price_cache.store(fields, _prices())  # measured again
  assert price_cache.load(fields, check=check) == _prices()
  assert len(cache_dir) == 1
  file = price_cache.path(fields)
  with open(file, "w", encoding="utf-8") as f:
    json.dump({"fields": "other"}, f)
  assert price_cache.load(fields, check=check) is None  # another key: silent
  assert len(cache_dir) == 1
