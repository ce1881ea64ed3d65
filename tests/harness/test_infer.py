"""MODE='infer': the speculative decoder only; the predictions.jsonl rows of
every mode are T5X's (a run end to end: tests/e2e/test_run_e2e.py)."""
from types import SimpleNamespace

import numpy as np
import pytest

from specdec_jax.config import flag_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import batches
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import predictions
from specdec_jax.experiment import runner

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_infer_is_a_mode_and_beams_may_infer():
  args = arguments.RunArguments(output_dir="/tmp/unused", mode="infer",
                                decode_mode=decode_modes.BeamMode(size=2))
  assert args.mode == "infer"
  with pytest.raises(flag_utils.ConfigError, match="MODE='alph'"):
    arguments.RunArguments(output_dir="/tmp/unused", mode="alph")


# T5X's predictions rows, from t5x/infer.py's `write_inferences_to_file`
# (google-research/t5x): `json_dict['inputs']` holds the task's features
# whose names end in '_pretokenized' (`k.endswith('_pretokenized')`), mode
# 'predict' adds `json_dict['prediction']` (the decoded text) and, with
# output_ids, `json_dict['prediction_tokens']`; mode 'predict_with_aux'
# adds `json_dict['aux']` (the model's other values).
T5X_REQUIRED_KEYS = {"inputs", "prediction"}
T5X_OPTIONAL_KEYS = {"prediction_tokens", "aux"}
T5X_INPUT_SUFFIX = "_pretokenized"
# The features of a seqio translation / summarization task.
T5X_TASK_FEATURES = {"inputs_pretokenized", "targets_pretokenized"}


def _t5x_problems(row):
  """What in `row` a reader of T5X's predictions would not find."""
  problems = []
  if not T5X_REQUIRED_KEYS <= set(row):
    problems.append(f"missing {T5X_REQUIRED_KEYS - set(row)}")
  extra = set(row) - T5X_REQUIRED_KEYS - T5X_OPTIONAL_KEYS
  if extra:
    problems.append(f"keys T5X does not write: {extra}")
  inputs = row.get("inputs")
  if not isinstance(inputs, dict) or not all(
      k.endswith(T5X_INPUT_SUFFIX) and isinstance(v, str)
      for k, v in inputs.items()):
    problems.append(f"inputs not T5X's: {inputs!r}")
  if not isinstance(row.get("prediction"), str):
    problems.append("prediction is not a text")
  if "aux" in row and not isinstance(row["aux"], dict):
    problems.append("aux is not an object")
  return problems


def test_walltime_and_infer_rows_are_t5x_rows():
  """Issue 58: one predictions.jsonl schema, T5X's, for both modes; our
  own values under `aux`, the speculative text as the prediction."""
  example = {
      "input": "translate English to German: A dog.",
      "reference": "Ein Hund."
  }
  trace = {"accepted_counts": [2, 1], "trace": None}
  walltime = predictions.row(3, example, "Ein Hund.", 2, "Ein Hund!", trace)
  infer = predictions.row(3, example, "Ein Hund.", 2)
  for row in (walltime, infer):
    assert _t5x_problems(row) == [], row
    assert set(row["inputs"]) == T5X_TASK_FEATURES
    assert row["inputs"]["inputs_pretokenized"] == example["input"]
    assert row["inputs"]["targets_pretokenized"] == example["reference"]
    assert row["prediction"] == "Ein Hund."  # the speculative output
  assert walltime["aux"] == {
      "index": 3,
      "baseline": "Ein Hund!",
      "target_calls": 2,
      "accepted_counts": [2, 1],
      "trace": None
  }
  assert infer["aux"] == {"index": 3, "target_calls": 2}
  # No reference: no targets feature, as T5X writes a task without one.
  alone = predictions.row(0, {"input": "x", "reference": None}, "y", 1)
  assert _t5x_problems(alone) == [] and set(
      alone["inputs"]) == {"inputs_pretokenized"}


def test_infer_json_alpha_is_metrics_json_alpha():
  """Issue 58: infer.json's α was the histogram's estimator (min(n + 1, γ)
  trials per call, an output's last call included) while metrics.json's
  is kept guesses / acceptance trials that reached the output: the same
  decode printed two α. Both are `Tally.alpha` now."""
  # γ = 2, one row: a call keeping both guesses (2 trials), then one whose
  # output ended (EOS) after its first guess, kept (1 trial reached it).
  out = SimpleNamespace(target_calls=np.array([2]),
                        accepted_histogram=np.array([[0, 1, 1]]),
                        trace_num_accepted=np.array([[2, 1, -1]]),
                        tokens=np.array([[5, 6, 7, 1,
                                          0]]), lengths=np.array([4]),
                        beta_count=np.array([3]), beta_sum=np.array([2.7]))
  tally = batches.Tally()
  tally.add(out, np.array([0]), decode_modes.TOKEN, 1.0)
  assert tally.alpha == 1.0 and tally.call_alpha == 0.75
  args = SimpleNamespace(label="t", target_name="p", draft_name="q",
                         drafting=SimpleNamespace(label=lambda name: name),
                         gamma=2, temperature=0.0, speculation="on")
  plan = SimpleNamespace(online=None, args=args, mode=decode_modes.TOKEN,
                         task_kind="translation", settings={}, gamma_auto=None)
  record = runner.infer_record(plan, [{
      "input": "x",
      "reference": "y"
  }], ["y"], tally, 0.0, {})
  assert record["alpha"] == tally.alpha == 1.0
  assert "gamma_auto" not in record
  # GAMMA='auto': infer.json keeps how γ was chosen, as metrics.json does.
  chosen = {"chosen_gamma": 2, "chosen_predicted_speedup": 1.5}
  plan.gamma_auto = chosen
  assert runner.infer_record(plan, [{
      "input": "x",
      "reference": "y"
  }], ["y"], tally, 0.0, {})["gamma_auto"] == chosen
