#!/usr/bin/env bash
# Creates .venv at the repo root and installs tuner into it.
# torch is pinned and installed FIRST: with no torch present, a bare requirement would pull a multi-GB CUDA build.
# On a GPU host with its own torch, set TUNER_TORCH_SPEC="" (or to your pin) to keep the one you have.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
TORCH_SPEC=${TUNER_TORCH_SPEC-torch==2.13.0}
# pip's "Location ... is ignored" lines come from a find-links/index setting of some hosts, not from tuner: filtered.
quiet() { "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2); }
if [ -n "$TORCH_SPEC" ]; then
  quiet .venv/bin/python -m pip install -q "$TORCH_SPEC"
fi
quiet .venv/bin/python -m pip install -q -e ".[${1:-test}]"
