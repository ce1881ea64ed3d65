"""`python -m tools.device_check`: see `tools.device_check`."""
import sys

from tools.device_check import cli

if __name__ == "__main__":
  sys.exit(cli.main())
