#!/usr/bin/env bash
# Runs the test suite in the project's virtual environment (created or reused); GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(scripts/setup-venv.sh problems,dsl,dev,agent,ray | tail -n 1)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # smoke-size tensors gain nothing from threads; avoids oversubscription
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
