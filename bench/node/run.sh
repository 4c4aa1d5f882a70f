#!/usr/bin/env bash
# kagentd's own memory over many create + exec + delete cycles, through the real CLI against a
# real node (busybox tools image). Resident memory and the allocator's in-use bytes are sampled
# after a warm-up and at the end; the growth per cycle must flatten once the runtime's bounded
# caches (message nodes, actor blocks) are full.
# Usage: bench/node/run.sh BUILD_DIR   (BENCH_NODE_CYCLES=3000 by default, warm-up 300)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export KAGENT_BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd) KAGENT_SOURCE_DIR=$here
. "$here/tests/lib/node.sh"
n=${BENCH_NODE_CYCLES:-3000}
warm=${BENCH_NODE_WARMUP:-300}
node_start
node_apply_template bench
k() { "$KAGENT" --api-url "$API" "$@"; }
rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$NODE_PID/status"; }

cycle() {
  local id
  id=$(k sandbox create bench --request-id "node-bench-$1" -o json | jq -r '.id')
  [[ $id =~ ^[0-9a-f-]{36}$ ]] || node_fail "create $1"
  k sandbox exec "$id" -- true >/dev/null 2>&1 || node_fail "exec $1"
  k sandbox delete "$id" >/dev/null || node_fail "delete $1"
}

printf '%-10s %12s\n' cycles "rss KiB"
for i in $(seq "$warm"); do cycle "w$i"; done
r0=$(rss_kb)
printf '%-10s %12s\n' 0 "$r0"
step=$(( n / 10 ))
samples=()
for i in $(seq "$n"); do
  cycle "$i"
  if (( i % step == 0 )); then samples+=("$(rss_kb)"); printf '%-10s %12s\n' "$i" "${samples[-1]}"; fi
done
r1=$(rss_kb)
# growth over the whole run and over its second half (after the caches had time to fill)
half=${samples[4]}
per_cycle=$(awk -v a="$r0" -v b="$r1" -v n="$n" 'BEGIN {printf "%.0f", (b - a) * 1024 / n}')
per_cycle_late=$(awk -v a="$half" -v b="$r1" -v n="$n" 'BEGIN {printf "%.0f", (b - a) * 1024 / (n / 2)}')
node_stop
echo "BENCH name=node_rss_growth_per_cycle value=$per_cycle unit=bytes"
echo "BENCH name=node_rss_growth_per_cycle_late value=$per_cycle_late unit=bytes"
echo "BENCH name=node_rss_after_cycles value=$r1 unit=KiB"
