"""Exactness on this backend: every decoding mode against the target alone.

On tiny random float32 models (a target with sharpened logits and a noisy
copy of it as the draft, so that guesses are kept and rejected), decoding
on the check's decode path (`--path`; the check's: 'fused' on one GPU,
the GPU kernels of `kernels.gpu`), for each
mode (token: Algorithm 1; block: block verification; tree: k branches;
beam: speculative beam search):

* greedy identity (`exactness.greedy_identity`): the mode's greedy tokens
  equal the target alone's on every row (beam: `beam_search`'s beams, and
  its scores). If they differ at the backend's default matmul precision (a
  GPU may multiply float32 in TF32, and a K-token call may round
  differently from K one-token calls), the check is repeated at 'highest'
  precision, and both are reported (`common.at_highest_if_needed`);
* a whole-decoder two-sample chi-square (`exactness.distribution_test`;
  token, block, tree; beam search is deterministic): the first `chi_steps`
  tokens of `chi_samples` speculative samples against as many of the
  target alone at the same temperature must pass (p >= significance), and
  against the target at `wrong_factor` x the temperature (its logits
  divided by it) must fail (the test's power).
"""
import hashlib
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding import speculative_beam
from specdec_jax.core.decoding.block_acceptance import BlockAcceptance
from specdec_jax.core.kernels import gpu_layers
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes
from specdec_jax.metrics import exactness
from tools.device_check import common

MODES = ("token", "block", "tree", "beam")
_SHARPEN = 3.0  # logits x 3: far from uniform, so T x 0.9 is visible.
_NOISE = 0.5  # the draft: the target + 0.5 std of noise on every weight.


def argmax_kernel() -> Dict[str, Any]:
  """The GPU kernels' argmax (`gpu_layers.argmax`: what a layer's kernel
  fed a greedy draft's logits takes) against `jnp.argmax`, 8 rows at the
  shipped vocabulary (8000) and at T5's (32128): equal maxima in one block
  and in two, NaN after +inf, a row of -inf, the maximum last, and random
  rows. {'ok', 'by_vocab': {V: {'rows', 'agree'}}}; not part of the
  modes' exactness (the target verifies whatever a draft is fed), but
  their α under the tiles that run it."""
  rng = np.random.default_rng(8)
  by_vocab = {}
  for vocab in (8000, 32128):
    logits = rng.standard_normal((8, vocab)).astype(np.float32)
    logits[0, [3, 5]] = 9.0
    logits[1, [5, 2000]] = 9.0
    logits[2, [4, vocab - 1]] = [np.inf, np.nan]
    logits[3] = -np.inf
    logits[4, vocab - 1] = 9.0
    got = np.asarray(gpu_layers.argmax(jnp.asarray(logits)))
    want = np.asarray(jnp.argmax(jnp.asarray(logits), axis=-1))
    by_vocab[str(vocab)] = {
        "rows": len(want),
        "agree": int((got == want).sum())
    }
  return {
      "ok": all(v["agree"] == v["rows"] for v in by_vocab.values()),
      "by_vocab": by_vocab
  }


def _with_logits_scaled(params: Dict[str, Any], factor: float):
  """A copy of `params` whose output logits are multiplied by `factor`."""
  decoder = dict(params["decoder"])
  decoder["logits_dense"] = {
      "kernel": params["decoder"]["logits_dense"]["kernel"] * factor
  }
  return {**params, "decoder": decoder}


def _tiny_params(config: T5Config, wrong_factor: float):
  """(target, draft, wrong target) parameters, drawn with NumPy (nothing
  to compile): kernels N(0, 1/fan-in), embeddings N(0, 1), norms 1."""
  rng = np.random.default_rng(21)
  shapes = param_shapes(config)["params"]

  def draw(path, leaf):
    name = path[-1].key
    if name == "scale":
      return np.ones(leaf.shape, np.float32)
    std = common.leaf_std(name, leaf.shape)
    return (rng.standard_normal(leaf.shape) * std).astype(np.float32)

  params = _with_logits_scaled(jax.tree_util.tree_map_with_path(draw, shapes),
                               _SHARPEN)
  noisy = jax.tree_util.tree_map(
      lambda x: (x + _NOISE * np.std(x) * rng.standard_normal(x.shape)).astype(
          np.float32), params)
  return params, noisy, _with_logits_scaled(params, 1.0 / wrong_factor)


