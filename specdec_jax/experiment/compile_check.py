"""COMPILE_TOPOLOGY: the run's programs compiled for a Cloud TPU slice with
no TPU attached (docs/usage/tpu.md): abstract parameters sharded by T5X's
rules, TPU code only (the 2-D layout, no CPU compiler options), and what
the compiler says of each program (`program_record`, `hlo_reads`).
"""
import collections
from concurrent import futures
import dataclasses
import math
import os
import re
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from specdec_jax.core import decoding
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding import speculative_beam as speculative_beam_lib
from specdec_jax.experiment import hlo_reads
from specdec_jax.multihost import partitioning
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.core.drafters import tree as tree_drafters
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter",
               "collective-permute", "all-to-all")
# One op per collective: an async pair counts at its -start.
_COLLECTIVE = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')


def abstract_model(config: T5Config, mesh) -> T5Model:
  """The model with ShapeDtypeStruct parameters in `config.dtype`, sharded
  over `mesh` by the T5X rules."""
  shapes = param_shapes(config)["params"]
  shardings = partitioning.param_shardings(mesh, shapes)
  params = jax.tree_util.tree_map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, config.dtype, sharding=sh),
      shapes, shardings)
  return T5Model(config, {"params": params})


def abstract_draft(draft_config: T5Config, target: T5Model, mesh):
  """The draft as the run builds it (a shared encoder's paired)."""
  return SharedEncoderModel.draft_for(target,
                                      abstract_model(draft_config, mesh))


def shard_bytes(tree: Any) -> int:
  """Bytes one device holds of a pytree of sharded ShapeDtypeStructs."""
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape)
    total += int(jnp.dtype(leaf.dtype).itemsize) * math.prod(shape)
  return total


def program_record(compiled, seconds: float) -> Dict[str, Any]:
  """What the compiler says of one compiled program, per device (XLA's
  cost analysis counts a while loop's body once)."""
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per program
    cost = cost[0] if cost else {}
  text = compiled.as_text()
  collectives = collections.Counter(
      m.group(1) for m in _COLLECTIVE.finditer(text))
  arg, out = mem.argument_size_in_bytes, mem.output_size_in_bytes
  alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
  return {
      "argument_bytes": int(arg),
      "output_bytes": int(out),
      "alias_bytes": int(alias),
      "temp_bytes": int(temp),
      "generated_code_bytes": int(mem.generated_code_size_in_bytes),
      # What the program holds at once at most (JAX's own sum).
      "total_bytes": int(arg + out - alias + temp),
      "flops": float(cost.get("flops", 0.0)),
      "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
      "collectives": {
          k: collectives.get(k, 0) for k in COLLECTIVES
      },
      "custom_calls": sorted(set(_CUSTOM_CALL.findall(text))),
      "compile_seconds": round(seconds, 2),
  }


def _compile(fn, *args, static=(), donate=(), reads=False, **kwargs):
  """(`program_record`, compiled) of jax.jit(fn) for abstract args (with
  `hlo_reads.weight_reads` when `reads`: a call without loops over the
  weights)."""
  start = time.perf_counter()
  compiled = jax.jit(fn, static_argnames=static,
                     donate_argnums=donate).lower(*args, **kwargs).compile()
  record = program_record(compiled, time.perf_counter() - start)
  if reads:
    record["weight_reads"] = hlo_reads.weight_reads(compiled.as_text())
  return record, compiled


