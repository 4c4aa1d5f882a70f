#!/usr/bin/env bash
# Substrate benchmarks: sandbox start -> guest ready p50/p99, start+stop cycle, exec round trip
# of `true` through the guest, idle sandbox memory, and bubblewrap as the peer for start time.
# Usage: bench/substrate/run.sh BUILD_DIR   (needs root; bubblewrap for the peer figure)
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
bin="$build/bench/substrate/sbx_bench"
guest="$build/actors/guest/kagent-sandbox-guest"
[ -x "$bin" ] || { echo "missing $bin (build first)" >&2; exit 1; }
[ -x "$guest" ] || { echo "missing $guest" >&2; exit 1; }
command -v bwrap >/dev/null || echo "note: bubblewrap not installed, no peer figure" >&2
exec "$bin" "$guest" "${SBX_BENCH_CYCLES:-200}" "${SBX_BENCH_IDLE:-1000}"
