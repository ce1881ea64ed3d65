"""Models: a T5 v1.1 encoder-decoder in T5X's parameter layout."""
from specdec_jax.models.config import T5Config
from specdec_jax.models.t5 import DecodeCache
from specdec_jax.models.t5 import EncoderOutput
from specdec_jax.models.t5 import init_params
from specdec_jax.models.t5 import param_shapes
from specdec_jax.models.t5 import SharedEncoderModel
from specdec_jax.models.t5 import T5Model
from specdec_jax.models.t5 import Transformer
from specdec_jax.models.t5 import traced_overflow_checks

__all__ = ["T5Config", "DecodeCache", "EncoderOutput", "SharedEncoderModel",
           "T5Model", "Transformer", "init_params", "param_shapes",
           "traced_overflow_checks"]
