#!/usr/bin/env bash
# Pause / unpause on a real kagentd: a sandbox running a busy loop is paused and unpaused
# PAUSE_BENCH_RUNS (20) times. Figures: the thaw itself (the driver's freezer call, from the
# node's `sandbox_unpaused us=` log line) and the freeze, p50; and the whole UnpauseSandbox
# call through the CLI (process start, gRPC, actor, thaw), p50.
# Usage: bench/pause/run.sh BUILD_DIR   (needs root)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export KAGENT_BUILD_DIR KAGENT_SOURCE_DIR=$here
KAGENT_BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
. "$here/tests/lib/node.sh"
runs=${PAUSE_BENCH_RUNS:-20}
node_start
node_apply_template pbench
k() { "$KAGENT" --api-url "$API" "$@"; }
p50() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
id=$(k sandbox create pbench --request-id pause-bench -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
k sandbox exec "$id" --wait=false -- sh -c 'while :; do :; done' >/dev/null 2>&1
sleep 0.3
: > "$WORK/call_us"
for _ in $(seq "$runs"); do
  k sandbox pause "$id" >/dev/null
  t0=$(date +%s%6N)
  k sandbox unpause "$id" >/dev/null
  echo $(($(date +%s%6N) - t0)) >> "$WORK/call_us"
done
k sandbox delete "$id" >/dev/null
node_stop
grep -c "event=sandbox_unpaused .*rc=0" "$WORK/node.log" | grep -x "$runs" >/dev/null || node_fail "not $runs thaws in the log"
us() { sed -n "s/.*event=$1 .*rc=0 us=\([0-9]*\).*/\1/p" "$WORK/node.log"; }
thaw=$(us sandbox_unpaused | p50)
freeze=$(us sandbox_paused | p50)
call=$(p50 < "$WORK/call_us")
ms() { awk -v u="$1" 'BEGIN {printf "%.3f", u / 1000}'; }
printf '%-24s %10s\n' figure p50_ms thaw "$(ms "$thaw")" freeze "$(ms "$freeze")" unpause_call "$(ms "$call")"
echo "BENCH name=unpause_thaw_p50 value=$(ms "$thaw") unit=ms"
echo "BENCH name=pause_freeze_p50 value=$(ms "$freeze") unit=ms"
echo "BENCH name=unpause_call_p50 value=$(ms "$call") unit=ms"
