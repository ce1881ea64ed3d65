"""Evaluation tasks: seqio tasks for WMT EnDe and CNN/DailyMail, local files.

seqio tasks (T5 conventions, cf. T5's ``wmt_t2t_ende_v003`` and
``cnn_dailymail_v002``):

* ``specdec_wmt_ende``: TFDS ``wmt_t2t_translate/de-en:1.0.0``; inputs
  ``"translate English to German: " + en``, targets ``de``; BLEU.
* ``specdec_cnn_dailymail``: TFDS ``cnn_dailymail:3.4.0``; inputs
  ``"summarize: " + article``, targets ``highlights``; ROUGE.

Both tokenize with :func:`specdec_jax.data.vocab.get_vocabulary` (T5's default
SentencePiece model on gs://, loaded lazily by seqio, so registering does not
touch it) and append EOS. :func:`register_tasks` registers the same tasks with
another SentencePiece model under suffixed names.

Import cost: seqio (and thus TensorFlow, ~10 s) is imported lazily. The
default tasks are registered on import *if seqio is already imported* (e.g.
under T5X or a gin file that imports seqio first); otherwise they are
registered on first use of any function here that needs the registry
(:func:`load_examples`, :func:`get_task_kind`, ...). Code that imports this
module before seqio and then calls ``seqio.get_mixture_or_task`` directly
should call :func:`register_default_tasks` (idempotent) first.

Local evaluation data (no TensorFlow needed): :func:`read_parallel_text` reads
line-aligned ``X.en``/``X.de`` files or a two-column TSV, and
:func:`load_examples` returns ``[{'input': ..., 'reference': ...}]`` from
either a registered task or local files.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple, Union

import gin
import numpy as np

from specdec_jax.terminal import console
from specdec_jax.metrics import quality as metrics
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.data.vocab import DEFAULT_EXTRA_IDS
from specdec_jax.data.vocab import DEFAULT_SPM_PATH

logger = logging.getLogger(__name__)

WMT_ENDE_TASK = "specdec_wmt_ende"
CNN_DM_TASK = "specdec_cnn_dailymail"

WMT_ENDE_TFDS_NAME = "wmt_t2t_translate/de-en"
WMT_ENDE_TFDS_VERSION = "1.0.0"
CNN_DM_TFDS_NAME = "cnn_dailymail"
CNN_DM_TFDS_VERSION = "3.4.0"

WMT_ENDE_PREFIX = "translate English to German: "
CNN_DM_PREFIX = "summarize: "

SPLITS = ("train", "validation", "test")

TRANSLATION = metrics.TRANSLATION
SUMMARIZATION = metrics.SUMMARIZATION

PathLike = Union[str, os.PathLike]

# name -> (task kind, registration config) for tasks registered by this module.
_REGISTERED: Dict[str, Tuple[str, tuple]] = {}

# ---------------------------------------------------------------------------
# Plain-Python local data (no TensorFlow).
# ---------------------------------------------------------------------------


def _read_lines(path: PathLike, what: str,
                max_lines: Optional[int] = None) -> List[str]:
  """The file's lines (without their '\n' or '\r\n'), the first
  `max_lines` only when given: read line by line, so that 12 examples of a
  3 GB file read a few kilobytes."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ValueError(f"{what} file not found: {path}")
  if not os.path.isfile(path):
    raise ValueError(f"{what} path is not a regular file: {path}")
  lines = []
  try:
    # newline="\n": lines end at '\n' only, as the file was split before
    # (a lone '\r' stays inside its line).
    with open(path, "r", encoding="utf-8", newline="\n") as f:
      for line in itertools.islice(f, max_lines):
        line = line[:-1] if line.endswith("\n") else line
        lines.append(line[:-1] if line.endswith("\r") else line)
  except UnicodeDecodeError as e:
    raise ValueError(f"{what} file {path} is not valid UTF-8: {e}") from e
  if lines and lines[0].startswith("\ufeff"):  # UTF-8 BOM
    lines[0] = lines[0][1:]
  if not lines and max_lines != 0:
    raise ValueError(f"{what} file {path} is empty (no examples).")
  return lines


