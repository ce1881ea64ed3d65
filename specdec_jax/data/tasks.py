"""Evaluation tasks: seqio tasks for WMT EnDe and CNN/DailyMail, local files.

``specdec_wmt_ende`` and ``specdec_cnn_dailymail`` are T5's tasks (TFDS,
prefixes, BLEU / ROUGE) with T5's vocabulary (`register_tasks`: another).
seqio (and TensorFlow, ~10 s) is imported lazily: they are registered on
import only if seqio is imported already, else on first use here (call
`register_default_tasks` before ``seqio.get_mixture_or_task``). Local files
need no TensorFlow.
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

PathLike = Union[str, os.PathLike]

# name -> (task kind, registration config) for tasks registered by this module.
_REGISTERED: Dict[str, Tuple[str, tuple]] = {}


def _read_lines(path: PathLike, what: str,
                max_lines: Optional[int] = None) -> List[str]:
  """The file's first `max_lines` (None: all) lines, without '\n' or
  '\r\n', read line by line (12 examples of a 3 GB file read kilobytes)."""
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


def _tsv_pairs(lines: Sequence[str], path: str) -> List[Tuple[str, str]]:
  """The (source, reference) pair of each of a TSV file's `lines`."""
  pairs = []
  for i, line in enumerate(lines, start=1):
    cols = line.split("\t")
    if len(cols) != 2:
      raise ValueError(
          f"{path}:{i}: expected exactly 2 tab-separated columns "
          f"(source, reference), got {len(cols)} (a file of inputs alone "
          "has no tab on any line).")
    _check_nonempty(cols[0], path, i, "source (column 1)")
    _check_nonempty(cols[1], path, i, "reference (column 2)")
    pairs.append((cols[0], cols[1]))
  return pairs


def read_parallel_text(
    source_file: PathLike, reference_file: Optional[PathLike] = None,
    max_lines: Optional[int] = None) -> List[Tuple[str, str]]:
  """``(source, reference)`` pairs: line-aligned `source_file` and
  `reference_file`, or without it a TSV file (source, reference); the first
  `max_lines` lines only (None: all).

  Raises:
    ValueError: a file is missing, empty or not UTF-8; the two files have
      different numbers of lines; a line is empty; a TSV line does not have
      exactly two columns. Messages name the file and the 1-based line.
  """
  source_path = os.fspath(source_file)
  if reference_file is None:
    return _tsv_pairs(_read_lines(source_path, "TSV", max_lines), source_path)

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


def read_inputs_and_references(
    source_file: PathLike, reference_file: Optional[PathLike] = None,
    max_lines: Optional[int] = None) -> List[Tuple[str, Optional[str]]]:
  """`read_parallel_text`'s pairs, or without `reference_file` a file of
  inputs alone, one a line (no line holds a tab: a TSV's lines all do):
  ``(source, None)`` each; the first `max_lines` lines only."""
  if reference_file is not None:
    return read_parallel_text(source_file, reference_file, max_lines)
  path = os.fspath(source_file)
  lines = _read_lines(path, "Source", max_lines)
  if any("\t" in line for line in lines):
    return _tsv_pairs(lines, path)  # read once, not again as a TSV
  for i, line in enumerate(lines, start=1):
    _check_nonempty(line, path, i, "source")
  return [(line, None) for line in lines]


def _eos_id(vocab) -> int:
  eos = vocab.eos_id
  return int(eos() if callable(eos) else eos)


def encode_batch(vocab, texts: Sequence[str], max_length: int, *,
                 return_lengths: bool = False):
  """int32 ``[len(texts), max_length]``: each text's ids truncated to
  ``max_length - 1``, then EOS, 0-padded. With ``return_lengths``, also
  each row's length with EOS before truncation (``(array, lengths)``)."""
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


def _seqio_task_names() -> set:
  import seqio  # pylint: disable=g-import-not-at-top
  return set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())


