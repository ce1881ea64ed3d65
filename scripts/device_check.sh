#!/usr/bin/env bash
# The device check (issue 47; docs/usage/gpu.md; running it:
# docs/contributing/device_check.md): checks and measures the
# project on a lent GPU in one command, within 8 minutes, writing
# $OUT/device_check.json (after every phase) and $OUT/device_check.log.
#
#   scripts/device_check.sh            # on the GPU machine (the `run` call)
#   scripts/device_check.sh --small    # the same phases at tiny shapes (CPU)
#   scripts/device_check.sh --phases=env,paths   # only the decode paths
#   scripts/device_check.sh --path=packed        # every phase on that path
#   scripts/device_check.sh --tiles=default      # the GPU kernels' tiles
#
# Wheels carried in .whl/ (git-ignored through .git/info/exclude) are
# installed first, without network; the project itself is not installed:
# the repository goes on PYTHONPATH, and nothing it imports here needs
# gin, seqio or TensorFlow. PYTHON picks the interpreter (default python3,
# the GPU image's JAX); DEVICE_CHECK_TIMEOUT_S the hard limit (480 s; 1560 s
# with --small: a loaded 2-core CPU, the kernels interpreted).
# A bad DEVICE_CHECK_TIMEOUT_S or an OUT that cannot be a folder is one
# line and exit 2, before anything runs. The log is written under a
# temporary name and renamed at the end, unless the check refused to start
# (exit 2: a bad setting, or another check holding OUT): a refused second
# check never overwrites the first one's log.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
out="${OUT:-/tmp/specdec_jax/device_check}"
default_limit=480
for arg in "$@"; do
  [ "$arg" = --small ] && default_limit=1560
done
limit="${DEVICE_CHECK_TIMEOUT_S:-$default_limit}"
if ! [[ "$limit" =~ ^([0-9]+[.]?[0-9]*|[.][0-9]+)$ && "$limit" =~ [1-9] ]]; then
  echo "device_check: error: DEVICE_CHECK_TIMEOUT_S='$limit': allowed: a" \
    "number of seconds > 0 (unset: $default_limit)." >&2
  exit 2
fi
if ! mkdir -p "$out" 2>/dev/null || [ ! -d "$out" ] || [ ! -w "$out" ]; then
  echo "device_check: error: OUT='$out' is not a folder this user can" \
    "write (a file, or a path under one?); allowed: a folder, or a path" \
    "where one can be created." >&2
  exit 2
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  echo "[device_check] installing $(ls .whl/*.whl | wc -l) carried wheels" >&2
  "$python" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/device_check_site .whl/*.whl ||
    exit 1
  export PYTHONPATH="/tmp/device_check_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
log="$(mktemp "$out/.device_check.log.XXXXXX")" || exit 1
timeout -k 10 "$limit" \
  "$python" -m tools.device_check --out "$out" "$@" 2>&1 |
  tee "$log"
code="${PIPESTATUS[0]}"
if [ "$code" = 2 ]; then
  rm -f "$log"
else
  mv -f "$log" "$out/device_check.log"
fi
exit "$code"
