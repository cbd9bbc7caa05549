#!/usr/bin/env bash
# Installs tuner with its test extras into .venv (and the system packages the tests need) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/system-deps.sh ]; then scripts/system-deps.sh; fi
scripts/install.sh test
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-$HOME/.cache/tuner}
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
