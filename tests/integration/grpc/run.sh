#!/usr/bin/env bash
# gRPC bridge integration test: kb_test_server (listener + gRPC + reflection + HTTP on ONE port)
# against real clients: Debian's python3-grpcio (/usr/bin/python3), npm's @grpc/grpc-js, curl.
# usage: run.sh KB_TEST_SERVER KBTEST_PROTOSET
# Fails loudly when a client or tool is missing; leaves no process or file behind.
set -euo pipefail
server_bin=$1
protoset=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../lib/npm.sh"
src=${KAGENT_SOURCE_DIR:-$(cd "$here/../../.." && pwd)}
build=${KAGENT_BUILD_DIR:?KAGENT_BUILD_DIR must be set (ctest sets it)}

fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in protoc /usr/bin/grpc_python_plugin /usr/bin/python3 node npm curl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (deploy/install-deps.sh)"
done
/usr/bin/python3 -c 'import grpc' || fail "python3-grpcio is not installed"

work=$(mktemp -d /tmp/kb-grpc-it.XXXXXX)
pids=()
cleanup() { # teardown only (EXIT): a server may have exited already; no result depends on it
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# --- Python stubs, generated now with protoc + grpc_python_plugin ---
mkdir -p "$work/py/grpc_reflection_v1alpha" "$work/py/grpc_reflection_v1" "$work/protos"
cp "$here/kbtest.proto" "$work/protos/"
cp "$src/proto/grpc/reflection/v1alpha/reflection.proto" "$work/protos/ra.proto"
cp "$src/proto/grpc/reflection/v1/reflection.proto" "$work/protos/r1.proto"
mkdir -p "$work/protos/grpc_reflection_v1alpha" "$work/protos/grpc_reflection_v1"
mv "$work/protos/ra.proto" "$work/protos/grpc_reflection_v1alpha/reflection.proto"
mv "$work/protos/r1.proto" "$work/protos/grpc_reflection_v1/reflection.proto"
(cd "$work/protos" && protoc -I. --python_out="$work/py" --grpc_out="$work/py" \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin kbtest.proto \
  grpc_reflection_v1alpha/reflection.proto grpc_reflection_v1/reflection.proto) \
  || fail "protoc could not generate the Python stubs"

# --- npm clients, installed into the build tree from the committed lock file ---
nodedir="$build/tests/integration/grpc/node"
npm_from_lockfile "$here" "$nodedir" || fail "npm ci of @grpc/grpc-js failed"

# --- start the server on an ephemeral port ---
"$server_bin" --protoset "$protoset" >"$work/server.out" 2>"$work/server.err" &
spid=$!
pids+=("$spid")
for _ in $(seq 100); do
  grep -q '^PORT ' "$work/server.out" && break
  kill -0 "$spid" 2>/dev/null || { cat "$work/server.err" >&2; fail "server died at start"; }
  sleep 0.1
done
port=$(awk '/^PORT /{print $2}' "$work/server.out")
[ -n "$port" ] || fail "server did not report its port"
echo "server on port $port"

# --- a second server on the same port must refuse to start ---
set +e
"$server_bin" --port "$port" >"$work/second.out" 2>"$work/second.err"
rc=$?
set -e
[ "$rc" = 3 ] || fail "second server on port $port exited $rc, want 3 (bind failure)"
grep -q "Address already in use" "$work/second.err" || { cat "$work/second.err" >&2; fail "no clear bind error"; }
echo "ok   second server on the same port refused: $(grep -o 'cannot listen.*' "$work/second.err")"

# --- HTTP/1.1 on the same port ---
body=$(curl -sS --max-time 5 "http://127.0.0.1:$port/healthz")
[ "$body" = "ok" ] || fail "/healthz said '$body'"
echo "ok   /healthz 200 ok"
code=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")
[ "$code" = 200 ] || fail "/readyz $code"
echo "ok   /readyz 200"
code=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/nope")
[ "$code" = 404 ] || fail "/nope $code, want 404"
echo "ok   unknown path 404"
hdrs=$(curl -sS --max-time 5 -o /dev/null -D - -X POST "http://127.0.0.1:$port/metrics")
grep -q '^HTTP/1.1 405' <<< "$hdrs" || fail "POST /metrics: $hdrs"
grep -qi '^allow: GET, HEAD' <<< "$hdrs" || fail "405 without Allow: $hdrs"
echo "ok   wrong method 405 with Allow"

# --- the clients ---
/usr/bin/python3 "$here/client_test.py" "$port" "$work/py" || fail "python client checks"
NODE_PATH="$nodedir/node_modules" node "$here/client_test.js" "$port" "$here" || fail "node client checks"

# --- metrics after the traffic ---
metrics=$(curl -sS --max-time 5 "http://127.0.0.1:$port/metrics")
grep -q '^# TYPE kagent_grpc_calls_started_total counter' <<< "$metrics" || fail "metrics: $metrics"
started=$(echo "$metrics" | awk '/^kagent_grpc_calls_started_total /{print $2}')
[ "${started:-0}" -gt 200 ] || fail "kagent_grpc_calls_started_total=$started, want > 200"
grep -q 'kagent_listener_connections_total{protocol="http"}' <<< "$metrics" || fail "metrics: $metrics"
echo "ok   /metrics Prometheus text, $started gRPC calls counted"

# --- clean shutdown with a call in flight (under ASan, leaks make the exit non-zero) ---
PYTHONPATH="$work/py" /usr/bin/python3 -c '
import sys, grpc, kbtest_pb2 as pb, kbtest_pb2_grpc as g
s = g.TestServiceStub(grpc.insecure_channel("127.0.0.1:" + sys.argv[1]))
try:
    s.Sleep(pb.SleepRequest(ms=60000), timeout=30)
    print("sleep returned OK")
except grpc.RpcError as e:
    print(e.code().name, e.details())
' "$port" >"$work/inflight.out" 2>&1 &
cpid=$!
pids+=("$cpid")
for _ in $(seq 100); do
  live=$(curl -sS --max-time 5 "http://127.0.0.1:$port/metrics" | awk '/^kagent_grpc_calls_live /{print $2}')
  [ "${live:-0}" -ge 1 ] && break
  sleep 0.05
done
[ "${live:-0}" -ge 1 ] || fail "the in-flight Sleep call never arrived"
kill -TERM "$spid"
set +e
wait "$spid"
rc=$?
set -e
pids=()
[ "$rc" = 0 ] || { tail -30 "$work/server.err" >&2; fail "server exited $rc after SIGTERM"; }
wait "$cpid" || fail "the in-flight client exited $? (its output: $(cat "$work/inflight.out"))"
grep -q '^UNAVAILABLE' "$work/inflight.out" || fail "in-flight call at shutdown: $(cat "$work/inflight.out")"
echo "ok   server shut down cleanly; the in-flight call got $(cat "$work/inflight.out")"
echo "PASS grpc_bridge"
