#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment and installs mkb with the given extras.
# usage: scripts/setup-venv.sh EXTRAS        e.g. scripts/setup-venv.sh problems,dev
# MKB_VENV (default .venv) and MKB_TORCH (default torch==2.13.0; "skip" to keep what is there) override.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MKB_VENV:-.venv}"
extras="${1:-problems,dev}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
torch_spec="${MKB_TORCH:-torch==2.13.0}"
if [ "$torch_spec" != skip ] && ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  "$venv/bin/python" -m pip install -q "$torch_spec"
fi
"$venv/bin/python" -m pip install -q -e ".[$extras]"
echo "$venv"
