"""Sizes checked before anything is built or read (issue 59).

A model's config against its checkpoint and this machine, before its
shapes are built (`checkpoints.check_checkpoint`, `sizes`), for
`pairs.load_pair` (a folder's model_config.json) and `run`
(`loading.load_model`, gin's T5Config): defect 7 (a copied draft with
num_decoder_layers 10^7 ran a minute to a bare MemoryError before its
digests were checked) and defect 8 (emb_dim / mlp_dim 10^6, draft mlp_dim
10^8, num_decoder_layers 100000 ended in tracebacks after seconds to
minutes). Building a shape fails these tests (`no_shapes`), so on the old
code they fail at once instead of allocating terabytes.

And two inputs sized before they are read: infer's SOURCE_FILE, read up to
the NUM_EXAMPLES rows asked for; a TASK too long for a sweep point's
folder name, refused at start-up.
"""
import jax
import pytest

from specdec_jax import checkpoints
from specdec_jax import pairs
from specdec_jax import sweep
from specdec_jax.checkpoints import sizes
from specdec_jax.data import tasks
from specdec_jax.experiment import arguments
from specdec_jax.experiment import loading

from conftest import tiny_config
import pair_helpers


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  return pair_helpers.write_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture
def no_shapes(monkeypatch):
  """Building a model's shapes (`param_shapes`: `jax.eval_shape` of its
  init) fails the test: every refusal here comes before it."""

  def fail(*args, **kwargs):
    raise AssertionError("shapes built before the sizes were checked")

  monkeypatch.setattr(jax, "eval_shape", fail)


def _load_pair(pair, **folders):
  return pairs.load_pair(str(folders.get("target", pair["target"])),
                         str(folders.get("draft", pair["draft"])),
                         str(pair["spm"]), compilation_cache=False)


# ---------------------------------------------------------------------------
# Defect 7: the digests first.
# ---------------------------------------------------------------------------
def test_an_edited_config_is_a_digest_mismatch_before_any_shape(
    pair, tmp_path, no_shapes):
  draft = pair_helpers.edited_copy(pair["draft"], tmp_path / "draft",
                                   num_decoder_layers=10**7)
  with pytest.raises(checkpoints.CheckpointError) as e:
    _load_pair(pair, draft=draft)
  assert str(e.value).startswith(
      f"Checkpoint {pair_helpers.step_folder(draft)}: model_config.json does "
      "not match DIGESTS.json")


# ---------------------------------------------------------------------------
# Defect 8: the config against the checkpoint's stored shapes (metadata
# only), the file and field named.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("role,field,value,stored", [
    ("target", "emb_dim", 10**6, 16),
    ("target", "mlp_dim", 10**6, 32),
    ("draft", "mlp_dim", 10**8, 32),
    ("target", "num_decoder_layers", 100000, 2),
    ("target", "vocab_size", 10**12, 256),
    ("draft", "num_heads", 4, 2),
    ("draft", "head_dim", 4, 8),
    ("draft", "num_encoder_layers", 3, 1),
])
def test_a_config_unlike_its_checkpoint_is_refused(pair, tmp_path, no_shapes,
                                                   role, field, value, stored):
  """Without DIGESTS.json, the config is all there is to go by."""
  folder = pair_helpers.edited_copy(pair[role], tmp_path / role,
                                    keep_digests=False, **{field: value})
  step = pair_helpers.step_folder(folder)
  with pytest.raises(checkpoints.CheckpointError) as e:
    _load_pair(pair, **{role: folder})
  assert str(e.value).startswith(
      f"{step}/model_config.json: {field} = {value} but checkpoint {step} "
      f"stores {stored} (")
  assert "allowed: the sizes the checkpoint was trained with" in str(e.value)


@pytest.mark.parametrize("field,value", [("num_decoder_layers", 100000),
                                         ("emb_dim", 10**6)])
def test_run_refuses_a_t5config_unlike_its_checkpoint(pair, no_shapes, field,
                                                      value):
  """`run`'s loading: gin's target/T5Config against TARGET_CHECKPOINT_PATH
  (a model dir as train writes it: its latest checkpoint)."""
  config = pair_helpers.CONFIGS["target"].replace(**{field: value})
  with pytest.raises(checkpoints.CheckpointError) as e:
    loading.load_model(config, str(pair["target"]), 0, None, "target")
  assert str(e.value).startswith(
      f"target/T5Config.{field} = {value} but checkpoint "
      f"{pair_helpers.step_folder(pair['target'])} stores ")


