"""T5X's own beams (../shared/fixtures/t5x_beam) and the models they were
computed with, for the beam search tests (tests/core/test_beam_search.py,
test_speculative_beam.py, tests/e2e/test_speculative_beam_e2e.py)."""
import json

import numpy as np

from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes

from conftest import REPO
from conftest import SHARED
from conftest import T5X_TINY
from conftest import require_shared

T5X_BEAM = SHARED / "fixtures" / "t5x_beam"
PRETRAINED = REPO / "pretrained" / "multi30k"


def load_reference() -> dict:
  require_shared(T5X_BEAM / "beam_reference.npz")
  return dict(np.load(T5X_BEAM / "beam_reference.npz"))


def load_tiny_target() -> T5Model:
  """The T5X-written tiny fixture model (parameters from its checkpoint)."""
  require_shared(T5X_TINY)
  config = T5Config(**json.loads((T5X_TINY / "config.json").read_text()))
  params = checkpoints.load_t5x_params(
      str(T5X_TINY / "legacy" / "checkpoint_0"),
      expected=param_shapes(config)["params"])
  return T5Model(config, {"params": params}).prepared_for_decoding()


def load_pretrained(name: str, gin_file: str) -> T5Model:
  """A model shipped in pretrained/multi30k, float32, prepared."""
  config = gin_reader.read_t5_config(gin_file)
  ckpt = checkpoints.latest_checkpoint(str(PRETRAINED / name))
  assert ckpt is not None, f"no checkpoint in {PRETRAINED / name}"
  params = checkpoints.load_t5x_params(ckpt,
                                       expected=param_shapes(config)["params"],
                                       dtype=config.dtype)
  return T5Model(config, {"params": params}).prepared_for_decoding()


def assert_same_beams(tokens, scores, ref_tokens, ref_scores, what):
  tokens, ref_tokens = np.asarray(tokens), np.asarray(ref_tokens)
  differ = np.nonzero(~np.all(tokens == ref_tokens, axis=(1, 2)))[0]
  assert differ.size == 0, (
      f"{what}: beams differ on sentences {differ.tolist()}; first: ours "
      f"{tokens[differ[0]].tolist()}, reference "
      f"{ref_tokens[differ[0]].tolist()}")
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-4,
                             err_msg=what)
