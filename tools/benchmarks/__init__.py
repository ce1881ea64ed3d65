"""The benchmarks: each module with a `main` is a command,
`python -m tools.benchmarks.NAME` (docs/usage/running.md lists them; their
results are the pages of docs/results/).

`decode` is the decode benchmark (`decode_measure` what it measures,
`synthetic` its timing-only acceptance rule); `compare_with_t5x` times our
decoders against T5X's (`t5x_reference`, `t5x_pair`); `common` holds what
they share: models by size or gin file, checkpoints loaded for decoding,
sentences, medians of interleaved rounds, the host.
"""
