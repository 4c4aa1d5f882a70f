#!/usr/bin/env bash
# The seed's walkthrough through the kagent CLI against a real node: apply a template, see it
# Ready, create a sandbox, exec, upload, download, list, ownership, delete. The tools image is
# busybox (the python image of `make run` takes minutes to build; CI proves the same path).
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }

# 1. templates
k sandbox templates -n kagent | grep "^kagent  *scratch  *test/tools@sha256:" >/dev/null || fail "templates table"
k get template scratch | grep "Prepared" >/dev/null || fail "get template shows Ready"

# 2. create (idempotent)
id=$(k sandbox create scratch --request-id my-first-sandbox -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
[[ $id =~ ^[0-9a-f-]{36}$ ]] || fail "create returned id '$id'"
again=$(k sandbox create scratch --request-id my-first-sandbox -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
[ "$again" = "$id" ] || fail "create is not idempotent: $again vs $id"
k sandbox get "$id" > "$WORK/get" # (grep -q on a pipe: SIGPIPE)
grep -q "RUNTIME_STATE_READY *RUNTIME_OPERATION_NONE" "$WORK/get" || fail "get shows READY/NONE"
grep -q "^ID .* OPERATION  *NODE  *EXPIRES" "$WORK/get" || fail "get has no NODE column: $(cat "$WORK/get")"
grep -q "RUNTIME_OPERATION_NONE  *node-1  " "$WORK/get" || fail "get does not show node-1: $(cat "$WORK/get")"
k sandbox get "$id" -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["node"] == "node-1", d' ||
  fail "get -o json has no node"

# 3. exec: output, cwd, uid, exit codes
out=$(k sandbox exec "$id" -- sh -c 'echo hello; pwd; id -u' 2>/dev/null)
[ "$out" = "$(printf 'hello\n/data/workspace\n65532')" ] || fail "exec output: $out"
set +e; k sandbox exec "$id" -- sh -c 'exit 7' >/dev/null 2>&1; rc=$?; set -e
[ $rc = 7 ] || fail "exec exit code $rc, want 7"
set +e; k sandbox exec "$id" -- no-such-program >/dev/null 2>&1; rc=$?; set -e
[ $rc != 0 ] || fail "exec of a missing program succeeded"

# 4. upload / download
head -c 300000 /dev/urandom > "$WORK/blob.bin"
k sandbox upload "$id" "$WORK/blob.bin" data/blob.bin | grep "Wrote 300000 bytes" >/dev/null || fail "upload"
k sandbox exec "$id" -- sh -c 'wc -c < data/blob.bin' 2>/dev/null | grep 300000 >/dev/null || fail "uploaded size"
echo old > "$WORK/back.bin"
k sandbox download "$id" data/blob.bin "$WORK/back.bin" >/dev/null || fail "download"
cmp -s "$WORK/blob.bin" "$WORK/back.bin" || fail "download differs"
set +e; k sandbox download "$id" data/missing.bin "$WORK/back.bin" >/dev/null 2>&1; rc=$?; set -e
[ $rc != 0 ] && cmp -s "$WORK/blob.bin" "$WORK/back.bin" || fail "failed download touched the file"

# 5. list and ownership
k sandbox list > "$WORK/list"
grep -q "^ID .* OPERATION  *NODE  *EXPIRES" "$WORK/list" || fail "list has no NODE column: $(cat "$WORK/list")"
grep -q "^$id .* node-1  " "$WORK/list" || fail "list lacks the sandbox on node-1: $(cat "$WORK/list")"
k --user-id bob@example.com sandbox list | grep "$id" >/dev/null && fail "another user lists it"
set +e; k --user-id bob@example.com sandbox get "$id" >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] && grep -q "NotFound" "$WORK/err" || fail "another user can get it: $(cat "$WORK/err")"
set +e; k --user-id bob@example.com sandbox exec "$id" -- true >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] || fail "another user can exec"

# 6. delete: DELETED, guest refused, create replay returns the tombstone
k sandbox delete "$id" | grep RUNTIME_STATE_DELETED >/dev/null || fail "delete"
set +e; k sandbox exec "$id" -- true >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] && grep -q "Sandbox is not ready or has expired" "$WORK/err" || fail "exec after delete: $(cat "$WORK/err")"
k sandbox create scratch --request-id my-first-sandbox | grep "$id.*RUNTIME_STATE_DELETED" >/dev/null || fail "replay after delete"

# 7. the operator's view
k runtime tree | grep sandboxes >/dev/null || fail "runtime tree"
curl -fsS "$API/metrics" > "$WORK/metrics" || fail "metrics" # (grep -q on a pipe: SIGPIPE)
grep -q '^kagent_sandboxes_live ' "$WORK/metrics" || fail "metrics: no kagent_sandboxes_live"

node_stop
echo "PASS walkthrough"
