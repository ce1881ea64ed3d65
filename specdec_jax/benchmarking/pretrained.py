"""A trained checkpoint loaded for decoding, as the benchmarks use it.

`benchmarking.loop_overhead`, `tree`, `beam` and `scripts/iteration_hlo.py`
read checkpoints such as those in `pretrained/` outside `run` (no RunPlan,
no vocabulary checks).
"""
from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes


def load_for_decoding(path: str, gin_file: str) -> T5Model:
  """The model `gin_file` binds (a T5Config), with the latest checkpoint in
  `path` (or `path` itself), in the config's dtype, prepared for decoding
  (`T5Model.prepared_for_decoding`)."""
  config = gin_reader.read_t5_config(gin_file)
  ckpt = checkpoints.latest_checkpoint(path) or path
  params = checkpoints.load_t5x_params(ckpt,
                                       expected=param_shapes(config)["params"],
                                       dtype=config.dtype)
  return T5Model(config, {"params": params}).prepared_for_decoding()
