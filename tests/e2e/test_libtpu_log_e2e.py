"""Issue 44 end to end: a command on a machine with libtpu but no TPU
starts JAX quietly (`console.setup`), in fresh processes (the noise filter
itself, on libtpu's real text: tests/harness/test_libtpu_log.py)."""
import importlib.util
import os
import subprocess
import sys

import pytest

from specdec_jax.terminal import console

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="needs libtpu (pip install -e '.[tpu]'): without it JAX prints "
    "nothing to drop")
def test_a_command_on_a_machine_without_a_tpu_starts_jax_quietly():
  """`console.setup`: with libtpu installed and no TPU, JAX's first use
  prints libtpu's error block unless the backends were started quietly;
  the CPU backend is the same either way."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  probe = "import jax; print(jax.devices()[0].platform)"

  def started(first: str):
    done = subprocess.run([sys.executable, "-c", first + probe], env=env,
                          capture_output=True, text=True, timeout=120,
                          check=True)
    return done.stdout, done.stderr

  plain_out, plain_err = started("")
  if "unexpected worker hostname" not in plain_err:
    pytest.skip("this libtpu prints no worker-hostname block here")
  out, err = started(
      "from specdec_jax.terminal import console; console.setup(); "
      "print(len(console.startup_noise())); ")
  kept_aside = len(console.split_noise(plain_err)[1])
  assert out == f"{kept_aside}\n{plain_out}" and plain_out == "cpu\n"
  assert not console.split_noise(err)[1], err
  # The Python facade starts JAX as the commands do.
  out, err = started(
      "from specdec_jax import pairs; pairs.load_pair("
      "'pretrained/multi30k/target_38m', "
      "'pretrained/multi30k/draft_1m_distill_38m', "
      "'pretrained/multi30k/multi30k.model', compilation_cache=False); ")
  assert out == "cpu\n" and not console.split_noise(err)[1], err
