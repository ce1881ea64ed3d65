"""What a run is set up from: the model configs (gin scopes 'target' and
'draft'), the shared vocabulary (gin's `vocabulary.*`), and the models
(a T5X checkpoint, or random weights), sharded over the run's mesh.
"""
import dataclasses
import functools
import os
from typing import Any, Dict, Optional

from absl import logging
import gin
import jax

from specdec_jax.config import flag_utils
from specdec_jax import checkpoints
from specdec_jax.terminal import console
from specdec_jax.files import io_utils
from specdec_jax.multihost import partitioning
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.experiment import drafter_registry
from specdec_jax.checkpoints import digests
from specdec_jax.checkpoints import sizes
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Model
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import decode_paths
from specdec_jax.core.models import param_shapes

ConfigError = flag_utils.ConfigError


def resolve(path: Optional[str]) -> Optional[str]:
  """A data path from a gin file, resolved as `io_utils.resolve_path` does
  (None and '' stay as they are: "not set")."""
  return io_utils.resolve_path(path) if path else path


def model_config(scope: str) -> T5Config:
  """The T5Config bound under a gin scope ('target' or 'draft')."""
  with gin.config_scope(scope):
    return T5Config()  # pylint: disable=no-value-for-parameter


@gin.configurable
def vocabulary(spm_model_path: Optional[str] = vocab_lib.DEFAULT_SPM_PATH,
               extra_ids: int = vocab_lib.DEFAULT_EXTRA_IDS,
               byte_level: bool = False):
  """The shared vocabulary: a SentencePiece model (read now, once per path
  and extra_ids: a bad file fails at start-up), or bytes.

  Args:
    spm_model_path: the SentencePiece model both models share (local or
      gs://; default T5's cc_all.32000).
    extra_ids: sentinel ids appended to the model's pieces (T5: 100).
    byte_level: bytes instead of a SentencePiece model (no file).
  """
  if not isinstance(byte_level, bool):
    raise ConfigError(f"vocabulary.byte_level={byte_level!r}: allowed: True "
                      "or False.")
  if byte_level:
    return _load_vocabulary(None, 0, True)
  if not drafter_registry.is_int(extra_ids) or extra_ids < 0:
    raise ConfigError(f"EXTRA_IDS={extra_ids!r}: allowed: an integer >= 0 "
                      "(T5: 100).")
  if spm_model_path is not None and not isinstance(spm_model_path, str):
    raise ConfigError(f"SPM_MODEL_PATH={spm_model_path!r}: allowed: the path "
                      "of a SentencePiece .model file (a string), got "
                      f"{type(spm_model_path).__name__}.")
  if not spm_model_path:
    raise ConfigError(f"SPM_MODEL_PATH={spm_model_path!r}: give the path of "
                      "a SentencePiece .model file (or bind "
                      "vocabulary.byte_level = True).")
  path = resolve(spm_model_path)
  if not io_utils.is_url(path) and not os.path.exists(path):
    raise ConfigError(
        f"SPM_MODEL_PATH={spm_model_path!r} does not exist "
        f"(looked for {path}){trained_here_hint(spm_model_path)}.")
  return _load_vocabulary(path, extra_ids, False)


def trained_here_hint(path: str) -> str:
  """For a missing path under outputs/ (where `train` writes): where it
  comes from, and the shipped pairs that need no training ('' for any
  other path)."""
  if not os.path.normpath(path).startswith("outputs"):
    return ""
  return ("; outputs/ holds models trained on this machine by `python -m "
          "specdec_jax.train` (docs/usage/running.md, \"train\"). The shipped "
          "pairs in pretrained/multi30k/ need no training: "
          "--gin_file=pretrained_multi30k.gin (the README's main job), or on "
          "Multi30k's test set multi30k_38m_1m.gin / "
          "multi30k_38m_1m_distill.gin")


@functools.lru_cache(maxsize=None)
def _load_vocabulary(spm_model_path, extra_ids, byte_level):
  if byte_level:
    console.import_tensorflow_quietly()
    import seqio  # pylint: disable=g-import-not-at-top
    return seqio.ByteVocabulary()
  try:
    return vocab_lib.load_vocabulary(spm_model_path, extra_ids)
  except ValueError as e:
    raise ConfigError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class Names:
  """How the vocabulary checks name what the user chose: gin's macros for
  `run`, `pairs.load_pair`'s arguments (`{role}`: 'target' or 'draft',
  `{ROLE}` in capitals; None: no such setting)."""
  vocabulary: str = "SPM_MODEL_PATH"
  extra_ids: Optional[str] = "EXTRA_IDS"
  vocab_size: str = "{role}/T5Config.vocab_size"
  checkpoint: str = "{ROLE}_CHECKPOINT_PATH"
  size_mismatch: Optional[str] = (
      "bind check_vocabulary_fits.allow_size_mismatch = True")

  def of(self, name: str, role: str) -> str:
    """Field `name`, for `role`."""
    return getattr(self, name).format(role=role, ROLE=role.upper())


RUN_NAMES = Names()


