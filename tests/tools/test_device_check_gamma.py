"""The device check's main job at other γ and as trees
(`tools.device_check.gamma_sweep`): what it records per run, which run it
calls fastest, and its summary line, on stand-in decoders (the real pair
runs in tests/e2e/test_device_check_e2e.py).
"""
import dataclasses

import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core.models import shared_encoder
from specdec_jax.metrics import analysis
from specdec_jax.metrics import timing
from tools.device_check import common
from tools.device_check import gamma_sweep
from tools.device_check import pair_runs
from tools.device_check import summary


@dataclasses.dataclass(frozen=True)
class _Model:
  path: str = "xla"

  def prepared_for_decoding(self, path):
    return _Model(path)


@dataclasses.dataclass(frozen=True)
class _Out:
  tokens: np.ndarray
  calls: int

  def statistics(self):
    # Each call keeps 2 of 3 guesses: α 2/3 over 3 trials a call.
    return {
        "accepted_histogram": [0, 0, self.calls],
        "acceptance_trials": 3 * self.calls,
        "tokens_generated": int(self.tokens.size),
        "target_calls": self.calls,
    }


# Seconds a round per decoder; γ 7 the fastest, but it parts from the
# target alone on the last caption.
_ROUND_S = {
    "baseline": 1.0,
    "gamma_3": 0.8,
    "gamma_5": 0.6,
    "gamma_7": 0.5,
    "tree_2x3": 0.7,
    "draft_shared_x": 0.75
}
_PRICES = {
    "target": 1e-3,
    "draft": 1e-4,
    "verify_4": 1.1e-3,
    "verify_6": 1.2e-3,
    "verify_8": 1.4e-3
}


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
  built, priced = [], []
  (tmp_path / "shared_x").mkdir()  # A shipped draft; 'gone' is not here.
  monkeypatch.setattr(pair_runs, "PAIR_DIR", tmp_path)
  monkeypatch.setattr(
      pair_runs, "load_model", lambda directory, path:
      (_Model(f"{directory.name} on {path}"), str(directory)))
  monkeypatch.setattr(
      shared_encoder.SharedEncoderModel, "draft_for",
      classmethod(lambda cls, t, d: _Model(f"{d.path} reading {t.path}")))

  def baseline(target, max_len):
    built.append(("baseline", target.path))
    return lambda b, rng: _Out(np.asarray(b)[:, :3], 3)

  def speculative(target, draft, max_len, gamma=3):
    built.append((gamma, target.path, draft.path))

    def decode(b, rng):
      tokens = np.asarray(b)[:, :3].copy()
      if gamma == 7 and tokens[0, 0] == 2:
        tokens[0, 1] += 1
      return _Out(tokens, 1)

    return decode

  def tree(target, draft, *, gamma, tree_width, max_decode_length, method,
           eos_id):
    built.append((f"tree {tree_width}x{gamma}", target.path, draft.path))
    return lambda b, rng: _Out(np.asarray(b)[:, :3], 2)

  def interleaved(decoders, batches, rounds, deadline):
    outs = {n: [d(b, None) for b in batches] for n, d in decoders.items()}
    return {n: [_ROUND_S[n]] * rounds for n in decoders}, outs

  def call_seconds(calls, inputs, **kwargs):
    priced.append((sorted(calls), kwargs["cache_len"]))
    return {name: _PRICES[name] for name in calls}

  monkeypatch.setattr(pair_runs, "baseline", baseline)
  monkeypatch.setattr(pair_runs, "speculative", speculative)
  monkeypatch.setattr(pair_runs, "interleaved", interleaved)
  monkeypatch.setattr(decoding, "tree_decoder", tree)
  monkeypatch.setattr(timing, "call_seconds", call_seconds)
  return built, priced


def _settings(**kwargs):
  return dataclasses.replace(
      common.SMALL, **{
          "rounds": 3,
          "main_job_gammas": (7, 3, 5),
          "main_job_trees": ((2, 3),),
          "main_job_drafts": ("shared_x", "gone"),
          "main_job_gamma_paths": ("packed", "fused"),
          **kwargs
      })