def _check_nonempty(line: str, path: str, lineno: int, what: str) -> None:
  if not line.strip():
    raise ValueError(f"{path}:{lineno}: empty {what} line.")


def read_parallel_text(
    source_file: PathLike, reference_file: Optional[PathLike] = None,
    max_lines: Optional[int] = None) -> List[Tuple[str, str]]:
  """Reads (source, reference) pairs from local text files.

  Args:
    source_file: with ``reference_file``, a file with one source sentence per
      line (e.g. ``newstest.en``); without it, a TSV file with exactly two
      tab-separated columns per line: source, reference.
    reference_file: a file with one reference per line, line-aligned with
      ``source_file`` (e.g. ``newstest.de``).
    max_lines: read (and check) only the first `max_lines` lines of each
      file; None: all of them.

  Returns:
    A list of ``(source, reference)`` string pairs.

  Raises:
    ValueError: a file is missing, empty or not UTF-8; the two files have
      different numbers of lines; a line is empty; a TSV line does not have
      exactly two columns. Messages name the file and the 1-based line.
  """
  source_path = os.fspath(source_file)
  if reference_file is None:
    lines = _read_lines(source_path, "TSV", max_lines)
    pairs = []
    for i, line in enumerate(lines, start=1):
      cols = line.split("\t")
      if len(cols) != 2:
        raise ValueError(
            f"{source_path}:{i}: expected exactly 2 tab-separated columns "
            f"(source, reference), got {len(cols)}.")
      _check_nonempty(cols[0], source_path, i, "source (column 1)")
      _check_nonempty(cols[1], source_path, i, "reference (column 2)")
      pairs.append((cols[0], cols[1]))
    return pairs

  reference_path = os.fspath(reference_file)
  sources = _read_lines(source_path, "Source", max_lines)
  references = _read_lines(reference_path, "Reference", max_lines)
  if len(sources) != len(references):
    n = min(len(sources), len(references))
    longer = source_path if len(sources) > len(references) else reference_path

    def count(lines):  # the longer file is read up to max_lines only
      more = len(lines) > n and len(lines) == max_lines
      return f"{'at least ' if more else ''}{len(lines)}"

    raise ValueError(
        f"Line count mismatch: {source_path} has {count(sources)} lines but "
        f"{reference_path} has {count(references)} lines (first unmatched "
        f"line: {longer}:{n + 1}).")
  for i, (s, r) in enumerate(zip(sources, references), start=1):
    _check_nonempty(s, source_path, i, "source")
    _check_nonempty(r, reference_path, i, "reference")
  return list(zip(sources, references))


# ---------------------------------------------------------------------------
# Token-level helpers (numpy; work with seqio vocabularies).
# ---------------------------------------------------------------------------


def _eos_id(vocab) -> int:
  eos = vocab.eos_id
  return int(eos() if callable(eos) else eos)


def encode_batch(vocab, texts: Sequence[str], max_length: int, *,
                 return_lengths: bool = False):
  """Tokenizes ``texts`` into an int32 array ``[len(texts), max_length]``.

  Each row is the SentencePiece encoding followed by EOS; too-long encodings
  are truncated to ``max_length - 1`` tokens so that EOS is always the last
  non-pad token; rows are right-padded with 0.

  With ``return_lengths``, returns ``(array, lengths)`` where ``lengths[i]``
  is row i's full length with EOS before truncation: rows with
  ``lengths > max_length`` were truncated.
  """
  if isinstance(texts, str):
    raise TypeError("encode_batch expects a sequence of strings, not a str.")
  if max_length < 1:
    raise ValueError(f"max_length must be >= 1, got {max_length}.")
  eos = _eos_id(vocab)
  out = np.zeros((len(texts), max_length), dtype=np.int32)
  lengths = np.zeros((len(texts),), dtype=np.int64)
  for i, text in enumerate(texts):
    ids = list(vocab.encode(text))
    lengths[i] = len(ids) + 1
    ids = ids[:max_length - 1] + [eos]
    out[i, :len(ids)] = ids
  return (out, lengths) if return_lengths else out


