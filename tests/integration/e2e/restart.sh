#!/usr/bin/env bash
# kill -9 of the node with live, suspended and expiring sandboxes, then a restart: every record
# is still there; the live sandbox whose compute died comes back SUSPENDED with the reason
# ComputeLost and its /data kept (a crash loses no acknowledged write: a resume boots it again
# on it); the suspended one resumes with its /data; the one that expired while the node was down
# is deleted; TTLs of the others are re-armed (the same expires_at).
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', ''))"; }

live=$(k sandbox create scratch --request-id live -o json | field id)
susp=$(k sandbox create scratch --request-id susp -o json | field id)
short=$(k sandbox create scratch --request-id short --ttl 3s -o json | field id)
live_exp=$(k sandbox get "$live" -o json | field expiresAt)
k sandbox exec "$susp" -- sh -c 'echo kept > /data/workspace/k.txt' >/dev/null 2>&1 || fail "exec"
k sandbox exec "$live" -- sh -c 'echo acked > /data/workspace/live.txt' >/dev/null 2>&1 || fail "exec"
k sandbox suspend "$susp" | grep RUNTIME_STATE_SUSPENDED >/dev/null || fail "suspend"

kill -KILL "$NODE_PID"
wait "$NODE_PID" 2>/dev/null || true
sleep 4 # `short` expires while the node is down

node_restart

state() { k sandbox get "$1" -o json | field state; }
settled() { k sandbox get "$1" -o json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('state',''), d.get('operation','RUNTIME_OPERATION_NONE'))"; }
for _ in $(seq 100); do [ "$(settled "$live")" = "RUNTIME_STATE_SUSPENDED RUNTIME_OPERATION_NONE" ] && break; sleep 0.1; done
[ "$(state "$live")" = RUNTIME_STATE_SUSPENDED ] || fail "live sandbox is $(state "$live"), want SUSPENDED"
k sandbox get "$live" -o json | grep ComputeLost >/dev/null || fail "no ComputeLost reason"
[ "$(k sandbox get "$live" -o json | field expiresAt)" = "$live_exp" ] || fail "expiry changed"
for _ in $(seq 100); do [ "$(state "$short")" = RUNTIME_STATE_DELETED ] && break; sleep 0.1; done
[ "$(state "$short")" = RUNTIME_STATE_DELETED ] || fail "expired sandbox is $(state "$short")"
[ "$(state "$susp")" = RUNTIME_STATE_SUSPENDED ] || fail "suspended sandbox is $(state "$susp")"
k sandbox resume "$susp" | grep RUNTIME_STATE_READY >/dev/null || fail "resume after restart"
out=$(k sandbox exec "$susp" -- cat /data/workspace/k.txt 2>"$WORK/exec.err")
[ "$out" = kept ] || fail "/data lost across the restart: '$out' ($(cat "$WORK/exec.err"))"
k sandbox list | grep "$live" >/dev/null || fail "record lost"
k sandbox resume "$live" | grep RUNTIME_STATE_READY >/dev/null || fail "resume of the lost sandbox"
[ "$(k sandbox get "$live" -o json | field expiresAt)" = "$live_exp" ] || fail "resume changed the expiry"
out=$(k sandbox exec "$live" -- cat /data/workspace/live.txt 2>"$WORK/exec.err")
[ "$out" = acked ] || fail "the crash lost /data: '$out' ($(cat "$WORK/exec.err"); ls -la:
$(k sandbox exec "$live" -- ls -la /data/workspace 2>&1))"
k sandbox delete "$live" | grep RUNTIME_STATE_DELETED >/dev/null || fail "delete the resumed sandbox"
k sandbox delete "$susp" >/dev/null
node_stop
echo "PASS restart"
