#!/usr/bin/env bash
# Idle sandboxes on a node configured as `make run` does (bench/lib/makerun_node.sh), created
# and deleted through the real CLI: node RSS, guest PSS and host memory per sandbox (and where
# the host's goes) at checkpoints, the creation rate, the counts a limit applies to, and what
# would stop 1,000 and 10,000 (bench/density/density.py). The node's stop must leave nothing
# behind, also when density.py stopped short (its status is kept).
# Usage: bench/density/run.sh BUILD_DIR [N]   (N: DENSITY_N, default 50; needs root)
# The pool's capacity is raised to N + 10 (the warm sandboxes count too) when N needs it;
# DENSITY_PARALLEL, DENSITY_CHECKPOINTS, DENSITY_MEM_FLOOR_MB, DENSITY_PID_HEADROOM: density.py.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
n=${2:-${DENSITY_N:-50}}
. "$here/bench/lib/makerun_node.sh"
if [ "$n" -gt 990 ]; then MR_CAPACITY=$((n + 10)); fi
makerun_start "${1:?usage: run.sh BUILD_DIR [N]}"
echo "node: pid $MR_PID, state $MR_STATE, $(grep -m1 'Max open files' "/proc/$MR_PID/limits")"
rc=0
python3 "$here/bench/density/density.py" "$KAGENT" "$MR_API" "$MR_PID" "$MR_STATE" "$n" || rc=$?
makerun_stop
exit $rc
