#!/usr/bin/env bash
# Idle sandboxes on a node configured as `make run` does (bench/lib/makerun_node.sh), created
# and deleted through the real CLI: node RSS, guest PSS and host memory per sandbox (and where
# the host's goes), the creation rate, the counts a limit applies to, and what would stop
# 1,000 and 10,000 (bench/density/density.py). The node's stop must leave nothing behind.
# Usage: bench/density/run.sh BUILD_DIR [N]   (N: DENSITY_N, default 50; needs root)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/bench/lib/makerun_node.sh"
makerun_start "${1:?usage: run.sh BUILD_DIR [N]}"
python3 "$here/bench/density/density.py" "$KAGENT" "$MR_API" "$MR_PID" "$MR_STATE" \
  "${2:-${DENSITY_N:-50}}"
makerun_stop
