#!/usr/bin/env bash
# Remote mesh benchmarks with plain ZeroMQ as the peer, each without and with CURVE, over tcp
# loopback. Usage: bench/mesh_remote/run.sh BUILD_DIR
# Prints the load average before and after (the figures depend on it on a shared machine).
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR}
exe="$build/bench/mesh_remote/bench_mesh_remote"
if [ ! -x "$exe" ]; then
  echo "bench/mesh_remote: $exe not built" >&2
  exit 1
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$exe"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
