#!/usr/bin/env bash
# Placement past a full node (deploy/cluster.sh up 2, pool kagent-default of capacity 1 on each;
# the node table's loads are up to a renewal, 1 s, old, and the creates follow each other closely):
#   1. two creates through node 1 both succeed, one on each node: when placement picks a node
#      the table still shows with room but which is full, that node refuses RESOURCE_EXHAUSTED
#      (recording nothing) and the create goes, under the same request id, to the other node;
#   2. a third create is refused RESOURCE_EXHAUSTED naming the pool, and leaves no sandbox (with
#      the table stale, after the node picked and then the other refused it);
#   3. replays of the two created request ids, through either node, answer the same sandboxes
#      (nothing created twice).
set -euo pipefail
src=${KAGENT_SOURCE_DIR:?} build=${KAGENT_BUILD_DIR:?}
. "$src/tests/lib/uids.sh"
. "$src/tests/lib/cluster.sh"
KAGENT=$build/bridges/cli/kagent
CLUSTER_DIR=$(mktemp -d /tmp/kagent-ccap.XXXXXX)
chmod 755 "$CLUSTER_DIR"
export CLUSTER_DIR CLUSTER_API_PORT=0 CLUSTER_MESH_PORT=0
CLUSTER_UID_BASES="$(test_uid_base) $(test_uid_base)" || { echo "FAIL: no uid ranges" >&2; exit 1; }
export CLUSTER_UID_BASES
CLUSTER_NODE1_YAML=$'pools:\n  - name: kagent-default\n    class: namespaces\n    capacity: 1\n    warm: 0'
CLUSTER_NODE2_YAML=$CLUSTER_NODE1_YAML
export CLUSTER_NODE1_YAML CLUSTER_NODE2_YAML
declare -A API

cleanup() {
  local status=$?
  [ $status = 0 ] || cluster_logs
  "$src/deploy/cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$CLUSTER_DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
k() { local i=$1; shift; "$KAGENT" --api-url "${API[$i]}" "$@"; }
listed() { k 2 sandbox list | grep -oE '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' | sort -u | wc -l; }
field() { python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$1"; }

# the busybox tools image in each node's image store
rootfs=$CLUSTER_DIR/tools-rootfs
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp"
cp /bin/busybox "$rootfs/bin/busybox"
"$rootfs/bin/busybox" --install -s "$rootfs/bin"
for i in 1 2; do
  mkdir -p "$CLUSTER_DIR/node-$i/state"
  ref=$("$build/actors/images/kagent-image" --state-dir "$CLUSTER_DIR/node-$i/state" build \
        --rootfs "$rootfs" --name test/tools) || fail "tools image for node $i"
done
out=$("$src/deploy/cluster.sh" up 2 "$build") || fail "cluster.sh up 2"
while read -r name url _; do API[${name#node-}]=$url; done <<< "$out"
alive() { k "$1" runtime nodes -o json | python3 -c '
import json, sys
print(sum(1 for n in json.load(sys.stdin)["nodes"] if n.get("alive")))'; }
for _ in $(seq 300); do [ "$(alive 1)" = 2 ] && break; sleep 0.1; done
[ "$(alive 1)" = 2 ] || fail "node-1 does not see two live nodes"

cat > "$CLUSTER_DIR/t.yaml" <<YAML
apiVersion: api.kagent.dev/v1alpha3
kind: SandboxTemplate
metadata:
  name: tools
  namespace: kagent
spec:
  workload:
    image: $ref
  substrate:
    workerPoolRef:
      name: kagent-default
    snapshotPolicy:
      location: file://$CLUSTER_DIR/snapshots/
YAML
k 1 apply -f "$CLUSTER_DIR/t.yaml" >/dev/null || fail "apply the template"
for _ in $(seq 300); do
  k 1 get template tools -o json 2>/dev/null | grep -q '"Prepared"' && break
  sleep 0.1
done

# 1. two creates, one per node, whatever placement picked first
a=$(k 1 sandbox create tools --request-id cc-a -o json 2>&1) || fail "create cc-a: $a"
b=$(k 1 sandbox create tools --request-id cc-b -o json 2>&1) || fail "create cc-b (a full node's refusal not placed again?): $b"
a=$(field id <<< "$a") b=$(field id <<< "$b")
na=$(k 2 sandbox get "$a" -o json | field node) nb=$(k 2 sandbox get "$b" -o json | field node)
[ "$na" != "$nb" ] || fail "both sandboxes on $na (capacity 1 each)"

# 2. a third: no node has room
set +e; out=$(k 1 sandbox create tools --request-id cc-c -o json 2>&1); rc=$?; set -e
[ "$rc" != 0 ] || fail "a third create went through two full nodes: $out"
grep -q "code = ResourceExhausted" <<< "$out" || fail "cc-c: want RESOURCE_EXHAUSTED: $out"
grep -q "of pool kagent-default has room for another sandbox" <<< "$out" || fail "cc-c: the pool's message: $out"
case "$out" in # the table as node 1 read it at its last renewal: stale (normal here), or not
  *"(all full, draining or down)"*) echo "note: node 1's table was fresh for cc-c" >&2 ;;
  *) grep "event=create_placed_again" "$CLUSTER_DIR/node-1/node.log" | grep -q "request_id=cc-c" ||
       fail "cc-c's refusal by a full node was not placed again: $out" ;;
esac
[ "$(listed)" = 2 ] || fail "a refused create left a sandbox: $(k 2 sandbox list)"

# 3. replays: the same sandboxes, through either node
[ "$(k 2 sandbox create tools --request-id cc-a -o json | field id)" = "$a" ] || fail "replay of cc-a"
[ "$(k 1 sandbox create tools --request-id cc-b -o json | field id)" = "$b" ] || fail "replay of cc-b"
[ "$(listed)" = 2 ] || fail "a replay made a sandbox"
k 1 sandbox delete "$a" >/dev/null
k 1 sandbox delete "$b" >/dev/null
echo "placed again after a refusal: $(grep "event=create_placed_again" "$CLUSTER_DIR"/node-*/node.log |
  grep -oE 'request_id=cc-[a-c]' | tr '\n' ' ')"
echo "PASS cluster_capacity"
