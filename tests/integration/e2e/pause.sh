#!/usr/bin/env bash
# Pause and unpause on a real node (the cgroup freezer: v2 cgroup.freeze, or v1's freezer
# hierarchy): a busy loop counting in /data stops counting and uses no CPU (its cgroup's
# cpu.stat usage_usec, v1 cpuacct.usage) while paused, exec and file calls
# are refused with one clear error, suspend too; after unpause the same process counts on from
# where it stopped. The same through MCP's pause_sandbox / unpause_sandbox. Delete of a paused
# sandbox removes it and its cgroup.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then V2=1; else V2=
  [ -d /sys/fs/cgroup/freezer ] && [ -d /sys/fs/cgroup/cpuacct ] || fail "cgroup v1 without the freezer or cpuacct hierarchy"
fi
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }

id=$(k sandbox create scratch --request-id pause-test -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
cgdir() { find "/sys/fs/cgroup/$1" -type d -name "$id" 2>/dev/null | head -1 || true; }
if [ -n "$V2" ]; then cg=$(cgdir .); frz=$cg; acct=$cg; else cg=$(cgdir pids); frz=$(cgdir freezer); acct=$(cgdir cpuacct); fi
[ -n "$cg" ] && [ -n "$frz" ] && [ -n "$acct" ] || fail "no cgroup dirs for $id (procs '$cg' freezer '$frz' cpu '$acct')"
frozen() { if [ -n "$V2" ]; then grep -q '^frozen 1' "$frz/cgroup.events"; else grep -qx FROZEN "$frz/freezer.state"; fi; }
# the counter: a busy loop renaming each value into place (a reader never sees a partial file)
k sandbox exec "$id" --wait=false -- sh -c 'echo $$ > pid; i=0; while :; do i=$((i+1)); echo $i > c.tmp; mv c.tmp counter; done' >/dev/null
sleep 0.5
pid=$(k sandbox exec "$id" -- cat pid 2>/dev/null)
[[ $pid =~ ^[0-9]+$ ]] || fail "no pid from the counter: '$pid'"
hostpid() { # the counter as the host sees it: the task in the cgroup whose cmdline is the loop
  for p in $(cat "$cg/cgroup.procs"); do
    if tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" | grep 'mv c.tmp counter' >/dev/null; then
      grep -q "^NSpid:.*[[:space:]]$pid\$" "/proc/$p/status" && { echo "$p"; return; }
    fi
  done
}
hp=$(hostpid)
[ -n "$hp" ] || fail "the counter's process is not in the sandbox's cgroup"
counter() { cat "/proc/$hp/root/data/workspace/counter"; } # readable while frozen
usage() { # cpu time used, in us
  if [ -n "$V2" ]; then awk '$1 == "usage_usec" {print $2}' "$acct/cpu.stat"; else echo $(($(cat "$acct/cpuacct.usage") / 1000)); fi
}
c0=$(counter)
# it counts before anything is paused (a loop of fork+exec under a CPU quota can stall for a
# quota period: wait for a step rather than assume one in the next few calls)
for _ in $(seq 100); do [ "$(counter)" -gt "$c0" ] && break; sleep 0.1; done
[ "$(counter)" -gt "$c0" ] || fail "the counter never counted"

check_paused() { # WHAT: frozen, not counting, no CPU, calls refused
  frozen || fail "$1: cgroup not frozen"
  local a u1 b u2
  a=$(counter); u1=$(usage); sleep 1; b=$(counter); u2=$(usage)
  [ "$a" = "$b" ] || fail "$1: the counter advanced while paused ($a -> $b)"
  [ $((u2 - u1)) -lt 5000 ] || fail "$1: the cgroup used $((u2 - u1)) us of CPU in 1 s paused"
  set +e; k sandbox exec "$id" -- true >/dev/null 2>"$WORK/err"; rc=$?; set -e
  [ $rc != 0 ] && grep -q "FailedPrecondition.*sandbox is paused; unpause it first\|sandbox is paused; unpause it first" "$WORK/err" ||
    fail "$1: exec while paused: rc=$rc $(cat "$WORK/err")"
  set +e; k sandbox download "$id" counter "$WORK/x" >/dev/null 2>"$WORK/err"; rc=$?; set -e
  [ $rc != 0 ] && grep -q "sandbox is paused; unpause it first" "$WORK/err" || fail "$1: download while paused: $(cat "$WORK/err")"
  set +e; k sandbox suspend "$id" >/dev/null 2>"$WORK/err"; rc=$?; set -e
  [ $rc != 0 ] && grep -q "sandbox is paused; unpause it first" "$WORK/err" || fail "$1: suspend while paused: $(cat "$WORK/err")"
  PAUSED_AT=$b
}
check_counting() { # WHAT: thawed, the same process counting on from where it stopped
  frozen && fail "$1: cgroup still frozen"
  sleep 0.3
  local c
  c=$(counter)
  [ "$c" -gt "$PAUSED_AT" ] || fail "$1: the counter did not advance after unpause ($PAUSED_AT -> $c)"
  [ "$(hostpid)" = "$hp" ] || fail "$1: the counter's process changed"
  [ "$(k sandbox exec "$id" -- cat pid 2>/dev/null)" = "$pid" ] || fail "$1: pid file changed"
  k sandbox exec "$id" -- kill -0 "$pid" 2>/dev/null || fail "$1: pid $pid is gone in the sandbox"
}

# 1. the CLI (gRPC kagent.runtime.v1 PauseSandbox / UnpauseSandbox)
set +e; k sandbox unpause "$id" >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] && grep -q "the sandbox is not paused" "$WORK/err" || fail "unpause of a running sandbox: $(cat "$WORK/err")"
k sandbox pause "$id" > "$WORK/out" || fail "pause: $(cat "$WORK/out")"
grep -q "RUNTIME_STATE_READY" "$WORK/out" && grep -q "^paused: yes" "$WORK/out" || fail "pause output: $(cat "$WORK/out")"
k sandbox pause "$id" -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["paused"] is True and d["sandbox"]["guest"].get("processExecution", False) is False, d' ||
  fail "pause again (json): not paused"