def describe_vocabulary(vocab, names: Names = RUN_NAMES) -> str:
  """How the user chose `vocab` (for messages)."""
  path = getattr(vocab, "sentencepiece_model_file", None)
  if path is None:
    return f"{type(vocab).__name__} (vocabulary.byte_level = True)"
  extra = (f" with {names.extra_ids}={getattr(vocab, 'extra_ids', '?')}"
           if names.extra_ids else "")
  return f"{names.vocabulary}={path!r}{extra}"


# T5X pads a model's vocab_size up to a multiple of this (32100 ids ->
# 32128 rows): the unused rows are never produced by training.
VOCAB_PADDING = 128


@gin.configurable(denylist=["vocab", "target_config", "draft_config"])
def check_vocabulary_fits(vocab, target_config: T5Config,
                          draft_config: T5Config,
                          allow_size_mismatch: bool = False) -> None:
  """`vocabulary_fits` as a run asks it (gin binds `allow_size_mismatch`)."""
  vocabulary_fits(vocab, target_config, draft_config, allow_size_mismatch)


def vocabulary_fits(vocab, target_config: T5Config, draft_config: T5Config,
                    allow_size_mismatch: bool = False,
                    names: Names = RUN_NAMES) -> None:
  """Every id of `vocab` must be a row of both models' embedding tables (a
  larger id would be clamped by the lookup: garbage), and the models must
  have no more rows than the vocabulary padded to T5X's multiple of 128
  (trained with another vocabulary), unless `allow_size_mismatch`;
  ConfigError naming the vocabulary and the vocab_size."""
  size = int(vocab.vocab_size)
  padded = -(-size // VOCAB_PADDING) * VOCAB_PADDING
  words = describe_vocabulary(vocab, names)
  extra = f"(and {names.extra_ids}) " if names.extra_ids else ""
  deliberate = (f"; or {names.size_mismatch} if this is deliberate"
                if names.size_mismatch else "")
  for role, config in (("target", target_config), ("draft", draft_config)):
    vocab_size = names.of("vocab_size", role)
    if size > config.vocab_size:
      raise ConfigError(
          f"the vocabulary has {size} ids ({words}) but {vocab_size} = "
          f"{config.vocab_size}: larger ids would decode to garbage. Allowed: "
          f"a vocabulary of at most {config.vocab_size} ids, or {vocab_size} "
          f">= {size}.")
    if config.vocab_size > padded and not allow_size_mismatch:
      raise ConfigError(
          f"the vocabulary has {size} ids ({words}) but {vocab_size} = "
          f"{config.vocab_size}, more than {padded} (T5X's padding): the "
          f"{role} was trained with another vocabulary. Allowed: the "
          f"SentencePiece model {extra}the checkpoints were trained with"
          f"{deliberate}.")


def checkpoint_dir(checkpoint_path: str) -> str:
  """The step folder a *_CHECKPOINT_PATH names: itself, or a model dir's
  latest `checkpoint_N`."""
  return checkpoints.checkpoint_path(resolve(checkpoint_path))


def check_vocabulary_for_run(vocab, args) -> None:
  """TOPK within the vocabulary, and the vocabulary the checkpoints'
  DIGESTS.json records, if any (`check_vocabulary_digest`); ConfigError."""
  size = int(vocab.vocab_size)
  if args.top_k > size:
    raise ConfigError(
        f"TOPK={args.top_k} is more than the vocabulary's {size} ids "
        f"({describe_vocabulary(vocab)}): allowed: 0 (off) to {size}.")
  paths = [("target", args.target_checkpoint_path)]
  if args.drafting.uses_draft_model:
    paths.append(("draft", args.draft_checkpoint_path))
  for role, path in paths:
    if path:
      check_vocabulary_digest(vocab, role, checkpoint_dir(path))


def check_vocabulary_digest(vocab, role: str, ckpt: str,
                            names: Names = RUN_NAMES) -> None:
  """`vocab`'s file against the vocabulary `ckpt` (the `role` model's step
  folder) records in its DIGESTS.json: another one is refused, even of the
  same size (its ids mean other pieces); none recorded, a warning.
  ConfigError naming both."""
  if not io_utils.isdir(ckpt):
    return  # `load_model` says what is wrong with the path
  macro = names.of("checkpoint", role)
  record = digests.vocabulary_record(ckpt)
  if record is None:
    _warn_unverified(macro, ckpt, describe_vocabulary(vocab, names))
    return
  path = getattr(vocab, "sentencepiece_model_file", None)
  got = _file_digest(path) if path else None
  if got != record.get("sha256"):
    what = (f"{path!r} (sha256 {got[:16]}...)" if got else describe_vocabulary(
        vocab, names))
    raise ConfigError(
        f"{names.vocabulary}: the vocabulary {what} is not the one {macro}'s "
        f"checkpoint {ckpt} was trained with ({record.get('file')!r}, sha256 "
        f"{str(record.get('sha256'))[:16]}..., its {digests.MANIFEST_FILE}). "
        "Allowed: that SentencePiece model.")


@functools.lru_cache(maxsize=None)  # once per process (a sweep's points)
def _warn_unverified(macro: str, ckpt: str, vocabulary_words: str) -> None:
  logging.warning(
      "%s: %s records no vocabulary digest (DIGESTS.json), so %s could "
      "not be verified.", macro, ckpt, vocabulary_words)


@functools.lru_cache(maxsize=None)
def _file_digest(path: str) -> str:
  return digests.digest(io_utils.read_bytes(path))


def load_model(config: T5Config, checkpoint_path: Optional[str], seed: int,
               mesh, what: str, decode_path: Optional[str] = None) -> T5Model:
  """Loads a T5X checkpoint (or its model dir's latest; None: random
  weights) sharded over `mesh`, checked before any shape is built
  (`checkpoints.check_checkpoint`), prepared for `decode_path` (None: the
  backend's; `check_decode_paths` checked it)."""
  fields = f"{what}/T5Config."
  available = sizes.available_bytes() * jax.device_count()
  opened = None
  if checkpoint_path:
    path = checkpoint_dir(checkpoint_path)
    if not io_utils.is_url(path) and not os.path.exists(path):
      raise checkpoints.CheckpointError(
          f"{what.upper()}_CHECKPOINT_PATH={checkpoint_path!r}: {path} does "
          "not exist (allowed: a T5X checkpoint_<N> folder, or a folder of "
          f"them){trained_here_hint(checkpoint_path)}.")
    opened = checkpoints.check_checkpoint(path, config, fields, available)
  else:
    sizes.check_fits_memory(config, fields, available)
  shapes = param_shapes(config)["params"]
  shardings = partitioning.param_shardings(mesh, shapes)
  if opened is not None:
    logging.info("Loading %s from %s", what, opened.ckpt)
    params = checkpoints.load_t5x_params(opened, expected=shapes,
                                         dtype=config.dtype,
                                         shardings=shardings)
  else:
    logging.warning("No %s checkpoint: random weights (seed %d).", what, seed)
    params = checkpoints.random_params(config, jax.random.PRNGKey(seed),
                                       dtype=config.dtype, shardings=shardings)
  # The path's weights, packed once (none for 'xla').
  model = T5Model(config, {"params": params}).prepared_for_decoding(decode_path)
  logging.info(
      "The %s decodes on the %r path (%s).", what, model.decode_path,
      "the backend's" if decode_path is None else f"{what.upper()}_DECODE_PATH")
  return model


def check_decode_paths(args, target_config: T5Config,
                       draft_config: T5Config) -> None:
  """TARGET_DECODE_PATH / DRAFT_DECODE_PATH (the names: `arguments`) can
  run here for the model's config (`DecodePath.unavailable`: 'cpu_kernel'
  needs float32 on one CPU with the kernel built, 'fused' a head width the
  GPU kernels take); ConfigError naming the macro, the value, why not and
  the paths allowed here."""
  configs = {
      "TARGET_DECODE_PATH": target_config,
      "DRAFT_DECODE_PATH": draft_config
  }
  for macro, path in args.chosen_decode_paths().items():
    config = configs[macro]
    why = decode_paths.get(path, macro).unavailable(config)
    if why:
      here = [
          n for n, p in decode_paths.PATHS.items() if not p.unavailable(config)
      ]
      raise ConfigError(f"{macro}={path!r}: {why}; allowed here: None (the "
                        f"backend's) or {', '.join(map(repr, here))}.")


def with_tiles(model: Any, name: Optional[str]) -> Any:
  """`model` under the tiles preset `name` (TARGET_TILES / DRAFT_TILES,
  checked by `arguments`; None: the kernels' own): itself if already
  (`with_tiles`)."""
  return model.with_tiles(None if name is
                          None else gpu_tiles.TILE_PRESETS[name])


def on_decode_paths(target: Any, draft: Any, args) -> Dict[str, Any]:
  """{'target', 'draft'}: models loaded for an earlier run (`sweep`) on
  this run's paths and tiles (each itself if already on them; a
  shared-encoder draft re-paired with the target)."""
  target = with_tiles(target.prepared_for_decoding(args.target_decode_path),
                      args.target_tiles)
  if isinstance(draft, SharedEncoderModel):
    decoder = with_tiles(
        draft.decoder.prepared_for_decoding(args.draft_decode_path),
        args.draft_tiles)
    if decoder is not draft.decoder or target is not draft.encoder:
      draft = SharedEncoderModel.pair(target, decoder)
  elif isinstance(draft, T5Model):
    draft = with_tiles(draft.prepared_for_decoding(args.draft_decode_path),
                       args.draft_tiles)
  return {"target": target, "draft": draft}


def decode_paths_record(target: Any, draft: Any) -> Dict[str, Optional[str]]:
  """metrics.json's `decode_paths`: the path each model decodes on (None:
  no T5 draft; a shared-encoder draft's: its decoder's)."""
  if isinstance(draft, SharedEncoderModel):
    draft = draft.decoder
  return {
      role: model.decode_path if isinstance(model, T5Model) else None
      for role, model in (("target", target), ("draft", draft))
  }
