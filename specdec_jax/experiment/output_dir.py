"""A run's settings record and the OVERWRITE rule of its OUTPUT_DIR.

`settings_record` is what makes a run's results what they are: every run
argument but OUTPUT_DIR / OVERWRITE / MODE, both model configs and the
vocabulary (metrics.json and alpha.json record it as `settings`).
`check_output_dir` claims OUTPUT_DIR as every command claims its folder
(`files.output_folder.claim`: created and probed, locked, one run at a
time) and refuses a result file there (metrics.json, alpha.json,
predictions.jsonl or its `.partial`) of other settings than the run's,
unless OVERWRITE=True; the same settings may be re-run freely. An empty
`.partial` (a run killed before its first row) holds nothing and protects
nothing.
"""
import dataclasses
import json
import os
import re
from typing import Any, Dict, Iterator

from absl import logging
import jax.numpy as jnp

from specdec_jax.config import gin_reader
from specdec_jax.config import paths
from specdec_jax.core.models import T5Config
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import loading
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from specdec_jax.metrics import run_metrics

# The settings of the run that last started writing here (hidden; read by
# the OVERWRITE rule for predictions files, which record none).
SETTINGS_FILE = ".specdec.settings.json"
# Where `predictions.PredictionsWriter` appends rows until the run ends.
PARTIAL_PREDICTIONS_FILE = "." + run_metrics.PREDICTIONS_FILE + ".partial"
PREDICTIONS_FILES = (run_metrics.PREDICTIONS_FILE, PARTIAL_PREDICTIONS_FILE)
# Every file a run's results are in, whole or partial (the OVERWRITE rule).
RESULT_FILES = (run_metrics.METRICS_FILE, run_metrics.ALPHA_FILE,
                run_metrics.INFER_FILE) + PREDICTIONS_FILES
# Arguments that do not make a run's results different (PRICE_CALL_COST:
# whether c is priced after the same decode; metrics.json says which).
# The components record themselves (`settings_record`).
NOT_SETTINGS = ("output_dir", "overwrite", "mode", "compile_topology",
                "price_call_cost", "decode_mode", "drafting")


def settings_record(args: arguments.RunArguments, mode: decode_modes.DecodeMode,
                    target_config: T5Config, draft_config: T5Config,
                    vocab) -> Dict[str, Any]:
  """The run's `settings` (see the module docstring; `mode`: the run's),
  JSON-normalized: `run` holds the run arguments and the components'
  settings under the flat names they had as run arguments, each only where
  it makes a run differ from the runs before it existed."""
  run_args = {
      f.name: getattr(args, f.name)
      for f in dataclasses.fields(args)
      if f.name not in NOT_SETTINGS
  }
  if args.mode == "infer":  # its predictions.jsonl rows are T5X's form
    run_args["mode"] = args.mode
  # The paper's setting (its drafter, exact): recorded as before these
  # options existed, so earlier results still count as the same run.
  beyond = {**args.drafting.flat(), "lenience": mode.lenience}
  if beyond != {**drafter_registry.FLAT_DEFAULTS, "lenience": 1.0}:
    run_args.update(beyond)
  else:
    run_args.pop("ngram_corpus")
  # Likewise: each mode's own settings (ACCEPTANCE, a tree's, the beams')
  # in its runs only; Algorithm 1 is the default.
  run_args.update(mode.record())
  if args.speculation == decode_modes.SPECULATION_ON:  # as before it existed
    run_args.pop("speculation")
  record = {
      "run": run_args,
      "target": gin_reader.t5_config_fields(target_config),
      "draft": gin_reader.t5_config_fields(draft_config),
      "vocabulary": {
          # `vocab.SentencePieceFile` reads as seqio's vocabulary does and
          # is recorded under its name: the same results, the same run.
          "kind": getattr(vocab, "seqio_kind",
                          type(vocab).__name__),
          "size": int(vocab.vocab_size),
          "file": getattr(vocab, "sentencepiece_model_file", None)
      },
  }
  return json.loads(json.dumps(record, sort_keys=True, default=str))


