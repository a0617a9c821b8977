#!/usr/bin/env bash
# Installs headrace into .venv (idempotent) and runs the demo: no arguments, no network needed after install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/python -m pip install -q -e ".[demo]"
exec .venv/bin/python -m headrace.demo "$@"
