"""The device check: one command that checks and measures the project on a
lent GPU (issue 47; docs/usage/gpu.md).

`scripts/device_check.sh` installs carried wheels if any, puts the
repository on the path (no install, no network: gin, seqio and TensorFlow
are never imported) and runs `python -m tools.device_check`, which
runs six phases, each in a child process under a time cap, and writes
$OUT/device_check.json after each (a phase killed at its cap keeps what it
had measured). Every phase decodes on one decode path (`--path`; default
the backend's: 'fused', the GPU kernels, on one GPU; `models.decode_paths`):

* `env`: the machine, versions, the copy and matmul ceilings, and that the
  CPU-only parts (the CPU matmul kernel, XLA:CPU compiler options) stay off
  the GPU path; a CPU-only setting on a GPU is a one-line error;
* `exactness`: greedy identity and a whole-decoder two-sample chi-square
  (with a power check against a deliberately wrong target) for the token,
  block, tree and speculative-beam modes at tiny shapes;
* `paths`: the decode paths side by side (issue 56): each model's step on
  each path, its share of the memory floor, c and Theorem 3.8 per path,
  kernels per decoder layer, XLA:GPU option sets, the GPU kernels' tiles;
* `pretrained`: the shipped 38M + 1M pair on the main job's 60 captions:
  greedy identity (60/60) and the main job's speedup, on 'xla' and on the
  check's path at batch 1 and 8;
* `loop`: the speculative loop's own cost per iteration (issue 56 item
  4) on the shipped pair, on the check's path and 'xla': the iteration
  split of `tools.benchmarks.loop_overhead`, the kernels an iteration
  launches outside the model calls (`tools.benchmarks.iteration_hlo`),
  and the main job's speedup ÷ Theorem 3.8;
* `physics`: a T5-XXL-shaped target and T5-small/base/large-shaped drafts
  (random bfloat16 weights made on the device): c, the K-token call, the
  tree call and the speculative-beam call in steps, and Theorem 3.8 for
  each of the paper's Table 2 rows.

`--small` runs the same phases at tiny shapes on a CPU. Modules: `cli`
(the command line, the phases as child processes, the verdicts and the
last lines), `common` (settings, random weights on the device, records),
`env`, `travel` (whether the working tree fits a device call:
`--preflight`; what stays behind for it: `--aside`, `--back`),
`exactness`, `paths`, `pretrained_pair` (its pair's decoders and rounds:
`pair_runs`; the main job at other γ: `gamma_sweep`), `loop`, `physics`,
`stats` (Table 2's rows, Theorem 3.8's table). Greedy identity and the chi-square test with its
power check are the package's (`specdec_jax.metrics.exactness`, which
`certify` uses too). Nothing in `specdec_jax` imports this package.
"""
