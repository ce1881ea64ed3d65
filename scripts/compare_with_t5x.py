#!/usr/bin/env python
"""Baseline decoder latency: ours vs T5X's `decoding.temperature_sample`.

The issue "Performance" asks that our baseline decoder
(`specdec_jax.decoding.temperature_sample`, one target call per token) be no
slower per token than T5X's own greedy decoder on the same model, the
baseline of the paper. T5X is not on PyPI and the project does not vendor it,
so this script imports T5X from a checkout the user supplies:

  git clone https://github.com/google-research/t5x /tmp/t5x
  python scripts/compare_with_t5x.py --t5x_path=/tmp/t5x \\
      --model small,tiny --max_decode_length 64 --batch_size 1 \\
      --output benchmarks/t5x_baseline_cpu.json

For each model size it
  1. builds our `Transformer` and T5X's `t5x/examples/t5/network.py`
     `Transformer` from the same hyperparameters (`network.T5Config`);
  2. initializes ONE set of random float32 params with
     `specdec_jax.models.init_params` and checks that it has exactly the tree
     (names and shapes) that T5X's own `init` produces, then feeds the same
     `{'params': ...}` to both;
  3. runs greedy decoding of the same random inputs with
     (a) T5X, the way `t5x/models.py` `EncoderDecoderModel.
         predict_batch_with_aux` does it: `module.encode`, the flax 'cache'
         collection from a `decode=True` apply on ones-shaped inputs of
         [B, max_decode_length], a `tokens_ids_to_logits` closure calling
         `module.apply({'params', 'cache'}, ..., decode=True,
         max_decode_length=..., mutable=['cache'], method=module.decode)`,
         then `t5x.decoding.temperature_sample(temperature=0, topk=1,
         num_decodes=1)`; all of it in one `jax.jit` with the params as an
         argument (T5X's partitioned predict fn; one device here);
     (b) ours: `specdec_jax.decoding.temperature_sample(T5Model, ...)`;
  4. checks that both produce the same greedy tokens, and that teacher-forced
     logits of the two networks agree;
  5. times both, excluding compilation: each round runs the two programs
     back to back (alternating which goes first) and `block_until_ready`s
     them; the report gives medians over rounds of each program's time and of
     the per-round ratio ours / T5X (robust to a loaded machine).

EOS: `--eos_id -1` (default) never fires, so both decoders make exactly
max_decode_length target calls and per-token latency is
wall time / max_decode_length (the encoder pass is included in both).

Shims. T5X's `t5x/__init__.py` imports its whole training stack (seqio,
airio, orbax, tensorstore, ...), which is not needed here and not installed.
The script therefore registers an empty `t5x` package whose `__path__` is the
checkout's `t5x/` folder, so `import t5x.decoding` and
`import t5x.examples.t5.network` load those modules (which only need jax and
flax) without running `t5x/__init__.py`. No T5X file is edited or copied.
With jax 0.10.2 / flax 0.12.8 and T5X at commit cc342d41 no API shims were
needed; `_apply_compat_shims` is where they would go.

Prompt prefill: newer T5X prefills the decoder cache with the prompt when
`module.decode` accepts `prefill` (the example network's does not at the
tested commit). Decoding here starts from an empty prompt, so prefill would
be a no-op; it is not replicated and the JSON records whether the checkout
would have used it.
"""
import argparse
import dataclasses
import functools
import inspect
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from typing import Any, Dict, List, Optional, Sequence

import numpy as np


class T5XPathError(SystemExit):
  pass


# ---------------------------------------------------------------------------
# Importing T5X from a checkout.
# ---------------------------------------------------------------------------
_REQUIRED_T5X_FILES = ("t5x/decoding.py", "t5x/binary_search.py",
                       "t5x/examples/t5/network.py",
                       "t5x/examples/t5/layers.py")


