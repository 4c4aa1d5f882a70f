#!/usr/bin/env bash
# gRPC bridge benchmark: unary round trips/s and latency (p50/p99) for an empty request, measured
# with a gRPC C-core client (the CLI's client path) against kb_test_server on the shared port
# (listener -> gRPC core -> kb_grpc method table), then the same against gRPC core's own listening
# port (names suffixed _direct) to show what the shared port costs, then the shared port over
# TLS (the listener's relay, a test CA from deploy/gen-test-certs.sh; names suffixed _tls). No
# peer.
# Usage: bench/grpc/run.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
server="$build/tests/integration/grpc/kb_test_server"
client="$build/bench/grpc/bench_grpc"
for b in "$server" "$client"; do
  [ -x "$b" ] || { echo "bench/grpc: $b not built" >&2; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/kb-grpc-bench.XXXXXX")
spid=
cleanup() { [ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null; rm -rf "$work"; }
start() { # start OUT ARGS...: kb_test_server in the background, its PORT line awaited
  local out=$1
  shift
  "$server" "$@" >"$out" 2>"$work/err" &
  spid=$!
  for _ in $(seq 100); do grep -q '^PORT ' "$out" && break; sleep 0.05; done
}
trap cleanup EXIT
start "$work/out" --grpc-addr 127.0.0.1:0 # prints PORT and GRPC_PORT together
port=$(awk '/^PORT /{print $2}' "$work/out")
[ -n "$port" ] || { cat "$work/err" >&2; echo "bench/grpc: server did not start" >&2; exit 1; }
direct=$(awk '/^GRPC_PORT /{print $2}' "$work/out")
args=("${GRPC_BENCH_SEQ:-5000}" "${GRPC_BENCH_CONC:-20000}" "${GRPC_BENCH_INFLIGHT:-16}")
"$client" "$port" "${args[@]}"
echo
"$client" "$direct" "${args[@]}" _direct
kill -TERM "$spid"
wait "$spid"
spid=

here=$(cd "$(dirname "$0")" && pwd)
"$here/../../deploy/gen-test-certs.sh" ca "$work/tls"
"$here/../../deploy/gen-test-certs.sh" server "$work/tls" server
start "$work/out-tls" --tls-cert "$work/tls/server.pem" --tls-key "$work/tls/server.key"
port=$(awk '/^PORT /{print $2}' "$work/out-tls")
[ -n "$port" ] || { cat "$work/err" >&2; echo "bench/grpc: TLS server did not start" >&2; exit 1; }
echo
BENCH_GRPC_CA=$work/tls/ca.pem "$client" "$port" "${args[@]}" _tls
kill -TERM "$spid"
wait "$spid"
spid=