def compile_concurrently(jobs: Dict[str, Callable[[], Any]],
                         workers: Optional[int] = None) -> Dict[str, Any]:
  """{name: job()} run on `workers` threads (default: the cores, at most
  4): XLA compiles without the GIL, so the programs compile side by side."""
  workers = workers or max(1, min(4, os.cpu_count() or 1))
  lock, finished = threading.Lock(), [0]

  def counted(name: str, job: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = job()
    with lock:  # one progress line per program, as each one ends
      finished[0] += 1
      logging.info("compiled %d/%d (%s) in %.1f s", finished[0], len(jobs),
                   name,
                   time.perf_counter() - start)
    return result

  with futures.ThreadPoolExecutor(max_workers=workers) as pool:
    pending = {
        name: pool.submit(counted, name, job) for name, job in jobs.items()
    }
    return {name: f.result() for name, f in pending.items()}


@dataclasses.dataclass(frozen=True)
class BeamShapes:
  """DECODE='beam': k beams, the draft's width u, R candidate rows, α."""
  beam_size: int
  width: int
  rows: int
  alpha: float


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The run's sizes: B, S, decode length, γ, beams (None: sampling) and
  a tree's k (0: no tree)."""
  batch: int
  inputs: int
  max_decode_length: int
  gamma: int
  beam: Optional[BeamShapes] = None
  tree_width: int = 0

  @property
  def cache_len(self) -> int:
    """KV cache slots of the speculative loop."""
    return self.max_decode_length + self.gamma + 1

  @property
  def tree_nodes(self) -> int:
    """The tree call's nodes, 1 + k·γ."""
    return 1 + self.tree_width * self.gamma

  @property
  def target_cache_len(self) -> int:
    """The target's KV cache slots (a tree loop's: decode length + nodes)."""
    if self.tree_width:
      return self.max_decode_length + self.tree_nodes
    return self.cache_len


class Compiler:
  """Abstract inputs on one mesh, and the programs compiled over them."""

  def __init__(self, mesh, shapes: Shapes):
    self.mesh, self.shapes = mesh, shapes
    self.replicated = NamedSharding(mesh, PartitionSpec())

  def tokens(self, length: int) -> jax.ShapeDtypeStruct:
    """[B, length] int32 token ids, batch over 'data'."""
    return jax.ShapeDtypeStruct(
        (self.shapes.batch, length), jnp.int32,
        sharding=partitioning.data_sharding(self.mesh, self.shapes.batch))

  def scalar(self, shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=self.replicated)

  def start(self, model: T5Model,
            length: Optional[int] = None) -> Tuple[Dict[str, Any], Any]:
    """(record, abstract cache with the compiler's shardings) of the
    encoder and an empty cache of `length` slots."""
    length = length or self.shapes.cache_len
    record, compiled = _compile(lambda m, x: m.start(x, length), model,
                                self.tokens(self.shapes.inputs))
    shapes = jax.eval_shape(lambda m, x: m.start(x, length), model,
                            self.tokens(self.shapes.inputs))
    cache = jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes, compiled.output_shardings)
    return record, cache

  def chunk(self, model: T5Model, cache, k: int) -> Dict[str, Any]:
    """One decode_chunk of K tokens per row (the cache donated), with its
    weight reads (XLA's bytes accessed counts prefetch copies too)."""
    return _compile(lambda m, t, c: m.decode_chunk(t, c), model, self.tokens(k),
                    cache, donate=(2,), reads=True)[0]

  def tree_call(self, model: T5Model, cache) -> Dict[str, Any]:
    """One `decode_tree` over the loop's 1 + k·γ nodes."""
    parents = tree_acceptance.chain_parents(self.shapes.tree_width,
                                            self.shapes.gamma)
    return _compile(lambda m, t, c: m.decode_tree(t, jnp.asarray(parents), c),
                    model, self.tokens(self.shapes.tree_nodes), cache,
                    donate=(2,), reads=True)[0]

  def _loop_args(self, target: T5Model, alpha: bool = False):
    """(target, inputs, rng or a beam's α (traced, as the run), eos)."""
    return (target, self.tokens(self.shapes.inputs), self.scalar(
        (), jnp.float32) if alpha else self.scalar(
            (2,), jnp.uint32), self.scalar((), jnp.int32))

  def baseline(self, target: T5Model, method) -> Dict[str, Any]:
    """The baseline program (beams: the target's beam search), jitted here
    with TPU options only."""
    shapes = self.shapes
    if shapes.beam is not None:
      return _compile(beam_search.beam_search_loop,
                      *self._loop_args(target, alpha=True),
                      static=("beam_size", "max_decode_len"),
                      beam_size=shapes.beam.beam_size,
                      max_decode_len=shapes.max_decode_length)[0]
    return _compile(decoding.temperature_loop, *self._loop_args(target),
                    static=("max_decode_length",),
                    max_decode_length=shapes.max_decode_length,
                    method=method)[0]

  def speculative_program(self, target: T5Model, drafter, method, acceptance,
                          without_replacement: bool) -> Dict[str, Any]:
    """The run's speculative program, jitted here (no CPU options): the
    tree loop, or the speculative loop with `acceptance` (None: Algorithm
    1); beams (`drafter`: the draft model): speculative beam search."""
    shapes = self.shapes
    if shapes.beam is not None:
      target_, inputs, alpha, eos = self._loop_args(target, alpha=True)
      return _compile(
          speculative_beam_lib.speculative_beam_loop, target_, drafter, inputs,
          alpha, eos, static=("beam_size", "width", "gamma", "num_rows",
                              "max_decode_len"),
          beam_size=shapes.beam.beam_size, width=shapes.beam.width,
          gamma=shapes.gamma, num_rows=shapes.beam.rows,
          max_decode_len=shapes.max_decode_length)[0]
    target_, inputs, rng, eos = self._loop_args(target)
    if shapes.tree_width:
      record, _ = _compile(
          decoding.tree_loop, target_,
          tree_drafters.as_tree_drafter(drafter, without_replacement), inputs,
          rng, eos, static=("gamma", "width", "max_decode_length"),
          gamma=shapes.gamma, width=shapes.tree_width,
          max_decode_length=shapes.max_decode_length, method=method)
      return dict(record, acceptance_rule="TreeAcceptance")
    rule = decoding.ExactAcceptance() if acceptance is None else acceptance
    record, _ = _compile(decoding.speculative_loop, target_, drafter, inputs,
                         rng, eos, static=("gamma", "max_decode_length",
                                           "statistics"), gamma=shapes.gamma,
                         max_decode_length=shapes.max_decode_length,
                         method=method, acceptance=rule, statistics=True)
    # compile.json names the rule, so a test can hold it to the run's.
    return dict(record, acceptance_rule=type(rule).__name__)


