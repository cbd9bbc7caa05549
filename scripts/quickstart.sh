#!/usr/bin/env bash
# Installs tuner into .venv and runs a short search of the built-in tiny T5 on this machine (CPU or GPUs), on the
# embedded SQLite storage, with a small emulated device memory so that the largest micro batches really run out of it;
# then lists the best probes and prints the best config as DeepSpeed JSON.
# BUDGET=10m DEVICE_MEMORY=256MiB change its size; TUNER_QUICKSTART_INSTALL=0 skips the install (the docs' test runs
# the rest in an installed environment: tests/docs/test_docs_commands.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TUNER_QUICKSTART_INSTALL:-1}" != 0 ]; then scripts/install.sh test; fi
.venv/bin/tuner prepare   # one-off DeepSpeed op compiles, outside the search budget
# 160 MiB of emulated device on a CPU; a 2 GiB share of the card on a GPU host (its CUDA context alone is more than
# 160 MiB), where the largest buckets still run out of memory (tuner.probing.gpus.quickstart_device_memory)
memory=$(.venv/bin/python -c "from tuner.probing.gpus import *; print(quickstart_device_memory(physical_gpus(), host_visible_devices()[0]))")
.venv/bin/tuner search --budget "${BUDGET:-2m}" --study quickstart --device-memory "${DEVICE_MEMORY:-$memory}" "$@"
.venv/bin/tuner trials --study quickstart --top 3   # --all: every trial, ruled-out ones too
.venv/bin/tuner export --study quickstart --format deepspeed
