"""`python -m specdec_jax.core.kernels [--force]`: compile the CPU matmul kernel."""
import sys

from specdec_jax.core.kernels import main

sys.exit(main())