def test_each_gamma_tree_and_draft_is_timed_against_the_target_alone(stand_ins):
  built, priced = stand_ins
  inputs = np.arange(3)[:, None] * np.ones((1, 4), np.int32)  # 3 captions
  r = gamma_sweep.by_gamma(_settings(), _Model(), _Model(), inputs,
                           common.Deadline(600.0))
  # The pair on the paths named, each decoder built once.
  assert sorted(built, key=str) == sorted(
      [("baseline", "packed"), (3, "packed", "fused"), (5, "packed", "fused"),
       (7, "packed", "fused"), ("tree 2x3", "packed", "fused"),
       (3, "packed", "shared_x on fused reading packed")], key=str)
  # Every verification call priced in one set of rounds, with room for the
  # largest γ's.
  assert priced == [(["draft", "target", "verify_4", "verify_6",
                      "verify_8"], common.SMALL.max_decode_length + 8)]
  assert r["paths"] == "packed+fused" and r["rounds"] == 3
  runs = r["runs"]
  assert list(runs) == [
      "gamma_3", "gamma_5", "gamma_7", "tree_2x3", "draft_shared_x"
  ]
  assert runs["draft_shared_x"]["draft"] == "shared_x"
  assert r["missing"] == ["gone"]
  for name, m in runs.items():
    assert m["speedup"] == pytest.approx(1.0 / _ROUND_S[name]), name
    assert m["alpha"] == pytest.approx(2 / 3), name
  for g, cost in ((3, 1.1), (5, 1.2), (7, 1.4)):
    m = runs[f"gamma_{g}"]
    assert m["gamma"] == g and m["c"] == pytest.approx(0.1)
    assert m["verification_call_cost"] == pytest.approx(cost)
    assert m["theorem_3_8_with_call_cost"] == pytest.approx(
        analysis.expected_speedup(2 / 3, g, 0.1, call_cost=cost))
  tree = runs["tree_2x3"]
  assert (tree["tree_width"], tree["gamma"], tree["nodes"]) == (2, 3, 7)
  assert tree["tokens_per_target_call"] == pytest.approx(1.5)
  assert "theorem_3_8" not in tree  # Theorem 3.8 is a chain's.
  assert runs["gamma_5"]["identity"]["identical"] == 3
  assert runs["gamma_7"]["identity"]["identical"] == 2
  # γ 7 ran fastest but parted from the target: not the one to use.
  assert r["fastest"] == "gamma_5"
  # In that order whatever the record's (JSON sorts keys).
  line = summary._gamma_line({**r, "runs": dict(sorted(runs.items()))})
  assert line.startswith(
      "  main job by γ, tree and draft, target on packed, draft on fused:")
  assert "γ 5 1.67x (α 0.67, call 1.20 steps" in line
  assert "tree 2x3 1.43x (α 0.67, 1.50 tokens a call)" in line
  assert "draft shared_x 1.33x (α 0.67, 3.00 tokens a call)" in line
  assert line.endswith("identity 3/3, 3/3, 2/3, 3/3, 3/3; fastest γ 5 "
                       "(drafts not here: gone)")
  report = {"pretrained": {"main_job_by_gamma": r}}
  assert summary._other_pairs_identical(report) is False


def test_trees_alone_are_timed_without_pricing_a_chain(stand_ins):
  _, priced = stand_ins
  r = gamma_sweep.by_gamma(_settings(main_job_gammas=(), main_job_drafts=()),
                           _Model(), _Model(), np.ones((2, 4), np.int32),
                           common.Deadline(600.0))
  assert list(r["runs"]) == ["tree_2x3"] and r["fastest"] == "tree_2x3"
  assert priced == []
  assert summary._gamma_line(r).endswith("fastest tree 2x3")


def test_no_runs_nothing_and_no_time_a_skip(stand_ins):
  inputs = np.ones((2, 4), np.int32)
  assert gamma_sweep.by_gamma(
      _settings(main_job_gammas=(), main_job_trees=(),
                main_job_drafts=("gone",)), _Model(), _Model(), inputs,
      common.Deadline(600.0)) == {}
  r = gamma_sweep.by_gamma(_settings(), _Model(), _Model(), inputs,
                           common.Deadline(5.0))
  assert r == {"skipped": "time cap"}
  assert summary._gamma_line(r) == "  main job by γ, tree and draft: time cap"
  assert stand_ins[0] == []  # Nothing built.
