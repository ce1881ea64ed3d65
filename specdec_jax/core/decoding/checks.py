"""Host-side argument checks of the decode loops' entry points.

`speculative_sample` and `temperature_sample` (`decoding.loops`) run these
on the host before anything is traced or compiled, so a bad argument is a
ValueError naming it, not a tracing error or a silently wrong output. They
are public for callers that jit the unchecked loops themselves (the run
harness checks its settings with them).
"""
import functools
import numbers
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import sampling
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.protocols import Drafter
from specdec_jax.core.protocols import Target
from specdec_jax.core.protocols import check_pytree
from specdec_jax.core.drafters.model import ModelDrafter


def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value,
                bool) or not isinstance(value, numbers.Integral) or (value < 1):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def _concrete_values(x: Any) -> Optional[np.ndarray]:
  """x as a host array, or None when it is traced (or not addressable)."""
  if isinstance(x, jax.core.Tracer):
    return None
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return None
  return np.asarray(x)


def check_encoder_inputs(encoder_input_tokens: Any,
                         vocab_size: Optional[int] = None) -> None:
  """Encoder inputs must be [B, S] integer token ids in [0, vocab_size).

  The dtype and shape are checked always. The ids are checked on the host
  when the array is concrete (a NumPy array, or a jax.Array outside jit);
  inside a caller's own `jax.jit` they are traced and cannot be: there an
  id >= vocab_size embeds as NaN (`jnp.take`'s fill mode) and a negative id
  wraps around, so the output is garbage without an error.

  Raises:
    ValueError naming `encoder_input_tokens`, what it got and what is
    allowed.
  """
  shape = getattr(encoder_input_tokens, "shape", None)
  dtype = getattr(encoder_input_tokens, "dtype", None)
  if shape is None or len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
    raise ValueError(
        "encoder_input_tokens must be a non-empty [batch, length] integer "
        f"array, got shape {shape}.")
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(
        "encoder_input_tokens must have an integer dtype (token ids), got "
        f"{dtype}: floats would be silently truncated to ids.")
  if vocab_size is None:
    return
  values = _concrete_values(encoder_input_tokens)
  if values is None or values.size == 0:
    return
  bad = (values < 0) | (values >= vocab_size)
  if np.any(bad):
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f"encoder_input_tokens must hold token ids in [0, {vocab_size}) (the "
        f"model's vocab_size; 0 is padding), got {int(values[where])} at "
        f"{list(where)} ({int(bad.sum())} ids out of range).")


def check_rng(rng: Any) -> None:
  """rng must be one JAX PRNG key: `jax.random.key(seed)` (a typed key of
  shape []) or `jax.random.PRNGKey(seed)` (raw uint32 [2], or [4] for the
  'rbg' implementations)."""
  dtype = getattr(rng, "dtype", None)
  shape = getattr(rng, "shape", None)
  if dtype is not None and not isinstance(rng, (str, bytes)):
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
      if shape == ():
        return
    elif dtype == np.uint32 and shape in ((2,), (4,)):
      return
  what = (f"an array of dtype {dtype} and shape {shape}"
          if dtype is not None else repr(rng))
  raise ValueError(
      "rng must be a single JAX PRNG key, e.g. jax.random.key(0) or "
      f"jax.random.PRNGKey(0), got {what}.")


def check_eos_id(eos_id: Any) -> None:
  """eos_id must be an integer token id (-1: never stop early)."""
  if isinstance(eos_id, bool) or not isinstance(eos_id, numbers.Integral):
    raise ValueError(
        f"eos_id must be an integer token id (-1: never stop early), got "
        f"{eos_id!r}.")


def resolve_method(method: Optional[sampling.SamplingMethod] = None,
                   temperature: Optional[float] = None,
                   top_k: Optional[int] = None,
                   top_p: Optional[float] = None) -> sampling.SamplingMethod:
  """The sampling method from either `method` or the loose scalars.

  Loose scalars default to greedy (temperature 0, top_k 0, top_p 1) and are
  validated by `sampling.make_method`; giving both forms is an error.
  """
  loose = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
  if method is not None:
    given = [k for k, v in loose.items() if v is not None]
    if given:
      raise ValueError(
          f"Pass either method or {'/'.join(given)}, not both: method "
          f"({method!r}) already fixes them.")
    if not isinstance(method, sampling.SamplingMethod):
      raise ValueError(
          "method must be a sampling.SamplingMethod (e.g. sampling.Greedy() "
          f"or sampling.Sampling(temperature=0.7, top_p=0.9)), got "
          f"{type(method).__name__}.")
    return method
  return sampling.make_method(0.0 if temperature is None else temperature,
                              0 if top_k is None else top_k,
                              1.0 if top_p is None else top_p)


