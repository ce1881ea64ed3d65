"""TARGET_DECODE_PATH / DRAFT_DECODE_PATH: each model's decode path chosen
in gin (before them every model took the backend's and nothing in `run`
could change it).

* A bad value stops the run before any model is loaded, in one line naming
  the macro, the value and what is allowed: an unknown name, a path the
  model's config cannot take here, a one-device path with a mesh of
  several devices or COMPILE_TOPOLOGY, a draft path for a drafter that
  decodes no T5 draft.
* The loader prepares each model for its path; models kept from an
  earlier sweep point are moved to this point's paths.
* metrics.json's `decode_paths`; the settings record (OVERWRITE) and the
  'auto' price cache tell a chosen path apart.

A run on a chosen path, end to end: tests/e2e/test_decode_paths_e2e.py.
"""
import types

import gin
import jax
import pytest

from specdec_jax import run as run_lib
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import decode_paths
from specdec_jax.core.models import init_params
from specdec_jax.experiment import arguments
from specdec_jax.experiment import loading
from specdec_jax.experiment import plan as plan_lib
from specdec_jax.experiment import price_cache
from specdec_jax.metrics import step_costs

from conftest import tiny_config
from run_helpers import parse_local_tiny

pytestmark = pytest.mark.usefixtures("clean_gin")