def tiny_models(vocab: int, layers: int, wrong_factor: float,
                path: Optional[str] = None) -> Tuple[T5Model, T5Model, T5Model]:
  """(target, draft, wrong target): float32 models of `layers` encoder and
  decoder layers, prepared for decoding on `path` (None: the backend's).
  The wrong target is the target at `wrong_factor` x the temperature (its
  logits / wrong_factor: the same compiled programs as the target's)."""
  config = T5Config(vocab_size=vocab, emb_dim=16, num_heads=2, head_dim=8,
                    mlp_dim=32, num_encoder_layers=layers,
                    num_decoder_layers=layers)
  models = []
  for params in _tiny_params(config, wrong_factor):
    params = jax.tree_util.tree_map(jnp.asarray, params)
    models.append(
        T5Model(config, {
            "params": params
        }).prepared_for_decoding(path))
  return models[0], models[1], models[2]


def _samplers(s: common.Settings, target, draft) -> Dict[str, Callable]:
  """The modes that sample: mode -> fn(inputs, rng, temperature, max_len,
  eos) -> (tokens [B, max_len], {statistic name: value})."""

  def token(inputs, rng, temperature, max_len, eos, acceptance=None):
    out = decoding.speculative_sample(target, draft, inputs, rng, gamma=s.gamma,
                                      max_decode_length=max_len,
                                      temperature=temperature, eos_id=eos,
                                      acceptance=acceptance)
    return out.tokens, {"alpha_hat": out.statistics()["alpha_hat"]}

  def block(inputs, rng, temperature, max_len, eos):
    return token(inputs, rng, temperature, max_len, eos, BlockAcceptance())

  def tree(inputs, rng, temperature, max_len, eos):
    out = decoding.tree_speculative_sample(target, draft, inputs, rng,
                                           gamma=s.gamma,
                                           tree_width=s.tree_width,
                                           max_decode_length=max_len,
                                           temperature=temperature, eos_id=eos)
    rate = out.statistics()["tokens_per_target_call"]
    return out.tokens, {"tokens_per_target_call": rate}

  return {"token": token, "block": block, "tree": tree}


def _baseline(target, inputs, rng, temperature, max_len, eos):
  return decoding.temperature_sample(target, inputs, rng,
                                     max_decode_length=max_len,
                                     temperature=temperature, eos_id=eos).tokens


def _beam_identity(s: common.Settings, target, draft, inputs) -> Dict[str, Any]:
  """Speculative beam search's beams and scores vs beam search's."""
  base = beam_search.beam_search(target, inputs, beam_size=s.beam_size,
                                 max_decode_len=s.greedy_length)
  spec = speculative_beam.speculative_beam_search(
      target, draft, inputs, beam_size=s.beam_size,
      max_decode_len=s.greedy_length, gamma=s.gamma)
  score_diff = float(
      np.max(np.abs(np.asarray(base.scores) - np.asarray(spec.scores))))
  return {
      **exactness.greedy_identity(base.tokens, spec.tokens),
      "max_abs_score_diff": score_diff,
      "target_calls": int(spec.calls),
      "baseline_steps": int(base.steps),
  }


