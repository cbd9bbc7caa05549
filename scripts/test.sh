#!/usr/bin/env bash
# Installs tuner with its test extras into .venv (and the system packages the tests need) and runs the whole suite.
# Arguments go to pytest (scripts/test.sh tests/api -x).
set -euo pipefail
cd "$(dirname "$0")/.."
# TUNER_TEST_INSTALL=0 skips both installs (.ci/run has just done them; tests/test_test_command.py runs this script
# inside an installed suite, where a reinstall would remap the venv's editable tuner to wherever it runs).
if [ "${TUNER_TEST_INSTALL:-1}" != 0 ]; then
  if [ -x scripts/system-deps.sh ]; then scripts/system-deps.sh; fi
  scripts/install.sh test
fi
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-$HOME/.cache/tuner}
# PostgreSQL: the server at TUNER_TEST_PG_ADMIN (127.0.0.1:5432 by default: CI's) when one answers, else a throwaway
# cluster of our own for this run, stopped and removed at the end.
admin=${TUNER_TEST_PG_ADMIN:-postgresql://postgres@127.0.0.1:5432/postgres}
if [ "${TUNER_TEST_POSTGRES:-}" != skip ] && ! .venv/bin/python -c \
    'import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=3).close()' "$admin" 2>/dev/null; then
  echo "test: no PostgreSQL answers at $admin; starting a throwaway cluster (scripts/throwaway-pg.sh)" >&2
  exports=$(scripts/throwaway-pg.sh start) || exit 2
  eval "$exports"
  trap 'scripts/throwaway-pg.sh stop "$TUNER_THROWAWAY_PG"' EXIT
fi
# The venv through its real path: where .venv is a symlink (a worktree sharing another checkout's venv) the `tuner`
# entry script's shebang names the real path while .venv/bin/python would name the link, and torch's JIT writes the
# path it was started from into each op's build.ninja, so probes started both ways rebuilt cpu_adam and shm comm
# in turns (minutes each, inside budgeted searches). A plain .venv directory resolves to itself.
# Three workers (TUNER_TEST_WORKERS; 0 runs in one process): most of the suite's time is e2e tests waiting on probe
# ranks, servers, heartbeats and timeouts, which overlap well even on 2 cores (the whole suite on the 2-core host:
# 34.5 min on 3 workers, 48.0 min on 2 with a table recording beside it).
"$(cd .venv && pwd -P)/bin/python" -m pytest -q -p no:cacheprovider --durations=25 \
  --numprocesses "${TUNER_TEST_WORKERS:-3}" --dist worksteal "$@"