def decode_tokens(vocab, tokens) -> List[str]:
  """Decodes a ``[B, L]`` array of ids; stops at the first EOS, drops pad (0)."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 2:
    raise ValueError(
        f"decode_tokens expects a 2-D [batch, length] array, got shape "
        f"{tokens.shape}.")
  eos = _eos_id(vocab)
  out = []
  for row in tokens.tolist():
    if eos in row:
      row = row[:row.index(eos)]
    row = [t for t in row if t != vocab_lib.PAD_ID]
    out.append(vocab.decode(row))
  return out


# ---------------------------------------------------------------------------
# seqio tasks.
# ---------------------------------------------------------------------------


def _seqio_task_names() -> set:
  import seqio  # pylint: disable=g-import-not-at-top
  return set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())


def _make_prefix_preprocessor(input_key: str, target_key: str, prefix: str):
  """A preprocessor mapping {input_key, target_key} -> {inputs, targets}."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @seqio.map_over_dataset
  def preprocess(ex):
    return {
        "inputs": tf.strings.join([prefix, ex[input_key]]),
        "targets": ex[target_key],
    }

  return preprocess


def _output_features(spm_model_path: str, extra_ids: int):
  import seqio  # pylint: disable=g-import-not-at-top
  vocabulary = vocab_lib.get_vocabulary(spm_model_path, extra_ids)
  return {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True,
                              required=False),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }


def _add_task(name: str, kind: str, config: tuple, *, source, input_key: str,
              target_key: str, prefix: str, spm_model_path: str,
              extra_ids: int) -> bool:
  """Adds a task unless already registered; returns True if it was added."""
  import seqio  # pylint: disable=g-import-not-at-top
  in_seqio = name in _seqio_task_names()
  if in_seqio and name in _REGISTERED:
    if _REGISTERED[name][1] != config:
      raise ValueError(
          f"Task {name!r} is already registered with a different "
          f"configuration ({_REGISTERED[name][1]} vs {config}); use another "
          "name/suffix.")
    return False
  if in_seqio:
    logger.warning("seqio task %r already registered elsewhere; skipping.",
                   name)
    return False
  metric_fn = metrics.seqio_bleu if kind == TRANSLATION else metrics.seqio_rouge
  seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[
          _make_prefix_preprocessor(input_key, target_key, prefix),
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=_output_features(spm_model_path, extra_ids),
      metric_fns=[metric_fn],
  )
  _REGISTERED[name] = (kind, config)
  return True


def register_tasks(spm_model_path: str = DEFAULT_SPM_PATH,
                   extra_ids: int = DEFAULT_EXTRA_IDS, suffix: str = "", *,
                   wmt_version: str = WMT_ENDE_TFDS_VERSION,
                   cnn_dm_version: str = CNN_DM_TFDS_VERSION,
                   tfds_data_dir: Optional[str] = None) -> List[str]:
  """Registers the WMT EnDe and CNN/DM seqio tasks (idempotent).

  Args:
    spm_model_path: SentencePiece model for both inputs and targets.
    extra_ids: number of extra (sentinel) ids of the vocabulary.
    suffix: appended to the task names (``"specdec_wmt_ende" + suffix``), so
      the same tasks can be registered with another vocabulary.
    wmt_version: TFDS version of ``wmt_t2t_translate/de-en``.
    cnn_dm_version: TFDS version of ``cnn_dailymail``.
    tfds_data_dir: TFDS data dir (None: TFDS default).

  Returns:
    The two task names ``[wmt_ende_name, cnn_dm_name]``.
  """
  console.import_tensorflow_quietly()  # no oneDNN/CUDA banner
  import seqio  # pylint: disable=g-import-not-at-top
  wmt_name = WMT_ENDE_TASK + suffix
  cnn_name = CNN_DM_TASK + suffix
  wmt_tfds = f"{WMT_ENDE_TFDS_NAME}:{wmt_version}"
  cnn_tfds = f"{CNN_DM_TFDS_NAME}:{cnn_dm_version}"
  common = dict(spm_model_path=spm_model_path, extra_ids=extra_ids)
  _add_task(
      wmt_name, TRANSLATION,
      ("tfds", wmt_tfds, tfds_data_dir, spm_model_path, extra_ids),
      source=seqio.TfdsDataSource(tfds_name=wmt_tfds, splits=SPLITS,
                                  tfds_data_dir=tfds_data_dir), input_key="en",
      target_key="de", prefix=WMT_ENDE_PREFIX, **common)
  _add_task(
      cnn_name, SUMMARIZATION,
      ("tfds", cnn_tfds, tfds_data_dir, spm_model_path, extra_ids),
      source=seqio.TfdsDataSource(tfds_name=cnn_tfds, splits=SPLITS,
                                  tfds_data_dir=tfds_data_dir),
      input_key="article", target_key="highlights", prefix=CNN_DM_PREFIX,
      **common)
  return [wmt_name, cnn_name]