k sandbox get "$id" -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["state"] == "RUNTIME_STATE_READY" and not d["guest"].get("processExecution", False), d' ||
  fail "get of a paused sandbox: guest capabilities not off"
check_paused cli
k sandbox unpause "$id" | grep "^paused: no" >/dev/null || fail "unpause output"
check_counting cli

# 2. MCP's tools (same identity as the CLI's default)
mcp() { curl -sS -m 10 -o "$WORK/mcp.out" -D "$WORK/mcp.hdr" -w '%{http_code}' -X POST \
  -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
  -H 'x-user-id: admin@kagent.dev' ${session:+-H "mcp-session-id: $session"} -d "$1" "$API/mcp"; }
session=
[ "$(mcp '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}')" = 200 ] ||
  fail "mcp initialize: $(cat "$WORK/mcp.out")"
session=$(sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: *\([^\r]*\).*/\1/p' "$WORK/mcp.hdr")
[ -n "$session" ] || fail "no Mcp-Session-Id"
mcp '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
tool() { # NAME -> the tool result's structured content (JSON) on stdout
  [ "$(mcp "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"$1\",\"arguments\":{\"sandbox_id\":\"$id\"}}}")" = 200 ] ||
    fail "mcp $1: $(cat "$WORK/mcp.out")"
  python3 - "$WORK/mcp.out" <<'PY'
import json, sys
raw = open(sys.argv[1]).read()
if raw.lstrip().startswith("event:") or raw.lstrip().startswith("data:"):
    raw = [l[5:] for l in raw.splitlines() if l.startswith("data:")][-1]
r = json.loads(raw)["result"]
print(json.dumps({"isError": r.get("isError", False), "content": r.get("structuredContent"),
                  "text": r["content"][0].get("text", "") if r.get("content") else ""}))
PY
}
tool pause_sandbox > "$WORK/t.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["isError"] and d["content"]["paused"] is True, d' "$WORK/t.json" ||
  fail "mcp pause_sandbox: $(cat "$WORK/t.json")"
check_paused mcp
tool get_sandbox > "$WORK/t.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["content"]["paused"] is True, d' "$WORK/t.json" ||
  fail "mcp get_sandbox of a paused sandbox: $(cat "$WORK/t.json")"
tool unpause_sandbox > "$WORK/t.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["isError"] and d["content"]["paused"] is False, d' "$WORK/t.json" ||
  fail "mcp unpause_sandbox: $(cat "$WORK/t.json")"
check_counting mcp
tool unpause_sandbox > "$WORK/t.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["isError"] and "not paused" in d["text"], d' "$WORK/t.json" ||
  fail "mcp unpause of a running sandbox: $(cat "$WORK/t.json")"

# 3. delete while paused: gone, with its cgroup
k sandbox pause "$id" >/dev/null
k sandbox delete "$id" | grep RUNTIME_STATE_DELETED >/dev/null || fail "delete of a paused sandbox"
for d in "$cg" "$frz" "$acct"; do [ ! -d "$d" ] || fail "the paused sandbox's cgroup $d is left behind"; done
kill -0 "$hp" 2>/dev/null && fail "the counter's process $hp outlived the delete"

node_stop
echo "PASS pause"