def _run_error(tmp_path, no_load, *bindings) -> str:
  """`run`'s ConfigError for local_tiny.gin with `bindings`: nothing loaded
  (`no_load`), nothing written."""
  out = tmp_path / "out"
  gin.clear_config()
  parse_local_tiny([f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  assert not out.exists()
  return str(e.value).splitlines()[0]


@pytest.mark.parametrize(
    "bindings,expect",
    [
        (["TARGET_DECODE_PATH = 'cuda'"], [
            "TARGET_DECODE_PATH='cuda': allowed: xla, cpu_kernel, packed, fused "
            "(None: the backend's)."
        ]),
        (["DRAFT_DECODE_PATH = 'Packed'"], [
            "DRAFT_DECODE_PATH='Packed': allowed: "
            "xla, cpu_kernel, packed, fused"
        ]),
        (["DRAFT_DECODE_PATH = 1"], [
            "DRAFT_DECODE_PATH=1 (run.draft_decode_path): allowed: None or a "
            "string"
        ]),
        # The CPU kernel multiplies float32 only (`DecodePath.unavailable`).
        ([
            "DRAFT_DECODE_PATH = 'cpu_kernel'",
            "draft/T5Config.dtype = 'bfloat16'"
        ], [
            "DRAFT_DECODE_PATH='cpu_kernel': needs float32 weights",
            "dtype=bfloat16", "allowed here: None (the backend's) or 'xla', "
            "'packed', 'fused'."
        ]),
        # The GPU kernels take a power-of-2 head width.
        (["TARGET_DECODE_PATH = 'fused'", "target/T5Config.head_dim = 12"], [
            "TARGET_DECODE_PATH='fused': head_dim=12 is not a power of 2",
            "allowed here: None (the backend's) or 'xla'"
        ]),
        (["TARGET_DECODE_PATH = 'packed'", "MESH_SHAPE = (1, 2)"], [
            "TARGET_DECODE_PATH='packed' with MESH_SHAPE=(1, 2): 'packed' decodes "
            "on one device", "allowed with a mesh of 2 devices: None or 'xla'."
        ]),
        (["DRAFT_DECODE_PATH = 'cpu_kernel'", "MESH_SHAPE = (2, 1)"
         ], ["DRAFT_DECODE_PATH='cpu_kernel' with MESH_SHAPE=(2, 1)"]),
        (["DRAFT_DECODE_PATH = 'fused'", "COMPILE_TOPOLOGY = 'v4-8'"], [
            "DRAFT_DECODE_PATH='fused' with COMPILE_TOPOLOGY='v4-8'",
            "allowed: None or 'xla'."
        ]),
        (["DRAFT_DECODE_PATH = 'xla'", "DRAFTER = 'prompt_lookup'"], [
            "DRAFT_DECODE_PATH='xla' with DRAFTER='prompt_lookup': that drafter "
            "decodes no T5 draft model; allowed: DRAFT_DECODE_PATH=None, or "
            "DRAFTER='model', 'hierarchical', 'shared_encoder'."
        ]),
        (["DRAFT_DECODE_PATH = 'packed'", "DRAFTER = 'feature'"
         ], ["DRAFT_DECODE_PATH='packed' with DRAFTER='feature'"]),
        # Tiles: a preset's name, for a model set on 'fused'.
        (["TARGET_DECODE_PATH = 'fused'", "TARGET_TILES = 'huge'"], [
            "TARGET_TILES='huge': allowed: None (the kernels' own) or "
            "default, wide"
        ]),
        (["DRAFT_TILES = 'mma_split'"], [
            "DRAFT_TILES='mma_split' with DRAFT_DECODE_PATH=None: tiles are the "
            "'fused' path's GPU kernels'; allowed: DRAFT_TILES=None, or "
            "DRAFT_DECODE_PATH='fused'."
        ]),
        (["TARGET_DECODE_PATH = 'packed'", "TARGET_TILES = 'mma_split'"
         ], ["TARGET_TILES='mma_split' with TARGET_DECODE_PATH='packed'"]),
    ])
def test_bad_decode_paths_stop_the_run_before_loading(bindings, expect,
                                                      tmp_path, no_load):
  message = _run_error(tmp_path, no_load, *bindings)
  for text in expect:
    assert text in message, (text, message)


def test_xla_shards_and_none_is_the_backends(tmp_path):
  """'xla' is allowed with a mesh of several devices (the mesh itself is
  checked when built); None is every path's default."""
  parse_local_tiny([f"OUTPUT_DIR = '{tmp_path}'", "MESH_SHAPE = (1, 2)"])
  args = arguments.run_arguments({"target_decode_path": "xla"})
  assert args.chosen_decode_paths() == {"TARGET_DECODE_PATH": "xla"}
  assert arguments.run_arguments().chosen_decode_paths() == {}


def test_macros_page_names_every_decode_path():
  """The docstring macros.md is made of lists the registry's paths: a new
  path in `decode_paths.PATHS` fails this until it is documented."""
  doc = arguments.RunArguments.__doc__.split("target_decode_path:")[1]
  doc = doc.split("draft_decode_path:")[0]
  for name in decode_paths.DECODE_PATHS:
    assert f"'{name}'" in doc, name


def test_the_loader_prepares_each_model_for_its_path(tmp_path):
  parse_local_tiny([
      f"OUTPUT_DIR = '{tmp_path}'", "NUM_EXAMPLES = 2",
      "DRAFT_DECODE_PATH = 'packed'"
  ])
  plan = plan_lib.RunPlan.build(arguments.run_arguments())
  models = plan.load_models()
  default = decode_paths.default_path(plan.target_config)
  assert models.target.decode_path == default
  assert models.draft.decode_path == "packed" and models.draft.is_packed
  assert loading.decode_paths_record(models.target, models.draft) == {
      "target": default,
      "draft": "packed"
  }
  # The next sweep point (same models, other paths): moved, not reloaded.
  later = plan.at(target_decode_path="xla", draft_decode_path=None)
  kept = later.load_models(models)
  assert kept.target.decode_path == "xla" and not kept.target.is_packed
  assert kept.draft.decode_path == decode_paths.default_path(plan.draft_config)
  assert kept.target.params is models.target.params
  assert kept.draft.params is models.draft.params
  # A point on the same paths keeps the very models.
  again = later.load_models(kept)
  assert again.target is kept.target and again.draft is kept.draft


def test_the_loader_puts_each_model_under_its_tiles(tmp_path):
  """TARGET_TILES / DRAFT_TILES: each model carries its preset
  (`T5Model.with_tiles`); a later sweep point's own (None: the kernels'
  own), and the same tiles keep the very models."""
  presets = gpu_tiles.TILE_PRESETS
  parse_local_tiny([
      f"OUTPUT_DIR = '{tmp_path}'", "NUM_EXAMPLES = 2",
      "TARGET_DECODE_PATH = 'fused'", "DRAFT_DECODE_PATH = 'fused'",
      "TARGET_TILES = 'mma_split'",
      "DRAFT_TILES = 'tall_mma_persistent_prefetch'"
  ])
  plan = plan_lib.RunPlan.build(arguments.run_arguments())
  models = plan.load_models()
  assert models.target.tiles == presets["mma_split"]
  assert models.draft.tiles == presets["tall_mma_persistent_prefetch"]
  assert plan.settings["run"]["draft_tiles"] == "tall_mma_persistent_prefetch"
  later = plan.at(target_tiles=None, draft_tiles="mma_split")
  kept = later.load_models(models)
  assert kept.target.tiles is None
  assert kept.draft.tiles == presets["mma_split"]
  assert kept.target.params is models.target.params
  assert later.load_models(kept).draft is kept.draft
  # A shared-encoder draft's tiles are its decoder's.
  config = tiny_config(vocab_size=32)
  decoder_config = tiny_config(vocab_size=32, num_encoder_layers=0,
                               encoder_width=config.emb_dim)
  draft = SharedEncoderModel.pair(
      T5Model(config, init_params(config, jax.random.PRNGKey(0))),
      T5Model(decoder_config, init_params(decoder_config,
                                          jax.random.PRNGKey(1))))
  tiled = loading.with_tiles(draft, "mma_split")
  assert tiled.decoder.tiles == tiled.tiles == presets["mma_split"]
  assert loading.with_tiles(tiled, "mma_split") is tiled
  assert tiled.with_tiles(presets["mma_split"]) is tiled
  assert tiled.with_tiles(None).decoder.tiles is None


def test_a_shared_encoder_draft_moves_with_its_target():
  config = tiny_config(vocab_size=32)
  decoder_config = tiny_config(vocab_size=32, num_encoder_layers=0,
                               encoder_width=config.emb_dim)
  target = T5Model(config, init_params(config, jax.random.PRNGKey(0)))
  decoder = T5Model(decoder_config,
                    init_params(decoder_config, jax.random.PRNGKey(1)))
  draft = SharedEncoderModel.pair(target, decoder)
  paths = types.SimpleNamespace(target_decode_path="packed",
                                draft_decode_path="xla", target_tiles=None,
                                draft_tiles=None)
  moved = loading.on_decode_paths(target, draft, paths)
  assert moved["target"].decode_path == "packed"
  # The draft reads the moved target's encoder; its decoder stays on 'xla'.
  assert moved["draft"].encoder is moved["target"]
  assert moved["draft"].decoder is decoder
  assert loading.decode_paths_record(moved["target"], moved["draft"]) == {
      "target": "packed",
      "draft": "xla"
  }
  # No T5 draft (n-grams, prompt lookup, a feature draft): null.
  assert loading.decode_paths_record(target, None) == {
      "target": "xla",
      "draft": None
  }
  assert loading.decode_paths_record(target, object())["draft"] is None


def test_a_chosen_path_is_a_setting_and_another_price(tmp_path):
  """The OVERWRITE rule tells a run on a chosen path from the backend's
  (whose record is as before the macros existed), and so does the 'auto'
  price cache: prices measured on one path are not another's."""
  parse_local_tiny([f"OUTPUT_DIR = '{tmp_path}'"])
  default = arguments.run_arguments()
  chosen = arguments.run_arguments({
      "target_decode_path": "fused",
      "draft_decode_path": "packed",
      "target_tiles": "mma_split"
  })
  plans = [plan_lib.RunPlan.build(a) for a in (default, chosen)]
  run_default, run_chosen = (p.settings["run"] for p in plans)
  assert "target_decode_path" not in run_default
  assert "draft_decode_path" not in run_default
  assert run_chosen["target_decode_path"] == "fused"
  assert run_chosen["draft_decode_path"] == "packed"
  assert run_chosen["target_tiles"] == "mma_split"
  assert "target_tiles" not in run_default

  feed = types.SimpleNamespace(batch_width=lambda index: 16)
  loaded = [
      types.SimpleNamespace(
          args=p.args, settings=p.settings,
          providers=types.SimpleNamespace(pricing=step_costs.PRICING))
      for p in plans
  ]
  fields = [price_cache.price_fields(l, feed, (1, 5), None) for l in loaded]
  assert "TARGET_DECODE_PATH" not in fields[0]["pair"]  # old entries still hit
  assert fields[1]["pair"]["DRAFT_DECODE_PATH"] == "packed"
  assert price_cache.path(fields[0]) != price_cache.path(fields[1])
  target_fields = [
      price_cache.target_price_fields(l, f) for l, f in zip(loaded, fields)
  ]
  assert target_fields[1]["TARGET_DECODE_PATH"] == "fused"
  assert target_fields[1]["TARGET_TILES"] == "mma_split"
  assert "TARGET_TILES" not in target_fields[0]
  assert "DRAFT_DECODE_PATH" not in target_fields[1]
  assert "TARGET_DECODE_PATH" not in target_fields[0]
