#!/usr/bin/env bash
# Snapshot benchmarks on a real kagentd: suspend and resume of a 1 MiB, a 100 MiB (random, so
# incompressible) and a 10,000-file /data, to file:// and to s3:// (npm's s3rver on loopback);
# medians of SNAP_BENCH_RUNS (3); SNAP_BENCH_TREES picks trees (default all three). Peers in the
# same run on the same trees: `tar | zstd -3` (what the archive costs) and Debian's `aws s3 cp`
# of that archive to the same s3rver. For each resume, the medians of the phases the node
# logged for it (store_intent, compute_start, guest_ready, resume_download; the rest of the
# call is the CLI, gRPC and the store's final write) and of a `kagent sandbox get` beside it
# (what any CLI call costs at that moment). Each tree is timed once the warm pools are full again: the create
# claimed a warm sandbox, and the pool's refill boot would otherwise run during the first
# suspends and resumes.
# Then, per tree, snap_phases (bench/snapshots/snap_phases.c) on the same s3rver: the resume's
# phases one at a time (the download alone; sha256; the unpack from a local copy; a syncfs after
# it; the whole restore) with wall and CPU ms, s3rver's CPU too (it shares the cores).
# SNAP_BENCH_PHASES=0 leaves it out.
# Usage: bench/snapshots/run.sh BUILD_DIR   (needs root, node, npm, awscli)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export KAGENT_BUILD_DIR KAGENT_SOURCE_DIR=$here
KAGENT_BUILD_DIR=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
. "$here/tests/lib/node.sh"
. "$here/tests/lib/s3rver.sh"
runs=${SNAP_BENCH_RUNS:-3}
s3_install
stop_all() { [ -n "${S3PID:-}" ] && kill "$S3PID" 2>/dev/null; node_cleanup; }
node_prestart() {
  trap stop_all EXIT
  s3_start
}
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$S3PORT
node_start
NODE_SNAPSHOT_LOCATION=file://$WORK/snapshots/ node_apply_template fbench
NODE_SNAPSHOT_LOCATION=s3://snaps/bench/ node_apply_template sbench
k() { "$KAGENT" --api-url "$API" "$@"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', ''))"; }
us() { echo "${EPOCHREALTIME/./}"; } # no process: a `date` would be timed with the call
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
lines() { wc -l < "$WORK/node.log"; }
settle() { # until every warm pool is full again (2, the default warm) and no refill is booting
  for _ in $(seq 300); do
    curl -sS "$API/metrics" | awk '$1 ~ /^kagent_warm_pool_depth\{/ && $2 < 2 {low = 1}
      END {exit low}' && return 0
    sleep 0.1
  done
  node_fail "the warm pools did not fill again"
}
phases() { # ID FROM_LINE: "phase ms" for each phase of ID the node logged after line FROM_LINE
  tail -n +$(($2 + 1)) "$WORK/node.log" |
    sed -n "s/.*event=sandbox_phase sandbox=$1 phase=\([a-z_]*\) ms=\([0-9.]*\).*/\1 \2/p"
}
# the tree: in the sandbox (to snapshot) and on the host (for the peers)
mk_tree() { # SIZE DIR
  case $1 in
  1MiB) echo "head -c 1048576 /dev/urandom > $2/f" ;;
  100MiB) echo "head -c 104857600 /dev/urandom > $2/f" ;;
  10kfiles) echo "for d in \$(seq 100); do mkdir -p $2/d\$d; for f in \$(seq 100); do echo \$d-\$f > $2/d\$d/\$f; done; done" ;;
  esac
}
printf '%-10s %-7s %12s %12s\n' tree target suspend_ms resume_ms
for size in ${SNAP_BENCH_TREES:-1MiB 100MiB 10kfiles}; do
  for tpl in fbench sbench; do
    target=$([ $tpl = fbench ] && echo file || echo s3)
    id=$(k sandbox create $tpl --request-id "b-$size-$tpl" -o json | field id)
    k sandbox exec "$id" -- sh -c "$(mk_tree $size /data/workspace)" >/dev/null 2>&1 || node_fail "tree $size"
    sus=() res=() gets=()
    : > "$WORK/phases"
    settle
    for _ in $(seq "$runs"); do
      t0=${EPOCHREALTIME/./}; k sandbox suspend "$id" >/dev/null || node_fail "suspend"
      t1=${EPOCHREALTIME/./}
      l=$(lines)
      t2=${EPOCHREALTIME/./}; k sandbox resume "$id" >/dev/null || node_fail "resume"
      t3=${EPOCHREALTIME/./}
      k sandbox get "$id" >/dev/null || node_fail "get"
      t4=${EPOCHREALTIME/./}
      sus+=($(((t1 - t0) / 1000))); res+=($(((t3 - t2) / 1000))); gets+=($(((t4 - t3) / 1000)))
      phases "$id" "$l" >> "$WORK/phases"
    done
    s=$(printf '%s\n' "${sus[@]}" | median); r=$(printf '%s\n' "${res[@]}" | median)
    printf '%-10s %-7s %12s %12s\n' "$size" "$target" "$s" "$r"
    printf '  resume phases, median ms:'
    for p in store_intent compute_start guest_ready resume_download; do
      printf ' %s=%s' "$p" "$(awk -v p=$p '$1 == p {print $2}' "$WORK/phases" | median)"
    done
    printf ' (cli get: %s)' "$(printf '%s\n' "${gets[@]}" | median)"
    echo
    echo "BENCH name=snapshot_suspend_${size}_${target} value=$s unit=ms"
    echo "BENCH name=snapshot_resume_${size}_${target} value=$r unit=ms"
    k sandbox delete "$id" >/dev/null
  done
  # peers: the same tree on the host
  peer=$WORK/peer-$size; mkdir -p "$peer"
  sh -c "$(mk_tree $size "$peer")"
  t0=$(us); tar -C "$peer" -cf - . | zstd -3 -q -c > "$WORK/peer.tar.zst"; t1=$(us)
  s3_aws s3 cp "$WORK/peer.tar.zst" "s3://snaps/peer/$size.tar.zst" >/dev/null; t2=$(us)
  s3_aws s3 cp "s3://snaps/peer/$size.tar.zst" "$WORK/peer.dl" >/dev/null; t3=$(us)
  echo "BENCH name=peer_tar_zstd_${size} value=$(((t1 - t0) / 1000)) unit=ms"
  echo "BENCH name=peer_aws_s3_cp_up_${size} value=$(((t2 - t1) / 1000)) unit=ms"
  echo "BENCH name=peer_aws_s3_cp_down_${size} value=$(((t3 - t2) / 1000)) unit=ms"
  if [ "${SNAP_BENCH_PHASES:-1}" = 1 ]; then
    mkdir -p "$WORK/snap-phases"
    S3RVER_PID=$S3PID "$KAGENT_BUILD_DIR/bench/snapshots/snap_phases" "s3://snaps/phases-$size/" \
      "$peer" "$WORK/snap-phases" "$runs" | sed "s/^BENCH name=snapshot_phase_/BENCH name=snapshot_phase_${size}_/"
  fi
  rm -rf "$peer" "$WORK/peer.tar.zst" "$WORK/peer.dl" "$WORK/snap-phases"
done
node_stop
