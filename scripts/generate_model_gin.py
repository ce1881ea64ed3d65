#!/usr/bin/env python
"""Writes the scoped model files gin/models/{target,draft}/X.gin from the
unscoped gin/models/X.gin.

The command of `specdec_jax.tools.generate_model_gin` (see its docstring):

  python scripts/generate_model_gin.py           # rewrites the scoped files
  python scripts/generate_model_gin.py --check   # exit 1 if one is stale
"""
import sys

from specdec_jax.tools import generate_model_gin

if __name__ == "__main__":
  sys.exit(generate_model_gin.main())
