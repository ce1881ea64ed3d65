#!/usr/bin/env bash
# The checks that .ci/run runs before the tests: ruff's linter, the
# formatter yapf (--diff: it changes nothing) and mypy on the core, all
# configured in pyproject.toml. Installed by the `test` extra. Runs every
# check and fails if any failed. `python -m yapf -i -r -p specdec_jax
# tools tests` formats the code.
#
#   scripts/check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
python -m ruff check . || failed+=("ruff check")
# Prints the changes yapf would make (none: the check passes).
python -m yapf --diff --recursive --parallel specdec_jax tools tests ||
  failed+=("yapf --diff")
python -m mypy || failed+=("mypy")
if (( ${#failed[@]} )); then
  names=$(printf '%s; ' "${failed[@]}")
  echo "scripts/check.sh: failed: ${names%; }" >&2
  exit 1
fi
