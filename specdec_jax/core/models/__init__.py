"""Models: a T5 v1.1 encoder-decoder in T5X's parameter layout.

`config` (T5Config) -> `layers` (T5X's building blocks) -> `attention` ->
`network` (the stacks, `Transformer`, `DecodeCache`) -> `t5` (`T5Model`, a
`Transformer` bound to its parameters as the decoders use it) ->
`shared_encoder` (a draft decoder reading its target's encoder);
`feature_drafter` (an EAGLE-style draft reading its target's hidden states).
"""
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.feature_drafter import FeatureDraftModel
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig
from specdec_jax.core.models.network import DecodeCache
from specdec_jax.core.models.network import init_params
from specdec_jax.core.models.network import param_shapes
from specdec_jax.core.models.network import Transformer
from specdec_jax.core.models.shared_encoder import SharedEncoderModel
from specdec_jax.core.models.t5 import EncoderOutput
from specdec_jax.core.models.t5 import T5Model
from specdec_jax.core.models.t5 import traced_overflow_checks

__all__ = [
    "T5Config", "DecodeCache", "EncoderOutput", "FeatureDraftModel",
    "FeatureDrafterConfig", "SharedEncoderModel", "T5Model", "Transformer",
    "init_params", "param_shapes", "traced_overflow_checks"
]
