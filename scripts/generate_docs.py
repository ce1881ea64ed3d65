#!/usr/bin/env python
"""Writes the generated pages of docs/usage from their single sources.

The command of `specdec_jax.tools.generate_docs` (see its docstring;
`--help` lists the flags):

  python scripts/generate_docs.py                # into docs/usage
  python scripts/generate_docs.py --out /tmp/d   # elsewhere
"""
import sys

from specdec_jax.tools import generate_docs

if __name__ == "__main__":
  sys.exit(generate_docs.main())
