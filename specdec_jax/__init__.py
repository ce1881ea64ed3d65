"""specdec_jax: exact speculative decoding for T5X-style models in JAX."""
__version__ = "0.1.0"
