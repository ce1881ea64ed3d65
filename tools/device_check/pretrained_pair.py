"""The shipped main pair on this backend: greedy identity and the speedup
(the pair, its captions and decoders: `pair_runs`).

* identity: per caption, the speculative decoder's tokens against the
  target alone's (`exactness.greedy_identity`, must be 60/60). If they
  differ at the backend's default matmul precision, again at 'highest',
  both reported (`common.at_highest_if_needed`).
* matches_xla: on a path other than 'xla', the target alone's tokens
  there against its tokens on 'xla' (`matches_xla`): identity compares
  two loops on one path, this the path's kernels against XLA's.
* decode path: the check's (`--path`; the check's: 'fused' on one GPU)
  for the identity and the main job; `main_job_by_path` repeats the main
  job on 'xla' too, each path at batch 1 and 8 (`main_job_batches`;
  consecutive captions, a last partial batch left out);
  `main_job_by_options` the main job at batch 1 with its loops compiled
  under XLA:GPU option sets (`main_job_option_sets`) against the
  library's own, interleaved; `main_job_by_tiles` the identity and the
  main job at batch 1 on 'fused' under other tiles (`main_job_tiles`: a
  preset for both models, or the target's and the draft's), compiled
  several at once first;
  `main_job_by_mixed_paths` the identity and the main job at batch 1
  with the target and the draft on paths of their own
  (`main_job_mixed_paths`); `main_job_by_gamma` the main job at other γ
  (`gamma_sweep`). In the order γ, mixed paths, options, tiles, then
  `main_job_by_path` (the last two runs left the rest unmeasured); each
  only if `Settings.pretrained_groups` names it (`--pretrained_groups`,
  `common.PRETRAINED_GROUPS`: the record's name less 'main_job_', the
  profile among them).
* main job: the walltime of decoding every caption with each decoder, in
  interleaved rounds (alternating which goes first), compilation excluded
  (one untimed caption each first): speedup = median over rounds of target
  alone / speculative; α, tokens per call, c and the verification call's
  cost (`timing.call_seconds`, as `run` prices them) and Theorem 3.8 at the
  measured α and c.
* main job profile: each loop's round of every caption on the device's
  own timeline (`main_job_profile`), per caption: what the main job's
  time outside its model calls is (on 2026-11-30, 0.85 ms a caption and
  80 µs a speculative iteration): kernels, idle time, and the host's
  waits (gaps over `kernel_profile.LONG_GAP_US`) against the iterations;
  and the target's one-token and verification calls, a call each.
* handover: the host's part of a call (`dispatch.handover`): a program
  that takes what the speculative loop takes and does nothing, handed
  the pair as pytrees (as decoders did before `LoopProgram.bound`) or
  bound, µs a call.
"""
import functools
import os
import time
from typing import Any, Dict, Tuple

import jax
import numpy as np

from specdec_jax.files import io_utils
from specdec_jax.metrics import timing
from specdec_jax.core.decoding import programs
from specdec_jax.core.kernels import gpu
from tools.device_check import common
from tools.device_check import compiles
from tools.device_check import gamma_sweep
from tools.device_check import kernel_profile
from tools.device_check import pair_runs
from tools.device_check import stats
from tools.benchmarks import dispatch


def _decoders(target, draft, max_len: int):
  return (pair_runs.baseline(target, max_len),
          pair_runs.speculative(target, draft, max_len))


def identity(target, draft, batches, max_len: int) -> Dict[str, Any]:
  """Greedy speculative vs target-alone tokens for every caption."""

  def check():
    base, spec = _decoders(target, draft, max_len)
    return pair_runs.identity(pair_runs.decode_all(base, batches),
                              pair_runs.decode_all(spec, batches))

  return common.at_highest_if_needed(check)


