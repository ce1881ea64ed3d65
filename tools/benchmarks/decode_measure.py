"""The decode benchmark's measurements (`decode`), step by step, into its
JSON result.

`run_benchmark` builds the models and inputs once (`_setup`), then measures
in this order, each step's programs interleaved round by round
(`timing.InterleavedTimer`): the baseline and both models' `start`
(`_measure_baseline_and_start`), the target's K-token calls and the draft's
step (`_measure_calls`: the K-curve and c), and per γ the split of one
iteration (`_measure_iteration_split`) and the whole loop at every α against
the baseline (`_measure_points`). The baseline's memory-bandwidth bound
(`bandwidth_fields`) and, with --check_greedy_identity, the temperature-0
exactness check (`greedy_identity_check`) complete it.
"""
import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.t5 import T5Model
from specdec_jax.metrics import analysis
from specdec_jax.metrics import exactness
from specdec_jax.metrics import timing
from tools.benchmarks import synthetic
from tools.benchmarks.common import DTYPES

Array = jax.Array
Log = Callable[[str], None]


@dataclasses.dataclass
class BenchmarkConfig:
  """Validated benchmark settings (see the flags for their meaning).

  Built by `decode.validate`, whose keyword defaults are the benchmark's
  defaults (the flags' too): this class has none.
  """
  target: str
  draft: str
  target_config: T5Config
  draft_config: T5Config
  alphas: Tuple[float, ...]
  gammas: Tuple[int, ...]
  chunk_sizes: Tuple[int, ...]  # Always includes 1.
  batch_size: int
  input_length: int
  max_decode_length: int
  fill_length: int
  repeats: int
  inner_steps: int
  temperature: float
  dtype: str
  device_bandwidth_gbps: Optional[float]
  output: Optional[str]
  seed: int
  check_greedy_identity: bool
  warnings: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Bench:
  """What every measurement shares (built once by `_setup`).

  Attributes:
    encoder_inputs: [B, input_length] int32 ids in [2, V) (no pad, no EOS).
    prefix: [B, fill + 2] int32 decoder tokens, start token 0 first.
    fill: [B] int32, `cfg.fill_length`: the cache length per-call timings
      start from.
    cache_len: cache slots of every per-call timing (the largest K fits).
    target_param_bytes: `bandwidth.decoder_param_bytes` of the target.
  """
  cfg: BenchmarkConfig
  target: T5Model
  draft: T5Model
  drafter: decoding.ModelDrafter
  encoder_inputs: Array
  prefix: Array
  rng: Array
  fill: Array
  cache_len: int
  method: sampling.SamplingMethod
  timer: timing.InterleavedTimer
  target_param_bytes: int

  def baseline(self, r: int):
    """The target alone over max_decode_length tokens (never stops early)."""
    del r  # Greedy or not, the baseline's cost does not depend on the key.
    return decoding.temperature_sample(
        self.target, self.encoder_inputs, self.rng,
        max_decode_length=self.cfg.max_decode_length,
        temperature=self.cfg.temperature, eos_id=-1)

  def call_loop(self, model: T5Model, cache, k: int):
    """fn(round): `steps` k-token calls (`timing.call_loop`, as `run` times)."""
    return lambda r: timing.call_loop(model, cache, self.fill, k=k, steps=self.
                                      cfg.inner_steps)


def _median(x) -> float:
  return float(np.median(np.asarray(x)))


def _load_average() -> Optional[float]:
  try:
    return os.getloadavg()[0]
  except (AttributeError, OSError):
    return None


