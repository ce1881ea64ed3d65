"""The core library: speculative decoding for any model behind four
protocols (docs/architecture.md). Imports JAX, Flax, NumPy, the standard
library and itself, never the harness around it (`tests/project/test_architecture.py`).

* `protocols`: `Target`, `Drafter`, `SamplingMethod`, `AcceptanceRule`.
* `sampling`, `acceptance`: sampling methods and acceptance rules.
* `kernels`: the XLA:CPU packed matmul.
* `models`: T5 (T5X's layout), a `Target`.
* `drafters`: what guesses.
* `decoding`: the loops.
"""