def matches_xla(target, batches, max_len: int) -> Dict[str, Any]:
  """The target alone's greedy tokens on its decode path against the same
  model's on 'xla', per caption: the GPU kernels as this device compiled
  them (their masks, biases and gathers, which interpret mode checked on
  the CPU) against XLA's own ops. Float32 sums in another order may part
  two captions at a near-tie; a kernel compiled wrong parts most."""

  def tokens(model):
    return pair_runs.decode_all(pair_runs.baseline(model, max_len), batches)

  xla = tokens(target.unpacked())
  return {
      **pair_runs.identity(xla, tokens(target)),
      **_logits_apart(target, batches[0], xla[0])
  }


def _logits_apart(target, inputs: np.ndarray, decoded: Any) -> Dict[str, Any]:
  """The first caption's tokens as XLA decoded them fed one at a time on
  both paths: how far apart their logits are (float32 sums in another
  order: 2e-5 on the CPU, logits up to 17; a kernel compiled wrong: more,
  0.15 on the CPU with the cache's relative-position biases dropped)."""
  step = jax.jit(lambda m, t, c: m.decode_chunk(t, c))
  length = int(np.asarray(decoded.lengths)[0])
  fed = np.concatenate(  # The start token, then what XLA's path decoded.
      [
          np.asarray(target.start_token(inputs), np.int32)[:, None],
          np.asarray(decoded.tokens, np.int32)[:, :length]
      ], axis=1)
  models = (target, target.unpacked())
  caches = [model.start(inputs, fed.shape[1]) for model in models]
  apart, largest = 0.0, 0.0
  for i in range(fed.shape[1]):
    outs = []
    for j, model in enumerate(models):
      logits, caches[j] = step(model, fed[:, i:i + 1], caches[j])
      outs.append(np.asarray(logits, np.float32))
    apart = max(apart, float(np.abs(outs[0] - outs[1]).max()))
    largest = max(largest, float(np.abs(outs[1]).max()))
  return {
      "logits_max_abs_diff": apart,
      "logits_max_abs": largest,
      "logits_steps": int(fed.shape[1])
  }


def main_job(s: common.Settings, target, draft, batches,
             deadline: common.Deadline) -> Dict[str, Any]:
  """The main job's speedup: interleaved rounds, compilation excluded; what
  a loop that cost nothing would reach (`pair_runs.free_loop`)."""
  base, spec = _decoders(target, draft, s.max_decode_length)
  times, outs = pair_runs.interleaved({
      "baseline": base,
      "speculative": spec
  }, batches, s.rounds, deadline)
  measured = pair_runs.statistics(outs["speculative"])
  seconds = pair_runs.call_seconds(s, target, draft, batches,
                                   measured["tokens_generated"],
                                   (pair_runs.GAMMA,))
  job = {
      "rounds": len(times["baseline"]),
      "baseline_s": times["baseline"],
      "speculative_s": times["speculative"],
      "speedup": stats.median_ratio(times["baseline"], times["speculative"]),
      **measured,
      "batch_factor": pair_runs.batch_factor(outs["baseline"],
                                             outs["speculative"]),
      "target_step_ms": seconds["target"] * 1e3,
      "draft_step_ms": seconds["draft"] * 1e3,
      **pair_runs.theorem_3_8(measured["alpha"], pair_runs.GAMMA, seconds),
  }
  return dict(job, **pair_runs.free_loop(job))


def main_job_profile(s: common.Settings, target, draft, batches, job: Dict[str,
                                                                           Any],
                     deadline: common.Deadline) -> Dict[str, Any]:
  """{'baseline', 'speculative'}: `kernel_profile.profile` of one round of
  every caption (after an untraced one), per caption, with
  `iterations_per_caption` (the baseline's: a token each; the speculative
  loop's: its target calls, from `job`, the main job's record): on a GPU
  each iteration's condition is read back by the host, a long gap each
  unless the loop runs in a CUDA graph; and `_target_calls`' (a call
  each). On a CPU: `note` (no device plane)."""
  base, spec = _decoders(target, draft, s.max_decode_length)
  tokens = job.get("tokens_generated", 0) / len(batches)
  iterations = {
      "baseline": tokens,
      "speculative": tokens / max(job.get("tokens_per_target_call", 1), 1e-9)
  }
  runs: Dict[str, Tuple[Any, int, Dict[str, Any]]] = {
      name: (functools.partial(pair_runs.decode_round, decode, batches),
             len(batches), {
                 "iterations_per_caption": iterations[name]
             }) for name, decode in (("baseline", base), ("speculative", spec))
  }
  runs.update(_target_calls(s, target, batches[0], tokens))
  out: Dict[str, Any] = {}
  for name, (fn, steps, extra) in runs.items():
    if not deadline.allows(10.0):
      out[name] = {"skipped": "time cap"}
      continue
    out[name] = {
        **kernel_profile.profile(fn, calls=1, steps_per_call=steps),
        **extra
    }
  return out


