#!/usr/bin/env bash
# The environment of `make test-scale`: SkyRL's Tinker server (JAX backend, CPU) in its own uv
# project, scripts/skyrl-server/.venv (Python 3.12, ~6 GB: SkyRL pulls torch with CUDA libraries
# through peft; about 1-2 min from PyPI), and uv itself in the main venv.
set -euo pipefail
VENV_PY="${1:-.venv/bin/python}"

"$VENV_PY" -m pip install -q "uv>=0.5"
UV="$(dirname "$VENV_PY")/uv"

# Python 3.12: on PATH, or a pyenv install, else uv's own managed one (needs its download host).
PY312=""
if command -v python3.12 >/dev/null 2>&1 && python3.12 --version >/dev/null 2>&1; then
    PY312="$(command -v python3.12)"
elif command -v pyenv >/dev/null 2>&1; then
    for candidate in "$(pyenv root)"/versions/3.12*/bin/python3.12; do
        if [ -x "$candidate" ]; then PY312="$candidate"; fi
    done
fi
PY312="${PY312:-3.12}"

"$UV" sync -q --project scripts/skyrl-server --python "$PY312" --extra tinker --extra jax
echo "SkyRL Tinker server environment ready: scripts/skyrl-server/.venv ($("$UV" run --project scripts/skyrl-server --no-sync python --version))"
