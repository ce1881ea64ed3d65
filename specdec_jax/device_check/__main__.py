"""`python -m specdec_jax.device_check`: see `specdec_jax.device_check`."""
import sys

from specdec_jax.device_check import cli

if __name__ == "__main__":
  sys.exit(cli.main())