# ---------------------------------------------------------------------------
# Defect 8: parameters larger than this machine's memory, with numbers.
# ---------------------------------------------------------------------------
def test_run_refuses_random_weights_larger_than_memory(no_shapes):
  """emb_dim = mlp_dim = 10^6: a 4 TB allocation after 10 s."""
  config = tiny_config(emb_dim=10**6, mlp_dim=10**6)
  with pytest.raises(checkpoints.CheckpointError) as e:
    loading.load_model(config, None, 0, None, "draft")
  message = str(e.value)
  assert message.startswith(f"draft/T5Config: the model's "
                            f"{config.num_params:,} parameters need ")
  assert "GiB (float32) but this machine has " in message
  assert "emb_dim = 1000000, mlp_dim = 1000000" in message


def test_a_checkpoint_larger_than_memory_is_refused(pair, monkeypatch):
  monkeypatch.setattr(sizes, "available_bytes", lambda: 1000)
  with pytest.raises(checkpoints.CheckpointError) as e:
    _load_pair(pair)
  target = pair_helpers.CONFIGS["target"]
  assert str(e.value).startswith(
      f"{pair_helpers.step_folder(pair['target'])}/model_config.json: the "
      f"model's {target.num_params:,} parameters need ")
  assert "but this machine has 9.31e-07 GiB" in str(e.value)


# ---------------------------------------------------------------------------
# infer: the rows asked for, not the whole SOURCE_FILE.
# ---------------------------------------------------------------------------
def test_only_the_examples_asked_for_are_read(tmp_path):
  """NUM_EXAMPLES=12 of a 3 GB SOURCE_FILE read all of it. What comes after
  the rows asked for is not read: not even an empty line or a line count
  that differs from the references'."""
  source, reference = tmp_path / "s.en", tmp_path / "r.de"
  lines = [f"sentence {i}" for i in range(20)]
  lines[14] = ""
  source.write_text("\n".join(lines) + "\n")
  reference.write_text("\n".join(f"Satz {i}" for i in range(30)) + "\n")
  examples = tasks.load_examples(source_file=source, reference_file=reference,
                                 num_examples=12)
  assert [e["input"] for e in examples] == lines[:12]
  assert examples[-1]["reference"] == "Satz 11"
  with pytest.raises(ValueError, match=r"s\.en:15: empty source line"):
    tasks.load_examples(source_file=source, reference_file=reference,
                        num_examples=16)


def test_a_short_file_is_still_named_within_the_rows_asked_for(tmp_path):
  source, reference = tmp_path / "s.en", tmp_path / "r.de"
  source.write_text("a\nb\nc\n")
  reference.write_text("".join(f"x{i}\n" for i in range(20)))
  with pytest.raises(ValueError) as e:
    tasks.load_examples(source_file=source, reference_file=reference,
                        num_examples=12)
  assert (f"{source} has 3 lines but {reference} has at least 12 lines "
          f"(first unmatched line: {reference}:4)") in str(e.value)


# ---------------------------------------------------------------------------
# A TASK too long for a folder name: refused before anything is written.
# ---------------------------------------------------------------------------
@pytest.mark.usefixtures("clean_gin")
def test_run_refuses_a_task_too_long_for_a_folder_name(tmp_path):
  out = str(tmp_path / "o")
  with pytest.raises(arguments.ConfigError) as e:
    arguments.run_arguments(overrides={
        "task_name": "t" * 300,
        "output_dir": out
    })
  assert str(e.value).startswith(f"TASK={'t' * 40!r}... (300 bytes, "
                                 "run.task_name): allowed: at most 250 bytes")
  arguments.run_arguments(overrides={"task_name": "t" * 250, "output_dir": out})


@pytest.mark.usefixtures("clean_gin")
def test_a_sweep_refuses_a_task_too_long_before_writing(tmp_path, no_load):
  """It failed at its first point and left sweep.json behind."""
  results = tmp_path / "r"
  with pytest.raises(sweep.SweepError) as e:
    sweep.run_sweep([{
        "TASK": "t" * 300
    }], str(results), ["local_tiny.gin"], providers=no_load)
  assert str(e.value).startswith("sweep key 'TASK' (point TASK=ttt")
  assert "would have 305 bytes, 305 of them TASK's, more than the 255" in str(
      e.value)
  assert "TASK: at most 250 bytes" in str(e.value)
  assert not results.exists()
