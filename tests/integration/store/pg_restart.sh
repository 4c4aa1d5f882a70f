#!/usr/bin/env bash
# PostgreSQL restarted (immediate mode: a crash and recovery) under load: in-flight requests
# fail with UNAVAILABLE instead of hanging, and the engine reconnects by itself and serves
# again. store_writer checks the outcome. Runs under tests/with-pg (PG_BASE is its cluster).
set -euo pipefail
W=${KAGENT_BUILD_DIR:?}/tests/integration/store/store_writer
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
RUN=()
[ "$(id -u)" = 0 ] && RUN=(runuser -u postgres --)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$W" load 5 32 >"$out" 2>&1 &
pid=$!
sleep 1
"${RUN[@]}" "$PGBIN/pg_ctl" -D "${PG_BASE:?}/data" restart -m immediate -w -t 30 >/dev/null
rc=0
wait "$pid" || rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "pg_restart: FAIL (writer exit $rc)" >&2; exit 1; }
echo "pg_restart: ok"
