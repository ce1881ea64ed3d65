"""Speculative decoding (Leviathan et al., 2023, Algorithm 1) and its baseline.

One loop, four plug points:

1. a **target** (`Target`: `start`, `decode_chunk`, `truncate`,
   `vocab_size`; `models.T5Model` implements it),
2. a **drafter** (`Drafter`: `init`, `propose`, `rollback`; see
   `specdec_jax.core.drafters`, e.g. `ModelDrafter(small_t5)`),
3. a **sampling method** (`sampling.Greedy()`,
   `sampling.Sampling(temperature, top_k, top_p)`: frozen pytrees whose
   values are traced),
4. an **acceptance rule** (`ExactAcceptance()`, Algorithm 1; or
   `LenientAcceptance(l)`, Appendix A.5, not exact).

Entry points: `speculative_sample` and `temperature_sample` (checked at
every call, jitted); `speculative_decoder` / `baseline_decoder` check once
and return a function of the batch (a run's many batches);
`speculative_loop` / `temperature_loop` are the same loops unchecked and
unjitted, for composing inside one's own `jax.jit`.

Modules: `loops` (the loops and their jitted, checked entry points),
`checks` (the host-side argument checks), `outputs` (`DecodeOutput`,
`SpeculativeOutput`), `statistics` (the optional α̂ / β / histogram / trace
pytree), `block_acceptance` (blockwise verification), `tree_acceptance`
and `tree_loop` (k draft branches per target call:
`tree_speculative_sample`). The four protocols
live in `specdec_jax.core.protocols`, the acceptance rules in
`specdec_jax.core.acceptance`.
"""
from specdec_jax.core import sampling
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.acceptance import ExactAcceptance
from specdec_jax.core.acceptance import LenientAcceptance
from specdec_jax.core.protocols import Verdict
from specdec_jax.core.decoding.checks import as_drafter
from specdec_jax.core.decoding.checks import speculative_target
from specdec_jax.core.decoding.checks import check_encoder_inputs
from specdec_jax.core.decoding.checks import check_eos_id
from specdec_jax.core.decoding.checks import check_rng
from specdec_jax.core.decoding.checks import check_settings
from specdec_jax.core.decoding.checks import check_speculative_args
from specdec_jax.core.decoding.checks import check_target
from specdec_jax.core.decoding.checks import check_vocab_sizes
from specdec_jax.core.decoding.checks import resolve_method
from specdec_jax.core.decoding.decoders import Decoder
from specdec_jax.core.decoding.decoders import baseline_decoder
from specdec_jax.core.decoding.decoders import speculative_decoder
from specdec_jax.core.decoding.loops import EOS_ID
from specdec_jax.core.decoding.loops import SpeculativeState
from specdec_jax.core.decoding.loops import init_speculative_state
from specdec_jax.core.decoding.loops import speculative_iteration
from specdec_jax.core.decoding.loops import speculative_loop
from specdec_jax.core.decoding.loops import speculative_sample
from specdec_jax.core.decoding.loops import temperature_loop
from specdec_jax.core.decoding.loops import temperature_sample
from specdec_jax.core.decoding.outputs import DecodeOutput
from specdec_jax.core.decoding.tree_acceptance import TreeAcceptance
from specdec_jax.core.decoding.tree_acceptance import TreeVerdict
from specdec_jax.core.decoding.tree_loop import TreeOutput
from specdec_jax.core.decoding.tree_loop import tree_decoder
from specdec_jax.core.decoding.tree_loop import tree_loop
from specdec_jax.core.decoding.tree_loop import tree_speculative_sample
from specdec_jax.core.decoding.outputs import SpeculativeOutput
from specdec_jax.core.protocols import Target
from specdec_jax.core.protocols import check_pytree
from specdec_jax.core.decoding.statistics import NO_TOKEN
from specdec_jax.core.decoding.statistics import SpeculativeStatistics
from specdec_jax.core.drafters import NO_GUESS
from specdec_jax.core.drafters import Drafter
from specdec_jax.core.drafters import ModelDrafter

__all__ = [
    "AcceptanceRule",
    "DecodeOutput",
    "Decoder",
    "Drafter",
    "EOS_ID",
    "ExactAcceptance",
    "LenientAcceptance",
    "ModelDrafter",
    "NO_GUESS",
    "NO_TOKEN",
    "SpeculativeOutput",
    "SpeculativeState",
    "SpeculativeStatistics",
    "Target",
    "Verdict",
    "as_drafter",
    "baseline_decoder",
    "check_encoder_inputs",
    "check_eos_id",
    "check_pytree",
    "check_rng",
    "check_settings",
    "check_speculative_args",
    "check_target",
    "check_vocab_sizes",
    "speculative_target",
    "init_speculative_state",
    "resolve_method",
    "sampling",
    "speculative_decoder",
    "speculative_iteration",
    "speculative_loop",
    "speculative_sample",
    "temperature_loop",
    "temperature_sample",
    "TreeAcceptance",
    "TreeOutput",
    "TreeVerdict",
    "tree_decoder",
    "tree_loop",
    "tree_speculative_sample",
]
