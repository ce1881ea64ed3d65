"""Decode benchmark: baseline vs speculative walltime, cost curves, c, overhead.

What it measures, for a target and a draft T5 config with random weights, on
the default JAX backend (see `scripts/benchmark_decode.py` for the CLI):

* `baseline_ms_per_token`: `decoding.temperature_sample` (the target alone)
  over `max_decode_length` tokens with eos_id=-1 (it never stops early),
  walltime / max_decode_length. Includes the one-off encoding.
* `target_cost_ratio_by_k`: the target's time for one `decode_chunk` call of
  K new tokens (cache filled to `fill_length`), divided by K = 1's.
* `draft_ms_per_step`, `target_ms_per_step` (one-token calls) and the cost
  coefficient c = draft / target (Definition 3.7).
* `iteration_split_ms[γ]`: one speculative iteration (Algorithm 1 as
  `decoding.speculative_iteration` runs it) split into the draft loop
  (`drafter.propose`, γ draft steps), the target's γ+1 chunk (the K = γ+1
  point of the sweep, which always includes it), and the rest (total - the
  two: standardization, acceptance, statistics/trace writes, rollback).
* `points`: for each (α, γ), the speculative decoder's walltime over the
  same number of tokens with a *synthetic* acceptance rule (each draft token
  accepted independently with probability α), the measured speedup over the
  baseline, Theorem 3.8's prediction for α, γ and the measured c, and the
  efficiency = measured / theoretical; also the prediction with the
  measured cost of the γ+1 chunk in place of 1 target step
  (`theoretical_speedup_chunk_adjusted`), and the walltime modeled as the
  two encodings + iterations x the measured iteration time.
* Memory-bandwidth bound of the baseline: decoder parameter bytes read per
  token / device bandwidth (`--device_bandwidth_gbps`, else a known value for
  the device kind; omitted when unknown, e.g. on CPU).

Synthetic acceptance is for timing only: the emitted tokens are not samples
of the target's distribution. The rule (`SyntheticAcceptance`) lives in this
module only; `decoding` never uses it unless it is passed as the loop's
acceptance rule, as this benchmark does. The output says
`"synthetic_acceptance": true`.

Timing method. Every timed function is jitted; the first call (compile and
first run) is a warm-up whose excess over the median run is reported as
`compile_time_s`, never part of a timing. Timings are medians over
`repeats` runs, each ended by `jax.block_until_ready`. Per-call costs (K
sweep, draft step, iteration split) run `inner_steps` calls inside one
jitted `lax.fori_loop` (carrying the cache, so nothing is hoisted or
dead-code eliminated) and divide: like the decode loops themselves, they then
pay no per-call dispatch. Each call resets the cache length to the fill
length (alternating +0/+1 so nothing is loop-invariant); all per-call
timings use one cache capacity (max_decode_length + max K + 2).
"""
import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax import analysis
from specdec_jax import decoding
from specdec_jax import gin_utils
from specdec_jax import io_utils
from specdec_jax import sampling
from specdec_jax import timing
from specdec_jax.models.config import T5Config
from specdec_jax.models.t5 import T5Model
from specdec_jax.models.t5 import init_params

Array = jax.Array

# ---------------------------------------------------------------------------
# Model sizes.
# ---------------------------------------------------------------------------
# Size names of --target/--draft -> model gin files (under gin/): the T5 v1.1
# sizes (T5X's t5_1_1/*.gin hyperparameters) plus small test/CPU configs.
MODEL_SIZES: Dict[str, str] = {
    "tiny": "models/bench_tiny.gin",  # Tests only.
    "mini": "models/bench_mini.gin",  # Tests only.
    "xsmall": "models/bench_xsmall.gin",  # A draft for small (CPU).
    **{size: f"models/t5_1_1_{size}.gin"
       for size in ("small", "base", "large", "xl", "xxl")},
}

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# Peak HBM bandwidth in GB/s by (substring of) jax device_kind; first match
# wins, so more specific names come first.
DEVICE_BANDWIDTH_GBPS: List[Tuple[str, float]] = [
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),
    ("H200", 4800.0),
    ("A100-SXM4-40GB", 1555.0),
    ("A100-PCIE-40GB", 1555.0),
    ("A100", 2039.0),
    ("TPU v4", 1200.0),
    ("TPU v5 lite", 819.0),
    ("TPU v5e", 819.0),
    ("TPU v5p", 2765.0),
]


def default_bandwidth_gbps(device_kind: str) -> Optional[float]:
  """Known peak memory bandwidth of a device kind, or None."""
  for key, value in DEVICE_BANDWIDTH_GBPS:
    if key.lower() in device_kind.lower():
      return value
  return None


class BenchmarkFlagError(ValueError):
  """A bad flag value; the message names the flag, the value and what is allowed."""


def _flag_error(flag: str, value: Any, allowed: str) -> BenchmarkFlagError:
  return BenchmarkFlagError(
      f"--{flag}: invalid value {value!r} (allowed: {allowed}).")


# ---------------------------------------------------------------------------
# Gin files: the T5Config a file binds.
# ---------------------------------------------------------------------------
# Scopes that the repository's model files bind T5Config under.
_ROLE_SCOPES = ("target", "draft")


def load_gin_config(path: os.PathLike, role: str = "") -> Tuple[T5Config, str]:
  """The T5Config that a gin file binds for `role`, and the scope read.

  Reads the file with `gin_utils.read_t5_config`, which leaves gin's global
  configuration alone (so the target's and the draft's files, which may both
  bind unscoped T5Config, cannot leak into each other). Includes are looked up
  in the current directory, the file's folder and the repository's gin/
  folder. T5Config is read under the `role` scope, as `run.model_config`
  does: `role/T5Config.x` bindings override unscoped ones. A file that binds
  T5Config under the other role's scope only (a models/draft/ file given as
  the target) is read under that scope.

  The benchmark's --dtype decides the dtype, so a dtype the file cannot
  resolve on its own (`T5Config.dtype = %MODEL_DTYPE` with the macro defined
  elsewhere, or a configurable reference) keeps T5Config's default.

  Returns:
    (config, scope): `scope` is `role`, or the other role's scope read.

  Raises:
    ValueError: the file (or an include) is missing or unparsable, binds no
      T5Config for `role`, or binds values T5Config rejects.
  """
  path = os.path.abspath(path)
  search_paths = [os.getcwd(), os.path.dirname(path), str(gin_utils.GIN_DIR)]
  scopes = gin_utils.t5_config_scopes(path, search_paths)
  scope = role
  if role not in scopes and "" not in scopes:
    others = [s for s in _ROLE_SCOPES if s in scopes]
    if len(others) > 1:
      raise ValueError(
          f"{path}: binds no T5Config" +
          (f" under the {role}/ scope or" if role else "") +
          " unscoped (it binds both target/ and draft/T5Config).")
    if others:
      scope = others[0]
  # Raises if nothing is bound under `scope` or unscoped.
  config = gin_utils.read_t5_config(path, scope, search_paths,
                                    allow_unresolved_dtype=True)
  return config, scope