def _check_t5x_path(t5x_path: Optional[str]) -> str:
  if not t5x_path:
    raise T5XPathError(
        "error: --t5x_path is required: the root of a google-research/t5x "
        "checkout (the folder that contains t5x/decoding.py), e.g.\n"
        "  git clone https://github.com/google-research/t5x /tmp/t5x\n"
        "  python scripts/compare_with_t5x.py --t5x_path=/tmp/t5x")
  root = os.path.abspath(os.path.expanduser(t5x_path))
  if not os.path.isdir(root):
    raise T5XPathError(f"error: --t5x_path={t5x_path!r}: no such directory.")
  missing = [f for f in _REQUIRED_T5X_FILES
             if not os.path.isfile(os.path.join(root, f))]
  if missing:
    hint = ""
    if os.path.isfile(os.path.join(root, "decoding.py")):
      hint = (f" (it looks like the inner t5x/ package; pass its parent "
              f"{os.path.dirname(root)!r})")
    raise T5XPathError(
        f"error: --t5x_path={t5x_path!r} is not a T5X checkout{hint}: "
        f"missing {', '.join(missing)}.")
  return root


def _apply_compat_shims() -> List[str]:
  """Monkeypatches for jax/flax APIs T5X still uses; returns what was done.

  None are needed with jax 0.10.2 / flax 0.12.8 at the tested T5X commit.
  """
  return []


def import_t5x(t5x_path: str):
  """Imports T5X's decoding and example network from a checkout.

  Returns (decoding_module, network_module, shims_applied).
  """
  root = _check_t5x_path(t5x_path)
  package_dir = os.path.join(root, "t5x")
  existing = sys.modules.get("t5x")
  if existing is not None:
    paths = [os.path.abspath(p) for p in getattr(existing, "__path__", [])]
    if package_dir not in paths:
      raise T5XPathError(
          f"error: a different `t5x` is already imported from {paths}; "
          f"cannot also import {package_dir}.")
  else:
    # Shim: a bare package instead of running t5x/__init__.py (which imports
    # T5X's training stack: seqio, airio, orbax, ...).
    package = types.ModuleType("t5x")
    package.__path__ = [package_dir]
    package.__file__ = os.path.join(package_dir, "__init__.py")
    sys.modules["t5x"] = package
  if root not in sys.path:
    sys.path.insert(0, root)
  shims = ["t5x imported as a bare package (t5x/__init__.py not executed)"]
  shims += _apply_compat_shims()
  import importlib  # pylint: disable=g-import-not-at-top
  try:
    t5x_decoding = importlib.import_module("t5x.decoding")
    network = importlib.import_module("t5x.examples.t5.network")
  except ImportError as e:
    raise T5XPathError(
        f"error: importing T5X from {root} failed: {e!r}. The script needs "
        "only t5x/decoding.py, t5x/binary_search.py and t5x/examples/t5/"
        "{network,layers}.py with jax and flax.") from e
  return t5x_decoding, network, shims


def t5x_commit(root: str, override: Optional[str]) -> Optional[str]:
  if override:
    return override
  try:
    out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"],
                         capture_output=True, text=True, timeout=30,
                         check=True)
    return out.stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    return None


def t5x_version(root: str) -> Optional[str]:
  path = os.path.join(root, "t5x", "version.py")
  try:
    scope: Dict[str, Any] = {}
    with open(path) as f:
      exec(compile(f.read(), path, "exec"), scope)  # pylint: disable=exec-used
    return str(scope.get("__version__"))
  except Exception:  # pylint: disable=broad-except
    return None


# ---------------------------------------------------------------------------
# The two decoders.
# ---------------------------------------------------------------------------
def t5x_config(network, config):
  """T5X's `network.T5Config` with our config's hyperparameters."""
  theirs = {f.name for f in dataclasses.fields(network.T5Config)}
  ours = {f.name for f in dataclasses.fields(config)}
  if theirs - ours or ours - theirs:
    raise SystemExit(
        f"error: T5Config fields differ: only in T5X {sorted(theirs - ours)}, "
        f"only in ours {sorted(ours - theirs)}.")
  kwargs = {name: getattr(config, name) for name in theirs}
  kwargs["dropout_rate"] = 0.0
  kwargs["mlp_activations"] = tuple(config.mlp_activations)
  return network.T5Config(**kwargs)


