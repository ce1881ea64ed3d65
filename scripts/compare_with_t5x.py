#!/usr/bin/env python
"""Greedy decoding latency: ours (baseline, speculative) vs T5X's decoder.

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

Real pair (`--pair=pretrained`, or any run gin file binding
TARGET_CHECKPOINT_PATH and DRAFT_CHECKPOINT_PATH). Issue 10 asks that
speculative decoding be >= 1.5x faster than T5X's own
`decoding.temperature_sample` on the same target. This mode loads the pair,
vocabulary and sentences exactly as `python -m specdec_jax.run
--gin_file=pretrained_multi30k.gin` does (`run.Experiment`: the T5X
checkpoints decoded in float32, the models `prepared_for_decoding` for the
CPU kernel, run's own decoders), hands T5X the same target weights in
T5X's layout (`T5Model.unpacked`, its tree checked against T5X's `init`),
and for each sentence at batch 1, greedy, EOS = 1, decodes with
  (a) T5X's `temperature_sample` on the target (as above, real EOS);
  (b) our baseline `decoding.temperature_sample` on the target;
  (c) our speculative decoder with the draft, for each γ of `--gammas`
      (default: the gin file's GAMMA).
All must give the same tokens for every sentence (else exit 1, untimed).
Each input is cut to its length rounded up to `run.INPUT_BUCKET`, as run
does, the same width for all programs; every width is compiled first.
Timing: each round decodes every sentence with every program, the order
rotated per sentence and round; a program's round time is the sum of its
whole-sentence times (encoder included). Reported: medians over rounds and
the median per-round ratios T5X/baseline, T5X/speculative and
baseline/speculative.

  python scripts/compare_with_t5x.py --t5x_path=/tmp/t5x --pair=pretrained \\
      --gammas=3,6 --repeats=5 --output=benchmarks/t5x_pretrained_cpu.json

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
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
  # Our extensions, at the values that mean T5X's model.
  extensions = {"encoder_width": None}
  for name, plain in extensions.items():
    if getattr(config, name) != plain:
      raise SystemExit(f"error: T5X has no {name}; got {getattr(config, name)!r}.")
  ours = {f.name for f in dataclasses.fields(config)} - set(extensions)
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


def teacher_forced_logits_diff(config, t5x_module, params, inputs, tokens):
  """(max |ours - T5X|, max |T5X|) of teacher-forced logits [B, L, V].

  Both networks read `params` (T5X's layout) on `inputs` [B, S], with the
  decoder fed `tokens` [B, L] shifted right by one (start token 0).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import Transformer  # pylint: disable=g-import-not-at-top
  tokens = jnp.asarray(tokens, jnp.int32)
  decoder_inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  ours = jax.jit(Transformer(config).apply)(
      {"params": params}, inputs, decoder_inputs, tokens)
  theirs = jax.jit(functools.partial(t5x_module.apply, enable_dropout=False))(
      {"params": params}, inputs, decoder_inputs, tokens)
  return (float(jnp.max(jnp.abs(ours - theirs))),
          float(jnp.max(jnp.abs(theirs))))


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
  logits_diff, logits_scale = teacher_forced_logits_diff(
      config, t5x_module, params, inputs, t5x_tokens)
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


# ---------------------------------------------------------------------------
# A real pair (--pair): T5X vs our baseline vs speculative, as `run` decodes.
# ---------------------------------------------------------------------------
# --pair aliases: the README's main job.
PAIRS = {"pretrained": "pretrained_multi30k.gin",
         "pretrained_11m": "pretrained_multi30k_11m.gin"}


def resolve_pair(pair: str) -> str:
  """The run gin file `--pair` names: an alias of PAIRS, or a path, or a
  bare name in the current folder or the repository's gin/ folder."""
  from specdec_jax.paths import GIN_DIR  # pylint: disable=g-import-not-at-top
  name = os.path.expanduser(PAIRS.get(pair, pair))
  for folder in (os.getcwd(), str(GIN_DIR)):
    path = os.path.join(folder, name)  # `name` itself when absolute
    if name and os.path.isfile(path):
      return os.path.abspath(path)
  raise ValueError(
      f"--pair={pair!r}: no such run gin file (looked in {os.getcwd()} and "
      f"{GIN_DIR}). Allowed: {', '.join(sorted(PAIRS))} (= "
      f"{', '.join(PAIRS[k] for k in sorted(PAIRS))}), or a run gin file "
      "that binds TARGET_CHECKPOINT_PATH and DRAFT_CHECKPOINT_PATH.")


def parse_gammas(text: str) -> Tuple[int, ...]:
  """'3,6' -> (3, 6): distinct integers >= 1."""
  try:
    gammas = tuple(int(x) for x in text.split(","))
  except ValueError:
    gammas = ()
  if not gammas or min(gammas) < 1 or len(set(gammas)) != len(gammas):
    raise ValueError(
        f"--gammas={text!r}: expected distinct comma-separated integers >= 1 "
        "(γ, draft guesses per target call), e.g. --gammas=3,6.")
  return gammas


def pair_experiment(gin_file: str, args):
  """(`run.Experiment` for the pair, the γs): the gin file's settings, at
  T = 0 and batch 1, with --num_examples / --max_decode_length if given.

  Nothing is loaded yet; a gin file without both checkpoints, with
  GAMMA='auto' and no --gammas, or with LENIENCE < 1 is an error here.
  """
  from specdec_jax import gin_utils  # pylint: disable=g-import-not-at-top
  from specdec_jax import run as run_lib  # pylint: disable=g-import-not-at-top
  where = f"--pair={args.pair!r} ({gin_file})"
  try:
    gin_utils.parse_gin([gin_file], [], finalize=False)
    settings = run_lib.run_arguments()  # pylint: disable=no-value-for-parameter
  except (ValueError, LookupError) as e:  # incl. gin_utils.ConfigError
    raise SystemExit(f"error: {where}: {e}") from None
  missing = [macro for macro, key in (
      ("TARGET_CHECKPOINT_PATH", "target_checkpoint_path"),
      ("DRAFT_CHECKPOINT_PATH", "draft_checkpoint_path")) if not settings[key]]
  if missing:
    raise SystemExit(f"error: {where} binds no {' or '.join(missing)}: a "
                     "trained pair is needed (random weights: leave out "
                     "--pair).")
  if settings["lenience"] != 1:
    raise SystemExit(f"error: {where} sets LENIENCE={settings['lenience']}: "
                     "not exact, so not comparable token for token; allowed: "
                     "1.")
  gammas = args.gammas or (settings["gamma"],)
  if not all(isinstance(g, int) for g in gammas):
    raise SystemExit(f"error: {where} sets GAMMA={settings['gamma']!r}: "
                     "give the γs to time with --gammas (e.g. --gammas=3,6).")
  overrides = {"temperature": 0.0, "top_k": 0, "top_p": 1.0,
               "batch_size": 1, "gamma": gammas[0]}
  if args.num_examples:
    overrides["num_examples"] = args.num_examples
  if args.max_decode_length:
    overrides["task_feature_lengths"] = dict(
        settings["task_feature_lengths"], targets=args.max_decode_length)
  try:
    experiment = run_lib.Experiment(  # pylint: disable=missing-kwoa
        **run_lib.run_arguments(overrides=overrides))
  except ValueError as e:
    raise SystemExit(f"error: {where}: {e}") from None
  return experiment, gammas


def input_widths(inputs: np.ndarray, bucket: int) -> np.ndarray:
  """[N] widths: each row's tokens (EOS included) rounded up to `bucket`,
  at most S, as `multihost.Feeder` cuts a batch of one."""
  lengths = np.sum(inputs != 0, axis=1)
  return np.minimum(inputs.shape[1], -(-lengths // bucket) * bucket)


def _first_difference(a: np.ndarray, b: np.ndarray) -> Optional[int]:
  diff = np.flatnonzero(a != b)
  return int(diff[0]) if diff.size else None


def run_pair(args, t5x_decoding, network, log) -> Dict[str, Any]:
  """Greedy decodes of every sentence by T5X, our baseline and speculative
  decoding (each γ): identity check, then interleaved timing rounds."""
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax import partitioning  # pylint: disable=g-import-not-at-top
  from specdec_jax import run as run_lib  # pylint: disable=g-import-not-at-top

  gin_file = resolve_pair(args.pair)
  exp, gammas = pair_experiment(gin_file, args)
  a = exp.args
  vocab = exp.vocabulary()
  examples = exp.examples()
  exp.check_examples(examples)
  inputs, full_lengths = exp.encode_inputs(vocab, examples)
  exp.check_truncation(full_lengths)
  L = a["task_feature_lengths"]["targets"]
  config = exp.target_config
  cfg = t5x_config(network, config)
  t5x_module, t5x_predict = make_t5x_predict(
      t5x_decoding, network, cfg, max_decode_length=L, eos_id=decoding.EOS_ID)

  mesh, target, draft = exp.models()  # run's loader: float32, packed
  # T5X reads the same weights in its own layout (packing is a layout).
  t5x_params = target.unpacked().params["params"]
  num_leaves = check_same_tree(t5x_module, t5x_params, inputs.shape[1], L)
  source = a["source_file"] or a["mixture_or_task_name"]
  log(f"[pair] {len(examples)} sentences from {source}; target "
      f"{a['target_checkpoint_path']} ({config.num_params:,} params, tree = "
      f"T5X's init, {num_leaves} leaves), draft "
      f"{a['draft_checkpoint_path']}; max_decode_length {L}, γ {list(gammas)}")

  # Run's own decoders (`Experiment._decoders`: what `run` times).
  baseline, _ = exp._decoders(target, draft)  # pylint: disable=protected-access
  programs = {
      "t5x": lambda x, key: t5x_predict(t5x_params, x, key),
      "baseline": baseline,
  }
  for g in gammas:
    _, programs[f"speculative_gamma{g}"] = exp._decoders(  # pylint: disable=protected-access
        target, draft, g)
  names = list(programs)

  widths = input_widths(inputs, run_lib.INPUT_BUCKET)
  sharding = partitioning.data_sharding(mesh, 1)
  rows = [jax.device_put(inputs[i:i + 1, :w], sharding)
          for i, w in enumerate(widths)]
  rng = jax.random.PRNGKey(a["seed"])
  keys = [jax.random.fold_in(rng, i) for i in range(len(rows))]

  # Compile every program for every input width before anything is timed.
  firsts: Dict[int, int] = {}
  for i, w in enumerate(widths):
    firsts.setdefault(int(w), i)
  compile_s = dict.fromkeys(names, 0.0)
  for _, i in sorted(firsts.items()):
    for name in names:
      t0 = time.perf_counter()
      jax.block_until_ready(programs[name](rows[i], keys[i]))
      compile_s[name] += time.perf_counter() - t0
  log(f"[pair] compiled for input widths {sorted(firsts)}: " + ", ".join(
      f"{n} {s:.1f}s" for n, s in compile_s.items()))

  # Identity: every program's greedy tokens, sentence by sentence.
  tokens = {n: [] for n in names}
  stats = {g: [] for g in gammas}
  for i, x in enumerate(rows):
    for name in names:
      out = programs[name](x, keys[i])
      tokens[name].append(np.asarray(getattr(out, "tokens", out))[0])
      if name.startswith("speculative_gamma"):
        stats[int(name[len("speculative_gamma"):])].append(out.statistics())
  tokens = {n: np.stack(t) for n, t in tokens.items()}
  base = tokens["baseline"]
  identical = {n: int(np.sum(np.all(t == base, axis=1)))
               for n, t in tokens.items() if n != "baseline"}
  mismatches = {n: [(i, _first_difference(t[i], base[i]))
                    for i in range(len(base)) if not np.array_equal(t[i],
                                                                    base[i])]
                for n, t in tokens.items() if n != "baseline"}
  logits_diff, logits_scale = teacher_forced_logits_diff(
      config, t5x_module, t5x_params, rows[0], tokens["t5x"][:1])
  log(f"[pair] identical to our baseline on {len(base)} sentences: " +
      ", ".join(f"{n} {k}/{len(base)}" for n, k in identical.items()) +
      f"; teacher-forced logits (sentence 0, unpacked weights) ours vs T5X "
      f"max |diff| {logits_diff:.2e} (max |logit| {logits_scale:.2e})")

  speculative_stats = {}
  for g, per in stats.items():
    hist = np.sum([s["accepted_histogram"] for s in per], axis=0)
    trials = sum(s["acceptance_trials"] for s in per)
    calls = sum(s["target_calls"] for s in per)
    generated = sum(s["tokens_generated"] for s in per)
    speculative_stats[g] = {
        "target_calls": calls, "tokens_generated": generated,
        "tokens_per_target_call": generated / max(calls, 1),
        "alpha": float(np.arange(g + 1) @ hist) / max(trials, 1),
        "accepted_histogram": hist.tolist()}
  widths_count = {int(w): int(np.sum(widths == w)) for w in sorted(firsts)}
  result: Dict[str, Any] = {
      "gin_file": os.path.relpath(gin_file),
      "target_checkpoint_path": a["target_checkpoint_path"],
      "draft_checkpoint_path": a["draft_checkpoint_path"],
      "target_model": a["target_name"], "draft_model": a["draft_name"],
      "target_num_params": config.num_params,
      "draft_num_params": exp.draft_config.num_params,
      "dtype": str(np.dtype(config.dtype)),
      "param_leaves": num_leaves,
      "params_tree_matches_t5x_init": True,
      "source": source,
      "num_examples": len(examples),
      "batch_size": 1, "temperature": 0.0, "eos_id": decoding.EOS_ID,
      "max_decode_length": L,
      "inputs_length": int(inputs.shape[1]),
      "input_bucket": run_lib.INPUT_BUCKET,
      "examples_per_input_width": widths_count,
      "gammas": list(gammas),
      "programs": names,
      "tokens_generated": int(np.sum(base != 0)),
      "identical_to_baseline": identical,
      "all_identical": all(k == len(base) for k in identical.values()),
      "mismatches_sentence_and_first_position": {
          n: m[:20] for n, m in mismatches.items() if m},
      "teacher_forced_logits_max_abs_diff_sentence0": logits_diff,
      "teacher_forced_logits_max_abs_sentence0": logits_scale,
      "speculative": {str(g): s for g, s in speculative_stats.items()},
      "compile_plus_first_run_s": compile_s,
  }
  if not result["all_identical"]:
    print("error: greedy tokens differ from our baseline's: " + "; ".join(
        f"{n}: {len(m)} sentences, first (sentence, position) {m[:5]}"
        for n, m in mismatches.items() if m) + ". Not timed.",
        file=sys.stderr, flush=True)
    return result

  # Timing: whole-sentence calls, programs in an order rotated per sentence
  # and round (none always runs first, or right after another), summed
  # over the sentences per round.
  round_s = {n: [] for n in names}
  for r in range(args.repeats):
    total = dict.fromkeys(names, 0.0)
    for i, x in enumerate(rows):
      k = (r + i) % len(names)
      for name in names[k:] + names[:k]:
        t0 = time.perf_counter()
        jax.block_until_ready(programs[name](x, keys[i]))
        total[name] += time.perf_counter() - t0
    for n in names:
      round_s[n].append(total[n])
    log(f"[pair] round {r + 1}/{args.repeats}: " + ", ".join(
        f"{n} {s:.3f}s" for n, s in total.items()))

  def ratios(num, den):
    return [x / y for x, y in zip(round_s[num], round_s[den])]
  per_round = {"t5x_over_baseline": ratios("t5x", "baseline")}
  for g in gammas:
    spec = f"speculative_gamma{g}"
    per_round[f"t5x_over_{spec}"] = ratios("t5x", spec)
    per_round[f"baseline_over_{spec}"] = ratios("baseline", spec)
  tokens_generated = result["tokens_generated"]
  result.update({
      "repeats": args.repeats,
      "seconds_per_round": round_s,
      "median_seconds_per_round": {n: _median(s) for n, s in round_s.items()},
      "ms_per_token": {n: 1e3 * _median(s) / tokens_generated
                       for n, s in round_s.items()},
      "ratio_per_round": per_round,
      "ratio_median": {k: _median(v) for k, v in per_round.items()},
  })
  return result


def pair_table(result: Dict[str, Any]) -> List[str]:
  """The console table of a timed pair result."""
  med = result["median_seconds_per_round"]
  ratio = result["ratio_median"]
  n = result["num_examples"]
  lines = [f"{'program':<22}{'median s / ' + str(n) + ' sentences':>26}"
           f"{'ms/token':>10}{'T5X / it':>10}{'baseline / it':>15}"]
  for name in result["programs"]:
    label = {"t5x": "T5X temperature_sample",
             "baseline": "ours, baseline"}.get(
                 name, name.replace("speculative_gamma", "speculative γ="))
    vs_t5x = 1.0 if name == "t5x" else ratio[f"t5x_over_{name}"]
    vs_base = ("" if not name.startswith("speculative") else
               f"{ratio[f'baseline_over_{name}']:.2f}x")
    lines.append(f"{label:<22}{med[name]:>26.3f}"
                 f"{result['ms_per_token'][name]:>10.3f}{vs_t5x:>9.2f}x"
                 f"{vs_base:>15}")
  ident = ", ".join(f"{k} {v}/{n}" for k, v in
                    result["identical_to_baseline"].items())
  lines.append(f"greedy tokens identical to our baseline: {ident}; ratios: "
               f"medians over {result['repeats']} rounds of per-round "
               "ratios (> 1: faster than T5X / than our baseline)")
  return lines


# Flags of the random-weights mode, and their defaults there.
_RANDOM_DEFAULTS = {"model": "small", "dtype": "float32", "input_length": 64,
                    "batch_size": 1, "eos_id": -1, "seed": 0}


def parse_args(argv: Optional[Sequence[str]] = None):
  """Flags, checked before anything is imported, loaded or compiled."""
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--t5x_path", default=None,
                 help="root of a google-research/t5x checkout (required)")
  p.add_argument("--t5x_commit", default=None,
                 help="T5X commit to record when --t5x_path is not a git "
                      "work tree (default: `git rev-parse HEAD` there)")
  p.add_argument("--pair", default=None,
                 help="time a trained pair: 'pretrained' (= "
                      "pretrained_multi30k.gin) or a run gin file binding "
                      "TARGET_CHECKPOINT_PATH and DRAFT_CHECKPOINT_PATH; "
                      "default: random weights (--model)")
  p.add_argument("--gammas", default=None,
                 help="with --pair: comma-separated γs for speculative "
                      "decoding (default: the gin file's GAMMA)")
  p.add_argument("--num_examples", type=int, default=None,
                 help="with --pair: sentences to decode (default: the gin "
                      "file's NUM_EXAMPLES)")
  p.add_argument("--model", default=None,
                 help="random weights: comma-separated sizes (tiny, mini, "
                      "xsmall, small, base, ...) or gin files binding "
                      "T5Config (default small)")
  p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                 help="random weights (default float32)")
  p.add_argument("--max_decode_length", type=int, default=None,
                 help="generated tokens per row (default 64; with --pair, "
                      "the gin file's TASK_FEATURE_LENGTHS['targets'])")
  p.add_argument("--input_length", type=int, default=None,
                 help="random weights (default 64)")
  p.add_argument("--batch_size", type=int, default=None,
                 help="random weights (default 1)")
  p.add_argument("--repeats", type=int, default=7,
                 help="timed rounds (interleaved)")
  p.add_argument("--eos_id", type=int, default=None,
                 help="random weights: -1 (default) never fires, every row "
                      "decodes max_decode_length tokens (--pair: EOS = 1)")
  p.add_argument("--seed", type=int, default=None,
                 help="random weights (default 0)")
  p.add_argument("--output", default=None, help="JSON results file")
  args = p.parse_args(argv)
  for name in ("max_decode_length", "input_length", "batch_size", "repeats",
               "num_examples"):
    value = getattr(args, name)
    if value is not None and value < 1:
      p.error(f"--{name}={value}: must be >= 1")
  if args.pair is None:
    for name in ("gammas", "num_examples"):
      if getattr(args, name) is not None:
        p.error(f"--{name}={getattr(args, name)}: only used with --pair "
                "(a trained pair)")
    for name, default in _RANDOM_DEFAULTS.items():
      if getattr(args, name) is None:
        setattr(args, name, default)
    if args.max_decode_length is None:
      args.max_decode_length = 64
    return args
  given = [f"--{n}={getattr(args, n)}" for n in _RANDOM_DEFAULTS
           if getattr(args, n) is not None]
  if given:
    p.error(f"{', '.join(given)}: only used with random weights, not with "
            f"--pair={args.pair} (its gin file sets the models, inputs and "
            "EOS)")
  try:
    resolve_pair(args.pair)
    if args.gammas is not None:
      args.gammas = parse_gammas(args.gammas)
  except ValueError as e:
    p.error(str(e))
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  root = _check_t5x_path(args.t5x_path)
  from specdec_jax import io_utils  # pylint: disable=g-import-not-at-top
  if args.output:
    try:  # fail now, not after the timing
      io_utils.probe_writable_dir(os.path.dirname(os.path.abspath(
          args.output)))
    except ValueError as e:
      raise SystemExit(f"error: --output={args.output!r}: {e}") from None
  t5x_decoding, network, shims = import_t5x(root)

  import flax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  def log(msg):
    print(msg, flush=True)

  commit = t5x_commit(root, args.t5x_commit)
  log(f"T5X from {root} (commit {commit}); jax {jax.__version__}, flax "
      f"{flax.__version__}, backend {jax.default_backend()}")
  load_before = os.getloadavg()[0]
  if args.pair:
    pair = run_pair(args, t5x_decoding, network, log)
    outcome = {"pair": pair}
    ok = pair["all_identical"]
    description = (
        "Greedy decoding of a trained pair's sentences at batch 1 (EOS "
        "stops decoding) by T5X's decoding.temperature_sample on the target "
        "(as EncoderDecoderModel.predict_batch_with_aux calls it, in one "
        "jax.jit), by our baseline and by our speculative decoder (run's "
        "loader and decoders), token-identical on all sentences. Each round "
        "decodes every sentence with every program (order rotated); a "
        "program's round time is the sum of its whole-sentence times, "
        "encoder included, compilation excluded. Ratios: medians over "
        "rounds of per-round ratios (> 1: the denominator is faster).")
  else:
    runs = [run_model(spec.strip(), args, t5x_decoding, network, log)
            for spec in args.model.split(",") if spec.strip()]
    outcome = {"dtype": args.dtype, "runs": runs}
    ok = all(r["tokens_equal"] for r in runs)
    description = (
        "Greedy decoding latency of specdec_jax.decoding.temperature_sample "
        "vs T5X's decoding.temperature_sample (called as "
        "EncoderDecoderModel.predict_batch_with_aux does, in one jax.jit) "
        "on the same random params and inputs. Times include the encoder "
        "pass; ms_per_token = median decode time / max_decode_length; "
        "ratio = median over rounds of (ours / T5X) from interleaved runs.")
  load_after = os.getloadavg()[0]
  device = jax.devices()[0]
  result = {
      "description": description,
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
      **outcome,
  }
  if args.pair and ok:
    log("\n".join(pair_table(outcome["pair"])))
  if args.output:
    io_utils.write_json(args.output, result)
    log(f"wrote {args.output}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
