#!/usr/bin/env bash
# The checks that .ci/run runs before the tests: ruff's linter, ruff's
# formatter (--check: it changes nothing) and mypy on the core, all
# configured in pyproject.toml. Installed by the `test` extra. Runs every
# check and fails if any failed. CHECK_FORMAT=0 skips the format check.
#
#   scripts/check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
python -m ruff check . || failed+=("ruff check")
if [[ "${CHECK_FORMAT:-1}" != 0 ]]; then
  # Names the files; `python -m ruff format --diff FILE` shows the changes.
  python -m ruff format --check --output-format concise . ||
    failed+=("ruff format --check")
fi
python -m mypy || failed+=("mypy")
if (( ${#failed[@]} )); then
  names=$(printf '%s; ' "${failed[@]}")
  echo "scripts/check.sh: failed: ${names%; }" >&2
  exit 1
fi
