#!/usr/bin/env bash
# gRPC bridge benchmark: unary round trips/s and latency (p50/p99) for an empty request, measured
# with a gRPC C-core client (the CLI's client path) against kb_test_server on the shared port
# (listener -> gRPC core -> kb_grpc method table), then the same against gRPC core's own listening
# port (names suffixed _direct) to show what the shared port costs. No peer.
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
trap cleanup EXIT
"$server" --grpc-addr 127.0.0.1:0 >"$work/out" 2>"$work/err" &
spid=$!
for _ in $(seq 100); do grep -q '^GRPC_PORT ' "$work/out" && break; sleep 0.05; done
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