def _target_calls(s: common.Settings, target, inputs: np.ndarray,
                  tokens: float) -> Dict[str, Tuple[Any, int, Dict]]:
  """{'target_k1', 'target_k<γ+1>': (a loop of `inner_steps` of the
  target's calls of that many tokens, as `timing.call_seconds` prices
  them, its steps, {'k'})}: the kernels a verification call's extra time
  is in (its 4-token call cost 1.30 steps on 'fused', 1.09 on 'xla',
  2026-11-29 and -30)."""
  fill, cache_len = pair_runs.priced_calls(s, tokens)
  cache = timing.start(target, jax.numpy.asarray(inputs), max_len=cache_len)
  fills = jax.numpy.full((inputs.shape[0],), fill, jax.numpy.int32)
  return {
      f"target_k{k}": (lambda _, k=k: timing.call_loop(
          target, cache, fills, k=k, steps=s.inner_steps), s.inner_steps, {
              "k": k
          }) for k in (1, pair_runs.GAMMA + 1)
  }


def main_job_by_path(s: common.Settings, target, draft, inputs, first,
                     deadline: common.Deadline) -> Dict[str, Any]:
  """The main job on 'xla' and on the check's path, at each batch size of
  `main_job_batches`: {path: {batch: main_job's record}} (`first`: the
  check's path at batch 1, measured already)."""
  out: Dict[str, Dict[str, Any]] = {}
  for path in dict.fromkeys(("xla", target.decode_path)):
    pair = (target.prepared_for_decoding(path),
            draft.prepared_for_decoding(path))
    for size in s.main_job_batches:
      if path == target.decode_path and size == 1:
        result = first
      elif not deadline.allows(15.0):
        result = {"skipped": "time cap"}
      else:
        common.log(f"pretrained: main job on {path}, batch {size}")
        result = common.guarded(lambda p=pair, n=size: main_job(
            s, p[0], p[1], pair_runs.batched(inputs, n), deadline))
      out.setdefault(path, {})[str(size)] = result
  return out


def _identity_and_main_job(s: common.Settings, target, draft, inputs,
                           deadline: common.Deadline) -> Dict[str, Any]:
  """{'identity', '1': the main job at batch 1} of one pair."""
  return {
      "identity": common.guarded(lambda: identity(
          target, draft, pair_runs.batched(inputs, 1), s.max_decode_length)),
      "1": common.guarded(lambda: main_job(
          s, target, draft, pair_runs.batched(inputs, 1), deadline)),
  }


def _compiled(target, draft, inputs: np.ndarray, max_len: int) -> None:
  """The pair's decoders compiled (one caption each: the main job's
  shape)."""
  base, spec = _decoders(target, draft, max_len)
  for decode in (base, spec):
    pair_runs.decode_all(decode, pair_runs.batched(inputs, 1)[:1])


