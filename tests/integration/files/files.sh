#!/usr/bin/env bash
# The Files API end to end against a real kagentd: gRPC (python3-grpcio, test_files_grpc.py),
# then the same sandbox through MCP over HTTP (curl) and the kagent CLI.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
command -v curl >/dev/null || node_fail "curl is required"
api_node filestest
sid=$(/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/files/test_files_grpc.py" \
  "127.0.0.1:$PORT" "$stubs" filestest | tail -1)
echo "gRPC: ok ($sid)"

# ---- MCP over HTTP (curl): the five tools on the same sandbox -----------------------------
MCP_N=0
mcp() { # mcp TOOL ARGS_JSON: the CallToolResult, on stdout
  MCP_N=$((MCP_N + 1))
  curl -sS --fail-with-body -X POST -H 'content-type: application/json' \
    -H 'accept: application/json' -H 'x-user-id: alice@example.com' \
    -d "{\"jsonrpc\":\"2.0\",\"id\":$MCP_N,\"method\":\"tools/call\",\"params\":{\"name\":\"$1\",\"arguments\":$2}}" \
    "$API/mcp" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["result"]))'
}
# mcp_ok TOOL ARGS PYEXPR: the result is a success and PYEXPR holds for its content r
mcp_ok() {
  local out
  out=$(mcp "$1" "$2")
  python3 -c 'import json,sys
res = json.loads(sys.argv[1])
assert not res["isError"], res
r = json.loads(res["content"][0]["text"])
assert eval(sys.argv[2]), (sys.argv[2], r)' "$out" "$3" || node_fail "MCP $1 $2: $out"
}
# mcp_err TOOL ARGS CODE [TEXT]: an isError result with that code (and text in its message)
mcp_err() {
  local out
  out=$(mcp "$1" "$2")
  python3 -c 'import json,sys
res = json.loads(sys.argv[1])
assert res["isError"] and res["_meta"]["kagent.dev/error-code"] == sys.argv[2], res
assert sys.argv[3] in res["content"][0]["text"], res' "$out" "$3" "${4:-}" ||
    node_fail "MCP $1 $2: want $3: $out"
}
S="\"sandbox_id\":\"$sid\""
curl -sS -X POST -H 'content-type: application/json' -H 'accept: application/json' \
  -H 'x-user-id: alice@example.com' -d '{"jsonrpc":"2.0","id":0,"method":"tools/list"}' "$API/mcp" |
  python3 -c 'import json,sys
names = [t["name"] for t in json.load(sys.stdin)["result"]["tools"]]
assert len(names) == 21, names
for n in ("list_sandbox_files", "stat_sandbox_file", "remove_sandbox_file",
          "make_sandbox_directory", "move_sandbox_file"):
    assert n in names, n' || node_fail "tools/list lacks the Files API tools"
mcp_ok list_sandbox_files "{$S,\"path\":\"many\",\"page_size\":1000}" \
  'len(r["entries"]) == 1000 and r["next_page_token"] == r["entries"][-1]["name"] and r["entries"][0]["type"] == "file"'
tok=$(mcp list_sandbox_files "{$S,\"path\":\"many\",\"page_size\":1000}" |
  python3 -c 'import json,sys; print(json.loads(json.load(sys.stdin)["content"][0]["text"])["next_page_token"])')
mcp_ok list_sandbox_files "{$S,\"path\":\"many\",\"page_size\":1000,\"page_token\":\"$tok\"}" \
  'len(r["entries"]) == 500 and r["next_page_token"] == "" and r["entries"][0]["name"] > "'"$tok"'"'
