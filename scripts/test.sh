#!/usr/bin/env bash
# Installs tuner with its test extras into .venv and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh test
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-$HOME/.cache/tuner}
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
