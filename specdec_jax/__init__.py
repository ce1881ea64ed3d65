"""specdec_jax: exact speculative decoding for T5X-style models in JAX.

Two layers (docs/architecture.md): the core, `specdec_jax.core` (protocols,
sampling, acceptance, kernels, models, drafters, decoding: the library,
JAX/Flax/NumPy only), and the harness, everything else in this package (the
`run`, `sweep`, `report` and `train` commands and what they use). Each
module has one import path: `from specdec_jax.core import decoding`.
"""

__version__ = "0.1.0"
