#!/usr/bin/env bash
# What a person at a terminal sees: create -> READY and exec of `true`, timed around the real
# `kagent` CLI process against a real kagentd (busybox tools image), 200 runs each.
# Usage: bench/cli/run.sh BUILD_DIR   (N=200 by default: BENCH_CLI_RUNS)
# Each run includes the CLI's own process start and gRPC channel setup, as a user pays them.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export KAGENT_BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd) KAGENT_SOURCE_DIR=$here
. "$here/tests/lib/node.sh"
n=${BENCH_CLI_RUNS:-200}
node_start
node_apply_template bench
k() { "$KAGENT" --api-url "$API" "$@"; }
now() { date +%s%N; }

create_ms=() ids=()
for i in $(seq "$n"); do
  t0=$(now)
  id=$(k sandbox create bench --request-id "cli-bench-$i" -o json | jq -r '.id')
  t1=$(now)
  [[ $id =~ ^[0-9a-f-]{36}$ ]] || node_fail "create $i"
  create_ms+=("$(( (t1 - t0) / 1000 ))")
  ids+=("$id")
  k sandbox delete "$id" >/dev/null
done
id=$(k sandbox create bench --request-id cli-bench-exec -o json | jq -r '.id')
exec_ms=()
for i in $(seq "$n"); do
  t0=$(now)
  k sandbox exec "$id" -- true >/dev/null 2>&1 || node_fail "exec $i"
  t1=$(now)
  exec_ms+=("$(( (t1 - t0) / 1000 ))")
done
k sandbox delete "$id" >/dev/null
node_stop

# p50/p99 of microsecond samples, printed in ms
pct() { printf '%s\n' "${@:2}" | sort -n | awk -v p="$1" '{a[NR]=$1} END {i=int((NR-1)*p/100)+1; printf "%.2f", a[i]/1000}'; }
c50=$(pct 50 "${create_ms[@]}"); c99=$(pct 99 "${create_ms[@]}")
e50=$(pct 50 "${exec_ms[@]}"); e99=$(pct 99 "${exec_ms[@]}")
printf '%-32s %10s %10s\n' "cli ($n runs)" "p50 ms" "p99 ms"
printf '%-32s %10s %10s\n' "create -> READY" "$c50" "$c99"
printf '%-32s %10s %10s\n' "exec true (start -> exit)" "$e50" "$e99"
echo "BENCH name=cli_create_ready_p50 value=$c50 unit=ms"
echo "BENCH name=cli_create_ready_p99 value=$c99 unit=ms"
echo "BENCH name=cli_exec_true_p50 value=$e50 unit=ms"
echo "BENCH name=cli_exec_true_p99 value=$e99 unit=ms"
