#!/usr/bin/env bash
# A cluster on this machine (deploy/cluster.sh, nodes sharing node 1's PostgreSQL, fsync on):
#   cluster_creates_per_s   CLUSTER_BENCH_CREATES creates (CLI processes, CLUSTER_BENCH_PAR at
#                           once, spread over the nodes' APIs round robin), 3 nodes; the peer is
#                           the same on 1 node. Placement spreads them (power of two choices).
#   cluster_exec_p50        `kagent sandbox exec ID -- true` through a node that does not serve
#                           the sandbox (the call relayed over the mesh); the peer is the same
#                           call through the node serving it.
# Warm pools are off on every node (warm: 0): every create is a cold start, on both sides.
# Usage: bench/cluster/run.sh BUILD_DIR   (needs root)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
creates=${CLUSTER_BENCH_CREATES:-60}
par=${CLUSTER_BENCH_PAR:-6}
execs=${CLUSTER_BENCH_EXECS:-100}
KAGENT=$build/bridges/cli/kagent
fail() { echo "bench/cluster: $*" >&2; exit 1; }
[ -x "$KAGENT" ] || fail "build first"
CLUSTER_DIR=$(mktemp -d /tmp/kagent-bench-cluster.XXXXXX)
chmod 755 "$CLUSTER_DIR"
export CLUSTER_DIR CLUSTER_API_PORT=0 CLUSTER_MESH_PORT=0
pools='pools:
  - name: kagent-default
    class: namespaces
    capacity: 1000
    warm: 0'
export CLUSTER_NODE1_YAML=$pools CLUSTER_NODE2_YAML=$pools CLUSTER_NODE3_YAML=$pools
declare -a API
rootfs=$CLUSTER_DIR/../kagent-bench-rootfs.$$
trap '"$here/deploy/cluster.sh" down >/dev/null 2>&1 || true; rm -rf "$CLUSTER_DIR" "$rootfs"' EXIT
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp"
cp /bin/busybox "$rootfs/bin/busybox"
"$rootfs/bin/busybox" --install -s "$rootfs/bin"
for b in "$rootfs"/bin/*; do [ -L "$b" ] && ln -sf busybox "$b"; done
p50() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

up() { # n: a cluster of n nodes with the tools image and a Prepared template; sets API, REF
  local n=$1 i out name url pid
  for i in $(seq "$n"); do
    mkdir -p "$CLUSTER_DIR/node-$i/state"
    REF=$("$build/actors/images/kagent-image" --state-dir "$CLUSTER_DIR/node-$i/state" build \
          --rootfs "$rootfs" --name bench/tools) || fail "tools image"
  done
  out=$("$here/deploy/cluster.sh" up "$n" "$build") || fail "cluster.sh up $n"
  API=()
  while read -r name url pid; do API[${name#node-}]=$url; done <<< "$out"
  cat > "$CLUSTER_DIR/t.yaml" <<YAML
apiVersion: api.kagent.dev/v1alpha3
kind: SandboxTemplate
metadata:
  name: bench
  namespace: kagent
spec:
  workload:
    image: $REF
  substrate:
    workerPoolRef:
      name: kagent-default
    snapshotPolicy:
      location: file://$CLUSTER_DIR/snapshots/
YAML
  "$KAGENT" --api-url "${API[1]}" apply -f "$CLUSTER_DIR/t.yaml" >/dev/null || fail "apply"
  for _ in $(seq 300); do
    "$KAGENT" --api-url "${API[1]}" get template bench -o json | grep '"Prepared"' >/dev/null && break
    sleep 0.1
  done
  until [ "$("$KAGENT" --api-url "${API[1]}" runtime nodes -o json | grep -c '"alive": *true')" = "$n" ]; do
    sleep 0.2
  done
}
create() { # api request-id -> id
  "$KAGENT" --api-url "$1" sandbox create bench --request-id "$2" --ttl 10m -o json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'
}
# creates/s: $creates creates, $par at a time, over the nodes round robin
creates_per_s() {
  local n=$1 tag=$2 t0 i
  for i in $(seq "$n"); do create "${API[$i]}" "warm-$tag-$i" >/dev/null; done # each node's first
  t0=${EPOCHREALTIME/./}
  for i in $(seq "$creates"); do
    echo "${API[$(( (i - 1) % n + 1 ))]} $tag-$i"
  done | xargs -P "$par" -n 2 sh -c '"$0" --api-url "$1" sandbox create bench --request-id "$2" --ttl 10m >/dev/null' "$KAGENT" ||
    fail "a create failed"
  awk -v n="$creates" -v us=$((${EPOCHREALTIME/./} - t0)) 'BEGIN {printf "%.1f\n", n / (us / 1e6)}'
}
exec_p50() { # api id
  local i t0
  "$KAGENT" --api-url "$1" sandbox exec "$2" -- true >/dev/null
  for i in $(seq "$execs"); do
    t0=${EPOCHREALTIME/./}
    "$KAGENT" --api-url "$1" sandbox exec "$2" -- true >/dev/null
    echo $((${EPOCHREALTIME/./} - t0))
  done | p50 | awk '{printf "%.2f\n", $1 / 1000}'
}

up 1
one=$(creates_per_s 1 one)
"$here/deploy/cluster.sh" down >/dev/null || fail "down"
mkdir -p "$CLUSTER_DIR"
chmod 755 "$CLUSTER_DIR"
up 3
three=$(creates_per_s 3 three)
id=$(create "${API[1]}" exec-bench)
node=$("$KAGENT" --api-url "${API[1]}" sandbox get "$id" -o json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["node"])')
owner=${node#node-}
other=$(( owner % 3 + 1 ))
own=$(exec_p50 "${API[$owner]}" "$id")
relayed=$(exec_p50 "${API[$other]}" "$id")
load=$(cut -d' ' -f1-3 /proc/loadavg)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
printf '%-34s %10s %10s\n' figure value peer \
  "cluster_creates_per_s (3 vs 1)" "$three" "$one" \
  "cluster_exec_p50_ms (relayed vs owner)" "$relayed" "$own"
echo "($creates creates, $par at a time; $execs execs each way; load average $load; $(nproc) cores)"
echo "BENCH name=cluster_creates_per_s value=$three unit=creates/s peer=one_node peer_value=$one ratio=$(ratio "$three" "$one")"
echo "BENCH name=cluster_exec_p50 value=$relayed unit=ms peer=owning_node peer_value=$own ratio=$(ratio "$own" "$relayed")"