def _setup(cfg: BenchmarkConfig, log: Log) -> Tuple[_Bench, float]:
  """Random models (stored in the compute dtype) and inputs; (bench, s)."""
  t0 = time.perf_counter()
  dtype = DTYPES[cfg.dtype]
  target_params = {
      "params": checkpoints.random_params(cfg.target_config,
                                          jax.random.PRNGKey(cfg.seed),
                                          dtype=dtype)
  }
  draft_params = {
      "params": checkpoints.random_params(cfg.draft_config,
                                          jax.random.PRNGKey(cfg.seed + 1),
                                          dtype=dtype)
  }
  # Packed for the CPU kernel as `run` does (a no-op elsewhere).
  target = T5Model(cfg.target_config, target_params).prepared_for_decoding()
  draft = T5Model(cfg.draft_config, draft_params).prepared_for_decoding()
  vocab, batch = cfg.target_config.vocab_size, cfg.batch_size
  host_rng = np.random.default_rng(cfg.seed + 2)
  encoder_inputs = jnp.asarray(
      host_rng.integers(2, vocab, (batch, cfg.input_length)), jnp.int32)
  prefix = host_rng.integers(2, vocab, (batch, cfg.fill_length + 2))
  prefix[:, 0] = 0  # The decoder start token.
  # One cache length for every K and every γ (the target's γ+1 chunk is one
  # of the K sweep's points).
  max_k = max(max(cfg.chunk_sizes), max(cfg.gammas) + 1)
  bench = _Bench(cfg=cfg, target=target, draft=draft,
                 drafter=decoding.ModelDrafter(draft),
                 encoder_inputs=encoder_inputs,
                 prefix=jnp.asarray(prefix, jnp.int32),
                 rng=jax.random.PRNGKey(cfg.seed), fill=jnp.full(
                     (batch,), cfg.fill_length,
                     jnp.int32), cache_len=cfg.max_decode_length + max_k + 2,
                 method=sampling.make_method(cfg.temperature),
                 timer=timing.InterleavedTimer(cfg.repeats, log),
                 target_param_bytes=decoder_param_bytes(target_params))
  jax.block_until_ready((target, draft, bench.encoder_inputs, bench.prefix))
  return bench, time.perf_counter() - t0


def _check_lengths(outputs, expected: int, what: str) -> None:
  for o in outputs:
    if not np.all(np.asarray(o.lengths) == expected):
      raise RuntimeError(f"{what} generated {o.lengths}, expected {expected}")


def _measure_baseline_and_start(b: _Bench, log: Log) -> Dict[str, Any]:
  """The baseline and the fixed per-sequence cost (encode + cache init).

  Returns:
    baseline_runs (seconds per round), target_start_s, draft_start_s, and
    both caches prefilled to the fill length for the per-call timings.
  """
  log("baseline (temperature_sample) and start (encode + cache init):")
  names = ("baseline", "target_start", "draft_start")
  times, outs = b.timer(
      {
          "baseline": b.baseline,
          "target_start": lambda r: timing.start(b.target, b.encoder_inputs,
                                                 max_len=b.cache_len),
          "draft_start": lambda r: timing.start(b.draft, b.encoder_inputs,
                                                max_len=b.cache_len),
      }, keep=names)
  _check_lengths(outs["baseline"], b.cfg.max_decode_length, "baseline")
  fill = b.cfg.fill_length
  caches = {}
  for model, name in ((b.target, "target_start"), (b.draft, "draft_start")):
    caches[name] = outs[name][-1]
    if fill:
      caches[name] = timing.prefill(model, caches[name], b.prefix[:, :fill])
  return {
      "baseline_runs": list(times["baseline"]),
      "target_start_s": _median(times["target_start"]),
      "draft_start_s": _median(times["draft_start"]),
      "target_cache": caches["target_start"],
      "draft_cache": caches["draft_start"]
  }


def _measure_calls(b: _Bench, target_cache, draft_cache,
                   log: Log) -> Dict[str, Any]:
  """The target's cost by K and the draft's one-token step: c.

  Interleaved, so that each round's ratios see the same machine load.
  """
  steps = b.cfg.inner_steps
  ks = tuple(sorted(set(b.cfg.chunk_sizes) | {g + 1 for g in b.cfg.gammas}))
  log(f"decode_chunk by K (fill {b.cfg.fill_length}, {steps} calls per run):")
  fns = {
      f"target_chunk_k{k}": b.call_loop(b.target, target_cache, k) for k in ks
  }
  fns["draft_chunk_k1"] = b.call_loop(b.draft, draft_cache, 1)
  times, _ = b.timer(fns)
  t1 = times["target_chunk_k1"]
  target_ms_by_k = {
      k: _median(times[f"target_chunk_k{k}"]) * 1e3 / steps for k in ks
  }
  return {
      "t1": t1,
      "target_ms_by_k": target_ms_by_k,
      "ratio_by_k": {
          k: _median(times[f"target_chunk_k{k}"] / t1) for k in ks
      },
      "target_ms_per_step": target_ms_by_k[1],
      "draft_ms_per_step": _median(times["draft_chunk_k1"]) * 1e3 / steps,
      "c": _median(analysis.cost_coefficient(times["draft_chunk_k1"], t1)),
  }