def _rows(c: "Compiler", rows: int) -> "Compiler":
  """A compiler for calls over `rows` rows (beams) per batch element."""
  return Compiler(c.mesh,
                  dataclasses.replace(c.shapes, batch=c.shapes.batch * rows))


def _calls(c: "Compiler", target: T5Model, draft: Any):
  """(starts compiled now: the calls take their shardings, the calls as
  jobs at the loops' rows (beams: B·k, B·R, B·u), target and draft cache)."""
  beam = c.shapes.beam
  step, verify, drafting = ((c, c, c) if beam is None else
                            (_rows(c, beam.beam_size), _rows(c, beam.rows),
                             _rows(c, beam.width)))
  calls = {}
  calls["target_start"], target_cache = step.start(target,
                                                   c.shapes.target_cache_len)
  calls["draft_start"], draft_cache = drafting.start(draft)
  rows_cache = target_cache if beam is None else verify.start(target)[1]
  jobs = {
      "target_step": lambda: step.chunk(target, target_cache, 1),
      "verification": lambda: verify.chunk(target, rows_cache, c.shapes.gamma +
                                           1),
      "draft_step": lambda: drafting.chunk(draft, draft_cache, 1),
  }
  return calls, jobs, target_cache, draft_cache


def compile_all(target_config: T5Config, draft_config: T5Config, mesh,
                shapes: Shapes, build_drafter, method,
                acceptance: Optional[decoding.AcceptanceRule],
                tree_without_replacement: bool = True) -> Dict[str, Any]:
  """{'params', 'kv_cache' (bytes per device: {'target', 'draft'}),
  'calls', 'programs' ({name: `program_record`})}: every program of the
  run compiled for `mesh`'s devices (`acceptance` None: Algorithm 1)."""
  c = Compiler(mesh, shapes)
  target = abstract_model(target_config, mesh)
  draft = abstract_draft(draft_config, target, mesh)
  calls, call_jobs, target_cache, draft_cache = _calls(c, target, draft)
  drafter = draft if shapes.beam is not None else build_drafter(draft)
  program_jobs = {
      "speculative": lambda: c.speculative_program(
          target, drafter, method, acceptance, tree_without_replacement),
      "baseline": lambda: c.baseline(target, method),
  }
  if shapes.tree_width:
    call_jobs["tree_call"] = lambda: c.tree_call(target, target_cache)
  # Longest first: the two decode programs dominate.
  done = compile_concurrently({**program_jobs, **call_jobs})
  programs = {k: done.pop(k) for k in ("baseline", "speculative")}
  calls.update(done)
  return {
      "params": {
          "target": shard_bytes(target.params),
          "draft": shard_bytes(draft.decoder.params if isinstance(
              draft, SharedEncoderModel) else draft.params)
      },
      "kv_cache": {
          "target": shard_bytes(target_cache),
          "draft": shard_bytes(draft_cache)
      },
      "calls": calls,
      "programs": programs,
  }


def speculative_total(target_config: T5Config, draft_config: T5Config, mesh,
                      shapes: Shapes, build_drafter, method, acceptance,
                      tree_without_replacement: bool = True) -> int:
  """Bytes per device of the speculative program (the largest), for
  trying other mesh shapes."""
  target = abstract_model(target_config, mesh)
  draft = abstract_draft(draft_config, target, mesh)
  drafter = draft if shapes.beam is not None else build_drafter(draft)
  return Compiler(
      mesh, shapes).speculative_program(target, drafter, method, acceptance,
                                        tree_without_replacement)["total_bytes"]
