"""The paper's physics at the paper's sizes: what calls cost on this chip.

A T5-XXL-shaped target and T5-small/base/large-shaped drafts with random
bfloat16 weights made on the device (`common.device_params`; nothing read
from disk), batch 1, a cache of `cache_len` slots filled to `fill`. Every
call is timed as the project times c (`timing.call_loop`: `inner_steps`
calls in one compiled loop, compilation excluded, interleaved rounds with
the target's one-token step, medians of the per-round ratios):

* `c`: each draft's one-token step / the target's (Definition 3.7), and
  Theorem 3.8 at the paper's α and γ for each Table 2 row with that c,
  beside the paper's measured speedup (`stats.theorem_rows`);
* `call_cost_by_k`: the target's K-token call in target steps, K = 1..8
  (Theorem 3.8 assumes 1: a memory-bound step), and Theorem 3.8 again with
  the measured cost of the γ+1 call;
* `tree_call_cost`: the tree call over 1 + k·γ nodes (k branches of γ,
  `decode_tree`), in target steps;
* `beam_call_cost`: the speculative-beam call (`beam_rows` rows of γ+1
  tokens) in steps of beam search (`beam_size` rows of one token).

Every model decodes on the check's decode path (`--path`; the backend's:
'fused' on one GPU, `common.checked_path`); the paths side by side: the `paths` phase. Each group
is written as soon as it is measured; a group that would not fit in what
is left of the phase's time cap is marked skipped.
"""
import time
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import structs
from specdec_jax.metrics import timing
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.core.models import T5Model
from tools.device_check import common
from tools.device_check import stats

REFERENCE = "target_k1"
_gather_rows = jax.jit(beam_search.gather_rows)


@structs.dataclass
class TreeCall:
  """The tree loop's target call as a K-token call (`timing.call_loop`):
  `decode_chunk(tokens [B, 1 + k·γ], cache)` scores them as the chain tree
  (`tree_acceptance.chain_parents`)."""
  target: Any
  parents: Tuple[int, ...] = structs.field(pytree_node=False)

  def decode_chunk(self, tokens, cache):
    return self.target.decode_tree(tokens, jnp.asarray(self.parents, jnp.int32),
                                   cache)


class Bench:
  """The models, their caches, and the interleaved timer.

  A model is named by its size ('small' .. 'xxl'), on the check's decode
  path (`Settings.decode_path`, None: the backend's), or 'size:path' on
  another path (`key`): the same weights, packed for that path.
  """

  def __init__(self, s: common.Settings):
    self.s = s
    self.timer = timing.InterleavedTimer(
        s.repeats, log=lambda m: common.log(f"physics:{m}"))
    self.models: Dict[str, T5Model] = {}
    self.plain: Dict[str, T5Model] = {}
    self.caches: Dict[Tuple[str, int], Any] = {}
    self.build_s: Dict[str, float] = {}

  @staticmethod
  def key(name: str, path: Optional[str] = None) -> str:
    return name if path is None else f"{name}:{path}"

  def model(self, name: str, seed: int, path: Optional[str] = None) -> T5Model:
    """The random bfloat16 model of size `name` on `path` (built once)."""
    key = self.key(name, path)
    if key not in self.models:
      start = time.perf_counter()
      if name not in self.plain:
        config = common.t5_size(name, tiny=self.s.tiny_physics)
        params = common.device_params(config, seed, jnp.bfloat16)
        self.plain[name] = T5Model(config, params)
      model = self.plain[name].prepared_for_decoding(path or self.s.decode_path)
      self.models[key] = jax.block_until_ready(model)
      self.build_s[key] = time.perf_counter() - start
    return self.models[key]

  def cache(self, name: str, rows: int):
    """Model `name`'s cache for `rows` rows (started once per size, on
    `beam_rows` rows: every path reads the same cache)."""
    name = name.split(":")[0]
    if (name, rows) not in self.caches:
      if (name, 0) not in self.caches:
        inputs = np.random.default_rng(0).integers(
            2, self.plain[name].vocab_size,
            (max(self.s.beam_rows, 1), self.s.physics_input_length))
        self.caches[(name, 0)] = timing.start(self.plain[name],
                                              jnp.asarray(inputs, jnp.int32),
                                              max_len=self.s.cache_len)
      self.caches[(name,
                   rows)] = _gather_rows(self.caches[(name, 0)],
                                         jnp.arange(rows, dtype=jnp.int32))
    return self.caches[(name, rows)]

  def call(self, name: str, k: int, rows: int = 1, caller: Any = None,
           loop: Optional[Callable[..., Any]] = None) -> Callable[[int], Any]:
    """fn(round): `inner_steps` k-token calls of model `name` (or `caller`
    on its cache) on `rows` rows, through `loop` (default
    `timing.call_loop`; `call_loop_with` for compiler options)."""
    cache = self.cache(name, rows)
    fill = jnp.full((rows,), self.s.fill, jnp.int32)
    model = self.models[name] if caller is None else caller
    loop = loop or timing.call_loop
    return lambda r: loop(model, cache, fill, k=k, steps=self.s.inner_steps)

  def time(self, fns: Dict[str, Callable[[int], Any]]) -> Dict[str, Any]:
    """Per call: median ms, and the median per-round ratio to the first."""
    times, _ = self.timer(fns)
    reference = times[next(iter(fns))]
    return {
        "ms": {
            n: float(np.median(t)) * 1e3 / self.s.inner_steps
            for n, t in times.items()
        },
        "ratio": {
            n: stats.median_ratio(t, reference) for n, t in times.items()
        },
        "first_call_s": {
            n: self.timer.first_call_s[n] for n in fns
        },
    }