mcp_ok list_sandbox_files "{$S}" '"many" in [e["name"] for e in r["entries"]]'
mcp_ok make_sandbox_directory "{$S,\"path\":\"mcp/a/b\",\"parents\":true,\"mode\":448}" 'r == {"created": "mcp/a/b"}'
mcp_ok stat_sandbox_file "{$S,\"path\":\"mcp/a/b\"}" 'r["type"] == "directory" and r["mode"] == 448 and r["modified_at"].endswith("Z")'
mcp_ok move_sandbox_file "{$S,\"source\":\"mcp/a/b\",\"destination\":\"mcp/c\"}" 'r["destination"] == "mcp/c"'
mcp_err stat_sandbox_file "{$S,\"path\":\"mcp/a/b\"}" NOT_FOUND
mcp_err make_sandbox_directory "{$S,\"path\":\"mcp/c\"}" ALREADY_EXISTS
mcp_err remove_sandbox_file "{$S,\"path\":\"mcp\"}" FAILED_PRECONDITION "not empty"
mcp_err list_sandbox_files "{$S,\"path\":\"d/c.txt\"}" FAILED_PRECONDITION "not a directory"
mcp_err list_sandbox_files "{$S,\"page_size\":1001}" INVALID_ARGUMENT "page_size must be between 0 and 1000"
mcp_err make_sandbox_directory "{$S,\"path\":\"q\",\"mode\":4096}" INVALID_ARGUMENT "mode must be permission bits"
mcp_err remove_sandbox_file "{$S,\"path\":\"\"}" INVALID_ARGUMENT "path must be 1-1023 bytes"
mcp_err remove_sandbox_file "{$S,\"path\":\"/data/workspace\",\"recursive\":true}" INVALID_ARGUMENT
mcp_err stat_sandbox_file "{\"sandbox_id\":\"nope\",\"path\":\"x\"}" INVALID_ARGUMENT
for p in ../.. /etc badlink/ uplink/etc; do
  mcp_err list_sandbox_files "{$S,\"path\":\"$p\"}" PERMISSION_DENIED
  mcp_err stat_sandbox_file "{$S,\"path\":\"$p/passwd\"}" PERMISSION_DENIED
  mcp_err remove_sandbox_file "{$S,\"path\":\"$p/passwd\"}" PERMISSION_DENIED
done
mcp_err move_sandbox_file "{$S,\"source\":\"mcp/c\",\"destination\":\"../../x\"}" PERMISSION_DENIED
mcp_ok remove_sandbox_file "{$S,\"path\":\"mcp\",\"recursive\":true}" 'r == {"removed": "mcp"}'
mcp_err stat_sandbox_file "{$S,\"path\":\"mcp\"}" NOT_FOUND
# another caller does not see alice's sandbox
out=$(curl -sS -X POST -H 'content-type: application/json' -H 'accept: application/json' \
  -H 'x-user-id: bob@example.com' \
  -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"stat_sandbox_file\",\"arguments\":{$S,\"path\":\"d\"}}}" "$API/mcp")
grep -q '"kagent.dev/error-code": *"NOT_FOUND"' <<< "$out" || node_fail "bob stat: $out"
echo "MCP: ok"

# ---- the kagent CLI ------------------------------------------------------------------------
k() { "$KAGENT" --api-url "$API" --user-id alice@example.com "$@"; }
for c in ls stat rm mkdir mv watch; do
  k sandbox "$c" --help | grep "kagent sandbox $c" >/dev/null || node_fail "kagent sandbox $c --help"
done
[ "$(k sandbox ls "$sid" many | wc -l)" = 1500 ] || node_fail "ls many: not 1500 lines"
k sandbox ls "$sid" many | sort -c || node_fail "ls many: not in name order"
k sandbox ls "$sid" -o json many | python3 -c 'import json,sys
e = json.load(sys.stdin)["entries"]
assert len(e) == 1500 and e[0]["name"] == "f0" and e[0]["type"] == "FILE_TYPE_FILE", e[:2]' ||
  node_fail "ls -o json"