def resolve_model_config(spec: str, flag: str
                         ) -> Tuple[T5Config, str, List[str]]:
  """A size name or a gin file path -> (config, label, warnings)."""
  if spec in MODEL_SIZES:
    path = gin_utils.GIN_DIR / MODEL_SIZES[spec]
  elif not (spec.endswith(".gin") or os.sep in spec):
    raise _flag_error(flag, spec, "one of " + ", ".join(MODEL_SIZES) +
                      ", or the path of a gin file binding T5Config")
  elif not os.path.isfile(spec):
    raise _flag_error(flag, spec, "an existing gin file or one of " +
                      ", ".join(MODEL_SIZES))
  else:
    path = spec
  try:
    config, scope = load_gin_config(path, role=flag)
  except ValueError as e:
    raise _flag_error(flag, spec, f"a gin file binding T5Config; {e}"
                      ) from None
  warnings = []
  if scope != flag:
    warnings.append(f"--{flag}: {spec}: T5Config is bound under the "
                    f"{scope}/ scope only; using it")
  return config, spec, warnings


# ---------------------------------------------------------------------------
# Flags.
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class BenchmarkConfig:
  """Validated benchmark settings (see `parse_flags` for their meaning)."""
  target: str = "small"
  draft: str = "xsmall"
  target_config: Optional[T5Config] = None
  draft_config: Optional[T5Config] = None
  alphas: Tuple[float, ...] = (0.5, 0.75, 0.9)
  gammas: Tuple[int, ...] = (1, 3, 5, 7)
  chunk_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16)
  batch_size: int = 1
  input_length: int = 64
  max_decode_length: int = 64
  fill_length: Optional[int] = None  # Default: max_decode_length // 2.
  repeats: int = 5
  inner_steps: int = 8
  temperature: float = 0.0
  dtype: str = "float32"
  device_bandwidth_gbps: Optional[float] = None
  output: Optional[str] = "benchmark.json"
  seed: int = 0
  check_greedy_identity: bool = False
  warnings: Tuple[str, ...] = ()


def _default_dtype() -> str:
  return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def _parse_list(flag, text, kind, allowed, check):
  items = [s.strip() for s in str(text).split(",")]
  if not items or any(not s for s in items):
    raise _flag_error(flag, text, allowed)
  values = []
  for s in items:
    try:
      v = kind(s)
    except ValueError:
      raise _flag_error(flag, s, allowed) from None
    if not check(v):
      raise _flag_error(flag, s, allowed)
    values.append(v)
  return tuple(dict.fromkeys(values))  # Dedupe, keep order.


def _parse_int(flag, text, minimum, allowed=None):
  allowed = allowed or f"an integer >= {minimum}"
  try:
    v = int(str(text).strip())
  except ValueError:
    raise _flag_error(flag, text, allowed) from None
  if v < minimum:
    raise _flag_error(flag, text, allowed)
  return v


def build_arg_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="benchmark_decode",
      description="Decode benchmark: baseline vs speculative walltime "
      "(synthetic acceptance), target cost vs chunk size, cost coefficient "
      "c, iteration split, Theorem 3.8 efficiency.")
  sizes = ", ".join(MODEL_SIZES)
  p.add_argument("--target", default="small",
                 help=f"target model: a size ({sizes}) or a gin file")
  p.add_argument("--draft", default="xsmall",
                 help=f"draft model: a size ({sizes}) or a gin file")
  p.add_argument("--alphas", default="0.5,0.75,0.9",
                 help="synthetic acceptance rates, comma-separated in [0, 1]")
  p.add_argument("--gammas", default="1,3,5,7",
                 help="draft tokens per iteration, comma-separated ints >= 1")
  p.add_argument("--chunk_sizes", default="1,2,4,8,16",
                 help="K values of the target cost curve (1 is always added)")
  p.add_argument("--batch_size", default="1")
  p.add_argument("--input_length", default="64",
                 help="encoder input tokens per row")
  p.add_argument("--max_decode_length", default="64",
                 help="tokens generated per row (eos never stops a row)")
  p.add_argument("--fill_length", default=None,
                 help="decoder cache fill for per-call timings "
                 "(default max_decode_length // 2)")
  p.add_argument("--repeats", default="5", help="timed runs (median)")
  p.add_argument("--inner_steps", default="8",
                 help="calls per timed program for per-call costs")
  p.add_argument("--temperature", default="0.0",
                 help="sampling temperature of both decoders (0 = greedy)")
  p.add_argument("--dtype", default=None,
                 help="float32 or bfloat16 (default: bfloat16 on "
                 "accelerators, float32 on CPU); params are cast to it")
  p.add_argument("--device_bandwidth_gbps", default=None,
                 help="peak memory bandwidth for the bandwidth bound "
                 "(default: known value for the device kind, else omitted)")
  p.add_argument("--seed", default="0")
  p.add_argument("--check_greedy_identity", action="store_true",
                 help="also decode greedily with both decoders (real "
                 "acceptance) and compare tokens, and compare the target's "
                 "(γ+1)-token logits with one-token calls: the temperature-0 "
                 "exactness check for this backend and dtype")
  p.add_argument("--output", default="benchmark.json",
                 help="JSON output path ('' to skip)")
  return p


