#!/usr/bin/env bash
# The node owns its embedded PostgreSQL: kill -9 of the postmaster makes /readyz say 503 (not
# 200 while every create fails), the node starts the database again by itself, /readyz comes
# back to 200 and creates work again; the sandbox created before is still there.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', ''))"; }
ready() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$API/readyz"; }

[ "$(ready)" = 200 ] || fail "/readyz is $(ready) before the kill"
before=$(k sandbox create scratch --request-id before -o json | field id)
pidfile=$STATE/postgres/data/postmaster.pid
[ -s "$pidfile" ] || fail "no postmaster.pid at $pidfile (is the database embedded?)"
pm=$(head -1 "$pidfile")
kill -KILL "$pm"
t0=$(date +%s%N)
seen503=
for _ in $(seq 100); do
  code=$(ready)
  [ "$code" = 503 ] && { seen503=1; break; }
  # the watch may restart the database before a probe sees it down; a new postmaster counts
  [ -s "$pidfile" ] && [ "$(head -1 "$pidfile")" != "$pm" ] && kill -0 "$(head -1 "$pidfile")" 2>/dev/null && break
  sleep 0.05
done
for _ in $(seq 300); do
  [ "$(ready)" = 200 ] && [ -s "$pidfile" ] && [ "$(head -1 "$pidfile")" != "$pm" ] && break
  sleep 0.1
done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$(ready)" = 200 ] || fail "/readyz is $(ready) $ms ms after the postmaster was killed"
new=$(head -1 "$pidfile")
[ "$new" != "$pm" ] && kill -0 "$new" || fail "the database was not started again"
grep -q 'event=database_down' "$WORK/node.log" || fail "no database_down in the log"
grep -q 'event=database_restarted' "$WORK/node.log" || fail "no database_restarted in the log"
after=""
for _ in $(seq 50); do
  after=$(k sandbox create scratch --request-id after -o json 2>/dev/null | field id) && [ -n "$after" ] && break
  sleep 0.2
done
[ -n "$after" ] || fail "create after the restart failed"
[ "$(k sandbox get "$before" -o json | field state)" = RUNTIME_STATE_READY ] ||
  fail "the sandbox created before is $(k sandbox get "$before" -o json | field state)"
k sandbox delete "$before" >/dev/null
k sandbox delete "$after" >/dev/null
node_stop
echo "PASS db_supervised (503 seen: ${seen503:-no, restarted first}; ready again after $ms ms)"
