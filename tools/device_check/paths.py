"""The decode paths side by side (issue 56): what a decoder step costs on
each path, per model, in one process.

For the T5-XXL-shaped target and the T5-small/base/large-shaped drafts of
the physics phase (random bfloat16 weights, batch 1, `physics.Bench`), on
each of `Settings.paths` ('xla': XLA's ops on T5X's kernels; 'packed':
packed kernels, biases once per call; 'fused': the GPU kernels of
`kernels.gpu`), every step timed in one set of interleaved rounds:

* `steps`: per model and path, the one-token step (ms), the share of its
  memory floor (the decoder's weight bytes at this process's measured copy
  rate, `env.ceilings`: floor ms / step ms; `read_floor_share` at its read
  rate, a sum's) and c (a draft's step / the
  target's step on the same path), and the target's `max(chunk_sizes)`
  -token call (the verification call of Table 2's γ = 7 rows) in target
  steps (`call_cost`); `table2`: Theorem 3.8 per Table 2 row at each
  path's c and call cost (`stats.theorem_rows`); `table2_pairs`: the same
  for every (target's path, draft's path) pair, and per row the best
  against the target alone on its fastest path (`table2_pairs`);
* `kernels`: per path, the kernels of the compiled one-token loop of a
  T5-small-shaped decoder with 1 and with 2 decoder layers
  (`launch_ops`): the difference is the kernels a decoder layer runs, the
  rest the step's fixed ones (embedding, logits, the loop);
* `tiles`: the target's and the small draft's step on 'fused' with each
  of `Settings.tile_presets` (`kernels.gpu_tiles.TILE_PRESETS`), and the
  target's `max(chunk_sizes)`-token call with each of `tile_call_presets`,
  and under each of those whether the small draft's logits are the same
  bits in one-token calls and in one call (`rows_identical`);
* `option_sets`: the small draft's step on each path under each XLA:GPU
  option set (`kernels.gpu.GPU_OPTION_SETS`), in ms and against the
  default set; a set this jaxlib refuses is recorded with its error;
* `profile`: where the small draft's and the target's step spend their
  device time on each path (`kernel_profile`: the kernels a step runs on
  the device, their time, the device's idle share, the costliest by name),
  and the small draft's on 'fused' under the CUDA cores' tiles too.

`Settings.paths_groups` picks the groups (`steps` and the tables from
it, then the others in `_GROUPS`' order). Each group is written when
measured; a group that does not fit the phase's time cap is marked
skipped, one that fails records its error and the others still run.
"""
import collections
import functools
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes
from tools.benchmarks import iteration_hlo
from tools.device_check import common
from tools.device_check import barriers
from tools.device_check import compiles
from tools.device_check import env
from tools.device_check import kernel_profile
from tools.device_check import physics
from tools.device_check import stats

# Seconds kept for timing the compiled variants (interleaved rounds of
# `Settings.repeats` calls; an XXL step is ~10 ms) after the last compile.
_TIMING_RESERVE_S = 15.0
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")
_OP = re.compile(r"^\s+(?:ROOT )?%?[\w.\-]+ = .*? ([a-z][\w\-]*)\(")


