"""specdec_jax: exact speculative decoding for T5X-style models in JAX.

Two layers (docs/architecture.md): the core, `specdec_jax.core` (protocols,
sampling, acceptance, kernels, models, drafters, decoding: the library,
JAX/Flax/NumPy only), and the harness, everything else in this package (the
`run`, `sweep`, `report` and `train` commands and what they use).

The core's public paths are also reachable without `.core`: `from
specdec_jax import decoding` and `from specdec_jax.models import T5Config`
name the same modules as `specdec_jax.core.decoding` and
`specdec_jax.core.models` (an import alias, `_CoreAlias`), so code written
against the paths the README shows keeps working.
"""
import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

CORE_UNITS = ("protocols", "sampling", "acceptance", "kernels", "models",
              "drafters", "decoding")


class _CoreAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports `specdec_jax.<unit>[...]` as the module `specdec_jax.core.<unit>
  [...]` itself (one module object under both names)."""

  def find_spec(self, fullname, path=None, target=None):
    parts = fullname.split(".")
    if len(parts) < 2 or parts[0] != __name__ or parts[1] not in CORE_UNITS:
      return None
    real = ".".join([__name__, "core", *parts[1:]])
    if parts[-1] == "__main__":  # `python -m specdec_jax.kernels`: runpy
      # runs the file's code under this name.
      return importlib.util.spec_from_file_location(
          fullname,
          importlib.util.find_spec(real).origin)
    real_spec = importlib.util.find_spec(real)
    if real_spec is None:
      return None
    spec = importlib.util.spec_from_loader(
        fullname, self, is_package=real_spec.submodule_search_locations
        is not None)
    if spec.submodule_search_locations is not None:
      spec.submodule_search_locations = real_spec.submodule_search_locations
    return spec

  def create_module(self, spec):
    real = spec.name.replace(f"{__name__}.", f"{__name__}.core.", 1)
    module = importlib.import_module(real)
    self._spec = module.__spec__  # restored below: the import sets it
    return module

  def exec_module(self, module):
    module.__spec__ = self._spec


if not any(isinstance(f, _CoreAlias) for f in sys.meta_path):
  sys.meta_path.insert(0, _CoreAlias())


def __getattr__(name):  # `import specdec_jax; specdec_jax.decoding`
  if name in CORE_UNITS:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