def parse_flags(argv: Optional[Sequence[str]] = None) -> BenchmarkConfig:
  """Parses and validates flags; raises BenchmarkFlagError (no compilation)."""
  args = build_arg_parser().parse_args(argv)
  return validate(
      target=args.target, draft=args.draft, alphas=args.alphas,
      gammas=args.gammas, chunk_sizes=args.chunk_sizes,
      batch_size=args.batch_size, input_length=args.input_length,
      max_decode_length=args.max_decode_length, fill_length=args.fill_length,
      repeats=args.repeats, inner_steps=args.inner_steps,
      temperature=args.temperature, dtype=args.dtype,
      device_bandwidth_gbps=args.device_bandwidth_gbps, seed=args.seed,
      output=args.output, check_greedy_identity=args.check_greedy_identity)


def validate(*, target="small", draft="xsmall", alphas="0.5,0.75,0.9",
             gammas="1,3,5,7", chunk_sizes="1,2,4,8,16", batch_size=1,
             input_length=64, max_decode_length=64, fill_length=None,
             repeats=5, inner_steps=8, temperature=0.0, dtype=None,
             device_bandwidth_gbps=None, seed=0, output="benchmark.json",
             check_greedy_identity=False) -> BenchmarkConfig:
  """Checks every setting (strings or values) and returns a BenchmarkConfig.

  Raises:
    BenchmarkFlagError naming the flag, the bad value and what is allowed.
  """
  def as_text(x):
    return ",".join(str(v) for v in x) if isinstance(x, (list, tuple)) else x

  alphas = _parse_list("alphas", as_text(alphas), float,
                       "comma-separated numbers in [0, 1]",
                       lambda a: 0.0 <= a <= 1.0)
  gammas = _parse_list("gammas", as_text(gammas), int,
                       "comma-separated integers >= 1", lambda g: g >= 1)
  ks = _parse_list("chunk_sizes", as_text(chunk_sizes), int,
                   "comma-separated integers >= 1", lambda k: k >= 1)
  ks = tuple(sorted(set(ks) | {1}))
  batch_size = _parse_int("batch_size", batch_size, 1)
  input_length = _parse_int("input_length", input_length, 1)
  max_decode_length = _parse_int("max_decode_length", max_decode_length, 1)
  if fill_length is None:
    fill_length = max_decode_length // 2
  else:
    fill_length = _parse_int(
        "fill_length", fill_length, 0,
        f"an integer in [0, max_decode_length - 1 = {max_decode_length - 1}]")
    if fill_length >= max_decode_length:
      raise _flag_error(
          "fill_length", fill_length,
          f"an integer in [0, max_decode_length - 1 = "
          f"{max_decode_length - 1}]")
  repeats = _parse_int("repeats", repeats, 1)
  inner_steps = _parse_int("inner_steps", inner_steps, 1)
  seed = _parse_int("seed", seed, 0)
  try:
    temperature = float(temperature)
  except (TypeError, ValueError):
    raise _flag_error("temperature", temperature, "a number >= 0") from None
  if not temperature >= 0.0 or math.isinf(temperature):
    raise _flag_error("temperature", temperature, "a finite number >= 0")
  if dtype is None:
    dtype = _default_dtype()
  if dtype not in DTYPES:
    raise _flag_error("dtype", dtype, ", ".join(DTYPES))
  if device_bandwidth_gbps is not None:
    try:
      bw = float(device_bandwidth_gbps)
    except (TypeError, ValueError):
      raise _flag_error("device_bandwidth_gbps", device_bandwidth_gbps,
                        "a number > 0 (GB/s)") from None
    if not bw > 0.0 or math.isinf(bw):
      raise _flag_error("device_bandwidth_gbps", device_bandwidth_gbps,
                        "a finite number > 0 (GB/s)")
    device_bandwidth_gbps = bw
  if output:
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
      raise _flag_error("output", output,
                        "a file path in an existing directory")
  target_config, target_label, w1 = resolve_model_config(target, "target")
  draft_config, draft_label, w2 = resolve_model_config(draft, "draft")
  if draft_config.vocab_size != target_config.vocab_size:
    raise BenchmarkFlagError(
        f"--draft: {draft!r} has vocab_size {draft_config.vocab_size} but "
        f"--target {target!r} has {target_config.vocab_size} (allowed: a "
        "draft with the target's vocabulary).")
  return BenchmarkConfig(
      target=target_label, draft=draft_label,
      target_config=target_config.replace(dtype=DTYPES[dtype]),
      draft_config=draft_config.replace(dtype=DTYPES[dtype]),
      alphas=alphas, gammas=gammas, chunk_sizes=ks, batch_size=batch_size,
      input_length=input_length, max_decode_length=max_decode_length,
      fill_length=fill_length, repeats=repeats, inner_steps=inner_steps,
      temperature=temperature, dtype=dtype,
      device_bandwidth_gbps=device_bandwidth_gbps, output=output or None,
      seed=seed, check_greedy_identity=bool(check_greedy_identity),
      warnings=tuple(w1 + w2))


# ---------------------------------------------------------------------------
# Synthetic acceptance (timing only; never used by speculative_sample).
# ---------------------------------------------------------------------------
def synthetic_accept(rng: Array, shape: Tuple[int, int], *, alpha) -> Array:
  """`SyntheticAcceptance`'s mask: each guess kept with probability alpha.

  n = leading successes of γ independent Bernoulli(alpha) trials (u < alpha
  with u ~ U[0, 1): alpha = 1 accepts all, alpha = 0 none).
  For timing only: the output is NOT the target's distribution.

  Args:
    rng: PRNG key.
    shape: (B, γ).
    alpha: acceptance probability (Python float or traced scalar).

  Returns:
    [B, γ] bool.
  """
  return jax.random.uniform(rng, shape) < alpha


