#!/usr/bin/env bash
# The GPU's decode programs compiled here for an H200, with no GPU or
# driver (docs/usage/gpu.md#compile-for-a-gpu-on-this-machine). JAX's CUDA
# plugin, at the installed jax's version and without CUDA's libraries, goes
# into a virtual environment of its own (.venv-gpu-aot: in the project's
# own, every JAX process would try to start CUDA), which sees the active
# environment's packages; then, in it:
#
#   scripts/gpu_aot.sh [FLAGS]          # python -m tools.benchmarks.gpu_aot
#   scripts/gpu_aot.sh pytest [ARGS]    # python -m pytest -q -n 0 ARGS (CI)
#
# Run it with the project's environment active (python: its interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
base="$(python -c 'import site; print(site.getsitepackages()[0])')"
version="$(python -c 'import jax; print(jax.__version__)')"
venv="$(pwd)/.venv-gpu-aot"
if ! "$venv/bin/python" -c "import jax_plugins.xla_cuda13" 2>/dev/null \
    || [[ "$("$venv/bin/python" -c 'import jax; print(jax.__version__)')" \
          != "$version" ]]; then
  rm -rf "$venv"
  python -m venv "$venv"
  site="$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  # addsitedir, not a plain path: the base's .pth files (the editable
  # install of specdec_jax) are read too.
  echo "import site; site.addsitedir('$base')" > "$site/base_venv.pth"
  "$venv/bin/python" -m pip install -q "jax-cuda13-plugin==$version"
fi
if [[ "${1:-}" == "pytest" ]]; then
  exec "$venv/bin/python" -m pytest -q -n 0 "${@:2}"
fi
exec "$venv/bin/python" -m tools.benchmarks.gpu_aot "$@"
