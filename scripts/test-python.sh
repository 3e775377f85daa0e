#!/usr/bin/env bash
# The Python package's checks: builds (or reuses) its virtual environment
# (scripts/python-venv.sh), runs mypy --strict on the package, its tests and
# examples, then pytest against the PostgreSQL named by
# ONCEFLOW_TEST_DATABASE_URL (the Makefile starts it with scripts/services.sh).
# Arguments go to pytest.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$repo/scripts/python-venv.sh")
cd "$repo/python"
"$venv/bin/mypy"
exec "$venv/bin/python" -m pytest -q "$@"
