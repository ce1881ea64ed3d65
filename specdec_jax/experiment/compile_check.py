"""COMPILE_TOPOLOGY: the run's programs compiled for a Cloud TPU slice, here.

`python -m specdec_jax.run --gin_file=ende_small.gin
--gin.COMPILE_TOPOLOGY="'v4-8'"` loads nothing and decodes nothing: both
models' parameters are `jax.ShapeDtypeStruct`s in the run's dtype, sharded
by the project's T5X rules (`partitioning`) over MESH_SHAPE on the
topology's devices (libtpu's description of the slice, no TPU attached).
It lowers and compiles, for that TPU:

* each model's start (encoder + empty KV cache; its output shardings are
  the cache shardings the calls below take; a shared-encoder draft's start
  runs the target's encoder, which the loop runs once for both),
* one target step (K = 1), one verification call (K = γ+1), one draft step,
* ACCEPTANCE='tree': the tree call (`decode_tree` over 1 + k·γ nodes with
  the tree mask), and the tree loop as the speculative program,
* the whole baseline and speculative decode programs (DECODE='beam': the
  target's beam search and speculative beam search, and the calls at the
  rows they make: a target step over B·k beams, the verification call over
  B·R candidate rows of γ+1 positions, a draft step over B·u beams),

and reads the compiler's own memory and cost analyses and HLO text
(`program_record`). `compile_report` turns that into compile.json's
figures and the summary.

Only TPU code goes into these programs: the parameters stay in T5X's 2-D
layout (never `prepared_for_decoding`, whose packing for the CPU matmul
kernel is decided by the *host's* backend, which is the CPU here), and the
loops are jitted here without the CPU compiler options
(`kernels.CPU_SPECULATIVE_COMPILER_OPTIONS`). Every program's custom
calls are recorded, so a CPU kernel that slipped in would show.
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
from specdec_jax.multihost import partitioning
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.core.drafters import tree as tree_drafters
from specdec_jax.experiment import hlo_reads
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
  """The model with ShapeDtypeStruct parameters in `config.dtype` (what
  `loading.load_model` loads), sharded over `mesh` by the T5X rules."""
  shapes = param_shapes(config)["params"]
  shardings = partitioning.param_shardings(mesh, shapes)
  params = jax.tree_util.tree_map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, config.dtype, sharding=sh),
      shapes, shardings)
  return T5Model(config, {"params": params})


def abstract_draft(draft_config: T5Config, target: T5Model, mesh):
  """The draft as the run builds it: a decoder without an encoder of its
  own (DRAFTER='shared_encoder') paired with the target it reads."""
  return SharedEncoderModel.draft_for(target,
                                      abstract_model(draft_config, mesh))


def own_params(model) -> Any:
  """A model's own parameters (a shared-encoder draft's: its decoder's)."""
  return (model.decoder
          if isinstance(model, SharedEncoderModel) else model).params


def shard_bytes(tree: Any) -> int:
  """Bytes one device holds of a pytree of sharded ShapeDtypeStructs (the
  largest shard of each leaf)."""
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape)
    total += int(jnp.dtype(leaf.dtype).itemsize) * math.prod(shape)
  return total


def program_record(compiled, seconds: float) -> Dict[str, Any]:
  """What the compiler says of one compiled program, per device.

  bytes_accessed and flops come from XLA's cost analysis: a while loop's
  body is counted once, not per iteration.
  """
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


def _compile(fn, *args, static=(), donate=(), **kwargs):
  """(compiled, seconds) of jax.jit(fn) for abstract args."""
  start = time.perf_counter()
  compiled = jax.jit(fn, static_argnames=static,
                     donate_argnums=donate).lower(*args, **kwargs).compile()
  return compiled, time.perf_counter() - start


