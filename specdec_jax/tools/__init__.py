"""Generators of the repository's derived files, each a command
(`python -m specdec_jax.tools.X`, or `python scripts/X.py`):
`generate_docs` (docs/usage/macros.md and outputs.md) and
`generate_model_gin` (gin/models/{target,draft}/ from gin/models/)."""
