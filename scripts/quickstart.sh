#!/usr/bin/env bash
# Installs tuner into .venv and runs a short search of the built-in tiny T5 on this machine (CPU or GPUs), on the
# embedded SQLite storage, with a small emulated device memory so that the largest micro batches really run out of it;
# then lists the best probes and prints the best config as DeepSpeed JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh test
.venv/bin/tuner prepare   # one-off DeepSpeed op compiles, outside the search budget
.venv/bin/tuner search --budget "${BUDGET:-2m}" --study quickstart --device-memory "${DEVICE_MEMORY:-160MiB}" "$@"
.venv/bin/tuner trials --study quickstart --top 3   # --all: every trial, ruled-out ones too
.venv/bin/tuner best --study quickstart --format deepspeed