def _add_task(name: str, kind: str, config: tuple, *, source, input_key: str,
              target_key: str, prefix: str, spm_model_path: str,
              extra_ids: int) -> None:
  """Adds a task unless already registered."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  in_seqio = name in _seqio_task_names()
  if in_seqio and name in _REGISTERED:
    if _REGISTERED[name][1] != config:
      raise ValueError(
          f"Task {name!r} is already registered with a different "
          f"configuration ({_REGISTERED[name][1]} vs {config}); use another "
          "name/suffix.")
    return
  if in_seqio:
    logger.warning("seqio task %r already registered elsewhere; skipping.",
                   name)
    return

  @seqio.map_over_dataset
  def with_prefix(ex):
    return {
        "inputs": tf.strings.join([prefix, ex[input_key]]),
        "targets": ex[target_key],
    }

  vocabulary = vocab_lib.get_vocabulary(spm_model_path, extra_ids)
  metric_fn = (metrics.seqio_bleu
               if kind == metrics.TRANSLATION else metrics.seqio_rouge)
  seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[
          with_prefix,
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features={
          "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True,
                                  required=False),
          "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
      },
      metric_fns=[metric_fn],
  )
  _REGISTERED[name] = (kind, config)


def register_tasks(spm_model_path: str = DEFAULT_SPM_PATH,
                   extra_ids: int = DEFAULT_EXTRA_IDS, suffix: str = "", *,
                   wmt_version: str = WMT_ENDE_TFDS_VERSION,
                   cnn_dm_version: str = CNN_DM_TFDS_VERSION,
                   tfds_data_dir: Optional[str] = None) -> List[str]:
  """Registers the WMT EnDe and CNN/DM seqio tasks (idempotent) with the
  vocabulary `spm_model_path` (`extra_ids` sentinels), their names ending in
  `suffix`; returns ``[wmt_ende_name, cnn_dm_name]``. `tfds_data_dir` None:
  TFDS's default."""
  console.import_tensorflow_quietly()  # no oneDNN/CUDA banner
  import seqio  # pylint: disable=g-import-not-at-top
  names = []
  for task, kind, tfds_name, version, keys, prefix in (
      (WMT_ENDE_TASK, metrics.TRANSLATION, WMT_ENDE_TFDS_NAME, wmt_version,
       ("en", "de"), WMT_ENDE_PREFIX),
      (CNN_DM_TASK, metrics.SUMMARIZATION, CNN_DM_TFDS_NAME, cnn_dm_version,
       ("article", "highlights"), CNN_DM_PREFIX)):
    tfds = f"{tfds_name}:{version}"
    # read_only: a run never downloads or prepares TFDS data (every host of
    # a slice would): `_task_examples` says how to prepare it.
    source = seqio.TfdsDataSource(tfds_name=tfds, splits=SPLITS,
                                  tfds_data_dir=tfds_data_dir, read_only=True)
    _add_task(task + suffix, kind,
              ("tfds", tfds, tfds_data_dir, spm_model_path, extra_ids),
              source=source, input_key=keys[0], target_key=keys[1],
              prefix=prefix, spm_model_path=spm_model_path, extra_ids=extra_ids)
    names.append(task + suffix)
  return names


def register_default_tasks() -> List[str]:
  """Registers the default tasks (T5 vocabulary); idempotent."""
  return register_tasks()


def register_local_task(
    name: str, source_file: PathLike, reference_file: Optional[PathLike] = None,
    *, prefix: str = WMT_ENDE_PREFIX, spm_model_path: str = DEFAULT_SPM_PATH,
    extra_ids: int = DEFAULT_EXTRA_IDS, task_kind: str = metrics.TRANSLATION,
    splits: Sequence[str] = ("validation",)
) -> str:
  """Registers (and returns) `name`: a seqio task of local files
  (`read_parallel_text`, read and validated now), the same examples for
  every split in `splits`; inputs ``prefix + source``; BLEU for
  'translation', ROUGE for 'summarization'."""
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


@gin.configurable
def load_examples(*, mixture_or_task_name: Optional[str] = None,
                  split: str = "validation", num_examples: Optional[int] = None,
                  source_file: Optional[PathLike] = None,
                  reference_file: Optional[PathLike] = None,
                  input_prefix: str = "",
                  shard_info=None) -> List[Dict[str, str]]:
  """Evaluation examples ``[{'input': str, 'reference': str}]``, in order:
  the raw text (with its prefix) of `split` of a registered seqio task or
  mixture, or (exactly one of the two) local files
  (`read_inputs_and_references`: a file of inputs alone gives each
  ``reference`` None), each ``input`` ``input_prefix + source``; the first
  `num_examples`.

  `shard_info` (anything with ``index`` and ``num_shards``): only examples
  ``index, index + num_shards, ...`` of those (one process's slice). A task
  is sliced by example: seqio's ``get_dataset(shard_info=...)`` shards by
  file, which changes which examples come first.
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
    pairs = read_inputs_and_references(source_file, reference_file,
                                       num_examples)
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
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:  # TF input pipelines stay off accelerators (they are JAX's).
    tf.config.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError):  # Already initialized.
    pass
  if mixture_or_task_name not in _seqio_task_names():
    register_default_tasks()
  task = seqio.get_mixture_or_task(mixture_or_task_name)
  try:
    ds = task.get_dataset(sequence_length=None, split=split, shuffle=False,
                          num_epochs=1, use_cached=False,
                          try_in_mem_cache=False)
  except AssertionError as e:  # TFDS's "could not find data in ..."
    if "could not find data" not in str(e):
      raise
    raise ValueError(
        f"Task {mixture_or_task_name!r}: {e} A run does not download or "
        "prepare TFDS data: prepare it once first (docs/usage/"
        "reproduce_table2.md, '2. Data: TFDS'), or set TFDS_DATA_DIR to "
        "where it is.") from None
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


# Register the defaults on import when cheap (module docstring).
if "seqio" in sys.modules:
  register_default_tasks()
