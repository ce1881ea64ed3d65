"""One jitted program per loop family, with each backend's compiler options.

Every decode loop (the baseline, speculative, tree, beam and speculative
beam loops) is jitted the same way: its shape-setting arguments static
(γ, widths, lengths), everything else traced (models, drafters, acceptance
rules and sampling methods are pytrees: a new temperature, top-k, top-p or
lenience reuses the compiled program), and compiler options by backend:
XLA:CPU's of `specdec_jax.core.kernels` on the CPU, XLA:GPU's
(`kernels.gpu.GPU_LOOP_OPTIONS`: none until the device check measures a
set faster, `kernels.gpu.GPU_OPTION_SETS`) on a GPU, none elsewhere.
`LoopProgram` holds the jitted versions and picks one by backend;
`gpu_loop_options` swaps the XLA:GPU options for a measurement.
`LoopProgram.bound` fixes a decoder's models and settings once, so that a
call hands JAX one list of arrays (`tools.benchmarks.dispatch` measures
what that saves a call).
"""
import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import kernels
from specdec_jax.core.kernels import gpu

# The XLA:GPU options of every loop jitted while `gpu_loop_options` is in
# force; None: each program's own `gpu_options`.
_GPU_OPTIONS: contextvars.ContextVar[Optional[Dict[str, Any]]] = (
    contextvars.ContextVar("gpu_loop_options", default=None))


@contextlib.contextmanager
def gpu_loop_options(options: Mapping[str, Any]) -> Iterator[None]:
  """Every `LoopProgram` jitted inside compiles for a GPU with `options`
  (e.g. a set of `kernels.gpu.GPU_OPTION_SETS`) instead of its own
  `gpu_options`: the device check's main job under an option set. A
  decoder keeps the program it was built with; other backends' options
  are unchanged."""
  token = _GPU_OPTIONS.set(dict(options))
  try:
    yield
  finally:
    _GPU_OPTIONS.reset(token)


@dataclasses.dataclass(frozen=True, eq=False)
class LoopProgram:
  """A decode loop jitted for the default backend.

  Attributes:
    loop: the traceable loop function.
    static_argnames: its arguments that set shapes or control flow.
    cpu_options: XLA:CPU compiler options (`kernels.CPU_*_OPTIONS`), used
      only when the backend is the CPU.
    gpu_options: XLA:GPU compiler options, used only on a GPU (default
      `kernels.gpu.GPU_LOOP_OPTIONS`). Other backends compile with none.
  """
  loop: Callable[..., Any]
  static_argnames: Tuple[str, ...]
  cpu_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  gpu_options: Mapping[str, Any] = dataclasses.field(
      default_factory=lambda: dict(gpu.GPU_LOOP_OPTIONS))
  # {options: the loop jitted with them}; filled on first use.
  _jitted: Dict[Tuple[Tuple[str, Any], ...],
                Callable[..., Any]] = dataclasses.field(default_factory=dict,
                                                        init=False, repr=False)
  # {(options, tree structure, static settings): the loop jitted over one
  # list of leaves (`bound`)}; filled on first use.
  _bound: Dict[Tuple[Any, ...],
               Callable[..., Any]] = dataclasses.field(default_factory=dict,
                                                       init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "static_argnames", tuple(self.static_argnames))

  def options(self, backend: Optional[str] = None,
              target: Any = None) -> Dict[str, Any]:
    """The compiler options the loop gets on `backend` (default: JAX's)
    decoding with `target` (its first argument)."""
    backend = jax.default_backend() if backend is None else backend
    swapped = _GPU_OPTIONS.get()
    by_backend = {
        "cpu": self.cpu_options,
        "gpu": self.gpu_options if swapped is None else swapped
    }
    options = dict(by_backend.get(backend, {}))
    if backend == "cpu" and getattr(target, "interpreted_kernels", False):
      # Pallas' interpreter writes each kernel program's blocks into whole
      # arrays carried by a loop; XLA:CPU's default copy insertion copies
      # them once per program, quadratic in the batch (the device check's
      # 8,192-row baseline: 27 s, not 0.3 s). Region analysis copies none.
      options.update(kernels.CPU_IN_PLACE_COMPILER_OPTIONS)
    return options

  def jitted(self, backend: Optional[str] = None,
             target: Any = None) -> Callable[..., Any]:
    """The loop jitted with the options for `backend` and `target`."""
    options = self.options(backend, target)
    key = tuple(sorted(options.items()))
    if key not in self._jitted:
      self._jitted[key] = jax.jit(self.loop,
                                  static_argnames=self.static_argnames,
                                  compiler_options=options or None)
    return self._jitted[key]

  def __call__(self, target, *args, **kwargs):
    return self.jitted(target=target)(target, *args, **kwargs)

  def bound(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """The loop with its leading arguments `args` (the target first: its
    options as `jitted`'s) and keyword arguments `kwargs` fixed now:
    call(*rest) = jitted(*args, *rest, **kwargs).

    A decoder's models, drafter, method and rule are fixed batch after
    batch; here their leaves are flattened once, and a call hands JAX one
    list of arrays instead of the models' nodes (whose flattening runs
    Python per node: the shipped pair's calls returned 1.3 ms sooner on a
    2-vCPU host, `tools.benchmarks.dispatch`). Static settings
    (`static_argnames`) are fixed in the program. Bindings of one tree
    structure and settings share one jitted program (new weights or a new
    temperature: no compile).
    """
    static = {k: v for k, v in kwargs.items() if k in self.static_argnames}
    traced = {k: v for k, v in kwargs.items() if k not in static}
    leaves, treedef = jax.tree_util.tree_flatten((args, traced))
    options = self.options(target=args[0] if args else None)
    key = (tuple(sorted(options.items())), treedef,
           tuple(sorted(static.items())))
    if key not in self._bound:
      self._bound[key] = jax.jit(_unflattening(self.loop, treedef, static),
                                 compiler_options=options or None)
    return functools.partial(self._bound[key], leaves)


def _unflattening(loop: Callable[..., Any], treedef: Any,
                  static: Dict[str, Any]) -> Callable[..., Any]:
  """call(leaves, *rest): `loop` with the bound arguments rebuilt from
  their `leaves` (`LoopProgram.bound`), then `rest`; named as `loop`, so
  that its program, dumps and profiles keep the loop's name."""

  def call(leaves: list, *rest: Any) -> Any:
    args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
    return loop(*args, *rest, **kwargs, **static)

  call.__name__ = call.__qualname__ = getattr(loop, "__name__", "loop")
  return call


def token_batch(encoder_input_tokens: Any) -> Any:
  """A batch of token ids as a decoder hands it to its program: int32; a
  host array stays on the host (JAX's call copies it over, without
  `jnp.asarray`'s Python on the way)."""
  if isinstance(encoder_input_tokens, jax.Array):
    return encoder_input_tokens.astype(jnp.int32)
  return np.asarray(encoder_input_tokens, np.int32)
