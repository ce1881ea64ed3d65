"""`python -m specdec_jax.kernels [--force]`: compile the CPU matmul kernel."""
import sys

from specdec_jax.kernels import main

sys.exit(main())