def make_t5x_predict(t5x_decoding, network, cfg, *, max_decode_length,
                     eos_id):
  """A jitted (params, encoder_input_tokens, rng) -> [B, L] greedy decodes.

  Follows `EncoderDecoderModel.predict_batch_with_aux` with
  `decode_fn=decoding.temperature_sample`, num_decodes=1, temperature 0.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  module = network.Transformer(cfg)

  def predict(params, encoder_input_tokens, rng):
    batch = encoder_input_tokens.shape[0]
    decoder_prompt_inputs = jnp.zeros((batch, max_decode_length), jnp.int32)
    encoded_inputs = module.apply(
        {"params": params}, encoder_input_tokens, enable_dropout=False,
        method=module.encode)
    # `_compute_kv_cache` without prefill.
    _, initial_variables = module.apply(
        {"params": params},
        encoder_input_tokens=jnp.ones_like(encoder_input_tokens),
        decoder_input_tokens=jnp.ones_like(decoder_prompt_inputs),
        decoder_target_tokens=jnp.ones_like(decoder_prompt_inputs),
        mutable=["cache"], decode=True, enable_dropout=False)
    cache = initial_variables["cache"]

    def tokens_ids_to_logits(decoding_state):
      flat_ids = decoding_state.cur_token
      flat_logits, new_vars = module.apply(
          {"params": params, "cache": decoding_state.cache},
          encoded_inputs, encoder_input_tokens, flat_ids, flat_ids,
          enable_dropout=False, decode=True,
          max_decode_length=max_decode_length, mutable=["cache"],
          method=module.decode)
      return jnp.squeeze(flat_logits, axis=1), new_vars["cache"]

    decodes, _ = t5x_decoding.temperature_sample(
        inputs=decoder_prompt_inputs, cache=cache,
        tokens_to_logits=tokens_ids_to_logits, eos_id=eos_id,
        decode_rng=rng, num_decodes=1, temperature=0.0, topk=1,
        cache_offset=0)
    return decodes[:, -1, :]

  return module, jax.jit(predict)


def would_prefill(t5x_decoding, network) -> bool:
  return ("initial_index" in
          inspect.signature(t5x_decoding.temperature_sample).parameters and
          "prefill" in inspect.signature(network.Transformer.decode).parameters)


def _tree_shapes(tree):
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  return {"/".join(k): tuple(v.shape)
          for k, v in traverse_util.flatten_dict(dict(tree)).items()}


def check_same_tree(t5x_module, params, input_length, max_decode_length):
  """Our init's params tree vs T5X's `init` (names and shapes)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  enc = jnp.ones((1, input_length), jnp.int32)
  dec = jnp.ones((1, max_decode_length), jnp.int32)
  theirs = jax.eval_shape(
      functools.partial(t5x_module.init, enable_dropout=False),
      jax.random.PRNGKey(0), enc, dec, dec)["params"]
  a, b = _tree_shapes(params), _tree_shapes(theirs)
  if a != b:
    diff = sorted(set(a.items()) ^ set(b.items()))[:10]
    raise SystemExit(f"error: params trees differ (ours ^ T5X): {diff}")
  return len(a)


# ---------------------------------------------------------------------------
# Benchmark.
# ---------------------------------------------------------------------------
def _median(xs):
  return float(statistics.median(xs))


