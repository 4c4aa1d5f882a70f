#!/usr/bin/env bash
# Fork of a running sandbox on a real node, through the kagent CLI, MCP and python3-grpcio:
# the forks see the source's /data and root changes (a file written under /var/tmp and a file
# of the image deleted there: a whiteout), later writes on either side stay on that side, N
# forks in one call, a replay with the same request id returns the same forks, another
# identity is refused (NOT_FOUND), a process running in the source keeps running (and
# counting) after the fork, and a count past the maximum is refused clearly.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
/usr/bin/python3 -c 'import grpc' 2>/dev/null || fail "python3-grpcio (Debian) is required"
node_prestart() { # a root directory the sandbox user may change, holding a file of the image
  mkdir -p "$WORK/tools-rootfs/var/tmp"
  chmod 0777 "$WORK/tools-rootfs/var/tmp"
  echo image > "$WORK/tools-rootfs/var/tmp/from-image"
}
node_start
node_apply_template forktest
k() { "$KAGENT" --api-url "$API" "$@"; }
json_ids() { python3 -c 'import json,sys; print(" ".join(s["id"] for s in json.load(sys.stdin)["sandboxes"]))'; }

src=$(k sandbox create forktest --request-id fork-src -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
k sandbox exec "$src" -- sh -c 'mkdir -p d/e && echo hello > d/e/f && ln -s d/e/f link && chmod 0640 d/e/f &&
  echo root-change > /var/tmp/written && rm /var/tmp/from-image' >/dev/null || fail "source setup"
# a counter running through the fork
k sandbox exec "$src" --wait=false -- sh -c 'i=0; while :; do i=$((i+1)); echo $i > c.tmp; mv c.tmp counter; sleep 0.01; done' >/dev/null
sleep 0.3
c0=$(k sandbox exec "$src" -- cat counter)

# 1. the CLI: one fork
k sandbox fork "$src" --request-id fork-1 -o json > "$WORK/f1.json" 2>"$WORK/f1.err" || fail "fork: $(cat "$WORK/f1.err")"
[ ! -s "$WORK/f1.err" ] || fail "fork wrote to a piped stderr: $(cat "$WORK/f1.err")"
f1=$(json_ids < "$WORK/f1.json")
[ "$(echo "$f1" | wc -w)" = 1 ] && [ "$f1" != "$src" ] || fail "fork ids: '$f1'"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["sandboxes"][0]; assert s["state"] == "RUNTIME_STATE_READY", s' "$WORK/f1.json" ||
  fail "fork not READY: $(cat "$WORK/f1.json")"
[ "$(k sandbox exec "$f1" -- cat d/e/f)" = hello ] || fail "the fork does not see /data"
[ "$(k sandbox exec "$f1" -- readlink link)" = d/e/f ] || fail "the fork's symlink"
[ "$(k sandbox exec "$f1" -- stat -c %a d/e/f)" = 640 ] || fail "the fork's mode"
[ "$(k sandbox exec "$f1" -- cat /var/tmp/written)" = root-change ] || fail "the fork does not see the root change"
k sandbox exec "$f1" -- test ! -e /var/tmp/from-image || fail "the fork sees a file the source deleted (whiteout lost)"
# the source's process runs on
c1=$(k sandbox exec "$src" -- cat counter); sleep 0.3; c2=$(k sandbox exec "$src" -- cat counter)
[ "$c2" -gt "$c1" ] && [ "$c1" -ge "$c0" ] || fail "the source's counter stopped after the fork ($c0 $c1 $c2)"
# the fork's copy of the counter file does not move (its processes were not copied)
a=$(k sandbox exec "$f1" -- cat counter); sleep 0.3; b=$(k sandbox exec "$f1" -- cat counter)
[ "$a" = "$b" ] || fail "the fork's counter file moves ($a -> $b)"
# later writes stay on their side
k sandbox exec "$src" -- sh -c 'echo src-later > later; echo src > d/e/f' >/dev/null
k sandbox exec "$f1" -- sh -c 'echo fork-later > forkonly' >/dev/null
k sandbox exec "$f1" -- test ! -e later || fail "the fork sees a later write of the source"
[ "$(k sandbox exec "$f1" -- cat d/e/f)" = hello ] || fail "the fork sees a later change of the source"
k sandbox exec "$src" -- test ! -e forkonly || fail "the source sees a write of the fork"

# 2. a replay returns the same fork; a count past the maximum is refused
[ "$(k sandbox fork "$src" --request-id fork-1 -o json | json_ids)" = "$f1" ] || fail "replay returned other ids"
set +e; k sandbox fork "$src" --request-id fork-x --count 17 >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] && grep -q "count must be between 1 and 16" "$WORK/err" || fail "count 17: $(cat "$WORK/err")"