@flax.struct.dataclass
class SyntheticAcceptance(decoding.AcceptanceRule):
  """An acceptance rule at a chosen α, for timing only (not exact).

  Runs Algorithm 1 (`decoding.ExactAcceptance`: probabilities, the accept
  test, the residual or argmax token) so that its cost is measured, then
  replaces its n by the leading successes of `synthetic_accept`; the extra
  token stays the one drawn at the exact n (its value does not matter
  here). `alpha` is a traced leaf: one compilation serves every α.
  """
  alpha: Any

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    verdict = decoding.ExactAcceptance()(rng, target_logits, draft_tokens,
                                         draft_probs, method)
    mask = synthetic_accept(jax.random.fold_in(rng, 1), draft_tokens.shape,
                            alpha=self.alpha)
    return verdict._replace(
        num_accepted=sampling.leading_accepted(mask))


def expected_accepted(alpha: float, gamma: int) -> Tuple[float, float]:
  """Mean and variance of n = leading successes of γ Bernoulli(alpha) trials."""
  k = np.arange(gamma + 1)
  prob = alpha**k * np.where(k < gamma, 1.0 - alpha, 1.0)
  mean = float(np.sum(k * prob))
  return mean, float(np.sum((k - mean)**2 * prob))


@functools.partial(jax.jit, static_argnames=("gamma", "max_decode_length",
                                             "temperature"))
def _synthetic_speculative_loop(target, drafter, encoder_input_tokens, rng,
                                alpha, eos_id, *, gamma, max_decode_length,
                                temperature):
  # alpha is traced: one compilation per γ serves every α.
  return decoding.speculative_loop(
      target, drafter, encoder_input_tokens, rng, eos_id, gamma=gamma,
      max_decode_length=max_decode_length,
      method=sampling.make_method(temperature),
      acceptance=SyntheticAcceptance(alpha), statistics=True)


# ---------------------------------------------------------------------------
# Jitted timing programs.
# ---------------------------------------------------------------------------
@jax.jit
def _prefill(model, cache, tokens):
  _, cache = model.decode_chunk(tokens, cache)
  return cache


@functools.partial(jax.jit, static_argnames=("gamma", "temperature", "steps"))
def _propose_loop(drafter, draft_state, buffer, fill, rng, *, gamma,
                  temperature, steps):
  """`steps` drafter.propose calls (γ draft steps each) at length fill(+1)."""

  def body(i, carry):
    state, acc = carry
    n = fill + i % 2
    # Each call grows the state past n: rolling back resets it to n.
    state, tokens, probs = drafter.propose(
        drafter.rollback(state, n), buffer, n, jax.random.fold_in(rng, i),
        gamma=gamma, method=sampling.make_method(temperature))
    # Depend on the outputs so nothing is optimized away (no q at T=0).
    acc = acc + jnp.sum(tokens).astype(jnp.float32)
    return state, acc if probs is None else acc + probs[0, -1, 0]

  return lax.fori_loop(0, steps, body, (draft_state, jnp.float32(0.0)))


@functools.partial(jax.jit, static_argnames=("gamma", "max_decode_length",
                                             "temperature", "steps"))
def _iteration_loop(target, drafter, state, fill, rng, alpha, eos_id, *,
                    gamma, max_decode_length, temperature, steps):
  """`steps` full speculative iterations, each from length fill(+1)."""
  acceptance = SyntheticAcceptance(alpha)

  def body(i, s):
    n = fill + i % 2
    # Each iteration grows the states past n: rolling back resets them.
    s = s.replace(length=n, done=jnp.zeros_like(s.done),
                  target_state=target.truncate(s.target_state, n),
                  draft_state=drafter.rollback(s.draft_state, n))
    return decoding.speculative_iteration(
        target, drafter, acceptance, s, rng, eos_id, gamma=gamma,
        max_decode_length=max_decode_length,
        method=sampling.make_method(temperature))

  return lax.fori_loop(0, steps, body, state)


@functools.partial(jax.jit, static_argnames=("gamma", "max_decode_length",
                                             "fill"))
def _make_state(target, drafter, encoder_input_tokens, target_cache,
                draft_cache, prefix, *, gamma, max_decode_length, fill):
  """A speculative loop state around caches that hold `fill` positions."""
  s = decoding.init_speculative_state(target, drafter, encoder_input_tokens,
                                      gamma=gamma,
                                      max_decode_length=max_decode_length)
  length = jnp.full_like(s.length, fill)
  return s.replace(buffer=s.buffer.at[:, :prefix.shape[1]].set(prefix),
                   target_state=target_cache,
                   draft_state=s.draft_state.replace(model_state=draft_cache,
                                                     length=length),
                   length=length)


_POOL_SIZE = 1 << 22


def random_params(config: T5Config, seed: int, dtype) -> Any:
  """Random parameters in T5X's layout, generated on the host in `dtype`.

  Much cheaper than `init_params` (nothing to compile; no float32 copy of an
  XXL model): kernels ~ N(0, 1/fan_in), layer-norm scales 1, embeddings
  N(0, 1), relative position embeddings N(0, 0.1^2). Leaves are windows of
  a pool of 4M standard normals (tiled for larger leaves): random enough for
  timing, and O(size) memcpy for XXL.
  """
  shapes = jax.eval_shape(functools.partial(init_params, config),
                          jax.random.PRNGKey(0))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  rng = np.random.default_rng(seed)
  pool = rng.standard_normal(_POOL_SIZE, dtype=np.float32)
  np_dtype = jnp.dtype(dtype)
  values = []
  for path, leaf in leaves:
    name = getattr(path[-1], "key", str(path[-1]))
    shape = tuple(leaf.shape)
    size = int(np.prod(shape))
    if name == "scale":
      values.append(jnp.ones(shape, np_dtype))
      continue
    if name == "kernel":
      std = 1.0 / math.sqrt(shape[0])
    elif name == "rel_embedding":
      std = 0.1
    else:
      std = 1.0
    start = int(rng.integers(0, _POOL_SIZE))
    if size <= _POOL_SIZE - start:
      x = pool[start:start + size]
    else:
      x = np.resize(np.concatenate([pool[start:], pool[:start]]), size)
    values.append(jax.device_put((x * np.float32(std)).astype(np_dtype)
                                 .reshape(shape)))
  return jax.tree_util.tree_unflatten(treedef, values)


