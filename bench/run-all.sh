#!/usr/bin/env bash
# Runs every benchmark: each bench/<area>/run.sh, given the build directory.
# Each prints its table and one `BENCH name=... value=... unit=... [peer=... peer_value=... ratio=...]`
# line per figure. Usage: bench/run-all.sh [BUILD_DIR]   (make bench builds build-bench first)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build-bench}" && pwd)
echo "# kagent benchmarks — $(date -u +%Y-%m-%dT%H:%MZ) — $(nproc) cores, $(uname -r)"
status=0
for script in "$here"/*/run.sh; do
  [ -x "$script" ] || continue
  area=$(basename "$(dirname "$script")")
  echo; echo "## $area"
  if ! "$script" "$build"; then
    echo "bench: $area FAILED" >&2
    status=1
  fi
done
exit $status
