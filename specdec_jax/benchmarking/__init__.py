"""Decode benchmark: baseline vs speculative walltime, cost curves, c, overhead.

What it measures, for a target and a draft T5 config with random weights, on
the default JAX backend (`scripts/benchmark_decode.py` runs `cli.main`):

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
of the target's distribution. The rule (`synthetic.SyntheticAcceptance`)
lives in this package only; `decoding` never uses it unless it is passed as
the loop's acceptance rule, as this benchmark does. The output says
`"synthetic_acceptance": true`.

Timing method (`specdec_jax.metrics.timing`, which `run` times c with too). Every
timed function is jitted; the first call (compile and
first run) is a warm-up whose excess over the median run is reported as
`compile_time_s`, never part of a timing. Timings are medians over
`repeats` runs, each ended by `jax.block_until_ready`. Per-call costs (K
sweep, draft step, iteration split) run `inner_steps` calls inside one
jitted `lax.fori_loop` (carrying the cache, so nothing is hoisted or
dead-code eliminated) and divide: like the decode loops themselves, they then
pay no per-call dispatch. Each call resets the cache length to the fill
length (alternating +0/+1 so nothing is loop-invariant); all per-call
timings use one cache capacity (max_decode_length + max K + 2).

Modules: `config` (settings and their checks), `cli` (absl flags, `main`, the
console summary),
`measure` (`run_benchmark`, step by step), `synthetic` (the timing-only
acceptance rule), `bandwidth` (the memory-bandwidth bound),
`greedy_identity` (the temperature-0 exactness check with real acceptance). Random weights come from
`specdec_jax.checkpoints.parameters.random_params`, as `run`'s without checkpoints.

Also here, imported on their own (not by this package), each a command
(`python -m specdec_jax.benchmarking.X`) behind a thin script in scripts/:
`t5x_comparison` (our decoders against T5X's: `scripts/compare_with_t5x.py`)
with `t5x_reference` (T5X's own greedy decoder from a checkout, and checks
that it runs our model) and `t5x_pair` (a trained pair against T5X);
`loop_overhead` (`scripts/benchmark_loop_overhead.py`: where a decode's time
goes), `tree` (`scripts/benchmark_tree.py`: tree against token
verification), `beam` (`scripts/benchmark_beam.py`: speculative beam search
against beam search), `timing_noise` (`scripts/benchmark_timing_noise.py`:
how steady run's c is) and `soak` (`scripts/soak_sweep.py`: a long sweep's
memory).
"""
from specdec_jax.benchmarking.bandwidth import DEVICE_BANDWIDTH_GBPS
from specdec_jax.benchmarking.bandwidth import default_bandwidth_gbps
from specdec_jax.benchmarking.cli import format_report
from specdec_jax.benchmarking.cli import main
from specdec_jax.benchmarking.cli import parse_flags
from specdec_jax.benchmarking.config import DTYPES
from specdec_jax.benchmarking.config import MODEL_SIZES
from specdec_jax.benchmarking.config import BenchmarkConfig
from specdec_jax.benchmarking.config import BenchmarkFlagError
from specdec_jax.benchmarking.config import resolve_model_config
from specdec_jax.benchmarking.config import validate
from specdec_jax.benchmarking.greedy_identity import greedy_identity_check
from specdec_jax.benchmarking.measure import run_benchmark
from specdec_jax.benchmarking.synthetic import SyntheticAcceptance
from specdec_jax.benchmarking.synthetic import expected_accepted
from specdec_jax.benchmarking.synthetic import synthetic_accept

__all__ = [
    "DEVICE_BANDWIDTH_GBPS",
    "DTYPES",
    "MODEL_SIZES",
    "BenchmarkConfig",
    "BenchmarkFlagError",
    "SyntheticAcceptance",
    "default_bandwidth_gbps",
    "expected_accepted",
    "format_report",
    "greedy_identity_check",
    "main",
    "parse_flags",
    "resolve_model_config",
    "run_benchmark",
    "synthetic_accept",
    "validate",
]