def by_tiles(s: common.Settings, target, draft, inputs,
             deadline: common.Deadline) -> Dict[str, Any]:
  """On 'fused', under each of `main_job_tiles` (`common.tiles_pair`; the
  draft's small layers as one kernel: `Tiles.layer_bytes`): {name:
  {'identity', '1': main job, 'compile_s'}}, each model carrying its
  tiles (`T5Model.with_tiles`: no cache to clear). Their decoders compile
  several at once first (`compiles.concurrently`), so that nothing
  compiles while anything is timed. Batch 1 only: on the H200 'fused' at
  batch 8 did not compile in the phase's time (2026-11-29);
  `main_job_by_path` has it."""
  if target.decode_path != "fused":
    return {}
  pairs = {}
  for name in s.main_job_tiles:
    target_tiles, draft_tiles = common.tiles_pair(name)
    pairs[name] = (target.with_tiles(target_tiles),
                   draft.with_tiles(draft_tiles))
  common.log("pretrained: compiling the main job under tiles " +
             ", ".join(pairs))
  done, _ = compiles.concurrently(
      {
          name: functools.partial(_compiled, *pair, inputs, s.max_decode_length)
          for name, pair in pairs.items()
      }, lambda slowest: deadline.allows(20.0 + slowest),
      count=compiles.workers())
  out: Dict[str, Any] = {}
  for name, pair in pairs.items():
    if name not in done or not deadline.allows(20.0):
      out[name] = {"skipped": "time cap"}
    elif done[name].error:
      out[name] = {"ok": False, "error": done[name].error}
    else:
      common.log(f"pretrained: identity and main job under tiles {name}")
      out[name] = {
          **_identity_and_main_job(s, *pair, inputs, deadline), "compile_s":
              done[name].seconds
      }
  return out


def by_mixed_paths(s: common.Settings, target, draft, inputs,
                   deadline: common.Deadline) -> Dict[str, Any]:
  """Each model on a path of its own (`main_job_mixed_paths`: the run's
  TARGET_DECODE_PATH and DRAFT_DECODE_PATH; e.g. the target on XLA's
  fastest path, the draft on the fused kernels, where each step is
  fastest): {'<target's path>+<draft's path>': {'identity', '1': main
  job}}; not the pairs whose paths are the same, which the main job on
  its path is."""
  out: Dict[str, Any] = {}
  for target_path, draft_path in s.main_job_mixed_paths:
    if target_path == draft_path:
      continue
    name = f"{target_path}+{draft_path}"
    if not deadline.allows(20.0):
      out[name] = {"skipped": "time cap"}
      continue
    common.log(f"pretrained: identity and main job, target on {target_path}"
               f", draft on {draft_path}")
    out[name] = _identity_and_main_job(
        s, target.prepared_for_decoding(target_path),
        draft.prepared_for_decoding(draft_path), inputs, deadline)
  return out


def by_options(s: common.Settings, target, draft, inputs,
               deadline: common.Deadline) -> Dict[str, Any]:
  """The main job at batch 1 with its loops compiled under each XLA:GPU
  option set of `main_job_option_sets` (`kernels.gpu.GPU_OPTION_SETS`;
  e.g. the while loop in a CUDA graph: no read back of its test to the
  host every iteration) and under the library's ('current':
  `GPU_LOOP_OPTIONS`), every decoder in one set of interleaved rounds:
  {'current': main job, set: main job + 'vs_current' (the median ratio of
  current's seconds to the set's, per decoder: above 1, faster)}; each
  with the greedy identity of its last round. Off a GPU every set
  compiles the same programs (the options are XLA:GPU's): there it runs
  on 'fused' only, as the GPU decodes (the check of this code on a CPU)."""
  if not s.main_job_option_sets or (jax.default_backend() != "gpu" and
                                    target.decode_path != "fused"):
    return {}
  if not deadline.allows(30.0):
    return {"skipped": "time cap"}
  common.log("pretrained: main job under XLA:GPU option sets " +
             ", ".join(s.main_job_option_sets))
  decoders: Dict[str, Any] = {}
  for name in ("current", *s.main_job_option_sets):
    options = (gpu.GPU_LOOP_OPTIONS
               if name == "current" else gpu.GPU_OPTION_SETS[name])
    with programs.gpu_loop_options(options):
      base, spec = _decoders(target, draft, s.max_decode_length)
    decoders.update({f"{name}/baseline": base, f"{name}/speculative": spec})
  times, outs = pair_runs.interleaved(decoders, pair_runs.batched(inputs, 1),
                                      s.rounds, deadline)
  out: Dict[str, Any] = {}
  for name in ("current", *s.main_job_option_sets):
    base_s, spec_s = times[f"{name}/baseline"], times[f"{name}/speculative"]
    out[name] = {
        "rounds": len(base_s),
        "baseline_s": base_s,
        "speculative_s": spec_s,
        "speedup": stats.median_ratio(base_s, spec_s),
        "identity": pair_runs.identity(outs[f"{name}/baseline"],
                                       outs[f"{name}/speculative"]),
        **pair_runs.statistics(outs[f"{name}/speculative"]),
    }
    if name != "current":
      out[name]["vs_current"] = {
          part: stats.median_ratio(
              times[f"current/{part}"],
              times[f"{name}/{part}"]) for part in ("baseline", "speculative")
      }
  return out


