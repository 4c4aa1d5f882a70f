#!/usr/bin/env bash
# What one `kagent sandbox exec ID -- true` costs inside the node: runtime messages and actors
# spawned per exec (kagent runtime stats before and after EXEC_PATH_RUNS execs, on an otherwise
# idle node), and the CLI's wall time p50, for
#   exec        the CLI's one call, kagent.api.v1.ProcessService/Exec (start with follow: one
#               guest round trip);
#   two_calls   the reference's way, as its clients make it: StartProcess (`exec --wait=false`)
#               then StreamProcessOutput with follow (`wait`): two calls, two guest round trips,
#               two CLI processes. This is the peer.
# Background work (the membership's lease renewal, a warm pool's timers) adds a few messages per
# second; the figures are per exec over the whole run, so they include that share.
# Usage: bench/exec_path/run.sh BUILD_DIR   (needs root; a node configured as `make run` does)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/bench/lib/makerun_node.sh"
build=${1:?usage: run.sh BUILD_DIR}
runs=${EXEC_PATH_RUNS:-200}
makerun_start "$build"
id=$(makerun_kagent sandbox create scratch --request-id exec-path-bench -o json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
stats() { makerun_kagent runtime stats -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(int(d.get("messages",0)), int(d.get("actorsSpawned",d.get("actors_spawned",0))))'; }
p50() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
exec_one() { makerun_kagent sandbox exec "$id" -- true >/dev/null; }
two_calls() {
  local pid
  pid=$(makerun_kagent sandbox exec "$id" --wait=false -o json -- true |
    python3 -c '
import json, sys
def find(d):
    if isinstance(d, dict):
        for k, v in d.items():
            if k in ("processId", "process_id"):
                return v
            if (r := find(v)) is not None:
                return r
    return None
print(find(json.load(sys.stdin)))')
  makerun_kagent sandbox wait "$id" "$pid" >/dev/null
}
# One way, runs times: messages/exec, actors/exec, p50 ms.
measure() {
  local fn=$1 m0 a0 m1 a1 t0
  "$fn" && "$fn" # warm: the first calls pay connection and cache set-up
  read -r m0 a0 < <(stats)
  : > "$MR_STATE/$fn.us"
  for _ in $(seq "$runs"); do
    t0=${EPOCHREALTIME/./}
    "$fn"
    echo $((${EPOCHREALTIME/./} - t0)) >> "$MR_STATE/$fn.us"
  done
  read -r m1 a1 < <(stats)
  awk -v m=$((m1 - m0 - 1)) -v a=$((a1 - a0)) -v n="$runs" -v t="$(p50 < "$MR_STATE/$fn.us")" \
    'BEGIN {printf "%.1f %.2f %.2f\n", m / n, a / n, t / 1000}'
}
read -r em ea et < <(measure exec_one)
read -r tm ta tt < <(measure two_calls)
makerun_kagent sandbox delete "$id" >/dev/null
load=$(cut -d' ' -f1-3 /proc/loadavg)
makerun_stop
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (a > 0 ? b / a : 0)}'; }
printf '%-28s %12s %12s\n' figure exec two_calls \
  messages_per_exec "$em" "$tm" actors_per_exec "$ea" "$ta" cli_p50_ms "$et" "$tt"
echo "(load average $load, $runs execs each)"
echo "BENCH name=exec_messages_per_exec value=$em unit=msgs peer=two_calls peer_value=$tm ratio=$(ratio "$em" "$tm")"
echo "BENCH name=exec_actors_per_exec value=$ea unit=actors peer=two_calls peer_value=$ta ratio=$(ratio "$ea" "$ta")"
echo "BENCH name=exec_cli_p50 value=$et unit=ms peer=two_calls peer_value=$tt ratio=$(ratio "$et" "$tt")"