# 3. gRPC (python3-grpcio): three forks in one call, replay, another identity refused
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
stubs=$(api_stubs)
py_ok=0
/usr/bin/python3 - "127.0.0.1:$PORT" "$stubs" "$src" > "$WORK/grpc.out" 2>"$WORK/grpc.err" <<'PY' || py_ok=$?
import sys
sys.path.insert(0, sys.argv[2])
import grpc
from kagent.api.v1 import runtime_pb2, sandboxes_pb2, sandboxes_pb2_grpc
chan = grpc.insecure_channel(sys.argv[1])
sbx = sandboxes_pb2_grpc.SandboxServiceStub(chan)
ME = (("x-user-id", "admin@kagent.dev"),)
OTHER = (("x-user-id", "mallory@example.com"),)
req = sandboxes_pb2.ForkSandboxRequest(sandbox_id=sys.argv[3], request_id="fork-3", count=3)
r = sbx.ForkSandbox(req, metadata=ME, timeout=120)
ids = [s.id for s in r.sandboxes]
assert len(ids) == 3 and len(set(ids)) == 3 and sys.argv[3] not in ids, ids
assert all(s.state == runtime_pb2.RUNTIME_STATE_READY and s.creator == "admin@kagent.dev"
           for s in r.sandboxes), r
again = sbx.ForkSandbox(req, metadata=ME, timeout=120)
assert [s.id for s in again.sandboxes] == ids, (ids, again)
for md in (OTHER,):
    try:
        sbx.ForkSandbox(sandboxes_pb2.ForkSandboxRequest(sandbox_id=sys.argv[3], request_id="evil", count=1),
                        metadata=md, timeout=60)
        raise AssertionError("another identity forked the sandbox")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
try:
    sbx.ForkSandbox(sandboxes_pb2.ForkSandboxRequest(sandbox_id="not-a-uuid", request_id="x"), metadata=ME)
    raise AssertionError("a bad id was accepted")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
print(" ".join(ids))
PY
[ $py_ok = 0 ] || fail "grpc: $(cat "$WORK/grpc.out" "$WORK/grpc.err")"
read -r -a three < "$WORK/grpc.out" || fail "grpc gave no ids: $(cat "$WORK/grpc.out" "$WORK/grpc.err")"
[ ${#three[@]} = 3 ] || fail "grpc ids: ${three[*]}"
for f in "${three[@]}"; do
  [ "$(k sandbox exec "$f" -- cat d/e/f)" = src ] || fail "fork $f of the second call does not see the source's /data at its call"
  k sandbox exec "$f" -- test -e later || fail "fork $f misses a file written before its call"
done
k sandbox exec "${three[0]}" -- sh -c 'echo only0 > mine' >/dev/null
k sandbox exec "${three[1]}" -- test ! -e mine || fail "forks of one call share their /data"

# 4. MCP's fork_sandbox
mcp() { curl -sS -m 120 -o "$WORK/mcp.out" -D "$WORK/mcp.hdr" -w '%{http_code}' -X POST \
  -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
  -H "x-user-id: ${MCP_USER:-admin@kagent.dev}" ${session:+-H "mcp-session-id: $session"} -d "$1" "$API/mcp"; }
mcp_session() {
  session=
  [ "$(mcp '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}')" = 200 ] ||
    fail "mcp initialize: $(cat "$WORK/mcp.out")"
  session=$(sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: *\([^\r]*\).*/\1/p' "$WORK/mcp.hdr")
  mcp '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
}
mcp_fork() { # REQUEST_ID -> the result as JSON {isError, content, text}
  [ "$(mcp "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"fork_sandbox\",\"arguments\":{\"sandbox_id\":\"$src\",\"request_id\":\"$1\",\"count\":2}}}")" = 200 ] ||
    fail "mcp fork_sandbox (session $session): $(cat "$WORK/mcp.out" "$WORK/mcp.hdr")"
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
mcp_session
mcp_fork fork-mcp > "$WORK/m.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["isError"] and len(d["content"]["sandboxes"]) == 2, d' "$WORK/m.json" ||
  fail "mcp fork_sandbox: $(cat "$WORK/m.json")"
m=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["content"]["sandboxes"][1]["id"])' "$WORK/m.json")
[ "$(k sandbox exec "$m" -- cat /var/tmp/written)" = root-change ] || fail "the MCP fork misses the root change"
MCP_USER=mallory@example.com
mcp_session
mcp_fork fork-evil > "$WORK/m.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["isError"] and "not found" in d["text"], d' "$WORK/m.json" ||
  fail "mcp fork by another identity: $(cat "$WORK/m.json")"

# 5. forks are sandboxes of their own: deleting the source leaves them
k sandbox delete "$src" >/dev/null
[ "$(k sandbox exec "$f1" -- cat d/e/f)" = hello ] || fail "the fork lost its /data with the source"
[ "$(k sandbox fork "$src" --request-id fork-1 -o json | json_ids)" = "$f1" ] || fail "replay after the source's delete"
set +e; k sandbox fork "$src" --request-id fork-late >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] && grep -q "sandbox not found" "$WORK/err" || fail "a new fork of a deleted sandbox: $(cat "$WORK/err")"
for f in $f1 "${three[@]}"; do k sandbox delete "$f" >/dev/null; done
node_stop
echo "PASS e2e_fork"