def _measure_iteration_split(b: _Bench, gamma: int, alpha: float,
                             caches: Dict[str, Any], t1: np.ndarray,
                             draft_ms_per_step: float,
                             log: Log) -> Dict[str, float]:
  """One iteration at γ split into draft loop, target call and the rest."""
  log(f"gamma {gamma}: iteration split (alpha {alpha}):")
  cfg, steps = b.cfg, b.cfg.inner_steps
  state = timing.speculative_state_at(b.target, b.drafter, b.encoder_inputs,
                                      caches["target_cache"],
                                      caches["draft_cache"], b.prefix,
                                      gamma=gamma,
                                      max_decode_length=cfg.max_decode_length,
                                      fill=cfg.fill_length)
  eos_never = jnp.asarray(-1, jnp.int32)
  times, _ = b.timer({
      f"propose_g{gamma}": lambda r: timing.propose_loop(
          b.drafter, state.draft_state, state.buffer, b.fill, b.rng, gamma=
          gamma, method=b.method, steps=steps),
      f"target_chunk_g{gamma}": b.call_loop(b.target, caches["target_cache"],
                                            gamma + 1),
      f"iteration_g{gamma}": lambda r: timing.iteration_loop(
          b.target, b.drafter, synthetic.SyntheticAcceptance(jnp.float32(
              alpha)), state, b.fill, b.rng, eos_never, gamma=gamma,
          max_decode_length=cfg.max_decode_length, method=b.method, steps=steps
      ),
  })
  per_call = {k.rsplit("_g", 1)[0]: v * 1e3 / steps for k, v in times.items()}
  other = per_call["iteration"] - per_call["propose"] - per_call["target_chunk"]
  return {
      "draft_ms": _median(per_call["propose"]),
      "target_ms": _median(per_call["target_chunk"]),
      "other_ms": _median(other),
      "total_ms": _median(per_call["iteration"]),
      "draft_ms_model_only": gamma * draft_ms_per_step,
      "target_cost_ratio": _median(per_call["target_chunk"] / (t1 * 1e3 / steps)
                                  ),
  }


def _point(alpha: float, gamma: int, outs: List[Any], spec_times: np.ndarray,
           baseline_times: np.ndarray, c: float, split: Dict[str, float],
           start_s: float, max_decode_length: int) -> Dict[str, Any]:
  """One (α, γ) point: measured speedup against Theorem 3.8's variants."""
  runs = [o.statistics() for o in outs]
  iterations = float(np.mean([np.max(np.asarray(o.target_calls)) for o in outs
                             ]))
  tokens_per_call = float(np.mean([x["tokens_per_target_call"] for x in runs]))
  spec_s = _median(spec_times)
  measured = _median(baseline_times / spec_times)
  theoretical = float(analysis.expected_speedup(alpha, gamma, c))
  expected_tokens = float(analysis.expected_tokens_per_iteration(alpha, gamma))
  # Theorem 3.8 with the measured cost of the γ+1 chunk instead of 1.
  chunk_adjusted = expected_tokens / (gamma * c + split["target_cost_ratio"])
  # Theorem 3.8's cost model at the realized tokens per call.
  realized = tokens_per_call / (gamma * c + 1.0)
  # Walltime modeled from the measured pieces: the two encodings plus
  # iterations x the measured iteration time.
  modeled_ms = start_s * 1e3 + iterations * split["total_ms"]
  return {
      "alpha": float(alpha),
      "gamma": gamma,
      "speculative_ms": spec_s * 1e3,
      "speculative_ms_per_token": spec_s * 1e3 / max_decode_length,
      "baseline_ms": _median(baseline_times) * 1e3,
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
  }