def _groups(s: common.Settings, record: common.Recorder, target, draft,
            inputs: np.ndarray, deadline: common.Deadline) -> None:
  """The main job's other measurements, each `s.pretrained_groups` names,
  as the records `main_job_<group>`. What two H200 runs left unmeasured
  first: γ and each model on its fastest path, the loops' while in a CUDA
  graph, other tiles; then 'xla' and batch 8 (measured on 2026-11-29)."""
  job, batch_1 = record.data["main_job"], pair_runs.batched(inputs, 1)
  groups = {
      "profile": lambda: main_job_profile(s, target, draft, batch_1, job,
                                          deadline),
      "by_gamma": lambda: gamma_sweep.by_gamma(s, target, draft, inputs,
                                               deadline),
      "by_mixed_paths": lambda: by_mixed_paths(s, target, draft, inputs,
                                               deadline),
      "by_options": lambda: by_options(s, target, draft, inputs, deadline),
      "by_tiles": lambda: by_tiles(s, target, draft, inputs, deadline),
      "by_path": lambda: main_job_by_path(s, target, draft, inputs, job,
                                          deadline),
  }
  assert tuple(groups) == common.PRETRAINED_GROUPS
  for name in s.pretrained_groups:
    # The other groups guard each of their runs (a pair, a preset, a path).
    whole = name in ("profile", "by_gamma", "by_options")
    record.set(f"main_job_{name}",
               common.guarded(groups[name]) if whole else groups[name]())


def run(s: common.Settings, record: common.Recorder,
        deadline: common.Deadline) -> bool:
  """The phase; True if the greedy outputs are identical on every caption."""
  start = time.perf_counter()
  target, target_ckpt = pair_runs.load_model(pair_runs.TARGET_DIR,
                                             s.decode_path)
  draft, draft_ckpt = pair_runs.load_model(pair_runs.DRAFT_DIR, s.decode_path)
  inputs = pair_runs.encode_captions(s.examples, s.input_length)
  batches = pair_runs.batched(inputs, 1)
  record.set(
      "pair", {
          "target": os.path.relpath(target_ckpt, io_utils.REPO_DIR),
          "draft": os.path.relpath(draft_ckpt, io_utils.REPO_DIR),
          "target_params": target.config.num_params,
          "draft_params": draft.config.num_params,
          "examples": len(batches),
          "max_decode_length": s.max_decode_length,
          "gamma": pair_runs.GAMMA,
          "load_s": time.perf_counter() - start,
          "decode_path": target.decode_path
      })
  common.log("pretrained: greedy identity")
  same = identity(target, draft, batches, s.max_decode_length)
  record.set("identity", same)
  record.set(
      "handover",
      common.guarded(lambda: dispatch.handover(target, draft, batches[0])))
  if target.decode_path != "xla":
    common.log("pretrained: the target's tokens on its path against 'xla'")
    record.set(
        "matches_xla",
        common.guarded(
            lambda: matches_xla(target, batches, s.max_decode_length)))
  if deadline.allows(10.0):
    common.log("pretrained: main job speedup (interleaved rounds)")
    record.set(
        "main_job",
        common.guarded(lambda: main_job(s, target, draft, batches, deadline)))
    _groups(s, record, target, draft, inputs, deadline)
  else:
    record.set("main_job", {"skipped": "time cap"})
  return bool(same["all_identical"])
