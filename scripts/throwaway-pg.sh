#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the test suite, for a machine where no server answers (a laptop, a fresh VM):
#   eval "$(scripts/throwaway-pg.sh start)"   # initdb in a temp dir, a free port on 127.0.0.1, trust auth for postgres;
#                                             # prints the exports TUNER_TEST_PG_ADMIN and TUNER_THROWAWAY_PG
#   scripts/throwaway-pg.sh stop "$TUNER_THROWAWAY_PG"   # stops it and removes the directory
# scripts/test.sh uses it only when nothing answers at TUNER_TEST_PG_ADMIN; a running server (CI) is used as it is.
# Needs Debian's postgresql package (scripts/system-deps.sh installs it). As root, the server runs as user postgres.
set -euo pipefail

pg_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    if [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null; then dirname "$(command -v initdb)"; return 0; fi
  echo "throwaway-pg: no initdb here; install the postgresql package (scripts/system-deps.sh does, as root)" >&2
  return 2
}

as_owner() {  # initdb and postgres refuse to run as root
  if [ "$(id -u)" -eq 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
      echo "throwaway-pg: running as root needs the system user 'postgres' (the postgresql package creates it)" >&2
      exit 2
    fi
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "${1:-}" in
  start)
    bin=$(pg_bin)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/tuner-pg.XXXXXX")
    if [ "$(id -u)" -eq 0 ]; then
      chown postgres "$dir"
      if ! runuser -u postgres -- test -x "$dir"; then
        rm -rf "$dir"
        echo "throwaway-pg: user postgres cannot reach $(dirname "$dir"); point TMPDIR at a directory it can" >&2
        exit 2
      fi
    fi
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-instructions >"$dir/initdb.log" 2>&1 \
      || { echo "throwaway-pg: initdb failed; see $dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null \
      || { echo "throwaway-pg: the server did not start; see $dir/server.log" >&2; exit 1; }
    echo "export TUNER_TEST_PG_ADMIN=postgresql://postgres@127.0.0.1:$port/postgres TUNER_THROWAWAY_PG=$dir"
    ;;
  stop)
    dir=${2:?usage: throwaway-pg.sh stop DIR}
    case "$dir" in */tuner-pg.*) ;; *) echo "throwaway-pg: $dir is not a throwaway cluster" >&2; exit 2 ;; esac
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_owner "$(pg_bin)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null || true
    fi
    rm -rf "$dir"
    ;;
  *)
    echo "usage: scripts/throwaway-pg.sh start | stop DIR" >&2
    exit 2
    ;;
esac