def _greedy_checks(s: common.Settings, target, draft) -> Dict[str, Callable]:
  """mode -> fn(inputs [B, S]) -> `exactness.greedy_identity`'s record
  (beam: and more): the mode's greedy output against the target alone's."""

  def against_baseline(sampler):

    def check(inputs):
      rng = jax.random.PRNGKey(0)
      base = _baseline(target, inputs, rng, 0.0, s.greedy_length, -1)
      spec = sampler(inputs, rng, 0.0, s.greedy_length, -1)[0]
      return exactness.greedy_identity(base, spec)

    return check

  checks = {
      mode: against_baseline(sampler)
      for mode, sampler in _samplers(s, target, draft).items()
  }
  checks["beam"] = lambda inputs: _beam_identity(s, target, draft, inputs)
  return checks


def distribution(s: common.Settings, sampler: Callable, inputs, base,
                 wrong) -> Dict[str, Any]:
  """A mode's samples against the target's (pass) and the wrong one's;
  `samples_sha256` tells each mode's draws apart (every mode draws from
  the same key: two modes with one digest ran one computation)."""
  spec, statistics = sampler(inputs, jax.random.PRNGKey(7), s.temperature,
                             s.chi_steps, 1)
  spec = np.array(spec)  # A copy, not a view of a device buffer.
  return {
      "samples": len(inputs),
      "samples_sha256": hashlib.sha256(spec.tobytes()).hexdigest(),
      **exactness.distribution_test(spec, base, wrong, significance=s.significance),
      **statistics,
  }


def _mode(s: common.Settings, mode: str, target, draft, greedy_inputs,
          chi_inputs, base, wrong) -> Dict[str, Any]:
  """One mode's greedy identity and, if it samples, its chi-square tests."""
  check = _greedy_checks(s, target, draft)[mode]
  greedy = common.at_highest_if_needed(lambda: check(greedy_inputs))
  entry: Dict[str, Any] = {"greedy": greedy, "ok": greedy["all_identical"]}
  sampler = _samplers(s, target, draft).get(mode)
  if sampler is not None:  # Beam search is deterministic.
    d = distribution(s, sampler, chi_inputs, base, wrong)
    entry["distribution"] = d
    entry["ok"] = entry["ok"] and d["passed"] and d["power_ok"]
  return entry


def run(s: common.Settings, record: common.Recorder,
        deadline: common.Deadline) -> bool:
  """The phase: every mode's greedy identity and chi-square; True if all
  hold."""
  target, draft, wrong_target = tiny_models(s.vocab, s.layers, s.wrong_factor,
                                            s.decode_path)
  rng = np.random.default_rng(3)
  greedy_inputs = rng.integers(2, s.vocab, (s.greedy_rows, 6)).astype(np.int32)
  chi_inputs = np.repeat(np.array([[3, 4, 2, 1]], np.int32), s.chi_samples,
                         axis=0)
  record.set(
      "settings", {
          "vocab": s.vocab,
          "layers": s.layers,
          "gamma": s.gamma,
          "tree_width": s.tree_width,
          "beam_size": s.beam_size,
          "temperature": s.temperature,
          "wrong_temperature": s.temperature * s.wrong_factor,
          "chi_samples": s.chi_samples,
          "chi_steps": s.chi_steps,
          "significance": s.significance,
          "backend": jax.default_backend(),
          "decode_path": target.decode_path
      })
  base = _baseline(target, chi_inputs, jax.random.PRNGKey(5), s.temperature,
                   s.chi_steps, 1)
  wrong = _baseline(wrong_target, chi_inputs, jax.random.PRNGKey(6),
                    s.temperature, s.chi_steps, 1)
  if target.decode_path == "fused":
    common.log("exactness: the kernels' argmax")
    record.set("argmax_kernel", common.guarded(argmax_kernel))
  results, all_ok = {}, True
  for mode in MODES:
    if not deadline.allows(5.0):
      results[mode] = {"skipped": "time cap"}
    else:
      common.log(f"exactness: {mode}")
      results[mode] = common.guarded(lambda m=mode: _mode(
          s, m, target, draft, greedy_inputs, chi_inputs, base, wrong))
    all_ok = all_ok and results[mode].get("ok") is True
    record.set("modes", results)
  record.set("all_ok", all_ok)
  return all_ok