def run_model(spec: str, args, t5x_decoding, network, log) -> Dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import benchmarking  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import T5Model  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import Transformer  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import init_params  # pylint: disable=g-import-not-at-top

  config, label, warnings = benchmarking.resolve_model_config(spec, "model")
  for w in warnings:
    log(f"warning: {w}")
  config = config.replace(dtype=benchmarking.DTYPES[args.dtype],
                          dropout_rate=0.0)
  cfg = t5x_config(network, config)
  L = args.max_decode_length
  t5x_module, t5x_predict = make_t5x_predict(
      t5x_decoding, network, cfg, max_decode_length=L, eos_id=args.eos_id)

  variables = init_params(config, jax.random.PRNGKey(args.seed))
  params = variables["params"]
  num_leaves = check_same_tree(t5x_module, params, args.input_length, L)
  target = T5Model(config=config, params={"params": params})

  rs = np.random.RandomState(args.seed)
  # Tokens 2..vocab-1: no padding (0) and no EOS (1) in the inputs.
  inputs = jnp.asarray(rs.randint(2, config.vocab_size,
                                  size=(args.batch_size, args.input_length)),
                       jnp.int32)
  rng = jax.random.PRNGKey(args.seed + 1)

  def run_ours():
    return decoding.temperature_sample(
        target, inputs, rng, max_decode_length=L, temperature=0.0,
        eos_id=args.eos_id).tokens

  def run_t5x():
    return t5x_predict(params, inputs, rng)

  programs = {"ours": run_ours, "t5x": run_t5x}
  compile_s = {}
  outputs = {}
  for name, fn in programs.items():
    t0 = time.perf_counter()
    outputs[name] = np.asarray(jax.block_until_ready(fn()))
    compile_s[name] = time.perf_counter() - t0
    log(f"[{label}] {name}: first call (compile + run) {compile_s[name]:.1f}s")

  # Correctness: same greedy tokens, and the same teacher-forced logits.
  ours_tokens, t5x_tokens = outputs["ours"], outputs["t5x"]
  same = ours_tokens == t5x_tokens
  rows_equal = same.all(axis=1)
  first_diff = [int(np.argmin(r)) if not r.all() else None for r in same]
  decoder_inputs = jnp.concatenate(
      [jnp.zeros((args.batch_size, 1), jnp.int32),
       jnp.asarray(t5x_tokens[:, :-1])], axis=1)
  targets = jnp.asarray(t5x_tokens)
  ours_logits = jax.jit(Transformer(config).apply)(
      {"params": params}, inputs, decoder_inputs, targets)
  t5x_logits = jax.jit(functools.partial(t5x_module.apply,
                                         enable_dropout=False))(
      {"params": params}, inputs, decoder_inputs, targets)
  logits_diff = float(jnp.max(jnp.abs(ours_logits - t5x_logits)))
  logits_scale = float(jnp.max(jnp.abs(t5x_logits)))
  log(f"[{label}] tokens equal: {bool(rows_equal.all())} "
      f"({int(same.sum())}/{same.size}); teacher-forced logits max |diff| "
      f"{logits_diff:.2e} (max |logit| {logits_scale:.2e})")

  # Warm runs, then interleaved timed rounds.
  for fn in programs.values():
    jax.block_until_ready(fn())
  times = {name: [] for name in programs}
  ratios = []
  for r in range(args.repeats):
    order = ("ours", "t5x") if r % 2 == 0 else ("t5x", "ours")
    for name in order:
      t0 = time.perf_counter()
      jax.block_until_ready(programs[name]())
      times[name].append(time.perf_counter() - t0)
    ratios.append(times["ours"][-1] / times["t5x"][-1])
  ms_per_token = {name: 1e3 * _median(ts) / L for name, ts in times.items()}
  ratio = _median(ratios)
  log(f"[{label}] ms/token: ours {ms_per_token['ours']:.3f}, T5X "
      f"{ms_per_token['t5x']:.3f}; median per-round ratio ours/T5X "
      f"{ratio:.3f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")

  return {
      "model": label,
      "config": {k: (jnp.dtype(v).name if k == "dtype" else
                     list(v) if isinstance(v, tuple) else v)
                 for k, v in dataclasses.asdict(config).items()},
      "num_params": config.num_params,
      "param_leaves": num_leaves,
      "params_tree_matches_t5x_init": True,
      "batch_size": args.batch_size,
      "input_length": args.input_length,
      "max_decode_length": L,
      "generated_tokens_per_row": L,
      "eos_id": args.eos_id,
      "tokens_equal": bool(rows_equal.all()),
      "tokens_equal_count": int(same.sum()),
      "tokens_total": int(same.size),
      "first_difference_per_row": first_diff,
      "teacher_forced_logits_max_abs_diff": logits_diff,
      "teacher_forced_logits_max_abs": logits_scale,
      "compile_plus_first_run_s": compile_s,
      "repeats": args.repeats,
      "seconds_per_decode": {k: v for k, v in times.items()},
      "median_seconds_per_decode": {k: _median(v) for k, v in times.items()},
      "ms_per_token": ms_per_token,
      "ratio_ours_over_t5x_per_round": ratios,
      "ratio_ours_over_t5x_median": ratio,
      "ratio_of_medians": ms_per_token["ours"] / ms_per_token["t5x"],
  }