class _Timer:
  """Interleaved timing: warm-up each program, then `repeats` rounds.

  Each round runs every program of a group once, in order, so that load
  changes on a shared machine hit them alike; ratios and differences are
  taken within a round, then the median over rounds. The warm-up's excess
  over the median run is recorded as compile time.
  """

  def __init__(self, repeats: int, log: Callable[[str], None]):
    self.repeats = repeats
    self.compile_time_s: Dict[str, float] = {}
    self.log = log

  def __call__(self, fns: Dict[str, Callable[[int], Any]],
               keep: Sequence[str] = ()
               ) -> Tuple[Dict[str, np.ndarray], Dict[str, List[Any]]]:
    """fns: name -> fn(round) (round -1 is the warm-up).

    Returns:
      (seconds per round [repeats] by name, outputs per round for `keep`).
    """
    first = {}
    for name, fn in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(-1))
      first[name] = time.perf_counter() - t0
    times = {name: [] for name in fns}
    outs = {name: [] for name in keep}
    for r in range(self.repeats):
      for name, fn in fns.items():
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(r))
        times[name].append(time.perf_counter() - t0)
        if name in outs:
          outs[name].append(out)
    result = {}
    for name in fns:
      t = np.asarray(times[name])
      median = float(np.median(t))
      self.compile_time_s[name] = max(
          self.compile_time_s.get(name, 0.0), first[name] - median, 0.0)
      self.log(f"  {name}: {median * 1e3:.3f} ms (median of {self.repeats}; "
               f"warm-up {first[name]:.2f} s)")
      result[name] = t
    return result, outs


def _load_average() -> Optional[float]:
  try:
    return os.getloadavg()[0]
  except (AttributeError, OSError):
    return None


def _median(x) -> float:
  return float(np.median(np.asarray(x)))


def _decoder_param_bytes(params) -> int:
  """Bytes of parameters read per decoder step: decoder stack + logits."""
  tree = params["params"]
  total = sum(x.size * x.dtype.itemsize
              for x in jax.tree_util.tree_leaves(tree["decoder"]))
  emb = tree["token_embedder"]["embedding"]
  return int(total + emb.shape[1] * emb.dtype.itemsize)  # One embedding row.


def _kv_bytes_per_step(config: T5Config, batch: int, max_len: int,
                       input_length: int) -> int:
  """Cache bytes read per decoder step (masked attention reads all slots)."""
  itemsize = jnp.dtype(config.dtype).itemsize
  per_pos = 2 * config.num_decoder_layers * config.num_heads * config.head_dim
  return int(batch * per_pos * (max_len + input_length) * itemsize)


def _config_dict(config: T5Config) -> Dict[str, Any]:
  d = dataclasses.asdict(config)
  d["dtype"] = jnp.dtype(config.dtype).name
  d["mlp_activations"] = list(config.mlp_activations)
  d["num_params"] = config.num_params
  return d


# ---------------------------------------------------------------------------
# The benchmark.
# ---------------------------------------------------------------------------
@jax.jit
def _decode_chunk(model, tokens, cache):
  return model.decode_chunk(tokens, cache)


def greedy_identity_check(target: T5Model, draft: T5Model,
                          encoder_inputs: Array, *, gamma: int,
                          max_decode_length: int) -> Dict[str, Any]:
  """Temperature-0 exactness on this backend and dtype (not synthetic).

  Greedy speculative decoding equals the target alone only if the target's
  (γ+1)-token verification call picks the same argmax as one-token calls at
  every position. In float32 on CPU their logits are bit-identical; in
  bfloat16 on an accelerator the two matmul shapes may round differently and
  flip a near-tie. This decodes `encoder_inputs` [B, S] with both decoders
  (real acceptance, EOS never stops a row) and compares tokens, then feeds
  the baseline's first γ+1 decoder tokens to the target as one chunk and as
  γ+1 one-token calls and compares the logits.

  Returns:
    JSON-ready dict: rows, rows_identical, first_difference (per row, None
    where identical), chunk_vs_step_max_abs_logit_diff,
    chunk_vs_step_argmax_agreement (fraction of the B·(γ+1) positions),
    alpha_hat of the speculative run, gamma.
  """
  base = decoding.temperature_sample(
      target, encoder_inputs, jax.random.PRNGKey(0),
      max_decode_length=max_decode_length, eos_id=-1)
  spec = decoding.speculative_sample(
      target, draft, encoder_inputs, jax.random.PRNGKey(1), gamma=gamma,
      max_decode_length=max_decode_length, eos_id=-1)
  base_tokens, spec_tokens = np.asarray(base.tokens), np.asarray(spec.tokens)
  same = base_tokens == spec_tokens
  first_difference = [None if row.all() else int(np.argmin(row))
                      for row in same]

  k = min(gamma + 1, max_decode_length)
  decoder_inputs = jnp.concatenate(
      [jnp.zeros_like(base.tokens[:, :1]), base.tokens[:, :k - 1]], axis=1)
  cache = timing.start(target, encoder_inputs, max_len=k + 1)
  chunk_logits, _ = _decode_chunk(target, decoder_inputs, cache)
  step_logits = []
  for i in range(k):
    logits, cache = _decode_chunk(target, decoder_inputs[:, i:i + 1], cache)
    step_logits.append(logits[:, 0])
  chunk_logits = np.asarray(chunk_logits, np.float32)
  step_logits = np.asarray(jnp.stack(step_logits, axis=1), np.float32)
  return {
      "gamma": gamma,
      "rows": int(same.shape[0]),
      "rows_identical": int(same.all(axis=1).sum()),
      "first_difference": first_difference,
      "alpha_hat": float(spec.alpha_hat),
      "chunk_vs_step_max_abs_logit_diff": float(
          np.max(np.abs(chunk_logits - step_logits))),
      "chunk_vs_step_argmax_agreement": float(np.mean(
          chunk_logits.argmax(-1) == step_logits.argmax(-1))),
  }


