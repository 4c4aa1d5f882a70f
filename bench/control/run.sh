#!/usr/bin/env bash
# Control-plane benchmarks: create -> READY p50/p99 (peer: bwrap on the same rootfs), exec round
# trip of `true` through the service layer and through gRPC on loopback, a lifecycle call's round
# trip to a sandbox's actor (sandbox_call_p50), concurrent creates per second, idle sandbox host
# memory. Starts its own private PostgreSQL (fsync on) and stops it.
# Usage: bench/control/run.sh BUILD_DIR   (needs root; bubblewrap for the peer figure)
# Sizes: CTL_BENCH_CREATES (200) CTL_BENCH_EXECS (500) CTL_BENCH_RATE (300)
#        CTL_BENCH_THREADS (8) CTL_BENCH_IDLE (200)
#        CTL_BENCH_GRPC (300): runs of `true` via gRPC (kb_grpc + kb_api on loopback, a C-core
#        client) for exec_roundtrip_grpc_p50; 0 leaves it out.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
bin="$build/bench/control/bench_control"
guest="$build/actors/guest/kagent-sandbox-guest"
[ -x "$bin" ] || { echo "missing $bin (build first)" >&2; exit 1; }
[ -x "$guest" ] || { echo "missing $guest" >&2; exit 1; }
command -v bwrap >/dev/null || echo "note: bubblewrap not installed, no peer figure" >&2
export PG_BASE
PG_BASE=$(mktemp -d /tmp/kagent-ctlbench-pg.XXXXXX)
trap '"$here/deploy/pg-private" stop' EXIT
envs=$(PG_SYNC=1 "$here/deploy/pg-private" start) || {
  echo "control bench: FAILED to start a private PostgreSQL" >&2
  exit 1
}
eval "$envs"
"$bin" "$guest" "${CTL_BENCH_CREATES:-200}" "${CTL_BENCH_EXECS:-500}" "${CTL_BENCH_RATE:-300}" \
  "${CTL_BENCH_THREADS:-8}" "${CTL_BENCH_IDLE:-200}" "${CTL_BENCH_GRPC:-300}"
