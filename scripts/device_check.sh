#!/usr/bin/env bash
# The device check (issue 47; docs/usage/gpu.md): checks and measures the
# project on a lent GPU in one command, within 8 minutes, writing
# $OUT/device_check.json (after every phase) and $OUT/device_check.log.
#
#   scripts/device_check.sh            # on the GPU machine (the `run` call)
#   scripts/device_check.sh --small    # the same phases at tiny shapes (CPU)
#
# Wheels carried in .whl/ (git-ignored through .git/info/exclude) are
# installed first, without network; the project itself is not installed:
# the repository goes on PYTHONPATH, and nothing it imports here needs
# gin, seqio or TensorFlow. PYTHON picks the interpreter (default python3,
# the GPU image's JAX); DEVICE_CHECK_TIMEOUT_S the hard limit (480 s).
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
out="${OUT:-/tmp/specdec_jax/device_check}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  echo "[device_check] installing $(ls .whl/*.whl | wc -l) carried wheels" >&2
  "$python" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/device_check_site .whl/*.whl ||
    exit 1
  export PYTHONPATH="/tmp/device_check_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
timeout -k 10 "${DEVICE_CHECK_TIMEOUT_S:-480}" \
  "$python" -m specdec_jax.device_check --out "$out" "$@" 2>&1 |
  tee "$out/device_check.log"
exit "${PIPESTATUS[0]}"
