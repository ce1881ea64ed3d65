"""Drafters: what proposes the γ guesses of each speculative iteration.

* `Drafter`: the protocol (`init`, `propose`, `rollback`; defined in
  `specdec_jax.core.protocols`); `NO_GUESS` marks the slots of a row that stopped guessing (a suffix).
* `ModelDrafter`: a draft model with the target's
  interface (`decoding.Target`), e.g. a small `T5Model` — the paper's M_q;
  with `confidence_threshold`, adaptive γ (§3.5).
* `NGramDrafter` (`build_ngram_table`): unigram / bigram / order-n counts
  of a corpus, cost ~0 (§3.6).
* `PromptLookupDrafter`: copies from the encoder input, cost ~0 (§3.6).
* `HierarchicalDrafter`: M_q sped up by one of the two above (§5).
* `TreeModelDrafter` (`as_tree_drafter`): a `ModelDrafter` that also
  proposes k branches per row, for tree verification.
* `FeatureDrafter`: a feature-level (EAGLE-style) draft reading the
  target's hidden states; `FeatureTreeDrafter`, its top-k branches.

Deterministic drafters (prompt lookup, or any at temperature 0) return
`draft_probs=None` and need no [B, γ, V] arrays; see docs/extending.md
for a complete example.
"""
from specdec_jax.core.protocols import NO_GUESS
from specdec_jax.core.protocols import Drafter
from specdec_jax.core.drafters.model import ModelDrafter
from specdec_jax.core.drafters.model import ModelDrafterState
from specdec_jax.core.drafters import guesses
from specdec_jax.core.drafters.ngram import NGramDrafter
from specdec_jax.core.drafters.ngram import NGramTable
from specdec_jax.core.drafters.ngram import build_ngram_table
from specdec_jax.core.drafters.prompt_lookup import PromptLookupDrafter
from specdec_jax.core.drafters.hierarchical import HierarchicalDrafter
from specdec_jax.core.drafters.hierarchical import HierarchicalState
from specdec_jax.core.drafters.feature import FeatureDrafter
from specdec_jax.core.drafters.feature import FeatureDrafterState
from specdec_jax.core.drafters.feature_tree import FeatureTreeDrafter
from specdec_jax.core.drafters.tree import TreeDraftState
from specdec_jax.core.drafters.tree import TreeModelDrafter
from specdec_jax.core.drafters.tree import as_tree_drafter

__all__ = [
    "Drafter", "FeatureDrafter", "FeatureDrafterState", "FeatureTreeDrafter",
    "HierarchicalDrafter", "HierarchicalState", "ModelDrafter",
    "ModelDrafterState", "NGramDrafter", "NGramTable", "NO_GUESS",
    "PromptLookupDrafter", "TreeDraftState", "TreeModelDrafter",
    "as_tree_drafter", "build_ngram_table", "guesses"
]
