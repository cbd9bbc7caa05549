#!/usr/bin/env bash
# Lint, format and type checks (configured in pyproject.toml); .ci/run runs them before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