def register_default_tasks() -> List[str]:
  """Registers the default tasks (T5 vocabulary); idempotent."""
  return register_tasks()


def register_local_task(
    name: str, source_file: PathLike, reference_file: Optional[PathLike] = None,
    *, prefix: str = WMT_ENDE_PREFIX, spm_model_path: str = DEFAULT_SPM_PATH,
    extra_ids: int = DEFAULT_EXTRA_IDS, task_kind: str = TRANSLATION,
    splits: Sequence[str] = ("validation",)) -> str:
  """Registers a seqio task backed by local files (see read_parallel_text).

  The files are read and validated now (ValueError on bad input); the same
  examples are served for every split in ``splits``. Inputs are
  ``prefix + source``, targets the reference; tokenized with the given
  SentencePiece model, EOS appended. Metrics: BLEU for ``task_kind=
  'translation'``, ROUGE for ``'summarization'``.

  Returns:
    ``name``.
  """
  console.import_tensorflow_quietly()  # no oneDNN/CUDA banner
  import seqio  # pylint: disable=g-import-not-at-top
  if task_kind not in metrics.TASK_KINDS:
    raise ValueError(f"Unknown task_kind {task_kind!r}; expected one of "
                     f"{metrics.TASK_KINDS}.")
  if isinstance(splits, str):
    splits = (splits,)
  pairs = read_parallel_text(source_file, reference_file)
  sources = [s for s, _ in pairs]
  references = [r for _, r in pairs]

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.data.Dataset.from_tensor_slices({
        "source": sources,
        "reference": references
    })

  config = ("local", os.path.abspath(os.fspath(source_file)),
            None if reference_file is None else os.path.abspath(
                os.fspath(reference_file)), tuple(pairs), prefix,
            spm_model_path, extra_ids, tuple(splits))
  _add_task(
      name, task_kind, config, source=seqio.FunctionDataSource(
          dataset_fn, splits=tuple(splits),
          num_input_examples={s: len(pairs) for s in splits}),
      input_key="source", target_key="reference", prefix=prefix,
      spm_model_path=spm_model_path, extra_ids=extra_ids)
  return name


def get_task_kind(mixture_or_task_name: str) -> str:
  """'translation' or 'summarization' for a task registered by this module."""
  if mixture_or_task_name not in _REGISTERED:
    register_default_tasks()
  if mixture_or_task_name not in _REGISTERED:
    raise ValueError(
        f"Unknown task {mixture_or_task_name!r}: not registered by "
        f"specdec_jax.data.tasks (known: {sorted(_REGISTERED)}).")
  return _REGISTERED[mixture_or_task_name][0]