def _measure_points(b: _Bench, gamma: int, c: float, split: Dict[str, float],
                    start_s: float,
                    log: Log) -> Tuple[List[Dict[str, Any]], List[float]]:
  """The speculative loop at every α vs the baseline; (points, baseline runs).

  Each round draws new acceptance coin flips (the loop's key changes, not
  its program: α and the key are traced).
  """
  log(f"gamma {gamma}: speculative loop vs baseline:")
  cfg, mdl = b.cfg, b.cfg.max_decode_length
  round_keys = [jax.random.fold_in(b.rng, r) for r in range(cfg.repeats + 1)]
  eos_never = jnp.asarray(-1, jnp.int32)

  def spec_fn(alpha):
    return lambda r: synthetic.speculative_loop(
        b.target, b.drafter, b.encoder_inputs, round_keys[r + 1],
        jnp.float32(alpha), eos_never, gamma=gamma, max_decode_length=mdl,
        method=b.method)

  names = {alpha: f"speculative_g{gamma}_a{alpha}" for alpha in cfg.alphas}
  fns = {"baseline": b.baseline}
  fns.update({names[a]: spec_fn(a) for a in cfg.alphas})
  times, outs = b.timer(fns, keep=tuple(names.values()))
  points = []
  for alpha in cfg.alphas:
    _check_lengths(outs[names[alpha]], mdl, "speculative")
    points.append(
        _point(alpha, gamma, outs[names[alpha]], times[names[alpha]],
               times["baseline"], c, split, start_s, mdl))
  return points, list(times["baseline"])


def _settings(cfg: BenchmarkConfig) -> Dict[str, Any]:
  """The result's description of what was run."""

  def config_fields(config):
    return {
        **gin_reader.t5_config_fields(config), "num_params": config.num_params
    }

  device = jax.devices()[0]
  return {
      "synthetic_acceptance": True,
      "synthetic_acceptance_note":
          ("timing only: each draft token accepted independently with "
           "probability alpha; outputs are not target samples"),
      "backend": jax.default_backend(),
      "device_kind": str(getattr(device, "device_kind", jax.default_backend())),
      "device_count": jax.device_count(),
      "jax_version": jax.__version__,
      "target": cfg.target,
      "draft": cfg.draft,
      "target_config": config_fields(cfg.target_config),
      "draft_config": config_fields(cfg.draft_config),
      "dtype": cfg.dtype,
      "batch_size": cfg.batch_size,
      "input_length": cfg.input_length,
      "max_decode_length": cfg.max_decode_length,
      "fill_length": cfg.fill_length,
      "repeats": cfg.repeats,
      "inner_steps": cfg.inner_steps,
      "temperature": cfg.temperature,
      "seed": cfg.seed,
      "warnings": list(cfg.warnings),
  }


