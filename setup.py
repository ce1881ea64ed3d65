"""specdec_jax: exact speculative decoding for T5X-style encoder-decoder models in JAX."""
import setuptools

setuptools.setup(
    name="specdec_jax",
    version="0.1.0",
    description=(
        "Speculative decoding (Leviathan, Kalman & Matias, ICML 2023) for "
        "T5 v1.1 encoder-decoder models in JAX/Flax, T5X-compatible."
    ),
    packages=setuptools.find_packages(include=["specdec_jax", "specdec_jax.*"]),
    # The CPU matmul kernel's source, compiled on the user's machine by
    # `python -m specdec_jax.kernels` (or at first use).
    package_data={"specdec_jax.kernels": ["*.cc"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.4.30",
        "flax>=0.8",
        "optax",
        "orbax-checkpoint",
        "tensorstore",
        "msgpack",
        "seqio",
        "tensorflow-datasets",
        "sentencepiece",
        "absl-py",
        "gin-config",
        "numpy",
        "scipy",
        "sacrebleu",
        "rouge-score",
        "matplotlib",
        "pyyaml",
    ],
    # gcp-storage-emulator: a local GCS server for the gs:// tests.
    # tpu: libtpu, for Cloud TPUs and for compiling for one without it
    # (COMPILE_TOPOLOGY). Unpinned on purpose: pip keeps the installed jax
    # and adds the libtpu that this jax version's own `tpu` extra names.
    extras_require={"test": ["pytest", "gcp-storage-emulator"],
                    "tpu": ["jax[tpu]"]},
)
