#!/usr/bin/env bash
# kill -9 of a writer in the middle of a write burst: afterwards every acknowledged create is
# in the database, no row is half-written (each create is one transaction of an insert and an
# update), and a restarted writer replaying the same request ids gets the same sandboxes back
# without creating any of the acknowledged ones again. Runs under tests/with-pg.
set -euo pipefail
W=${KAGENT_BUILD_DIR:?}/tests/integration/store/store_writer
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "crash_kill9: FAIL: $*" >&2; exit 1; }
ackre='^ACK req-[0-9]+ [0-9a-f-]{36} [01]$'

: >"$tmp/run1" # before the poll below: the background redirect opens it only in the child
"$W" burst crash 0 1000000 64 >"$tmp/run1" 2>"$tmp/err1" &
pid=$!
for _ in $(seq 1 400); do
  n=$(grep -cE "$ackre" "$tmp/run1") || [ $? = 1 ] # 1: no line yet (n=0); 2: an error
  [ "$n" -ge 500 ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/err1" >&2; fail "writer exited early"; }
  sleep 0.05
done
kill -9 "$pid"
rc=0; wait "$pid" 2>/dev/null || rc=$?
[ "$rc" = 137 ] || fail "the writer ended with status $rc, not 137 (our kill -9)"
pid=
grep -E "$ackre" "$tmp/run1" | awk '{print $2, $3}' | sort >"$tmp/acked"
acked=$(wc -l <"$tmp/acked")
[ "$acked" -ge 500 ] || fail "only $acked acknowledged writes before the kill"

psql -Atqc "SELECT request_id || ' ' || id FROM ka_sandboxes WHERE creator = 'crash'
            AND state = 'RUNTIME_STATE_READY' AND node = 'writer'" | sort >"$tmp/db"
missing=$(comm -23 "$tmp/acked" "$tmp/db" | wc -l)
[ "$missing" -eq 0 ] || fail "$missing acknowledged writes are missing"
partial=$(psql -Atqc "SELECT count(*) FROM ka_sandboxes WHERE creator = 'crash'
                      AND (state <> 'RUNTIME_STATE_READY' OR node <> 'writer')")
[ "$partial" -eq 0 ] || fail "$partial half-written rows"

# restart: replay every request id the killed writer can have issued (it keeps at most 64 in
# flight, issued in order, so none beyond the last acknowledged one + 64; 200 for margin)
last=$(awk '{sub("req-", "", $1); print $1}' "$tmp/acked" | sort -n | tail -1)
n=$((last + 200))
"$W" burst crash 0 "$n" 32 >"$tmp/run2" 2>"$tmp/err2" || { cat "$tmp/err2" >&2; fail "replay failed"; }
grep -E "$ackre" "$tmp/run2" | awk '{print $2, $3, $4}' | sort >"$tmp/replay"
[ "$(wc -l <"$tmp/replay")" -eq "$n" ] || fail "replay did not complete"
# every acknowledged request: same id, not created again
join "$tmp/acked" "$tmp/replay" | awk '$2 != $3 || $4 != 0 {bad++} END {exit bad > 0}' ||
  fail "a replayed request returned another sandbox or created a duplicate"
# one row per request id, whether written before the kill or by the replay
rows=$(psql -Atqc "SELECT count(*) FROM ka_sandboxes WHERE creator = 'crash'")
[ "$rows" -eq "$n" ] || fail "$rows rows for $n request ids"
echo "crash_kill9: ok: $acked acknowledged before kill -9, all present, no partial rows, replay idempotent"