def run_benchmark(cfg: BenchmarkConfig,
                  log: Callable[[str], None] = lambda s: None
                  ) -> Dict[str, Any]:
  """Runs every measurement of the module docstring; returns the JSON dict."""
  for w in cfg.warnings:
    log(f"warning: {w}")
  device = jax.devices()[0]
  backend = jax.default_backend()
  device_kind = str(getattr(device, "device_kind", backend))
  dtype = DTYPES[cfg.dtype]
  mdl, fill, batch = cfg.max_decode_length, cfg.fill_length, cfg.batch_size
  timer = _Timer(cfg.repeats, log)
  eos_never = jnp.asarray(-1, jnp.int32)

  # Models with random weights, stored in the compute dtype.
  t0 = time.perf_counter()
  target_params = random_params(cfg.target_config, cfg.seed, dtype)
  draft_params = random_params(cfg.draft_config, cfg.seed + 1, dtype)
  # Packed for the CPU kernel as `run` does (a no-op elsewhere).
  target = T5Model(cfg.target_config, target_params).prepared_for_decoding()
  draft = T5Model(cfg.draft_config, draft_params).prepared_for_decoding()
  drafter = decoding.T5Drafter(draft)
  vocab = cfg.target_config.vocab_size
  # Token ids in [2, V): no padding (0) and no EOS (1); host-generated.
  host_rng = np.random.default_rng(cfg.seed + 2)
  encoder_inputs = jnp.asarray(host_rng.integers(
      2, vocab, (batch, cfg.input_length)), jnp.int32)
  prefix_np = host_rng.integers(2, vocab, (batch, fill + 2))
  prefix_np[:, 0] = 0  # The decoder start token.
  prefix = jnp.asarray(prefix_np, jnp.int32)
  rng = jax.random.PRNGKey(cfg.seed)
  jax.block_until_ready((target_params, draft_params, encoder_inputs, prefix))
  setup_s = time.perf_counter() - t0
  log(f"backend {backend} ({device_kind}), dtype {cfg.dtype}, target "
      f"{cfg.target} ({cfg.target_config.num_params / 1e6:.1f}M params), "
      f"draft {cfg.draft} ({cfg.draft_config.num_params / 1e6:.1f}M)")

  load_before = _load_average()

  def baseline_fn(r):
    del r  # Greedy or not, the baseline's cost does not depend on the key.
    return decoding.temperature_sample(
        target, encoder_inputs, rng, max_decode_length=mdl,
        temperature=cfg.temperature, eos_id=-1)

  # Caches for per-call timings: one length for every K and every γ (the
  # target's γ+1 chunk is one of the K sweep's points), filled to `fill`.
  steps = cfg.inner_steps
  ks = tuple(sorted(set(cfg.chunk_sizes) | {g + 1 for g in cfg.gammas}))
  cache_len = mdl + max(ks) + 2
  fill_vec = jnp.full((batch,), fill, jnp.int32)

  # Baseline (the target alone, never stopping early) and the fixed
  # per-sequence cost: encoding + cache allocation.
  log("baseline (temperature_sample) and start (encode + cache init):")
  times, outs = timer({
      "baseline": baseline_fn,
      "target_start": lambda r: timing.start(target, encoder_inputs,
                                       max_len=cache_len),
      "draft_start": lambda r: timing.start(draft, encoder_inputs,
                                      max_len=cache_len),
  }, keep=("baseline", "target_start", "draft_start"))
  baseline_runs = list(times["baseline"])
  for o in outs["baseline"]:
    if not np.all(np.asarray(o.lengths) == mdl):
      raise RuntimeError(f"baseline generated {o.lengths}, expected {mdl}")
  target_start_s = _median(times["target_start"])
  draft_start_s = _median(times["draft_start"])
  target_cache, draft_cache = outs["target_start"][-1], outs["draft_start"][-1]
  del outs
  if fill:
    target_cache = _prefill(target, target_cache, prefix[:, :fill])
    draft_cache = _prefill(draft, draft_cache, prefix[:, :fill])

  # Target cost vs chunk size K, and the draft's one-token step, interleaved
  # so that each round's ratios see the same machine load.
  log(f"decode_chunk by K (fill {fill}, {steps} calls per run):")

  def chunk_fn(model, cache, k):
    # The program `run` times too (`timing`: one definition of a call's cost).
    return lambda r: timing.call_loop(model, cache, fill_vec, k=k,
                                      steps=steps)

  fns = {f"target_chunk_k{k}": chunk_fn(target, target_cache, k) for k in ks}
  fns["draft_chunk_k1"] = chunk_fn(draft, draft_cache, 1)
  times, _ = timer(fns)
  t1 = times["target_chunk_k1"]
  target_ms_by_k = {k: _median(times[f"target_chunk_k{k}"]) * 1e3 / steps
                    for k in ks}
  ratio_by_k = {k: _median(times[f"target_chunk_k{k}"] / t1) for k in ks}
  target_ms_per_step = target_ms_by_k[1]
  draft_ms_per_step = _median(times["draft_chunk_k1"]) * 1e3 / steps
  c = _median(analysis.cost_coefficient(times["draft_chunk_k1"], t1))

  # Per γ: the iteration split, then the full loop at every α.
  round_keys = [jax.random.fold_in(rng, r) for r in range(cfg.repeats + 1)]
  split_alpha = float(cfg.alphas[len(cfg.alphas) // 2])
  iteration_split = {}
  points = []
  for gamma in cfg.gammas:
    log(f"gamma {gamma}: iteration split (alpha {split_alpha}):")
    state = _make_state(target, drafter, encoder_inputs, target_cache,
                        draft_cache, prefix, gamma=gamma,
                        max_decode_length=mdl, fill=fill)
    times, _ = timer({
        f"propose_g{gamma}": lambda r: _propose_loop(
            drafter, state.draft_state, state.buffer, fill_vec, rng,
            gamma=gamma, temperature=cfg.temperature, steps=steps),
        f"target_chunk_g{gamma}": chunk_fn(target, target_cache, gamma + 1),
        f"iteration_g{gamma}": lambda r: _iteration_loop(
            target, drafter, state, fill_vec, rng, jnp.float32(split_alpha),
            eos_never, gamma=gamma, max_decode_length=mdl,
            temperature=cfg.temperature, steps=steps),
    })
    del state
    per_call = {k.rsplit("_g", 1)[0]: v * 1e3 / steps
                for k, v in times.items()}
    other = per_call["iteration"] - per_call["propose"] - per_call[
        "target_chunk"]
    iteration_split[gamma] = {
        "draft_ms": _median(per_call["propose"]),
        "target_ms": _median(per_call["target_chunk"]),
        "other_ms": _median(other),
        "total_ms": _median(per_call["iteration"]),
        "draft_ms_model_only": gamma * draft_ms_per_step,
        "target_cost_ratio": _median(
            per_call["target_chunk"] / (t1 * 1e3 / steps)),
    }

    # Baseline and the speculative loop at every α, interleaved; each round
    # draws new acceptance coin flips (the loop's key changes, not its
    # program: α and the key are traced).
    log(f"gamma {gamma}: speculative loop vs baseline:")

    def spec_fn(alpha, gamma=gamma):
      return lambda r: _synthetic_speculative_loop(
          target, drafter, encoder_inputs, round_keys[r + 1],
          jnp.float32(alpha), eos_never, gamma=gamma, max_decode_length=mdl,
          temperature=float(cfg.temperature))

    names = {alpha: f"speculative_g{gamma}_a{alpha}" for alpha in cfg.alphas}
    fns = {"baseline": baseline_fn}
    fns.update({names[a]: spec_fn(a) for a in cfg.alphas})
    times, outs = timer(fns, keep=tuple(names.values()))
    baseline_runs += list(times["baseline"])
    for alpha in cfg.alphas:
      name = names[alpha]
      runs = [o.statistics() for o in outs[name]]
      for o in outs[name]:
        if not np.all(np.asarray(o.lengths) == mdl):
          raise RuntimeError(
              f"speculative generated {o.lengths}, expected {mdl}")
      iterations = float(np.mean([np.max(np.asarray(o.target_calls))
                                  for o in outs[name]]))
      tokens_per_call = float(np.mean([x["tokens_per_target_call"]
                                       for x in runs]))
      spec_s = _median(times[name])
      measured = _median(times["baseline"] / times[name])
      theoretical = float(analysis.expected_speedup(alpha, gamma, c))
      expected_tokens = float(
          analysis.expected_tokens_per_iteration(alpha, gamma))
      split = iteration_split[gamma]
      # Theorem 3.8 with the measured cost of the γ+1 chunk instead of 1.
      chunk_adjusted = expected_tokens / (
          gamma * c + split["target_cost_ratio"])
      # Theorem 3.8's cost model at the realized tokens per call.
      realized = tokens_per_call / (gamma * c + 1.0)
      # Walltime modeled from the measured pieces: the two encodings plus
      # iterations x the measured iteration time.
      modeled_ms = ((target_start_s + draft_start_s) * 1e3 +
                    iterations * split["total_ms"])
      points.append({
          "alpha": float(alpha), "gamma": gamma,
          "speculative_ms": spec_s * 1e3,
          "speculative_ms_per_token": spec_s * 1e3 / mdl,
          "baseline_ms": _median(times["baseline"]) * 1e3,
          "measured_speedup": measured,
          "theoretical_speedup": theoretical,
          "efficiency": measured / theoretical,
          "tokens_per_target_call": tokens_per_call,
          "expected_tokens_per_call": expected_tokens,
          "alpha_hat": float(np.mean([x["alpha_hat"] for x in runs])),
          "iterations": iterations,
          "theoretical_speedup_realized_acceptance": realized,
          "efficiency_realized_acceptance": measured / realized,
          "theoretical_speedup_chunk_adjusted": chunk_adjusted,
          "efficiency_chunk_adjusted": measured / chunk_adjusted,
          "modeled_speculative_ms": modeled_ms,
          "unexplained_ms": spec_s * 1e3 - modeled_ms,
      })
    del outs

  baseline_s = _median(baseline_runs)
  baseline_ms_per_token = baseline_s * 1e3 / mdl
  load_after = _load_average()

  # Memory-bandwidth bound of the baseline.
  bandwidth = cfg.device_bandwidth_gbps
  bandwidth_source = "flag" if bandwidth is not None else None
  if bandwidth is None:
    bandwidth = default_bandwidth_gbps(device_kind)
    bandwidth_source = "device_kind" if bandwidth is not None else None
  param_bytes = _decoder_param_bytes(target_params)
  kv_bytes = _kv_bytes_per_step(cfg.target_config, batch, mdl + 1,
                                cfg.input_length)

  result: Dict[str, Any] = {
      "synthetic_acceptance": True,
      "synthetic_acceptance_note": (
          "timing only: each draft token accepted independently with "
          "probability alpha; outputs are not target samples"),
      "backend": backend,
      "device_kind": device_kind,
      "device_count": jax.device_count(),
      "jax_version": jax.__version__,
      "target": cfg.target,
      "draft": cfg.draft,
      "target_config": _config_dict(cfg.target_config),
      "draft_config": _config_dict(cfg.draft_config),
      "dtype": cfg.dtype,
      "batch_size": batch,
      "input_length": cfg.input_length,
      "max_decode_length": mdl,
      "fill_length": fill,
      "repeats": cfg.repeats,
      "inner_steps": steps,
      "temperature": cfg.temperature,
      "seed": cfg.seed,
      "host_load_average_1min": [load_before, load_after],
      "baseline_ms_per_token": baseline_ms_per_token,
      "baseline_ms": baseline_s * 1e3,
      "target_start_ms": target_start_s * 1e3,
      "draft_start_ms": draft_start_s * 1e3,
      "target_ms_by_k": {str(k): v for k, v in target_ms_by_k.items()},
      "target_cost_ratio_by_k": {str(k): v for k, v in ratio_by_k.items()},
      "target_ms_per_step": target_ms_per_step,
      "draft_ms_per_step": draft_ms_per_step,
      "cost_coefficient_c": c,
      "iteration_split_alpha": split_alpha,
      "iteration_split_ms": {str(g): v for g, v in iteration_split.items()},
      "points": points,
      "target_decoder_param_bytes_per_token": param_bytes,
      "target_kv_cache_bytes_per_token": kv_bytes,
      # Decoder parameter bytes / baseline time per token: the bandwidth the
      # baseline would need if it only streamed weights.
      "baseline_effective_param_bandwidth_gbps":
          param_bytes / (baseline_ms_per_token * 1e-3) / 1e9,
      "setup_time_s": setup_s,
      "compile_time_s": float(sum(timer.compile_time_s.values())),
      "compile_time_s_by_function": timer.compile_time_s,
      "warnings": list(cfg.warnings),
  }
  if cfg.check_greedy_identity:
    gamma = max(cfg.gammas)
    log(f"greedy identity check (real acceptance, γ = {gamma}):")
    check = greedy_identity_check(target, draft, encoder_inputs, gamma=gamma,
                                  max_decode_length=mdl)
    log(f"  {check['rows_identical']}/{check['rows']} rows identical; "
        f"(γ+1)-token vs one-token logits: max |diff| "
        f"{check['chunk_vs_step_max_abs_logit_diff']:.3g}, argmax agreement "
        f"{check['chunk_vs_step_argmax_agreement']:.3f}")
    result["greedy_identity"] = check
  if bandwidth is not None:
    bound_ms = param_bytes / (bandwidth * 1e9) * 1e3
    result.update({
        "device_bandwidth_gbps": bandwidth,
        "device_bandwidth_source": bandwidth_source,
        "baseline_bandwidth_bound_ms_per_token": bound_ms,
        "baseline_bandwidth_bound_ms_per_token_with_kv":
            (param_bytes + kv_bytes) / (bandwidth * 1e9) * 1e3,
        # >= 1: how many times slower than streaming the params at peak.
        "baseline_to_bandwidth_bound_ratio": baseline_ms_per_token / bound_ms,
    })
  return result


# ---------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------
def format_report(r: Dict[str, Any]) -> str:
  """A readable multi-table summary of a `run_benchmark` result."""
  lines = [
      "SYNTHETIC ACCEPTANCE (timing only: draft tokens accepted i.i.d. with "
      "probability alpha)",
      f"backend {r['backend']} ({r['device_kind']}), jax {r['jax_version']}, "
      f"dtype {r['dtype']}, batch {r['batch_size']}, input "
      f"{r['input_length']}, decode {r['max_decode_length']} tokens",
      f"target {r['target']} ({r['target_config']['num_params'] / 1e6:.1f}M)"
      f", draft {r['draft']} ({r['draft_config']['num_params'] / 1e6:.1f}M)",
      "",
      f"baseline            {r['baseline_ms_per_token']:9.3f} ms/token",
      f"target step (K=1)   {r['target_ms_per_step']:9.3f} ms",
      f"draft step (K=1)    {r['draft_ms_per_step']:9.3f} ms",
      f"cost coefficient c  {r['cost_coefficient_c']:9.4f}",
      f"start (encode)      target {r['target_start_ms']:.3f} ms, draft "
      f"{r['draft_start_ms']:.3f} ms",
  ]
  lines.append(
      f"weights streamed    {r['baseline_effective_param_bandwidth_gbps']:9.1f}"
      f" GB/s effective ({r['target_decoder_param_bytes_per_token'] / 1e6:.0f}"
      " MB of decoder params per token)")
  if "baseline_bandwidth_bound_ms_per_token" in r:
    lines.append(
        f"bandwidth bound     {r['baseline_bandwidth_bound_ms_per_token']:9.4f}"
        f" ms/token at {r['device_bandwidth_gbps']:.0f} GB/s "
        f"(baseline is {r['baseline_to_bandwidth_bound_ratio']:.2f}x it)")
  lines += ["", "target decode_chunk cost by K (ratio to K=1):",
            "     K     ms/call   ratio"]
  for k, ratio in r["target_cost_ratio_by_k"].items():
    lines.append(f"  {k:>4}  {r['target_ms_by_k'][k]:10.3f}  {ratio:6.2f}")
  lines += ["", f"one speculative iteration (ms; alpha "
            f"{r['iteration_split_alpha']}):",
            "  gamma     draft    target     other     total"]
  for g, s in r["iteration_split_ms"].items():
    lines.append(f"  {g:>5}  {s['draft_ms']:8.3f}  {s['target_ms']:8.3f}  "
                 f"{s['other_ms']:8.3f}  {s['total_ms']:8.3f}")
  lines += ["", "speedup over the baseline (same tokens; efficiency = "
            "measured / theory):",
            "                          |  Theorem 3.8      | at realized "
            "tok/call | with K=γ+1 cost",
            "  alpha  gamma  tok/call  measured | theory  effic.  |  theory"
            "  effic.    |  theory  effic."]
  for p in r["points"]:
    lines.append(
        f"  {p['alpha']:5.2f}  {p['gamma']:5d}  "
        f"{p['tokens_per_target_call']:8.2f}  {p['measured_speedup']:8.3f} |"
        f" {p['theoretical_speedup']:6.3f}  {p['efficiency']:6.3f}  |  "
        f"{p['theoretical_speedup_realized_acceptance']:6.3f}  "
        f"{p['efficiency_realized_acceptance']:6.3f}    |  "
        f"{p['theoretical_speedup_chunk_adjusted']:6.3f}  "
        f"{p['efficiency_chunk_adjusted']:6.3f}")
  if "greedy_identity" in r:
    g = r["greedy_identity"]
    lines += ["", f"greedy identity (REAL acceptance, γ = {g['gamma']}, "
              f"alpha_hat {g['alpha_hat']:.3f}): {g['rows_identical']}/"
              f"{g['rows']} rows identical; (γ+1)-token vs one-token logits "
              f"max |diff| {g['chunk_vs_step_max_abs_logit_diff']:.3g}, "
              f"argmax agreement {g['chunk_vs_step_argmax_agreement']:.3f}"]
  lines += ["", f"compile time (excluded from timings): "
            f"{r['compile_time_s']:.1f} s"]
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point; returns the exit status (2 on a bad flag)."""
  try:
    cfg = parse_flags(argv)
  except BenchmarkFlagError as e:
    print(f"benchmark_decode: error: {e}", file=sys.stderr)
    return 2
  log = functools.partial(print, file=sys.stderr, flush=True)
  result = run_benchmark(cfg, log=log)
  print(format_report(result))
  if cfg.output:
    io_utils.write_json(cfg.output, result)
    print(f"wrote {cfg.output}")
  return 0