def launch_ops(hlo: str) -> Dict[str, int]:
  """Kernel-launching ops of a compiled program (`compiled.as_text()`), by
  kind: those of the computations that run as its steps (the entry, loop
  bodies and conditions, conditional branches), not the ops inside a
  fusion or a reduction's computation."""
  inner = set(re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", hlo))
  counts: Dict[str, int] = collections.Counter()
  name = None
  for line in hlo.splitlines():
    header = _HEADER.match(line)
    if header:
      name = header.group(1)
      continue
    op = _OP.match(line)
    if name is not None and name not in inner and op and (
        op.group(1) not in iteration_hlo.NOT_LAUNCHES):
      counts[op.group(1)] += 1
  return dict(counts)


def _models(b: physics.Bench, s: common.Settings) -> List[str]:
  """Every (model, path) key, each model built once and packed per path."""
  keys = []
  for i, name in enumerate((s.target,) + tuple(s.drafts)):
    for path in s.paths:
      b.model(name, seed=i, path=path)
      keys.append(b.key(name, path))
  return keys


def _steps(b: physics.Bench, s: common.Settings, rates: Dict[str, float],
           record: common.Recorder) -> Dict[str, Dict[str, Any]]:
  """Every model's step and the target's `max(chunk_sizes)`-token call on
  every path (interleaved); returns per path the step's ms by model and
  the call's cost in target steps (`_pair_rows` reads them)."""
  keys = _models(b, s)
  k = max(s.chunk_sizes)
  calls = {f"{b.key(s.target, p)}@k{k}": b.key(s.target, p) for p in s.paths}
  common.log(f"paths: steps of {len(keys)} models x paths, the target's "
             f"{k}-token call on {len(calls)} paths")
  measured = b.time({
      **{
          key: b.call(key, 1) for key in keys
      },
      **{
          name: b.call(key, k) for name, key in calls.items()
      }
  })
  out: Dict[str, Any] = {}
  by_path: Dict[str, Dict[str, Any]] = {
      p: {
          "ms": {},
          "call_cost": {}
      } for p in s.paths
  }
  for key in keys:
    name, path = key.split(":")
    ms = measured["ms"][key]
    nbytes = common.param_bytes(b.plain[name].params["params"]["decoder"])
    floor_ms = nbytes / (rates["copy_gbps"] * 1e9) * 1e3
    target_ms = measured["ms"][b.key(s.target, path)]
    out.setdefault(path, {})[name] = {
        "step_ms": ms,
        "decoder_bytes": nbytes,
        "floor_ms": floor_ms,
        "floor_share": floor_ms / ms,
        "read_floor_share": nbytes / (rates["read_gbps"] * 1e6) / ms,
        "first_call_s": measured["first_call_s"][key],
    }
    by_path[path]["ms"][name] = ms
    if name != s.target:
      out[path][name]["c"] = ms / target_ms
  for name, key in calls.items():
    path = key.split(":")[1]
    cost = measured["ms"][name] / out[path][s.target]["step_ms"]
    out[path][s.target].update(call_k=k, call_ms=measured["ms"][name],
                               call_cost=cost)
    by_path[path]["call_cost"] = {k: cost}
  record.set("steps", out)
  return by_path


def _against(row: Dict[str, Any], scale: float) -> Optional[float]:
  """A `stats.theorem_rows` row's Theorem 3.8 (with the call cost where
  measured) times `scale`; None where its draft was not measured."""
  value = row["theorem_3_8_with_call_cost"]
  value = row["theorem_3_8"] if value is None else value
  return None if value is None else value * scale


def _pair_rows(rows: Sequence[Dict[str, Any]], t: Dict[str, Any],
               d: Dict[str, Any], target: str) -> List[Dict[str, Any]]:
  """`stats.theorem_rows` with the drafts' steps of `d` over the target's
  of `t` as c (`_steps`' per-path records) and `t`'s call cost."""
  c = {
      name: ms / t["ms"][target]
      for name, ms in d["ms"].items()
      if name != target
  }
  return stats.theorem_rows(rows, c, t["call_cost"])


def table2_pairs(rows: Sequence[Dict[str, Any]], by_path: Dict[str, Dict[str,
                                                                         Any]],
                 target: str) -> Dict[str, Any]:
  """Theorem 3.8 per Table 2 row for every (target's path, draft's path)
  pair (`run`'s TARGET_DECODE_PATH and DRAFT_DECODE_PATH): c = the draft's
  step on its path / the target's on its own, the target's call cost on
  its path (where measured at the row's γ+1). Each row also gets
  `against_fastest_target`: the speedup over the target alone on its
  fastest path (a pair whose target is slow has a small c, and beats only
  a slow baseline); `best` per row is the pair of the highest, its
  `of_paper` that ÷ the paper's speedup."""
  fastest = min(m["ms"][target] for m in by_path.values())
  pairs = {}
  for t_path, t in by_path.items():
    for d_path, d in by_path.items():
      pairs[f"{t_path}+{d_path}"] = [
          dict(row, against_fastest_target=_against(row,
                                                    fastest / t["ms"][target]))
          for row in _pair_rows(rows, t, d, target)
      ]
  best = []
  for i, row in enumerate(rows):
    scored = [(r[i]["against_fastest_target"], pair)
              for pair, r in pairs.items()
              if r[i]["against_fastest_target"] is not None]
    if scored:
      value, pair = max(scored)
      best.append({
          "task": row["task"],
          "draft": row["draft"],
          "temperature": row["temperature"],
          "gamma": row["gamma"],
          "paper": row["speedup"],
          "pair": pair,
          "against_fastest_target": value,
          "of_paper": value / row["speedup"]
      })
  return {"pairs": pairs, "best": best}


def on_device(tree: Any, device: Any = None) -> Any:
  """`tree`'s arrays as shapes (`jax.ShapeDtypeStruct`), on `device` (a
  deviceless GPU's: `tools.benchmarks.gpu_aot`) or this backend's."""
  sharding = None if device is None else jax.sharding.SingleDeviceSharding(
      device)
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def abstract_model(config: T5Config, path: str, device: Any = None) -> T5Model:
  """A model of `config` on decode path `path`, shapes only (no weights),
  its parameters in `config.dtype`."""
  shapes = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, config.dtype),
      param_shapes(config))
  return on_device(
      jax.eval_shape(lambda p: T5Model(config, p).prepared_for_decoding(path),
                     shapes), device)


