#!/usr/bin/env bash
# Keystroke echo round trip p50 through the real CLI: `kagent sandbox exec -it ID -- cat` on a
# local pty (keybench.py), against a node of tests/lib/node.sh (busybox tools image); the peer
# is the same measurement with `cat` on the local pty (the kernel's echo: the floor).
# Usage: bench/terminal/run.sh BUILD_DIR   (BENCH_TTY_RUNS keystrokes, default 500)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export KAGENT_BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd) KAGENT_SOURCE_DIR=$here
runs=${BENCH_TTY_RUNS:-500}
. "$here/tests/lib/node.sh"
node_start
node_apply_template scratch
id=$("$KAGENT" --api-url "$API" sandbox create scratch --request-id bench-tty -o json 0<&- |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
read -r p50 p99 < <(python3 "$here/bench/terminal/keybench.py" "$runs" \
  "$KAGENT" --api-url "$API" sandbox exec -it "$id" -- cat)
read -r l50 l99 < <(python3 "$here/bench/terminal/keybench.py" "$runs" cat)
"$KAGENT" --api-url "$API" sandbox delete "$id" 0<&- >/dev/null
node_stop
echo "| keystroke echo (exec -it ... -- cat) | p50 $p50 ms | p99 $p99 ms | local pty p50 $l50 ms |"
python3 -c "import sys; v, p = float(sys.argv[1]), float(sys.argv[2]); print(f'BENCH name=tty_keystroke_echo_p50 value={v:.3f} unit=ms peer=local_pty peer_value={p:.3f} ratio={p / v:.4f}')" "$p50" "$l50"