def call_loop_with(options: Dict[str, Any]) -> Callable[..., Any]:
  """`timing.call_loop` as a program of its own, compiled with XLA
  `options`: a fresh function, traced on its first call (jit's trace cache
  is keyed by the function: the same one would reuse a program traced
  under other tiles, `gpu.tiles`)."""

  def loop(*args, **kwargs):
    return timing.call_loop.__wrapped__(*args, **kwargs)

  return jax.jit(loop, static_argnames=("k", "steps"),
                 compiler_options=options or None)


def _decoder_bytes(model: T5Model) -> int:
  return common.param_bytes(model.params["params"]["decoder"])


def _steps_and_c(b: Bench, record: common.Recorder) -> Dict[str, float]:
  """The target's step, each draft's step, c; Theorem 3.8 by Table 2 row."""
  s = b.s
  target = b.model(s.target, seed=0)
  drafts = {d: b.model(d, seed=1 + i) for i, d in enumerate(s.drafts)}
  fns = {REFERENCE: b.call(s.target, 1)}
  fns.update({f"draft_{d}_k1": b.call(d, 1) for d in drafts})
  common.log("physics: target and draft steps (c)")
  measured = b.time(fns)
  step_ms = measured["ms"][REFERENCE]
  c = {d: measured["ratio"][f"draft_{d}_k1"] for d in drafts}
  record.set(
      "models", {
          name: {
              "params": m.config.num_params,
              "decoder_param_bytes": _decoder_bytes(m),
              "build_s": b.build_s[name],
              "decode_path": m.decode_path
          } for name, m in b.models.items()
      })
  record.set(
      "steps",
      {
          "target_step_ms": step_ms,
          "draft_step_ms": {
              d: measured["ms"][f"draft_{d}_k1"] for d in drafts
          },
          "c": c,
          # Decoder weight bytes / step: the bandwidth a step that only streamed
          # its weights would need.
          "target_effective_gbps": _decoder_bytes(target) /
                                   (step_ms * 1e-3) / 1e9,
          "first_call_s": measured["first_call_s"],
      })
  return c


def _chunks(b: Bench, record: common.Recorder) -> Dict[int, float]:
  s = b.s
  fns = {REFERENCE: b.call(s.target, 1)}
  fns.update(
      {f"target_k{k}": b.call(s.target, k) for k in s.chunk_sizes if k != 1})
  common.log(f"physics: target calls of K = {list(s.chunk_sizes)} tokens")
  measured = b.time(fns)
  cost = {1: 1.0}
  cost.update(
      {k: measured["ratio"][f"target_k{k}"] for k in s.chunk_sizes if k != 1})
  record.set(
      "call_cost_by_k", {
          "ratio": cost,
          "ms": {
              k: measured["ms"][REFERENCE if k == 1 else f"target_k{k}"]
              for k in cost
          },
          "first_call_s": measured["first_call_s"],
      })
  return cost


