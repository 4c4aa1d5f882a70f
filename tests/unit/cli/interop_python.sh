#!/bin/bash
# The kagent CLI binary against a gRPC server written with Debian's python3-grpcio
# (interop_server.py): unary, server streaming (exec's fallback follow, download), client streaming
# (upload), metadata, status codes and exit codes. Needs protoc, grpc_python_plugin and
# /usr/bin/python3 with grpc (deploy/install-deps.sh); a missing one fails the test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${KAGENT_SOURCE_DIR:?}
kagent=${KAGENT_BUILD_DIR:?}/bridges/cli/kagent
tmp=$(mktemp -d /tmp/kagent-cli-interop.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir "$tmp/py"
(cd "$src/proto" && protoc -I. -I/usr/include --python_out="$tmp/py" --grpc_out="$tmp/py" \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin kagent/api/v1/common.proto \
  kagent/api/v1/runtime.proto kagent/api/v1/sandboxes.proto ateenv/v1alpha/guest.proto)
/usr/bin/python3 "$here/interop_server.py" "$tmp/py" "$tmp/port" 2>"$tmp/server.err" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
[ -s "$tmp/port" ] || { cat "$tmp/server.err" >&2; fail "python server did not start"; }
api=(--api-url "http://127.0.0.1:$(cat "$tmp/port")")
sid=0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04

# create: -o json camelCase, identity metadata, ttl, node
out=$("$kagent" "${api[@]}" --user-id bob@example.com sandbox create scratch --request-id r1 \
  --ttl 1h --name demo -o json)
[ "$(echo "$out" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["id"], d["creator"], d["sandboxTemplate"]["name"], d["expiresAt"], d["node"])')" \
  = "$sid bob@example.com scratch 2026-10-01T17:30:00Z node-1" ] || fail "create json: $out"

# a status error from the server
set +e
err=$("$kagent" "${api[@]}" sandbox get nope 2>&1 >/dev/null); rc=$?
set -e
[ $rc -eq 1 ] && [ "$err" = "Error: get sandbox nope: rpc error: code = NotFound desc = sandbox nope not found" ] \
  || fail "get: rc=$rc $err"

# exec: this server has only the reference's ProcessService (Exec is UNIMPLEMENTED, nothing
# started), so the CLI starts and follows the stream; remote exit code 7 becomes ours
set +e
"$kagent" "${api[@]}" sandbox exec "$sid" -- python --version >"$tmp/out" 2>"$tmp/err"; rc=$?
set -e
[ $rc -eq 7 ] || fail "exec rc=$rc"
[ "$(cat "$tmp/out")" = "Python 3.11.2" ] || fail "exec stdout: $(cat "$tmp/out")"
grep -qx "Process p-python---version: PROCESS_STATE_EXITED, exit_code=7" "$tmp/err" \
  || fail "exec stderr: $(cat "$tmp/err")"

# upload (client stream, 3 chunks) and download (server stream) through the real binary
head -c 3000000 /dev/urandom >"$tmp/up.bin"
[ "$("$kagent" "${api[@]}" sandbox upload "$sid" "$tmp/up.bin" r.bin)" = "Wrote 3000000 bytes to r.bin" ] \
  || fail upload
"$kagent" "${api[@]}" sandbox download "$sid" r.bin "$tmp/down.bin" >/dev/null
[ "$(wc -c <"$tmp/down.bin")" -eq 210000 ] || fail "download size"
echo OLD >"$tmp/keep"
if "$kagent" "${api[@]}" sandbox download "$sid" broken "$tmp/keep" 2>"$tmp/err"; then
  fail "broken download succeeded"
fi
[ "$(cat "$tmp/keep")" = OLD ] || fail "old file replaced"
! ls -a "$tmp" | grep kagent-download >/dev/null || fail "temporary file left"
echo "interop with python3-grpcio: OK"