def compile_concurrently(jobs: Dict[str, Callable[[], Any]],
                         workers: Optional[int] = None) -> Dict[str, Any]:
  """{name: job()} with the jobs run on `workers` threads (default: the
  host's cores, at most 4), in the given order.

  XLA compiles without holding the GIL, so on a 2-core host the two decode
  programs compile side by side: the compile-only run's wall time is about
  its longest program, not the sum. Each record's compile_seconds is then
  that program's own wall time, overlapping the others'.
  """
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
  """The run's array sizes: batch B, input length S, decode length, γ;
  `beam` for DECODE='beam' (None: sampling), and ACCEPTANCE='tree''s k
  branches (tree_width; 0: no tree)."""
  batch: int
  inputs: int
  max_decode_length: int
  gamma: int
  beam: Optional[BeamShapes] = None
  tree_width: int = 0

  @property
  def cache_len(self) -> int:
    """KV cache slots of the speculative loop (`init_speculative_state`);
    the baseline's is smaller (max_decode_length + 1)."""
    return self.max_decode_length + self.gamma + 1

  @property
  def tree_nodes(self) -> int:
    """The tree call's nodes, 1 + k·γ."""
    return 1 + self.tree_width * self.gamma

  @property
  def target_cache_len(self) -> int:
    """The target's KV cache slots: the tree loop's (`decoding.tree_loop`:
    max_decode_length + 1 + k·γ) for a tree, else `cache_len`."""
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
    """(record, abstract cache with the compiler's shardings): the
    encoder and an empty cache of `length` slots (`Shapes.cache_len`)."""
    length = length or self.shapes.cache_len
    compiled, secs = _compile(lambda m, x: m.start(x, length), model,
                              self.tokens(self.shapes.inputs))
    shapes = jax.eval_shape(lambda m, x: m.start(x, length), model,
                            self.tokens(self.shapes.inputs))
    cache = jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes, compiled.output_shardings)
    return program_record(compiled, secs), cache

  def chunk(self, model: T5Model, cache, k: int) -> Dict[str, Any]:
    """One decode_chunk of K tokens per row (the cache donated, as the
    loops update it in place)."""
    compiled, secs = _compile(lambda m, t, c: m.decode_chunk(t, c), model,
                              self.tokens(k), cache, donate=(2,))
    record = program_record(compiled, secs)
    # A chunk has no loop over the weights: its HLO shows how often each
    # is read (XLA's bytes accessed also counts on-chip prefetch copies).
    record["weight_reads"] = hlo_reads.weight_reads(compiled.as_text())
    return record

  def tree_call(self, model: T5Model, cache) -> Dict[str, Any]:
    """One `decode_tree` over the loop's chain tree of 1 + k·γ nodes (the
    tree mask from its parents, a constant as in the loop; the cache
    donated), with its weight reads."""
    parents = tree_acceptance.chain_parents(self.shapes.tree_width,
                                            self.shapes.gamma)
    compiled, secs = _compile(
        lambda m, t, c: m.decode_tree(t, jnp.asarray(parents), c), model,
        self.tokens(self.shapes.tree_nodes), cache, donate=(2,))
    record = program_record(compiled, secs)
    record["weight_reads"] = hlo_reads.weight_reads(compiled.as_text())
    return record

  def _loop_args(self, target: T5Model):
    return (target, self.tokens(self.shapes.inputs),
            self.scalar((2,), jnp.uint32), self.scalar((), jnp.int32))

  def baseline(self, target: T5Model, method) -> Dict[str, Any]:
    """`decoding.temperature_loop`, jitted here (TPU options only)."""
    compiled, secs = _compile(decoding.temperature_loop,
                              *self._loop_args(target),
                              static=("max_decode_length",),
                              max_decode_length=self.shapes.max_decode_length,
                              method=method)
    return program_record(compiled, secs)

  def speculative(self, target: T5Model, drafter, method,
                  acceptance) -> Dict[str, Any]:
    """`decoding.speculative_loop`, jitted here (no CPU options)."""
    target_, inputs, rng, eos = self._loop_args(target)
    compiled, secs = _compile(
        decoding.speculative_loop, target_, drafter, inputs, rng, eos,
        static=("gamma", "max_decode_length", "statistics"),
        gamma=self.shapes.gamma,
        max_decode_length=self.shapes.max_decode_length, method=method,
        acceptance=acceptance, statistics=True)
    return program_record(compiled, secs)

  def tree(self, target: T5Model, drafter, method,
           without_replacement: bool) -> Dict[str, Any]:
    """`decoding.tree_loop` (k = tree_width branches; its own
    `TreeAcceptance`), jitted here (no CPU options)."""
    target_, inputs, rng, eos = self._loop_args(target)
    compiled, secs = _compile(
        decoding.tree_loop, target_,
        tree_drafters.as_tree_drafter(drafter, without_replacement), inputs,
        rng, eos, static=("gamma", "width", "max_decode_length"),
        gamma=self.shapes.gamma, width=self.shapes.tree_width,
        max_decode_length=self.shapes.max_decode_length, method=method)
    return program_record(compiled, secs)

  def speculative_program(self, target: T5Model, drafter, method, acceptance,
                          without_replacement: bool) -> Dict[str, Any]:
    """The run's speculative program: the tree loop for a tree, else the
    speculative loop with `acceptance` (None: Algorithm 1)."""
    if self.shapes.tree_width:
      record = self.tree(target, drafter, method, without_replacement)
      record["acceptance_rule"] = "TreeAcceptance"
      return record
    rule = decoding.ExactAcceptance() if acceptance is None else acceptance
    record = self.speculative(target, drafter, method, rule)
    # compile.json names the rule the program was compiled with, so a
    # test can hold it to the run's.
    record["acceptance_rule"] = type(rule).__name__
    return record