def compile_shapes(jitted: Any, *args, device: Any = None, **static) -> Any:
  """`jitted` (a `jax.jit` function, with its compiler options; `static`
  its static arguments) compiled for `args`' shapes: for this backend, or
  for `device`'s GPU (lowered for CUDA with the kernels for Triton,
  `gpu.lowering_for_gpu`)."""
  if device is None:
    return jitted.lower(*args, **static).compile()
  with gpu.lowering_for_gpu():
    lowered = jitted.trace(*args, **static).lower(lowering_platforms=("cuda",))
  return lowered.compile()


def loop_hlo(model: T5Model, *, input_length: int, cache_len: int, steps: int,
             k: int = 1, device: Any = None,
             options: Optional[Dict[str, Any]] = None) -> str:
  """The compiled program (HLO text) of `steps` `k`-token calls of `model`
  (`timing.call_loop`, batch 1, traced now: under `gpu.tiles`, with its
  tiles; the cache's fill is an argument: its value compiles nothing)."""
  tokens = jax.ShapeDtypeStruct((1, input_length), jnp.int32)
  cache = jax.eval_shape(lambda m, e: m.start(e, cache_len), model.unpacked(),
                         tokens)
  fill = jax.ShapeDtypeStruct((1,), jnp.int32)
  return compile_shapes(physics.call_loop_with(options or {}), model,
                        on_device(cache, device), on_device(fill, device),
                        device=device, k=k, steps=steps).as_text()


def kernel_counts(hlo: str) -> Dict[str, Any]:
  """A compiled call loop's (`loop_hlo`) kernels: the program's, by kind,
  those of one step (its loop's body and test) and its Triton calls."""
  ops = launch_ops(hlo)
  step = iteration_hlo.iteration_kernels(hlo)
  return {
      "kernels": sum(ops.values()),
      "by_kind": ops,
      "per_step": step["body"] + step["condition"],
      "triton_calls": hlo.count(gpu.TRITON_CALL),
  }


def layer_kernels(config: T5Config, paths: Sequence[str], *, device: Any = None,
                  **loop: int) -> Dict[str, Any]:
  """Kernels per decoder layer on each path: `config` with 1 and with 2
  decoder layers (one encoder layer), their one-token loops (`loop_hlo`'s
  `loop` arguments) compiled from shapes; the difference of their steps'
  kernels is what a decoder layer launches per step, the rest the step's
  fixed ones (embedding, logits, the loop's test)."""
  out: Dict[str, Any] = {}
  for layers in (1, 2):
    shaped = config.replace(num_decoder_layers=layers, num_encoder_layers=1)
    for path in paths:
      hlo = loop_hlo(abstract_model(shaped, path, device), device=device,
                     **loop)
      out.setdefault(path, {})[f"layers_{layers}"] = kernel_counts(hlo)
  for counts in out.values():
    one, two = counts["layers_1"]["per_step"], counts["layers_2"]["per_step"]
    counts["per_decoder_layer"] = two - one
    counts["fixed"] = 2 * one - two
  return out


