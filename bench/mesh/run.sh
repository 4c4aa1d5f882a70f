#!/usr/bin/env bash
# Mesh and codec benchmarks. Usage: bench/mesh/run.sh BUILD_DIR
# No peer figures: there is no comparable mesh in the same run.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR}
exe="$build/bench/mesh/bench_mesh"
if [ ! -x "$exe" ]; then
  echo "bench/mesh: $exe not built" >&2
  exit 1
fi
"$exe"
