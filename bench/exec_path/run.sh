#!/usr/bin/env bash
# What one `kagent sandbox exec ID -- true` costs inside the node: runtime messages and actors
# spawned per exec (kagent runtime stats before and after EXEC_PATH_RUNS execs, on an otherwise
# idle node), and the CLI's wall time p50, for
#   exec        the CLI's one call, kagent.api.v1.ProcessService/Exec (start with follow: one
#               guest round trip);
#   two_calls   the reference's way, as its clients make it: StartProcess (`exec --wait=false`)
#               then StreamProcessOutput with follow (`wait`): two calls, two guest round trips,
#               two CLI processes. This is the peer.
# Background work (the membership's lease renewal, timers) adds a few messages per second: its
# rate is measured on the idle node first and its share over each run taken out.
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
    sed -n 's/.*"process_id": *"\([0-9]*\)".*/\1/p')
  [ -n "$pid" ] || mr_fail "exec --wait=false named no process"
  makerun_kagent sandbox wait "$id" "$pid" >/dev/null 2>&1
}
# The idle node's own messages per second (lease renewals, timers), measured over 3 s.
idle_rate() {
  local m0 a0 m1 a1 t0
  read -r m0 a0 < <(stats)
  t0=${EPOCHREALTIME/./}
  sleep 3
  read -r m1 a1 < <(stats)
  awk -v m=$((m1 - m0)) -v us=$((${EPOCHREALTIME/./} - t0)) 'BEGIN {printf "%.3f\n", m / (us / 1e6)}'
}
# One way, runs times: messages/exec (the idle rate's share over the run taken out),
# actors/exec, p50 ms.
measure() {
  local fn=$1 m0 a0 m1 a1 t0 start
  "$fn" && "$fn" # warm: the first calls pay connection and cache set-up
  read -r m0 a0 < <(stats)
  start=${EPOCHREALTIME/./}
  : > "$MR_STATE/$fn.us"
  for _ in $(seq "$runs"); do
    t0=${EPOCHREALTIME/./}
    "$fn"
    echo $((${EPOCHREALTIME/./} - t0)) >> "$MR_STATE/$fn.us"
  done
  read -r m1 a1 < <(stats)
  awk -v m=$((m1 - m0)) -v a=$((a1 - a0)) -v n="$runs" -v t="$(p50 < "$MR_STATE/$fn.us")" \
    -v idle="$idle" -v us=$((${EPOCHREALTIME/./} - start)) \
    'BEGIN {printf "%.1f %.2f %.2f\n", (m - idle * us / 1e6) / n, a / n, t / 1000}'
}
idle=$(idle_rate)
read -r em ea et < <(measure exec_one)
read -r tm ta tt < <(measure two_calls)
makerun_kagent sandbox delete "$id" >/dev/null
load=$(cut -d' ' -f1-3 /proc/loadavg)
makerun_stop
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (a > 0 ? b / a : 0)}'; }
printf '%-28s %12s %12s\n' figure exec two_calls \
  messages_per_exec "$em" "$tm" actors_per_exec "$ea" "$ta" cli_p50_ms "$et" "$tt"
echo "(load average $load, $runs execs each, idle node $idle msgs/s taken out)"
echo "BENCH name=exec_messages_per_exec value=$em unit=msgs peer=two_calls peer_value=$tm ratio=$(ratio "$em" "$tm")"
echo "BENCH name=exec_actors_per_exec value=$ea unit=actors peer=two_calls peer_value=$ta ratio=$(ratio "$ea" "$ta")"
echo "BENCH name=exec_cli_p50 value=$et unit=ms peer=two_calls peer_value=$tt ratio=$(ratio "$et" "$tt")"