def _kernels(s: common.Settings, record: common.Recorder) -> None:
  """`layer_kernels` of a T5-small-shaped decoder (bfloat16)."""
  record.set(
      "kernels",
      layer_kernels(common.t5_size("small", tiny=s.tiny_physics), s.paths,
                    input_length=s.physics_input_length, cache_len=s.cache_len,
                    steps=s.inner_steps))


def _timed_variants(b: physics.Bench, variants: Dict[str, Callable[[int], Any]],
                    reference: str,
                    deadline: common.Deadline) -> Dict[str, Any]:
  """Times the variants that compile (interleaved), the others' errors.

  Compiles the variants several at once (`compiles.concurrently`),
  starting one only while the slowest compile so far plus the timing's
  reserve (`_TIMING_RESERVE_S`) still fits `deadline`: the others are
  `skipped` (named), so a group that runs out of time still times what
  it compiled rather than being killed with nothing written.
  """
  done, skipped = compiles.concurrently(
      {
          n: functools.partial(_first_call, fn) for n, fn in variants.items()
      }, lambda slowest: deadline.allows(slowest + _TIMING_RESERVE_S),
      count=compiles.workers())
  ok = {n: variants[n] for n, d in done.items() if d.error is None}
  failed = {n: d.error for n, d in done.items() if d.error is not None}
  compile_s = {n: d.seconds for n, d in done.items()}
  out: Dict[str, Any] = {
      "errors": failed,
      "skipped": skipped,
      "compile_s": compile_s
  }
  if ok:
    measured = b.time(ok)
    out["ms"] = measured["ms"]
    base = measured["ms"].get(reference)
    out["vs_reference"] = ({
        n: ms / base for n, ms in measured["ms"].items()
    } if base else None)
  return out


def _option_sets(b: physics.Bench, s: common.Settings, record: common.Recorder,
                 deadline: common.Deadline) -> None:
  """The small draft's step on each path under each XLA:GPU option set."""
  draft = s.drafts[0]
  variants = {}
  for path in s.paths:
    for name in s.option_sets:
      loop = physics.call_loop_with(gpu.GPU_OPTION_SETS[name])
      variants[f"{path}/{name}"] = b.call(b.key(draft, path), 1, loop=loop)
  common.log(f"paths: {len(variants)} option sets x paths ({draft} step)")
  record.set(
      "option_sets", {
          "model": draft,
          **_timed_variants(b, variants, f"{s.paths[0]}/default", deadline)
      })


def _first_call(fn: Callable[[int], Any]) -> None:
  """fn(0) to its end: a variant's compile (and one run)."""
  jax.block_until_ready(fn(0))


def _with_tiles(fn: Callable[[int], Any], preset: str) -> Callable[[int], Any]:
  """fn under tile preset `preset` (its fresh program is traced on its
  first call, inside)."""

  def run(r):
    with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS[preset]):
      return fn(r)

  return run