def check_settings(*, max_decode_length: Any, gamma: Any = None) -> None:
  """Checks γ (when given) and max_decode_length; raises ValueError."""
  if gamma is not None:
    _check_positive_int("gamma", gamma)
  _check_positive_int("max_decode_length", max_decode_length)


def check_vocab_sizes(target_vocab_size: int, draft_vocab_size: int) -> None:
  if draft_vocab_size != target_vocab_size:
    raise ValueError(
        f"draft vocab_size ({draft_vocab_size}) must equal the target's "
        f"vocab_size ({target_vocab_size}): speculative decoding compares "
        "their distributions token by token.")


# What `Target` asks for (protocols.Target).
_TARGET_MEMBERS = ("vocab_size", "start_token", "start", "length",
                   "decode_chunk", "truncate")


@functools.lru_cache(maxsize=None)
def _implements_target(cls: type) -> bool:
  """Whether instances of cls have Target's members (a Protocol isinstance
  costs ~0.1 ms: too much per decode call, so it is cached per class)."""
  return all(hasattr(cls, m) for m in _TARGET_MEMBERS)


def check_target(target: Any) -> None:
  """The target implements `Target` and is a pytree; raises ValueError."""
  # A class is hashable; mypy's Hashable protocol does not see type.__hash__.
  if (not _implements_target(type(target))  # type: ignore[arg-type]
      and not isinstance(target, Target)):
    missing = [m for m in _TARGET_MEMBERS if not hasattr(target, m)]
    raise ValueError(
        "target must implement specdec_jax.core.protocols.Target ("
        f"{', '.join(_TARGET_MEMBERS)}), e.g. a models.T5Model; got "
        f"{type(target).__name__}, missing {missing}.")
  check_pytree("target", target)


def as_drafter(drafter: Any) -> Drafter:
  """A `Drafter` as is; a model with the `Target` interface (e.g. a small
  `T5Model`) wrapped in `drafters.ModelDrafter`."""
  if not isinstance(drafter, Drafter) and isinstance(drafter, Target):
    return ModelDrafter(drafter)
  return drafter


def speculative_target(target: Any, drafter: Any) -> Any:
  """The target the speculative loop runs with `drafter`.

  `target.with_features()` when the drafter reads the target's hidden
  states (a feature-level draft, `Drafter.reads_target_features`), else
  `target` itself. The baseline always runs the plain target: the same
  weights and logits (bit for bit, `tests/core/test_feature_drafter.py`), without
  the features' cache, whose writes are the speculative loop's own cost.
  """
  reads = as_drafter(drafter).reads_target_features
  return target.with_features() if reads else target


def check_speculative_args(
    target: Any, drafter: Any, *, gamma: Any, max_decode_length: Any,
    method: Optional[sampling.SamplingMethod] = None,
    temperature: Optional[float] = None, top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    acceptance: Optional[AcceptanceRule] = None) -> sampling.SamplingMethod:
  """All model-level checks of `speculative_sample`; raises ValueError.

  Returns:
    The sampling method (`resolve_method`).
  """
  check_settings(gamma=gamma, max_decode_length=max_decode_length)
  method = resolve_method(method, temperature, top_k, top_p)
  check_target(target)
  if not isinstance(drafter, Drafter):
    raise ValueError(
        "drafter must be a specdec_jax.core.drafters.Drafter (e.g. "
        "ModelDrafter(small_model)) or a model with the Target interface, "
        f"got {type(drafter).__name__}.")
  check_pytree("drafter", drafter)
  check_vocab_sizes(target.vocab_size, drafter.vocab_size)
  if drafter.reads_target_features and (
      getattr(target, "features", None) is None or
      not getattr(target, "keep_features", True)):
    raise ValueError(
        f"drafter {type(drafter).__name__} reads the target's hidden states, "
        f"but target {type(target).__name__} does not keep them: pass "
        "`target.with_features()` (a T5Model) or a target with `features`.")
  if acceptance is not None:
    if not isinstance(acceptance, AcceptanceRule):
      raise ValueError("acceptance must be a decoding.AcceptanceRule (e.g. "
                       f"ExactAcceptance()), got {type(acceptance).__name__}.")
    check_pytree("acceptance", acceptance)
  return method
