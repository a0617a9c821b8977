#!/usr/bin/env bash
# Installs everything the test suite needs into .venv (idempotent) and runs ruff, mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# The real loaderx 0.4.1 wheel, which tests/test_loaderx_wheel.py compares headrace.loaderx with.
# It declares Requires-Python ==3.13 but runs on 3.11 (--ignore-requires-python); its run-time
# imports (numpy, blosc2, cffi) are in the test extra, so --no-deps keeps pip from resolving
# anything else for it.
.venv/bin/python -m pip install -q --no-deps --ignore-requires-python loaderx==0.4.1
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