def rows_identical(model: T5Model, cache: Any, k: int,
                   preset: str) -> Dict[str, Any]:
  """Whether k tokens' logits are the same bits from k one-token calls as
  from one k-token call of `model` from `cache` (batch 1), under tile
  preset `preset`: what greedy identity rests on (on tensor cores, that a
  GPU's dot rounds a row alike wherever it sits in the tile); and how far
  the call's logits are from XLA's path's (`vs_xla_max_abs_diff`, of
  `logits_max_abs`; `vs_xla_argmax_agree`: the tokens whose argmax
  agree): a kernel compiled wrong, or programs that read each other's
  rows too early (`Tiles.programs`' barriers), parts by far more than
  rounding."""
  tokens = jnp.asarray(
      np.random.default_rng(1).integers(2, model.config.vocab_size, (1, k)),
      jnp.int32)
  with gpu_tiles.tiles(gpu_tiles.TILE_PRESETS[preset]):
    step = jax.jit(lambda m, t, c: m.decode_chunk(t, c))  # Traced here.
    one, state = [], cache
    for i in range(k):
      logits, state = step(model, tokens[:, i:i + 1], state)
      one.append(np.asarray(logits, np.float32))
    chunk = np.asarray(step(model, tokens, cache)[0], np.float32)
  xla = np.asarray(step(model.unpacked(), tokens, cache)[0], np.float32)
  single = np.concatenate(one, axis=1)
  return {
      "k": k,
      "identical": bool(np.array_equal(single, chunk)),
      "max_abs_diff": float(np.abs(single - chunk).max()),
      "vs_xla_max_abs_diff": float(np.abs(chunk - xla).max()),
      "vs_xla_argmax_agree": int((chunk.argmax(-1) == xla.argmax(-1)).sum()),
      "logits_max_abs": float(np.abs(xla).max()),
  }


def folds_nothing(model: T5Model, preset: str) -> bool:
  """Whether tile preset `preset` folds layers (`Tiles.fold_bytes`) but
  none of `model`'s (`gpu.folded_layer` of decoder layer 0's T5X weights'
  bytes): the model's program is then its unfolded twin's, not timed
  again."""
  tiles = gpu_tiles.TILE_PRESETS[preset]
  layer = model.params["params"]["decoder"]["layers_0"]
  weight_bytes = sum(
      x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(layer))
  with gpu_tiles.tiles(tiles):
    return tiles.fold_bytes > 0 and not gpu.folded_layer(weight_bytes)


def target_skips(model: T5Model, preset: str) -> bool:
  """Whether the `tiles` group leaves the target out under tile preset
  `preset`: one that folds none of its layers (`folds_nothing`), or one
  that spreads layers over the GPU's programs (`Tiles.programs`: for
  small models; an XXL step under them the grids' model prices at 10.1
  ms, 6.9 split, and its 8-token call took 82-326 s to compile here)."""
  return folds_nothing(model,
                       preset) or gpu_tiles.TILE_PRESETS[preset].programs > 0


def _tiles(b: physics.Bench, s: common.Settings, record: common.Recorder,
           deadline: common.Deadline) -> None:
  """The target's and the small draft's 'fused' step with each tile preset,
  and the target's `max(chunk_sizes)`-token call with each of
  `tile_call_presets`; for the target, not the presets `target_skips`.
  Compiled in that order while `deadline` allows (`_timed_variants`),
  then `rows_identical` per call preset while it still does."""
  variants = {}
  k = max(s.chunk_sizes)
  target = b.key(s.target, "fused")
  for preset in s.tile_presets:
    for name in (s.drafts[0], s.target):
      key = b.key(name, "fused")
      if key == target and target_skips(b.models[key], preset):
        continue
      variants[f"{name}/{preset}"] = _with_tiles(
          b.call(key, 1, loop=physics.call_loop_with({})), preset)
  for preset in s.tile_call_presets:
    if target_skips(b.models[target], preset):
      continue
    variants[f"{s.target}@k{k}/{preset}"] = _with_tiles(
        b.call(target, k, loop=physics.call_loop_with({})), preset)
  common.log(f"paths: fused kernels' tiles, {len(variants)} variants")
  tiles = {
      "presets": {
          p: vars(gpu_tiles.TILE_PRESETS[p]) for p in s.tile_presets
      },
      **_timed_variants(b, variants, f"{s.target}/{s.tile_presets[0]}", deadline),
      "rows_identical": {},
  }
  # Written before the rows checks and after each: a check's compile that
  # outlasts the phase's cap (a '_persistent' preset's 8-token call took
  # minutes here) loses nothing measured before it. The checks several at
  # once (`compiles.concurrently`); a preset that fails: its own error.
  draft = b.key(s.drafts[0], "fused")
  model, cache = b.models[draft], b.cache(draft, 1)
  checks = tiles["rows_identical"]

  def checked(p: str, done: compiles.Done) -> None:
    checks[p] = done.result if done.error is None else {
        "ok": False,
        "error": done.error
    }
    record.set("tiles", tiles)

  record.set("tiles", tiles)
  compiles.concurrently(
      {
          p: functools.partial(rows_identical, model, cache, k, p)
          for p in s.tile_call_presets
      }, lambda _: deadline.allows(10.0), count=compiles.workers(),
      on_done=checked)
  tiles["rows_identical"] = {
      p: checks.get(p, {"skipped": "time cap"}) for p in s.tile_call_presets
  }
  record.set("tiles", tiles)


