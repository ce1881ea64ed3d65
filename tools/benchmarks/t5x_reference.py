"""T5X's own greedy decoder, imported from a checkout, as a reference.

`python -m tools.benchmarks.compare_with_t5x` times our decoders against T5X's
`decoding.temperature_sample` on the same model. T5X is not on PyPI and the
project does not vendor it: `import_t5x` loads `t5x/decoding.py` and the
example network `t5x/examples/t5/network.py` from a checkout the user
supplies, without running `t5x/__init__.py` (which imports T5X's training
stack: seqio, airio, orbax, ...). No T5X file is edited or copied.

`make_t5x_predict` decodes the way `t5x/models.py` `EncoderDecoderModel.
predict_batch_with_aux` does; `check_same_tree` and
`teacher_forced_logits_diff` check that T5X's network and ours read the same
parameters and agree.
"""
import dataclasses
import functools
import importlib
import inspect
import os
import subprocess
import sys
import types
from typing import Any, Dict, List, Optional, Tuple

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core.models import Transformer
from specdec_jax.metrics import exactness


class T5XPathError(SystemExit):
  """--t5x_path is missing, or not a T5X checkout, or T5X fails to import."""


@dataclasses.dataclass(frozen=True)
class T5X:
  """T5X's modules loaded from a checkout (`import_t5x`).

  Attributes:
    root: the checkout's root (holds t5x/decoding.py).
    decoding: `t5x.decoding`.
    network: `t5x.examples.t5.network`.
    shims: what was done to import them (for the results file).
  """
  root: str
  decoding: Any
  network: Any
  shims: Tuple[str, ...]

  def commit(self, override: Optional[str] = None) -> Optional[str]:
    """`override`, else the checkout's `git rev-parse HEAD` (None if not a
    git work tree)."""
    if override:
      return override
    try:
      out = subprocess.run(["git", "-C", self.root, "rev-parse", "HEAD"],
                           capture_output=True, text=True, timeout=30,
                           check=True)
      return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
      return None

  def version(self) -> Optional[str]:
    """t5x/version.py's __version__ (None if unreadable)."""
    path = os.path.join(self.root, "t5x", "version.py")
    try:
      scope: Dict[str, Any] = {}
      with open(path) as f:
        exec(compile(f.read(), path, "exec"), scope)  # pylint: disable=exec-used
      return str(scope.get("__version__"))
    except Exception:  # pylint: disable=broad-except
      return None

  def would_prefill(self) -> bool:
    """Whether this T5X would prefill the decoder cache with a prompt (not
    replicated: decoding here starts from an empty prompt)."""
    return ("initial_index" in inspect.signature(
        self.decoding.temperature_sample).parameters and "prefill"
            in inspect.signature(self.network.Transformer.decode).parameters)


# ---------------------------------------------------------------------------
# Importing T5X from a checkout.
# ---------------------------------------------------------------------------
_REQUIRED_T5X_FILES = ("t5x/decoding.py", "t5x/binary_search.py",
                       "t5x/examples/t5/network.py",
                       "t5x/examples/t5/layers.py")


def check_t5x_path(t5x_path: Optional[str]) -> str:
  if not t5x_path:
    raise T5XPathError(
        "error: --t5x_path is required: the root of a google-research/t5x "
        "checkout (the folder that contains t5x/decoding.py), e.g.\n"
        "  git clone https://github.com/google-research/t5x /tmp/t5x\n"
        "  python -m tools.benchmarks.compare_with_t5x --t5x_path=/tmp/t5x")
  root = os.path.abspath(os.path.expanduser(t5x_path))
  if not os.path.isdir(root):
    raise T5XPathError(f"error: --t5x_path={t5x_path!r}: no such directory.")
  missing = [
      f for f in _REQUIRED_T5X_FILES
      if not os.path.isfile(os.path.join(root, f))
  ]
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


def import_t5x(t5x_path: str) -> T5X:
  """Imports T5X's decoding and example network from a checkout.

  Shim: a bare `t5x` package whose `__path__` is the checkout's t5x/ folder,
  so `import t5x.decoding` and `import t5x.examples.t5.network` load those
  modules (which only need jax and flax) without running t5x/__init__.py.
  """
  root = check_t5x_path(t5x_path)
  package_dir = os.path.join(root, "t5x")
  existing = sys.modules.get("t5x")
  if existing is not None:
    paths = [os.path.abspath(p) for p in getattr(existing, "__path__", [])]
    if package_dir not in paths:
      raise T5XPathError(
          f"error: a different `t5x` is already imported from {paths}; "
          f"cannot also import {package_dir}.")
  else:
    package = types.ModuleType("t5x")
    package.__path__ = [package_dir]
    package.__file__ = os.path.join(package_dir, "__init__.py")
    sys.modules["t5x"] = package
  if root not in sys.path:
    sys.path.insert(0, root)
  shims = ["t5x imported as a bare package (t5x/__init__.py not executed)"]
  shims += _apply_compat_shims()
  try:
    t5x_decoding = importlib.import_module("t5x.decoding")
    network = importlib.import_module("t5x.examples.t5.network")
  except ImportError as e:
    raise T5XPathError(
        f"error: importing T5X from {root} failed: {e!r}. The script needs "
        "only t5x/decoding.py, t5x/binary_search.py and t5x/examples/t5/"
        "{network,layers}.py with jax and flax.") from e
  return T5X(root, t5x_decoding, network, tuple(shims))


