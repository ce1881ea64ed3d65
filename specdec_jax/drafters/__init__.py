"""Drafters: what proposes the γ guesses of each speculative iteration.

* `Drafter`: the protocol (`init`, `propose`, `rollback`; defined in
  `specdec_jax.protocols`); `NO_GUESS` marks the slots of a row that stopped guessing (a suffix).
* `ModelDrafter` (alias `T5Drafter`): a draft model with the target's
  interface (`decoding.Target`), e.g. a small `T5Model` — the paper's M_q;
  with `confidence_threshold`, adaptive γ (§3.5).
* `NGramDrafter` (`build_ngram_table`): unigram / bigram / order-n counts
  of a corpus, cost ~0 (§3.6).
* `PromptLookupDrafter`: copies from the encoder input, cost ~0 (§3.6).
* `HierarchicalDrafter`: M_q sped up by one of the two above (§5).

Deterministic drafters (prompt lookup, or any at temperature 0) return
`draft_probs=None` and need no [B, γ, V] arrays; see docs/extending.md
for a complete example.
"""
from specdec_jax.protocols import NO_GUESS
from specdec_jax.protocols import Drafter
from specdec_jax.drafters.model import ModelDrafter
from specdec_jax.drafters.model import ModelDrafterState
from specdec_jax.drafters.model import T5Drafter
from specdec_jax.drafters import guesses
from specdec_jax.drafters.ngram import NGramDrafter
from specdec_jax.drafters.ngram import NGramTable
from specdec_jax.drafters.ngram import build_ngram_table
from specdec_jax.drafters.prompt_lookup import PromptLookupDrafter
from specdec_jax.drafters.hierarchical import HierarchicalDrafter
from specdec_jax.drafters.hierarchical import HierarchicalState
from specdec_jax.drafters.feature import FeatureDrafter
from specdec_jax.drafters.feature import FeatureDrafterState

__all__ = [
    "Drafter", "FeatureDrafter", "FeatureDrafterState", "HierarchicalDrafter",
    "HierarchicalState", "ModelDrafter", "ModelDrafterState", "NGramDrafter",
    "NGramTable", "NO_GUESS", "PromptLookupDrafter", "T5Drafter",
    "build_ngram_table", "guesses"
]