def _profile(b: physics.Bench, s: common.Settings, record: common.Recorder,
             deadline: common.Deadline) -> None:
  """`kernel_profile.profile` of the small draft's and the target's step
  (one `inner_steps` loop a call) on each path, and of the small draft's
  on 'fused' under the CUDA cores' tiles ('default')."""
  runs: Dict[str, Callable[[int], Any]] = {}
  for name in (s.drafts[0], s.target):
    for path in s.paths:
      runs[f"{name}:{path}"] = b.call(b.key(name, path), 1)
  if "fused" in s.paths:
    runs[f"{s.drafts[0]}:fused/default"] = _with_tiles(
        b.call(b.key(s.drafts[0], "fused"), 1, loop=physics.call_loop_with({})),
        "default")
  common.log(f"paths: device profiles of {len(runs)} steps")
  out: Dict[str, Any] = {}
  for name, fn in runs.items():
    out[name] = (common.guarded(lambda f=fn: kernel_profile.profile(
        f, s.repeats, s.inner_steps)) if deadline.allows(10.0) else {
            "skipped": "time cap"
        })
    record.set("profile", out)


# (result key, step, the seconds it needs at the paper's sizes). The
# profile first (the question the 2026-11-29 H200 run left: why a fused
# kernel took ~11 µs); the kernel counts last: `scripts/gpu_aot.sh` counts the same programs without
# a GPU (and matched the H200's), the times only a GPU can give.
_GROUPS = (
    ("profile", _profile, 30.0),
    ("barriers",
     lambda b, s, r, d: barriers.measure(b, s, r, d, _timed_variants), 15.0),
    ("tiles", _tiles, 95.0),
    ("option_sets", _option_sets, 40.0),
    ("kernels", lambda b, s, r, d: _kernels(s, r), 40.0),
)


def run(s: common.Settings, record: common.Recorder,
        deadline: common.Deadline) -> bool:
  """The phase; True if every group was measured."""
  b = physics.Bench(s)
  rates = env.ceilings(s.mode == "small")
  record.set(
      "settings", {
          "target": s.target,
          "drafts": list(s.drafts),
          "paths": list(s.paths),
          "dtype": "bfloat16",
          "stand_in_shapes": s.tiny_physics,
          "batch": 1,
          "cache_len": s.cache_len,
          "fill": s.fill,
          "inner_steps": s.inner_steps,
          "repeats": s.repeats,
          "copy_gbps": rates["copy_gbps"],
          "read_gbps": rates["read_gbps"],
          "gpu_loop_options": gpu.GPU_LOOP_OPTIONS,
          "backend": jax.default_backend(),
      })
  if "steps" in s.paths_groups:
    done = common.guarded(lambda: {"by_path": _steps(b, s, rates, record)})
    if "error" in done:
      record.set("steps", done)
      return False
    rows = stats.paper_rows()
    record.set(
        "table2", {
            path: _pair_rows(rows, m, m, s.target)
            for path, m in done["by_path"].items()
        })
    record.set("table2_pairs", table2_pairs(rows, done["by_path"], s.target))
  else:
    _models(b, s)
  complete = True
  scale = 10.0 if s.tiny_physics else 1.0
  for name, step, need_s in _GROUPS:
    if name not in s.paths_groups or ("fused" not in s.paths and
                                      name == "tiles"):
      continue
    if not deadline.allows(need_s / scale):
      record.set(name, {"skipped": "time cap"})
      complete = False
      continue
    result = common.guarded(
        lambda f=step: f(b, s, record, deadline) or {"ok": True})
    if "error" in result:
      record.set(name, result)
      complete = False
  return complete
