#!/usr/bin/env bash
# Runs the test suite in the project's virtual environment (created or reused); GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(scripts/setup-venv.sh problems,dev | tail -n 1)
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