# ---------------------------------------------------------------------------
# T5X's greedy decoder, and checks that it runs our model.
# ---------------------------------------------------------------------------
def t5x_config(network, config):
  """T5X's `network.T5Config` with our config's hyperparameters."""
  theirs = {f.name for f in dataclasses.fields(network.T5Config)}
  # Our extensions, at the values that mean T5X's model.
  extensions = {"encoder_width": None}
  for name, plain in extensions.items():
    if getattr(config, name) != plain:
      raise SystemExit(
          f"error: T5X has no {name}; got {getattr(config, name)!r}.")
  ours = {f.name for f in dataclasses.fields(config)} - set(extensions)
  if theirs - ours or ours - theirs:
    raise SystemExit(
        f"error: T5Config fields differ: only in T5X {sorted(theirs - ours)}, "
        f"only in ours {sorted(ours - theirs)}.")
  kwargs = {name: getattr(config, name) for name in theirs}
  kwargs["dropout_rate"] = 0.0
  kwargs["mlp_activations"] = tuple(config.mlp_activations)
  return network.T5Config(**kwargs)


def make_t5x_predict(t5x: T5X, config, *, max_decode_length: int, eos_id: int):
  """T5X's network for our `config`, and its jitted greedy decoder.

  The decoder, (params, encoder_input_tokens [B, S], rng) -> [B, L] tokens,
  follows `EncoderDecoderModel.predict_batch_with_aux` with
  `decode_fn=decoding.temperature_sample`, num_decodes=1, temperature 0,
  all of it in one `jax.jit` with the params as an argument.

  Returns:
    (T5X's `Transformer` module, the jitted decoder).
  """
  module = t5x.network.Transformer(t5x_config(t5x.network, config))
  t5x_decoding = t5x.decoding

  def predict(params, encoder_input_tokens, rng):
    batch = encoder_input_tokens.shape[0]
    decoder_prompt_inputs = jnp.zeros((batch, max_decode_length), jnp.int32)
    encoded_inputs = module.apply({"params": params}, encoder_input_tokens,
                                  enable_dropout=False, method=module.encode)
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
          {
              "params": params,
              "cache": decoding_state.cache
          }, encoded_inputs, encoder_input_tokens, flat_ids, flat_ids,
          enable_dropout=False, decode=True,
          max_decode_length=max_decode_length, mutable=["cache"],
          method=module.decode)
      return jnp.squeeze(flat_logits, axis=1), new_vars["cache"]

    decodes, _ = t5x_decoding.temperature_sample(
        inputs=decoder_prompt_inputs, cache=cache,
        tokens_to_logits=tokens_ids_to_logits, eos_id=eos_id, decode_rng=rng,
        num_decodes=1, temperature=0.0, topk=1, cache_offset=0)
    return decodes[:, -1, :]

  return module, jax.jit(predict)


def _tree_shapes(tree):
  return {
      "/".join(k): tuple(v.shape)
      for k, v in traverse_util.flatten_dict(dict(tree)).items()
  }


def check_same_tree(t5x_module, params, input_length, max_decode_length):
  """Our init's params tree vs T5X's `init` (names and shapes)."""
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
  tokens = jnp.asarray(tokens, jnp.int32)
  decoder_inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  ours = jax.jit(Transformer(config).apply)({
      "params": params
  }, inputs, decoder_inputs, tokens)
  theirs = jax.jit(functools.partial(t5x_module.apply, enable_dropout=False))({
      "params": params
  }, inputs, decoder_inputs, tokens)
  return (float(jnp.max(jnp.abs(ours - theirs))),
          float(jnp.max(jnp.abs(theirs))))


def token_agreement(ours: np.ndarray, theirs: np.ndarray) -> Dict[str, Any]:
  """JSON-ready agreement of two [B, L] token arrays
  (`exactness.greedy_identity`): all rows equal, equal tokens, total
  tokens, the first difference per row (None if equal)."""
  identity = exactness.greedy_identity(ours, theirs)
  first: List[Optional[int]] = [None] * identity["examples"]
  for m in identity["mismatches"]:
    first[m["index"]] = m["position"]
  same = np.asarray(ours) == np.asarray(theirs)
  return {
      "tokens_equal": identity["identical"] == identity["examples"],
      "tokens_equal_count": int(same.sum()),
      "tokens_total": int(same.size),
      "first_difference_per_row": first,
  }