def _hide_gpus_from_tensorflow() -> None:
  """Keeps TF input pipelines off accelerators (they belong to JAX)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    tf.config.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError):  # Already initialized; nothing to do.
    pass


@gin.configurable
def load_examples(*, mixture_or_task_name: Optional[str] = None,
                  split: str = "validation", num_examples: Optional[int] = None,
                  source_file: Optional[PathLike] = None,
                  reference_file: Optional[PathLike] = None,
                  input_prefix: str = "",
                  shard_info=None) -> List[Dict[str, str]]:
  """Loads evaluation examples as ``[{'input': str, 'reference': str}]``.

  Exactly one of ``mixture_or_task_name`` and ``source_file`` must be given.

  * Task: the raw text (``inputs_pretokenized``/``targets_pretokenized``) of
    ``split`` of a registered seqio task or mixture, in order (no shuffling),
    so ``input`` already carries the task's prefix (e.g. "translate English
    to German: ..."). Registers the default tasks first if needed.
  * Local files (no TensorFlow): see :func:`read_parallel_text`; ``input`` is
    ``input_prefix + source``. ``split`` is ignored.

  Args:
    mixture_or_task_name: a registered seqio task/mixture name.
    split: dataset split (task only).
    num_examples: if set, only the first ``num_examples`` examples.
    source_file: local source file, or TSV if ``reference_file`` is None.
    reference_file: local reference file, line-aligned with ``source_file``.
    input_prefix: prepended to each local source (e.g. WMT_ENDE_PREFIX). Not
      used for tasks, whose preprocessors already add their prefix.
    shard_info: a ``seqio.ShardInfo`` (or anything with ``index`` and
      ``num_shards``): only examples ``index, index + num_shards, ...`` of
      the first ``num_examples`` (one process's slice on several hosts,
      `multihost`). A task is read in order and sliced by example, not
      through ``get_dataset(shard_info=...)``: seqio would shard a source
      with enough files by file, which changes which examples are the
      first ``num_examples`` and loses their order.

  Returns:
    A list of dicts with keys ``input`` and ``reference``.
  """
  if (mixture_or_task_name is None) == (source_file is None):
    raise ValueError(
        "load_examples needs exactly one of mixture_or_task_name and "
        f"source_file (got mixture_or_task_name={mixture_or_task_name!r}, "
        f"source_file={source_file!r}).")
  if num_examples is not None and num_examples < 0:
    raise ValueError(f"num_examples must be >= 0, got {num_examples}.")

  if source_file is not None:
    # Only the rows asked for are read (and checked).
    pairs = read_parallel_text(source_file, reference_file, num_examples)
    if shard_info is not None:
      pairs = pairs[shard_info.index::shard_info.num_shards]
    return [{"input": input_prefix + s, "reference": r} for s, r in pairs]

  if reference_file is not None:
    raise ValueError("reference_file requires source_file.")
  if input_prefix:
    logger.warning(
        "load_examples: input_prefix=%r is ignored for seqio task %r (the "
        "task's preprocessors add its prefix).", input_prefix,
        mixture_or_task_name)
  return _task_examples(mixture_or_task_name, split, num_examples, shard_info)


def _task_examples(mixture_or_task_name: str, split: str,
                   num_examples: Optional[int],
                   shard_info) -> List[Dict[str, str]]:
  """`load_examples` for a seqio task or mixture (its arguments)."""
  console.import_tensorflow_quietly()  # no oneDNN/CUDA banner
  import seqio  # pylint: disable=g-import-not-at-top
  _hide_gpus_from_tensorflow()
  if mixture_or_task_name not in _seqio_task_names():
    register_default_tasks()
  task = seqio.get_mixture_or_task(mixture_or_task_name)
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False,
                        num_epochs=1, use_cached=False, try_in_mem_cache=False)
  if num_examples is not None:
    ds = ds.take(num_examples)
  if shard_info is not None and shard_info.num_shards > 1:
    ds = ds.shard(shard_info.num_shards, shard_info.index)
  out = []
  for ex in ds.as_numpy_iterator():
    for key in ("inputs_pretokenized", "targets_pretokenized"):
      if key not in ex:
        raise ValueError(
            f"Task {mixture_or_task_name!r} does not provide {key!r}; "
            "load_examples needs the raw text (seqio.preprocessors.tokenize "
            "with copy_pretokenized=True).")
    out.append({
        "input": _to_str(ex["inputs_pretokenized"]),
        "reference": _to_str(ex["targets_pretokenized"]),
    })
  return out


def _to_str(x) -> str:
  if isinstance(x, bytes):
    return x.decode("utf-8")
  if isinstance(x, np.ndarray) and x.ndim == 0:
    return _to_str(x.item())
  return str(x)


# Register the defaults on import when that is cheap (seqio already loaded,
# e.g. under T5X/gin); otherwise lazily on first use (see module docstring).
if "seqio" in sys.modules:
  register_default_tasks()