k sandbox mkdir -p --mode 0750 "$sid" cli/x/y
k sandbox ls -l "$sid" cli/x | grep -Eq '^dir +0750 +[0-9]+ .* y$' || node_fail "ls -l: $(k sandbox ls -l "$sid" cli/x)"
k sandbox stat "$sid" cli/x/y | grep '^Type: *dir' >/dev/null || node_fail "stat"
k sandbox stat -o json "$sid" cli/x/y | python3 -c 'import json,sys
j = json.load(sys.stdin)
assert j["name"] == "y" and j["mode"] == 0o750, j' || node_fail "stat -o json"
k sandbox mv "$sid" cli/x/y cli/z
k sandbox mkdir "$sid" cli/y
set +e
k sandbox mv "$sid" cli/z cli/y 2>"$WORK/err"; rc=$?
set -e
[ $rc = 1 ] && grep -q "code = AlreadyExists" "$WORK/err" || node_fail "mv onto a dir: rc=$rc $(cat "$WORK/err")"
k sandbox mv -f "$sid" cli/z cli/y
expect_fail() { # expect_fail CODE_NAME COMMAND...: exits 1 with that gRPC code
  local want=$1 rc=0
  shift
  k "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  [ $rc = 1 ] && grep -q "code = $want" "$WORK/err" || node_fail "$*: rc=$rc $(cat "$WORK/err")"
}
expect_fail FailedPrecondition sandbox rm "$sid" cli
expect_fail NotFound sandbox stat "$sid" cli/nothing
expect_fail AlreadyExists sandbox mkdir "$sid" cli/y
expect_fail InvalidArgument sandbox rm -r "$sid" /data/workspace
expect_fail PermissionDenied sandbox ls "$sid" ../..
expect_fail PermissionDenied sandbox ls "$sid" badlink/
expect_fail PermissionDenied sandbox rm -r "$sid" /etc
expect_fail PermissionDenied sandbox stat "$sid" uplink/etc/passwd
k sandbox rm -r -o json "$sid" cli | grep '"removed": "cli"' >/dev/null || node_fail "rm -r -o json"
expect_fail NotFound sandbox ls "$sid" cli
# watch: one line per event until Ctrl-C (SIGINT), which ends it with status 0
k sandbox mkdir "$sid" wcli
watch_ready() { # watch_ready OUT: creates probes until the watch printed one (it is established)
  for i in $(seq 150); do
    k sandbox exec "$sid" -- touch "wcli/.probe$i" >/dev/null
    grep -q '\.probe' "$1" && return 0
    sleep 0.1
  done
  node_fail "the watch never printed a probe: $(cat "$1")"
}
await_line() { # await_line FILE PATTERN: polls FILE for PATTERN (10 s)
  for _ in $(seq 100); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  node_fail "no line $2 in: $(cat "$1")"
}
# (not through k(): $! must be the CLI itself, a background subshell ignores SIGINT)
"$KAGENT" --api-url "$API" --user-id alice@example.com sandbox watch "$sid" wcli \
  >"$WORK/watch.out" 2>"$WORK/watch.err" &
wpid=$!
watch_ready "$WORK/watch.out"
k sandbox exec "$sid" -- sh -c 'mkdir -p wcli/sub && echo x > wcli/sub/f' >/dev/null
await_line "$WORK/watch.out" '^CREATE sub/f$'
grep -q '^CREATE sub/$' "$WORK/watch.out" || node_fail "watch: no CREATE sub/: $(cat "$WORK/watch.out")"
kill -INT $wpid
rc=0; wait $wpid || rc=$?
[ $rc = 0 ] || node_fail "watch after Ctrl-C exited $rc: $(cat "$WORK/watch.err")"
"$KAGENT" --api-url "$API" --user-id alice@example.com sandbox watch -o json "$sid" wcli \
  >"$WORK/watch.json" &
wpid=$!
watch_ready "$WORK/watch.json"
k sandbox exec "$sid" -- mv wcli/sub/f wcli/g >/dev/null
await_line "$WORK/watch.json" '"FILE_EVENT_TYPE_MOVE"'
kill -INT $wpid
wait $wpid || node_fail "watch -o json after Ctrl-C"
python3 -c 'import json,sys
moves = [e for e in map(json.loads, open(sys.argv[1])) if e["type"] == "FILE_EVENT_TYPE_MOVE"]
assert moves and moves[0]["path"] == "g" and moves[0]["fromPath"] == "sub/f", moves' \
  "$WORK/watch.json" || node_fail "watch -o json: $(cat "$WORK/watch.json")"
expect_fail NotFound sandbox watch "$sid" nothing
echo "CLI: ok"
node_stop
