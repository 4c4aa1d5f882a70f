#!/usr/bin/env bash
# Fork of a running sandbox with 100 MiB in /data (4 x 25 MiB of random bytes and 1,000 small
# files) through the real CLI (`kagent sandbox fork`: freeze, copy /data and root changes to the
# fork's volume, thaw, boot the fork, READY), FORK_BENCH_RUNS (3) times, p50; beside it, in the
# same run, `cp --reflink=auto -a` of the same tree (the source's /data on its volume, to a new
# directory on the host's disk), p50.
# Usage: bench/fork/run.sh BUILD_DIR   (needs root)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export KAGENT_BUILD_DIR KAGENT_SOURCE_DIR=$here
KAGENT_BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
. "$here/tests/lib/node.sh"
runs=${FORK_BENCH_RUNS:-3}
node_start
node_apply_template fbench
k() { "$KAGENT" --api-url "$API" "$@"; }
p50() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
id=$(k sandbox create fbench --request-id fork-bench -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
k sandbox exec "$id" -- sh -c 'for i in 1 2 3 4; do dd if=/dev/urandom of=big$i bs=1M count=25 2>/dev/null; done;
  mkdir small && cd small && seq 1 1000 | xargs touch' >/dev/null
[ "$(k sandbox exec "$id" -- sh -c 'cat big1 big2 big3 big4 | wc -c')" = $((100 << 20)) ] || node_fail "100 MiB not written"
sdir=$(find "$STATE" -maxdepth 3 -type d -name "$id" | head -1)
[ -n "$sdir" ] && [ -d "$sdir/data/" ] || node_fail "the source's /data is not found under $STATE"
: > "$WORK/fork_ms"
: > "$WORK/cp_ms"
for r in $(seq "$runs"); do
  t0=$(date +%s%N)
  f=$(k sandbox fork "$id" --request-id "fork-bench-$r" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxes"][0]["id"])')
  echo $((($(date +%s%N) - t0) / 1000)) >> "$WORK/fork_ms"
  [ "$(k sandbox exec "$f" -- sh -c 'cat big1 big2 big3 big4 | wc -c')" = $((100 << 20)) ] || node_fail "fork $r lacks the data"
  k sandbox delete "$f" >/dev/null
  sync
  t0=$(date +%s%N)
  cp --reflink=auto -a "$sdir/data/." "$WORK/cp-$r"
  echo $((($(date +%s%N) - t0) / 1000)) >> "$WORK/cp_ms"
  rm -rf "$WORK/cp-$r"
done
k sandbox delete "$id" >/dev/null
node_stop
ms() { awk -v u="$1" 'BEGIN {printf "%.1f", u / 1000}'; }
fork=$(p50 < "$WORK/fork_ms")
cp=$(p50 < "$WORK/cp_ms")
printf '%-34s %10s\n' figure p50_ms "kagent sandbox fork (100 MiB)" "$(ms "$fork")" "cp --reflink=auto -a (100 MiB)" "$(ms "$cp")"
echo "BENCH name=fork_100mib_p50 value=$(ms "$fork") unit=ms peer=cp_reflink_auto_a peer_value=$(ms "$cp") ratio=$(awk -v a="$fork" -v b="$cp" 'BEGIN {printf "%.2f", b / a}')"