def run_benchmark(cfg: BenchmarkConfig,
                  log: Log = lambda s: None) -> Dict[str, Any]:
  """Runs every measurement of the package docstring; returns the JSON dict."""
  for w in cfg.warnings:
    log(f"warning: {w}")
  result = _settings(cfg)
  b, setup_s = _setup(cfg, log)
  log(f"backend {result['backend']} ({result['device_kind']}), dtype "
      f"{cfg.dtype}, target {cfg.target} "
      f"({cfg.target_config.num_params / 1e6:.1f}M params), draft "
      f"{cfg.draft} ({cfg.draft_config.num_params / 1e6:.1f}M)")
  load_before = _load_average()
  start = _measure_baseline_and_start(b, log)
  calls = _measure_calls(b, start["target_cache"], start["draft_cache"], log)
  split_alpha = float(cfg.alphas[len(cfg.alphas) // 2])
  baseline_runs, iteration_split, points = start["baseline_runs"], {}, []
  for gamma in cfg.gammas:
    iteration_split[gamma] = _measure_iteration_split(
        b, gamma, split_alpha, start, calls["t1"], calls["draft_ms_per_step"],
        log)
    gamma_points, runs = _measure_points(
        b, gamma, calls["c"], iteration_split[gamma],
        start["target_start_s"] + start["draft_start_s"], log)
    points += gamma_points
    baseline_runs += runs
  baseline_ms_per_token = _median(baseline_runs) * 1e3 / cfg.max_decode_length
  kv_bytes = kv_bytes_per_step(cfg.target_config, cfg.batch_size,
                               cfg.max_decode_length + 1, cfg.input_length)
  result.update({
      "host_load_average_1min": [load_before, _load_average()],
      "baseline_ms_per_token": baseline_ms_per_token,
      "baseline_ms": _median(baseline_runs) * 1e3,
      "target_start_ms": start["target_start_s"] * 1e3,
      "draft_start_ms": start["draft_start_s"] * 1e3,
      "target_ms_by_k": {
          str(k): v for k, v in calls["target_ms_by_k"].items()
      },
      "target_cost_ratio_by_k": {
          str(k): v for k, v in calls["ratio_by_k"].items()
      },
      "target_ms_per_step": calls["target_ms_per_step"],
      "draft_ms_per_step": calls["draft_ms_per_step"],
      "cost_coefficient_c": calls["c"],
      "iteration_split_alpha": split_alpha,
      "iteration_split_ms": {
          str(g): v for g, v in iteration_split.items()
      },
      "points": points,
      "target_decoder_param_bytes_per_token": b.target_param_bytes,
      "target_kv_cache_bytes_per_token": kv_bytes,
      # Decoder parameter bytes / baseline time per token: the bandwidth the
      # baseline would need if it only streamed weights.
      "baseline_effective_param_bandwidth_gbps":
          b.target_param_bytes / (baseline_ms_per_token * 1e-3) / 1e9,
      "setup_time_s": setup_s,
      "compile_time_s": float(sum(b.timer.compile_time_s.values())),
      "compile_time_s_by_function": b.timer.compile_time_s,
  })
  if cfg.check_greedy_identity:
    result["greedy_identity"] = _greedy_identity(b, log)
  result.update(
      bandwidth_fields(param_bytes=b.target_param_bytes, kv_bytes=kv_bytes,
                       baseline_ms_per_token=baseline_ms_per_token,
                       flag_gbps=cfg.device_bandwidth_gbps,
                       device_kind=result["device_kind"]))
  return result


def _greedy_identity(b: _Bench, log: Log) -> Dict[str, Any]:
  gamma = max(b.cfg.gammas)
  log(f"greedy identity check (real acceptance, γ = {gamma}):")
  check = greedy_identity_check(b.target, b.draft, b.encoder_inputs,
                                gamma=gamma,
                                max_decode_length=b.cfg.max_decode_length)
  log(f"  {check['identical']}/{check['examples']} rows identical; "
      f"(γ+1)-token vs one-token logits: max |diff| "
      f"{check['chunk_vs_step_max_abs_logit_diff']:.3g}, argmax agreement "
      f"{check['chunk_vs_step_argmax_agreement']:.3f}")
  return check


# -- greedy identity -----------------------------------------------------------
# Temperature-0 exactness on this backend and dtype (real acceptance).
#
# Greedy speculative decoding equals the target alone only if the target's
# (γ+1)-token verification call picks the same argmax as one-token calls at
# every position. In float32 on CPU their logits are bit-identical; in
# bfloat16 on an accelerator the two matmul shapes may round differently and
# flip a near-tie. This is the one exactness question the benchmark answers
# (--check_greedy_identity); its timings use synthetic acceptance.
@jax.jit
def _decode_chunk(model, tokens, cache):
  return model.decode_chunk(tokens, cache)


def _chunk_vs_steps(target: T5Model, encoder_inputs: Array,
                    decoder_inputs: Array) -> Dict[str, float]:
  """The target's logits for decoder_inputs [B, k] as one chunk vs k steps."""
  k = decoder_inputs.shape[1]
  cache = timing.start(target, encoder_inputs, max_len=k + 1)
  chunk_logits, _ = _decode_chunk(target, decoder_inputs, cache)
  step_logits = []
  for i in range(k):
    logits, cache = _decode_chunk(target, decoder_inputs[:, i:i + 1], cache)
    step_logits.append(logits[:, 0])
  chunk_logits = np.asarray(chunk_logits, np.float32)
  step_logits = np.asarray(jnp.stack(step_logits, axis=1), np.float32)
  return {
      "chunk_vs_step_max_abs_logit_diff": float(
          np.max(np.abs(chunk_logits - step_logits))),
      "chunk_vs_step_argmax_agreement": float(
          np.mean(chunk_logits.argmax(-1) == step_logits.argmax(-1))),
  }


def greedy_identity_check(target: T5Model, draft: T5Model,
                          encoder_inputs: Array, *, gamma: int,
                          max_decode_length: int) -> Dict[str, Any]:
  """Greedy speculative vs greedy target tokens, and chunk vs step logits.

  Decodes `encoder_inputs` [B, S] with both decoders (real acceptance, EOS
  never stops a row) and compares tokens, then feeds the baseline's first
  γ+1 decoder tokens to the target as one chunk and as γ+1 one-token calls
  and compares the logits.

  Returns:
    JSON-ready dict: `exactness.greedy_identity`'s examples, identical and
    mismatches, chunk_vs_step_max_abs_logit_diff,
    chunk_vs_step_argmax_agreement (fraction of the B·(γ+1) positions),
    alpha_hat of the speculative run, gamma.
  """
  base = decoding.temperature_sample(target, encoder_inputs,
                                     jax.random.PRNGKey(0),
                                     max_decode_length=max_decode_length,
                                     eos_id=-1)
  spec = decoding.speculative_sample(target, draft, encoder_inputs,
                                     jax.random.PRNGKey(1), gamma=gamma,
                                     max_decode_length=max_decode_length,
                                     eos_id=-1)
  k = min(gamma + 1, max_decode_length)
  decoder_inputs = jnp.concatenate(
      [jnp.zeros_like(base.tokens[:, :1]), base.tokens[:, :k - 1]], axis=1)
  return {
      "gamma": gamma,
      **exactness.greedy_identity(base.tokens, spec.tokens),
      "alpha_hat": float(spec.alpha_hat),
      **_chunk_vs_steps(target, encoder_inputs, decoder_inputs),
  }


# -- the bandwidth bound -------------------------------------------------------
# A one-token decoder step reads every decoder weight and one embedding row:
# on an accelerator, where a step is memory-bound, that many bytes at the
# device's peak bandwidth is a lower bound on the baseline's time per token.
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


def decoder_param_bytes(params) -> int:
  """Bytes of parameters read per decoder step: decoder stack + logits."""
  tree = params["params"]
  total = sum(x.size * x.dtype.itemsize
              for x in jax.tree_util.tree_leaves(tree["decoder"]))
  emb = tree["token_embedder"]["embedding"]
  return int(total + emb.shape[1] * emb.dtype.itemsize)  # One embedding row.


def kv_bytes_per_step(config: T5Config, batch: int, max_len: int,
                      input_length: int) -> int:
  """Cache bytes read per decoder step (masked attention reads all slots)."""
  itemsize = jnp.dtype(config.dtype).itemsize
  per_pos = 2 * config.num_decoder_layers * config.num_heads * config.head_dim
  return int(batch * per_pos * (max_len + input_length) * itemsize)


def bandwidth_fields(*, param_bytes: int, kv_bytes: int,
                     baseline_ms_per_token: float, flag_gbps: Optional[float],
                     device_kind: str) -> Dict[str, Any]:
  """The result's bandwidth-bound fields ({} when no bandwidth is known).

  Args:
    param_bytes: `decoder_param_bytes` of the target.
    kv_bytes: `kv_bytes_per_step` of the target.
    baseline_ms_per_token: the measured baseline.
    flag_gbps: --device_bandwidth_gbps (wins), or None for the known value
      of `device_kind`.
  """
  bandwidth, source = flag_gbps, "flag"
  if bandwidth is None:
    bandwidth, source = default_bandwidth_gbps(device_kind), "device_kind"
  if bandwidth is None:
    return {}
  bound_ms = param_bytes / (bandwidth * 1e9) * 1e3
  return {
      "device_bandwidth_gbps": bandwidth,
      "device_bandwidth_source": source,
      "baseline_bandwidth_bound_ms_per_token": bound_ms,
      "baseline_bandwidth_bound_ms_per_token_with_kv":
          (param_bytes + kv_bytes) / (bandwidth * 1e9) * 1e3,
      # >= 1: how many times slower than streaming the params at peak.
      "baseline_to_bandwidth_bound_ratio": baseline_ms_per_token / bound_ms,
  }