def _trees(b: Bench, record: common.Recorder) -> None:
  s = b.s
  target = b.models[s.target]
  fns = {REFERENCE: b.call(s.target, 1)}
  nodes = {}
  for k in s.tree_widths:
    parents = tuple(
        int(p) for p in tree_acceptance.chain_parents(k, s.tree_gamma))
    nodes[k] = len(parents)
    fns[f"tree_k{k}"] = b.call(s.target, len(parents),
                               caller=TreeCall(target, parents))
  common.log(f"physics: tree calls, k = {list(s.tree_widths)}, "
             f"γ = {s.tree_gamma}")
  measured = b.time(fns)
  record.set(
      "tree_call_cost", {
          "gamma": s.tree_gamma,
          "by_width": {
              k: {
                  "nodes": nodes[k],
                  "steps": measured["ratio"][f"tree_k{k}"],
                  "ms": measured["ms"][f"tree_k{k}"]
              } for k in nodes
          },
          "first_call_s": measured["first_call_s"],
      })


def _beam(b: Bench, record: common.Recorder) -> None:
  s = b.s
  gamma, k, rows = s.beam_gamma, s.beam_size, s.beam_rows
  common.log(f"physics: speculative-beam call ({rows} rows of {gamma + 1}) "
             f"vs beam step ({k} rows of 1)")
  measured = b.time({
      "beam_step": b.call(s.target, 1, rows=k),
      "speculative_beam_call": b.call(s.target, gamma + 1, rows=rows),
      REFERENCE: b.call(s.target, 1),
  })
  record.set(
      "beam_call_cost", {
          "beam_size": k,
          "gamma": gamma,
          "rows": rows,
          "beam_steps": measured["ratio"]["speculative_beam_call"],
          "beam_step_in_target_steps": 1.0 / measured["ratio"][REFERENCE],
          "ms": measured["ms"],
          "first_call_s": measured["first_call_s"],
      })


# After c: (result key, step, the seconds it needs at the paper's sizes:
# compiling its XXL programs); a group that does not fit is skipped.
_GROUPS = (
    ("call_cost_by_k", _chunks, 60.0),
    ("tree_call_cost", _trees, 30.0),
    ("beam_call_cost", _beam, 20.0),
)


def run(s: common.Settings, record: common.Recorder,
        deadline: common.Deadline) -> bool:
  """The phase; True if every group was measured."""
  b = Bench(s)
  rows = stats.paper_rows()
  record.set(
      "settings", {
          "target": s.target,
          "drafts": list(s.drafts),
          "dtype": "bfloat16",
          "stand_in_shapes": s.tiny_physics,
          "batch": 1,
          "input_length": s.physics_input_length,
          "fill": s.fill,
          "cache_len": s.cache_len,
          "inner_steps": s.inner_steps,
          "repeats": s.repeats,
          "backend": jax.default_backend(),
          "device": str(jax.devices()[0].device_kind),
          "decode_path": s.decode_path
      })
  steps = common.guarded(lambda: {"ok": True, "c": _steps_and_c(b, record)})
  if "error" in steps:
    record.set("steps", steps)
    return False
  c = steps["c"]
  record.set("table2", stats.theorem_rows(rows, c))
  complete = True
  for name, step, need_s in _GROUPS:
    if not deadline.allows(need_s / (10.0 if s.tiny_physics else 1.0)):
      record.set(name, {"skipped": "time cap"})
      complete = False
      continue
    done = common.guarded(lambda f=step: {"ok": True, "value": f(b, record)})
    if "error" in done:
      record.set(name, done)
      complete = False
    elif name == "call_cost_by_k":
      record.set("table2", stats.theorem_rows(rows, c, done["value"]))
  return complete