def comparable(settings: Any) -> Any:
  """A settings record as today's version writes it, for comparison.

  Earlier versions wrote a model's dtype as `str` of its type ("<class
  'numpy.float32'>") and a vocabulary file as the path resolved from the
  current directory (possibly relative); both name the same thing as
  today's "float32" and resolved path.
  """
  if not isinstance(settings, dict):
    return settings
  out = json.loads(json.dumps(settings))
  for role in ("target", "draft"):
    config = out.get(role)
    dtype = config.get("dtype") if isinstance(config, dict) else None
    match = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", str(dtype))
    if match:
      try:
        config["dtype"] = jnp.dtype(match.group(1)).name
      except TypeError:
        pass
  vocab = out.get("vocabulary")
  if isinstance(vocab, dict) and isinstance(vocab.get("file"), str):
    vocab["file"] = loading.resolve(vocab["file"])
  return out


def _recorded_settings(path: str) -> Any:
  """The `settings` a results file records, as today's version writes
  them (None: none, or unreadable)."""
  return comparable(output_folder.recorded_settings(path))


def check_output_dir(out: str, settings: Dict[str, Any], overwrite: bool,
                     program: str = "run") -> "_ResultsLock":
  """Claims `out` (`output_folder.claim`: created, probed and locked) and
  refuses another run's results there; returns the lock (the caller
  releases it).

  Raises:
    ConfigError: `out` is not a writable directory, another run holds it
      (`output_folder.acquire`), or it holds a result file of other
      settings (or of none) and `overwrite` is False.
  """
  held = output_folder.claim(out, comparable(settings), _results,
                             name="OUTPUT_DIR", program=program,
                             overwrite=overwrite,
                             overwrite_flag="OVERWRITE=True")
  try:
    # Whose results the folder will hold, before any is written: a
    # predictions file kept by this run (full disk, Ctrl-C) is protected
    # from a later run of other settings as metrics.json is.
    io_utils.write_json(os.path.join(out, SETTINGS_FILE),
                        {"settings": settings})
  except BaseException:
    held.release()
    raise
  return _ResultsLock(held, out)


class _ResultsLock:
  """The folder's claim; `release` also drops SETTINGS_FILE when the run
  kept no result file (nothing to protect: a folder the run created is
  then empty again, and removed)."""

  def __init__(self, held: output_folder.Claim, out: str):
    self.held, self.out = held, out

  def release(self) -> None:
    record = os.path.join(self.out, SETTINGS_FILE)
    try:
      if io_utils.isfile(record) and not any(
          _holds_results(self.out, name) for name in RESULT_FILES):
        io_utils.remove(record)
    except OSError as e:  # the results are written: only warn
      logging.warning("could not remove %s: %s", SETTINGS_FILE, e)
    self.held.release()


def _holds_results(out: str, name: str) -> bool:
  """Whether `out/name` is a result file to protect: an empty `.partial`
  (killed before its first row) is not one, and would otherwise refuse
  every run of other settings for nothing."""
  path = os.path.join(out, name)
  if not io_utils.isfile(path):
    return False
  if name == PARTIAL_PREDICTIONS_FILE and not paths.is_url(path):
    try:
      return os.path.getsize(path) > 0
    except OSError:
      return False
  return True


def _results(out: str) -> Iterator[output_folder.Result]:
  """Every result file, whole or partial (the OVERWRITE rule).
  metrics.json and alpha.json record their settings; the predictions
  files are the run's that metrics.json (or SETTINGS_FILE) names."""
  for name in RESULT_FILES:
    if not _holds_results(out, name):
      continue
    if name not in PREDICTIONS_FILES:
      yield output_folder.Result(name,
                                 _recorded_settings(os.path.join(out, name)))
      continue
    old = _recorded_settings(os.path.join(out, run_metrics.METRICS_FILE))
    if old is None:
      old = _recorded_settings(os.path.join(out, SETTINGS_FILE))
    yield output_folder.Result(name, old, kept=True)