def parse_args(argv: Optional[Sequence[str]] = None):
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--t5x_path", default=None,
                 help="root of a google-research/t5x checkout (required)")
  p.add_argument("--t5x_commit", default=None,
                 help="T5X commit to record when --t5x_path is not a git "
                      "work tree (default: `git rev-parse HEAD` there)")
  p.add_argument("--model", default="small",
                 help="comma-separated sizes (tiny, mini, xsmall, small, "
                      "base, ...) or gin files binding T5Config")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--max_decode_length", type=int, default=64)
  p.add_argument("--input_length", type=int, default=64)
  p.add_argument("--batch_size", type=int, default=1)
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--eos_id", type=int, default=-1,
                 help="-1 (default) never fires: every row decodes "
                      "max_decode_length tokens")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--output", default=None, help="JSON results file")
  args = p.parse_args(argv)
  for name in ("max_decode_length", "input_length", "batch_size", "repeats"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be >= 1")
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  root = _check_t5x_path(args.t5x_path)
  t5x_decoding, network, shims = import_t5x(root)

  import flax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import io_utils  # pylint: disable=g-import-not-at-top

  def log(msg):
    print(msg, flush=True)

  commit = t5x_commit(root, args.t5x_commit)
  log(f"T5X from {root} (commit {commit}); jax {jax.__version__}, flax "
      f"{flax.__version__}, backend {jax.default_backend()}")
  load_before = os.getloadavg()[0]
  runs = [run_model(spec.strip(), args, t5x_decoding, network, log)
          for spec in args.model.split(",") if spec.strip()]
  load_after = os.getloadavg()[0]
  device = jax.devices()[0]
  result = {
      "description": (
          "Greedy decoding latency of specdec_jax.decoding.temperature_sample "
          "vs T5X's decoding.temperature_sample (called as "
          "EncoderDecoderModel.predict_batch_with_aux does, in one jax.jit) "
          "on the same random params and inputs. Times include the encoder "
          "pass; ms_per_token = median decode time / max_decode_length; "
          "ratio = median over rounds of (ours / T5X) from interleaved runs."),
      "t5x_commit": commit,
      "t5x_version": t5x_version(root),
      "t5x_shims": shims,
      "t5x_would_prefill_prompt": would_prefill(t5x_decoding, network),
      "command": " ".join(["python", "scripts/compare_with_t5x.py"] +
                          list(sys.argv[1:] if argv is None else argv)),
      "backend": jax.default_backend(),
      "device_kind": str(getattr(device, "device_kind", "")),
      "jax_version": jax.__version__,
      "flax_version": flax.__version__,
      "python_version": platform.python_version(),
      "cpu_count": os.cpu_count(),
      "host_load_average_1min": [load_before, load_after],
      "dtype": args.dtype,
      "runs": runs,
  }
  if args.output:
    io_utils.write_json(args.output, result)
    log(f"wrote {args.output}")
  return 0 if all(r["tokens_equal"] for r in runs) else 1


if __name__ == "__main__":
  sys.exit(main())