def _beam_args(c: "Compiler", target: T5Model):
  """(target, inputs, alpha, eos) of the beam loops (α traced, as the run)."""
  return (target, c.tokens(c.shapes.inputs), c.scalar(
      (), jnp.float32), c.scalar((), jnp.int32))


def beam_baseline(c: "Compiler", target: T5Model) -> Dict[str, Any]:
  """`beam_search.beam_search_loop`, jitted here (no CPU options)."""
  beam = c.shapes.beam
  compiled, secs = _compile(beam_search.beam_search_loop,
                            *_beam_args(c, target),
                            static=("beam_size", "max_decode_len"),
                            beam_size=beam.beam_size,
                            max_decode_len=c.shapes.max_decode_length)
  return program_record(compiled, secs)


def speculative_beam(c: "Compiler", target: T5Model,
                     draft: Any) -> Dict[str, Any]:
  """`speculative_beam.speculative_beam_loop`, jitted here."""
  beam = c.shapes.beam
  target_, inputs, alpha, eos = _beam_args(c, target)
  compiled, secs = _compile(
      speculative_beam_lib.speculative_beam_loop, target_, draft, inputs, alpha,
      eos, static=("beam_size", "width", "gamma", "num_rows", "max_decode_len"),
      beam_size=beam.beam_size, width=beam.width, gamma=c.shapes.gamma,
      num_rows=beam.rows, max_decode_len=c.shapes.max_decode_length)
  return program_record(compiled, secs)


def _rows(c: "Compiler", rows: int) -> "Compiler":
  """A compiler for calls over `rows` rows (beams) per batch element."""
  return Compiler(c.mesh,
                  dataclasses.replace(c.shapes, batch=c.shapes.batch * rows))


def _calls(c: "Compiler", target: T5Model, draft: Any):
  """(calls, jobs, target cache, draft cache): each model's start, compiled
  now (the calls take its cache shardings), and the three calls the loops
  make as jobs for `compile_concurrently`, at the rows they make them
  (beams: B·k target rows, B·R verification rows, B·u draft rows)."""
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
  """Every program of the run, compiled for `mesh`'s devices.

  Args:
    build_drafter: draft T5Model -> the run's drafter.
    acceptance: None (Algorithm 1) or the run's rule (not for a tree).
    tree_without_replacement: a tree's branches' first draw
      (TREE_WITHOUT_REPLACEMENT; shapes.tree_width > 0).

  Returns:
    {'params': {'target': bytes, 'draft': bytes}, 'kv_cache': {...} (per
    device), 'calls': {name: record}, 'programs': {name: record}}.
  """
  c = Compiler(mesh, shapes)
  target = abstract_model(target_config, mesh)
  draft = abstract_draft(draft_config, target, mesh)
  calls, call_jobs, target_cache, draft_cache = _calls(c, target, draft)
  if shapes.beam is not None:
    program_jobs = {
        "speculative": lambda: speculative_beam(c, target, draft),
        "baseline": lambda: beam_baseline(c, target),
    }
  else:
    drafter = build_drafter(draft)
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
          "draft": shard_bytes(own_params(draft))
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
  """Bytes per device of the speculative program alone (the largest: both
  models, both caches), for trying other mesh shapes."""
  c = Compiler(mesh, shapes)
  target = abstract_model(target_config, mesh)
  if shapes.beam is not None:
    draft = abstract_draft(draft_config, target, mesh)
    return speculative_beam(c, target, draft)["total_bytes"]
  record = c.speculative_program(
      target, build_drafter(abstract_draft(draft_config, target, mesh)), method,
      acceptance, tree_without_replacement)
  return record["total_bytes"]
