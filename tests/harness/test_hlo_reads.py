"""`hlo_reads.weight_reads`: passes over each weight, read from HLO text."""
import jax
import jax.numpy as jnp
import pytest

from conftest import random_model
from conftest import tiny_config
from specdec_jax.experiment import hlo_reads

# A hand-written entry computation: w1 is read by one fusion; w2 by two
# slice-starts of halves (one read in all); w3 by two fusions (twice) and
# handed on in the output tuple (no read); the cache is not a weight.
_HLO = """HloModule m

%fused (p: f32[4,8]) -> f32[4,8] {
  ROOT %p = f32[4,8]{1,0} parameter(0)
}

ENTRY %main (a: f32[4,8], b: bf16[8,16], c: f32[2,2], d: f32[4,4]) -> f32[4,8] {
  %param.1 = f32[4,8]{1,0} parameter(0), metadata={op_name="m.params['params']['w1']"}
  %param.2 = bf16[8,16]{1,0} parameter(1), metadata={op_name="m.params['params']['w2']"}
  %param.3 = f32[2,2]{1,0} parameter(2), metadata={op_name="m.params['params']['w3']"}
  %param.4 = f32[4,4]{1,0} parameter(3), metadata={op_name="c['cache']"}
  %fusion = f32[4,8]{1,0} fusion(%param.1, %param.4), kind=kLoop, calls=%fused
  %slice-start = ((bf16[8,16]{1,0}), bf16[8,8]{1,0}, s32[]) slice-start(%param.2), slice={[0:8], [0:8]}
  %slice-start.1 = ((bf16[8,16]{1,0}), bf16[8,8]{1,0}, s32[]) slice-start(%param.2), slice={[0:8], [8:16]}
  %fusion.1 = f32[2,2]{1,0} fusion(%param.3), kind=kLoop, calls=%fused
  %fusion.2 = f32[2,2]{1,0} fusion(%param.3, %fusion.1), kind=kLoop, calls=%fused
  ROOT %tuple = (f32[4,8]{1,0}, f32[2,2]{1,0}) tuple(%fusion, %param.3)
}
"""


def test_counts_whole_reads_slices_and_pass_through():
  reads = hlo_reads.weight_reads(_HLO)
  assert reads["weights"] == 3
  assert reads["weight_bytes"] == 4 * 8 * 4 + 8 * 16 * 2 + 2 * 2 * 4
  assert reads["bytes_read"] == 4 * 8 * 4 + 8 * 16 * 2 + 2 * (2 * 2 * 4)
  assert reads["read_more_than_once"] == ["m.params['params']['w3']"]
  assert reads["unread"] == []


def test_unread_weight_and_custom_predicate():
  reads = hlo_reads.weight_reads(_HLO, is_weight=lambda n: "cache" in n)
  assert reads["weights"] == 1 and reads["reads_per_weight_byte"] == 1.0
  no_use = _HLO.replace("fusion(%param.1, %param.4)", "fusion(%param.1)")
  reads = hlo_reads.weight_reads(no_use, is_weight=lambda n: "cache" in n)
  assert reads["unread"] == ["c['cache']"] and reads["bytes_read"] == 0.0


def test_array_bytes_and_missing_entry():
  assert hlo_reads.array_bytes("(bf16[2,3]{1,0}, s32[])") == 12 + 4
  with pytest.raises(ValueError, match="ENTRY"):
    hlo_reads.weight_reads("HloModule m\n")


def test_a_cpu_decode_step_reads_each_weight_once():
  # The CPU's compiled step, with the parameters in T5X's layout: every
  # decoder weight passes once (the unused encoder is pruned by jit). The
  # exceptions are lookups: XLA:CPU fuses the embedding's one-row gather
  # (and the relative-position table's) into each consumer, which the
  # count, an upper bound, takes for whole reads.
  config = tiny_config()
  model = random_model(config, 0, prepared=False)
  inputs = jnp.ones((1, 4), jnp.int32)
  cache = model.start(inputs, 6)
  text = jax.jit(lambda m, t, c: m.decode_chunk(t, c)).lower(
      model, jnp.zeros((1, 1), jnp.int32), cache).compile().as_text()
  reads = hlo_reads.weight_reads(text)
  assert reads["weights"] > 0 and not reads["unread"], reads
  lookups = ("token_embedder", "relpos_bias")
  assert all(
      any(k in n for k in lookups) for n in reads["read_more_than_once"]), reads
  matmul_weights = hlo_reads.weight_reads(
      text,
      is_weight=lambda n: "params" in n and not any(k in n for k in lookups))
  assert matmul_weights["reads_per_weight_byte"] == 1.0, matmul_weights
