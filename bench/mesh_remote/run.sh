#!/usr/bin/env bash
# Remote mesh benchmarks with plain ZeroMQ as the peer. Usage: bench/mesh_remote/run.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR}
exe="$build/bench/mesh_remote/bench_mesh_remote"
if [ ! -x "$exe" ]; then
  echo "bench/mesh_remote: $exe not built" >&2
  exit 1
fi
"$exe"
