"""Drafters: what proposes the γ guesses of each speculative iteration.

* `Drafter`: the protocol (`init`, `propose`, `rollback`).
* `ModelDrafter` (alias `T5Drafter`): a draft model with the target's
  interface (`decoding.Target`), e.g. a small `T5Model` — the paper's M_q.

Deterministic drafters (n-gram tables, copying from the input) return
`draft_probs=None` and need no [B, γ, V] arrays; see the README's
"Extending" section for a complete example.
"""
from specdec_jax.drafters.base import Drafter
from specdec_jax.drafters.model import ModelDrafter
from specdec_jax.drafters.model import ModelDrafterState
from specdec_jax.drafters.model import T5Drafter

__all__ = ["Drafter", "ModelDrafter", "ModelDrafterState", "T5Drafter"]
