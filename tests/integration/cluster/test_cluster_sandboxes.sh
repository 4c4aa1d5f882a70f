#!/usr/bin/env bash
# Sandboxes across a local cluster (deploy/cluster.sh up 3, a 2.5 s lease renewed every 500 ms):
#   1. placement: a template of pool `solo`, which only node 3 serves, created through node 1
#      lands on node 3 (its record and node 3's log say so);
#   2. any node serves any sandbox: through node 2 an exec (output streamed), MCP tool calls
#      (get_sandbox, write_sandbox_file, start_sandbox_process), a fork (made on node 3), an
#      upload and a
#      download of 64 MiB (the transfer limit) byte for byte, a get; list through node 1; another identity gets
#      NotFound through node 2 as on node 3;
#   3. drain: node 1 drained, creates of the default pool through node 1 land on node 2;
#   4. kill -9 of node 3: every get through node 2 answers meanwhile (from the record while node
#      3 is gone); its sandboxes become FAILED (NodeLost) on a survivor within 5 s, the
#      short-TTL one still expires, one suspended into object storage (s3rver) stays SUSPENDED
#      and resumes on the survivor with its /data, creates keep working;
#   5. SIGSTOP of node 2 past its lease: node 1 takes its sandbox over; SIGCONT: node 2 fenced
#      itself (sandboxes_fenced), and after it registers again it does not recover the sandbox
#      node 1 took and discards the /data it kept of it;
#   6. node 3's row has left the node table 3 s after its lease lapsed (mesh.forget: nothing
#      names it any more); restarted, it registers anew under a greater incarnation, rejoins,
#      resurrects nothing another node decided and discards the /data it kept of the sandboxes
#      taken over meanwhile;
#   7. a fourth node started under a name in use (node-1), or under a live node's id, is refused
#      with the reason.
set -euo pipefail
src=${KAGENT_SOURCE_DIR:?} build=${KAGENT_BUILD_DIR:?}
. "$src/tests/lib/uids.sh"
. "$src/tests/lib/cluster.sh"
. "$src/tests/lib/s3rver.sh"
KAGENT=$build/bridges/cli/kagent
CLUSTER_DIR=$(mktemp -d /tmp/kagent-csbx.XXXXXX)
chmod 755 "$CLUSTER_DIR"
export CLUSTER_DIR CLUSTER_API_PORT=0 CLUSTER_MESH_PORT=0 CLUSTER_LEASE=2500ms CLUSTER_RENEW=500ms \
  CLUSTER_FORGET=3s
CLUSTER_UID_BASES="$(test_uid_base) $(test_uid_base) $(test_uid_base)" ||
  { echo "FAIL: no uid ranges" >&2; exit 1; }
export CLUSTER_UID_BASES
pools() { # pool names -> a pools: section, no warm sandboxes
  echo "pools:"
  for p in "$@"; do printf '  - name: %s\n    class: namespaces\n    capacity: 50\n    warm: 0\n' "$p"; done
}
CLUSTER_NODE1_YAML=$(pools kagent-default) CLUSTER_NODE2_YAML=$(pools kagent-default)
CLUSTER_NODE3_YAML=$(pools solo)
export CLUSTER_NODE1_YAML CLUSTER_NODE2_YAML CLUSTER_NODE3_YAML
declare -A API PID
node_fail() { fail "$@"; } # for s3rver.sh
WORK=$CLUSTER_DIR

cleanup() {
  local status=$?
  if [ $status != 0 ]; then
    cluster_logs
    rm -rf /tmp/kagent-csbx-failed && mkdir -p /tmp/kagent-csbx-failed &&
      for i in 1 2 3; do cp "$CLUSTER_DIR/node-$i/node.log" "/tmp/kagent-csbx-failed/node-$i.log" 2>/dev/null || true; done
  fi
  for p in "${PID[@]:-}"; do [ -z "$p" ] || kill -CONT "$p" 2>/dev/null || true; done
  s3_stop
  "$src/deploy/cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$CLUSTER_DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
k() { local i=$1; shift; "$KAGENT" --api-url "${API[$i]}" "$@"; }
field() { python3 -c 'import json,sys
d = json.load(sys.stdin)
for k in sys.argv[1].split("."): d = d.get(k, "") if isinstance(d, dict) else ""
print(d)' "$1"; }
get() { k "$1" sandbox get "$2" -o json | field "$3"; }
until_state() { # i id state ms why: waits until node i reads that state, else fails with why
  local t0
  t0=$(date +%s%N)
  until [ "$(get "$1" "$2" state)" = "$3" ]; do
    [ "$(ms_since "$t0")" -lt "$4" ] || fail "$5 (state $(get "$1" "$2" state))"
    sleep 0.1
  done
}

# The busybox tools image in every node's image store (same content, same digest).
rootfs=$CLUSTER_DIR/tools-rootfs
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp"
cp /bin/busybox "$rootfs/bin/busybox"
"$rootfs/bin/busybox" --install -s "$rootfs/bin"
for b in "$rootfs"/bin/*; do [ -L "$b" ] && ln -sf busybox "$b"; done
for i in 1 2 3; do
  mkdir -p "$CLUSTER_DIR/node-$i/state"
  ref[i]=$("$build/actors/images/kagent-image" --state-dir "$CLUSTER_DIR/node-$i/state" build \
           --rootfs "$rootfs" --name test/tools) || fail "tools image for node $i"
done
[ "${ref[1]}" = "${ref[3]}" ] || fail "the tools image differs between nodes: ${ref[1]} ${ref[3]}"

# object storage every node reaches (the nodes take the keys from their environment)
s3_install
s3_start
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$S3PORT
out=$("$src/deploy/cluster.sh" up 3 "$build") || fail "cluster.sh up 3"
while read -r name url pid; do
  i=${name#node-}
  API[$i]=$url
  PID[$i]=$pid
done <<< "$out"
alive_count() { k "$1" runtime nodes -o json | python3 -c '
import json, sys
print(sum(1 for n in json.load(sys.stdin)["nodes"] if n.get("alive")))'; }
node_field() { # i name field: that field of node `name`'s row as node i reads the table ("" if none)
  k "$1" runtime nodes -o json | python3 -c '
import json, sys
print(next((str(n.get(sys.argv[2], "")) for n in json.load(sys.stdin)["nodes"]
            if n.get("name") == sys.argv[1]), ""))' "$2" "$3"; }
t0=$(date +%s%N)
for i in 1 2 3; do
  until [ "$(alive_count "$i")" = 3 ]; do
    [ "$(ms_since "$t0")" -lt 30000 ] || fail "node-$i does not see three live nodes"
    sleep 0.2
  done
done
node_id() { k 1 runtime nodes -o json | python3 -c '
import json, sys
print(next(n["id"] for n in json.load(sys.stdin)["nodes"] if n["name"] == sys.argv[1]))' "$1"; }
id1=$(node_id node-1) id2=$(node_id node-2)

template() { # i name pool [location]: applied through node i, Prepared
  cat > "$CLUSTER_DIR/$2.yaml" <<YAML
apiVersion: api.kagent.dev/v1alpha3
kind: SandboxTemplate
metadata:
  name: $2
  namespace: kagent
spec:
  workload:
    image: ${ref[1]}
  substrate:
    workerPoolRef:
      name: $3
    snapshotPolicy:
      location: ${4:-file://$CLUSTER_DIR/snapshots/}
YAML
  k "$1" apply -f "$CLUSTER_DIR/$2.yaml" >/dev/null || fail "apply $2"
  for _ in $(seq 300); do
    k "$1" get template "$2" -o json 2>/dev/null | grep '"Prepared"' >/dev/null && return 0
    sleep 0.1
  done
  fail "template $2 never became Ready"
}
create() { # i template request-id [ttl] -> id
  local out
  out=$(k "$1" sandbox create "$2" --request-id "$3" --ttl "${4:-10m}" -o json 2>&1) ||
    fail "create $2 $3 through node $1: $out"
  echo "$out" | field id
}
template 3 solo solo
template 3 solo-s3 solo s3://snaps/cluster/
template 1 anywhere kagent-default

# ---- 1. placement ------------------------------------------------------------------------------
sbx=$(create 1 solo placed-1) || fail "create through node 1"
[ "$(get 1 "$sbx" state)" = RUNTIME_STATE_READY ] || fail "placed sandbox not READY"
grep -q "event=sandbox_created sandbox=$sbx " "$CLUSTER_DIR/node-3/node.log" ||
  fail "the solo sandbox was not created on node 3"
[ "$(get 2 "$sbx" node)" = node-3 ] || fail "Sandbox.node: $(get 2 "$sbx" node)"
same=$(create 2 solo placed-1) || fail "replay through node 2"
[ "$same" = "$sbx" ] || fail "a replay through another node made another sandbox: $same"
# a refusal by the owner's node comes back through another node as that node sent it (an error
# reply relayed with its status and message)
out=$(k 2 sandbox resume "$sbx" 2>&1) && fail "resume of a READY sandbox through node 2: $out"
case "$out" in
  *"code = FailedPrecondition desc = cannot resume a sandbox in state RUNTIME_STATE_READY"*) ;;
  *) fail "the refusal relayed through node 2: $out" ;;
esac

# ---- 2. any node serves any sandbox ------------------------------------------------------------
[ "$(k 2 sandbox exec "$sbx" -- sh -c 'for i in 1 2 3; do echo line$i; sleep 0.1; done')" = \
  "$(printf 'line1\nline2\nline3')" ] || fail "exec through node 2"
head -c 67108864 /dev/urandom > "$CLUSTER_DIR/blob"
k 2 sandbox upload "$sbx" "$CLUSTER_DIR/blob" data/blob >/dev/null || fail "upload through node 2"
[ "$(k 1 sandbox exec "$sbx" -- sh -c 'wc -c < data/blob')" = 67108864 ] || fail "uploaded size"
k 2 sandbox download "$sbx" data/blob "$CLUSTER_DIR/back" >/dev/null || fail "download via node 2"
cmp -s "$CLUSTER_DIR/blob" "$CLUSTER_DIR/back" || fail "the download through node 2 differs"
fork=$(k 2 sandbox fork "$sbx" --request-id fork-via-2 -o json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["sandboxes"][0]["id"])') || fail "fork through node 2"
[ "$(get 1 "$fork" node)" = node-3 ] && [ "$(get 1 "$fork" state)" = RUNTIME_STATE_READY ] ||
  fail "the fork through node 2: $(get 1 "$fork" node) $(get 1 "$fork" state)"
[ "$(k 1 sandbox exec "$fork" -- sh -c 'wc -c < data/blob')" = 67108864 ] || fail "the fork's /data"
k 1 sandbox list -o json | grep "$sbx" >/dev/null || fail "list through node 1"
k 3 sandbox list -o json | grep "$sbx" >/dev/null || fail "list through node 3"
mcp() { # i tool arguments-json -> the tool result's text (fails on a JSON-RPC or tool error)
  curl -fsS -X POST -H 'content-type: application/json' -H 'accept: application/json' \
    -H 'x-user-id: admin@kagent.dev' "${API[$1]}/mcp" -d "{\"jsonrpc\":\"2.0\",\"id\":7,
    \"method\":\"tools/call\",\"params\":{\"name\":\"$2\",\"arguments\":$3}}" |
    python3 -c 'import json, sys
r = json.load(sys.stdin)
assert "result" in r and not r["result"].get("isError"), r
print(r["result"]["content"][0]["text"])'
}
out=$(mcp 2 get_sandbox "{\"sandbox_id\":\"$sbx\"}") || fail "MCP get_sandbox through node 2"
[[ $out == *'"node": "node-3"'* || $out == *'"node":"node-3"'* ]] || fail "MCP get_sandbox: $out"
mcp 2 write_sandbox_file "{\"sandbox_id\":\"$sbx\",\"path\":\"mcp.txt\",\"data_base64\":\"aGkgbWNw\",\"mode\":420}" \
  >/dev/null || fail "MCP write_sandbox_file through node 2"
[ "$(k 3 sandbox exec "$sbx" -- cat mcp.txt)" = "hi mcp" ] || fail "the MCP write through node 2"
out=$(mcp 1 start_sandbox_process "{\"sandbox_id\":\"$sbx\",\"command\":[\"true\"]}") ||
  fail "MCP start_sandbox_process through node 1"
[[ $out == *process_id* ]] || fail "MCP start_sandbox_process: $out"
err=$("$KAGENT" --api-url "${API[2]}" --user-id mallory@example.com sandbox get "$sbx" 2>&1) &&
  fail "another identity read the sandbox through node 2"
[[ $err == *NotFound* ]] || fail "another identity through node 2: $err"
err=$("$KAGENT" --api-url "${API[2]}" --user-id mallory@example.com sandbox exec "$sbx" -- true 2>&1) &&
  fail "another identity ran a command through node 2"
[[ $err == *NotFound* ]] || fail "another identity's exec through node 2: $err"

# ---- 3. drain ------------------------------------------------------------------------------------
k 3 runtime drain "$id1" | grep "node $id1 (node-1) drained" >/dev/null || fail "drain node 1"
t0=$(date +%s%N)
until k 1 runtime nodes | grep 'node-1 .*true (draining)' >/dev/null; do
  [ "$(ms_since "$t0")" -lt 60000 ] || fail "node 1 does not show draining"; sleep 0.2
done
for n in 1 2 3 4; do
  s=$(create 1 anywhere drained-$n) || fail "create with node 1 drained"
  [ "$(get 1 "$s" node)" = node-2 ] || fail "a create landed on $(get 1 "$s" node) with node 1 drained"
done
on2=$s

# ---- 4. kill -9 of node 3 ------------------------------------------------------------------------
s3box=$(create 1 solo-s3 placed-s3) || fail "create an object-storage sandbox"
k 2 sandbox exec "$s3box" -- sh -c 'echo kept > kept.txt' >/dev/null || fail "write to s3box"
k 2 sandbox suspend "$s3box" >/dev/null || fail "suspend through node 2"
[ "$(get 3 "$s3box" state)" = RUNTIME_STATE_SUSPENDED ] || fail "s3box not SUSPENDED"
short=$(create 2 solo placed-short 5s) || fail "create a short-TTL sandbox"
[ "$(get 3 "$short" node)" = node-3 ] || fail "the short-TTL sandbox is not on node 3"
inc3=$(node_field 1 node-3 incarnation) state=
[ -n "$inc3" ] || fail "node 1 does not list node 3"
kill_ms=$(date +%s%3N)
kill -KILL "${PID[3]}"
# every get through node 2 (which remembers where $sbx runs) answers, from the record while
# node 3 is gone and its lease not yet lapsed
t0=$(date +%s%N)
until [ "$state" = RUNTIME_STATE_FAILED ]; do
  out=$(k 2 sandbox get "$sbx" -o json 2>&1) || fail "a get through node 2 after the kill: $out"
  state=$(field state <<< "$out")
  [ "$(ms_since "$t0")" -lt 10000 ] || fail "node 3's sandbox not FAILED 10 s after kill -9 ($state)"
  sleep 0.05
done
# when the taker recorded it (its log), not when this loop's CLI calls saw it
taken=$(grep -h "event=sandbox_taken_over sandbox=$sbx " "$CLUSTER_DIR"/node-[12]/node.log |
        sed -n 's/^ts=\([^ ]*\) .*/\1/p' | head -1)
[ -n "$taken" ] || fail "no node logged taking $sbx over"
failed_ms=$(( $(date -d "$taken" +%s%3N) - kill_ms ))
echo "CLUSTER kill9_sandbox_failed_ms=$failed_ms"
[ "$failed_ms" -le 5000 ] || fail "FAILED $failed_ms ms after the kill (more than 5 s)"
[ "$(get 2 "$sbx" failure.reason)" = NodeLost ] || fail "reason: $(get 2 "$sbx" failure.reason)"
taker=$(get 1 "$sbx" node)
[[ $taker == node-1 || $taker == node-2 ]] || fail "taken over by '$taker'"
[ "$(get 1 "$s3box" state)" = RUNTIME_STATE_SUSPENDED ] && [ "$(get 1 "$s3box" node)" != node-3 ] ||
  fail "the object-storage sandbox: $(get 1 "$s3box" state) on $(get 1 "$s3box" node)"
out=$(k 1 sandbox resume "$s3box" 2>&1) || fail "resume on the survivor: $out"
[ "$(get 2 "$s3box" state)" = RUNTIME_STATE_READY ] || fail "s3box not READY after resume"
[ "$(k 2 sandbox exec "$s3box" -- cat kept.txt)" = kept ] || fail "s3box lost its /data"
s=$(create 2 anywhere after-kill) || fail "a create after the kill"
[ "$(get 2 "$s" state)" = RUNTIME_STATE_READY ] || fail "a create after the kill is not READY"
until_state 1 "$short" RUNTIME_STATE_DELETED 15000 "the lost node's short TTL did not expire"

# ---- 5. SIGSTOP node 2 past its lease, SIGCONT ---------------------------------------------------
[ -d "$CLUSTER_DIR/node-2/state/sandboxes/$on2" ] || fail "node 2 holds no directory of $on2"
kill -STOP "${PID[2]}"
until_state 1 "$on2" RUNTIME_STATE_FAILED 10000 "node 2's sandbox not taken over while it is stopped"
[ "$(get 1 "$on2" node)" = node-1 ] || fail "node 2's sandbox went to $(get 1 "$on2" node)"
kill -CONT "${PID[2]}"
t0=$(date +%s%N)
until grep -q "path=node-2/sandboxes[^ ]* event=sandboxes_fenced" "$CLUSTER_DIR/node-2/node.log"; do
  [ "$(ms_since "$t0")" -lt 5000 ] || fail "node 2 did not fence its sandboxes"
  sleep 0.1
done
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "${API[2]}/readyz")" = 200 ]; do
  [ "$(ms_since "$t0")" -lt 20000 ] || fail "node 2 not ready again"
  sleep 0.2
done
sleep 1.5 # its recovery after the new registration
! grep -q "event=sandbox_recovered sandbox=$on2 " "$CLUSTER_DIR/node-2/node.log" ||
  fail "node 2 recovered a sandbox node 1 took over"
t0=$(date +%s%N)
while [ -e "$CLUSTER_DIR/node-2/state/sandboxes/$on2" ]; do # its kept /data: discarded
  [ "$(ms_since "$t0")" -lt 10000 ] || fail "node 2 kept the /data of a sandbox node 1 took over"
  sleep 0.1
done
[ "$(get 2 "$on2" node)" = node-1 ] && [ "$(get 2 "$on2" state)" = RUNTIME_STATE_FAILED ] ||
  fail "the taken sandbox changed: $(get 2 "$on2" node) $(get 2 "$on2" state)"
out=$(k 2 sandbox delete "$on2" 2>&1) || fail "delete through node 2: $out"
[[ $out == *RUNTIME_STATE_DELETED* ]] || fail "delete through node 2: $out"

# ---- 6. node 3 forgotten, restarted: it rejoins ---------------------------------------------------
[ -d "$CLUSTER_DIR/node-3/state/sandboxes/$sbx" ] || fail "node 3 kept no /data of $sbx"
t0=$(date +%s%N)
while [ -n "$(node_field 1 node-3 id)" ]; do
  [ "$(ms_since "$t0")" -lt 15000 ] || fail "node 3's row was not forgotten (mesh.forget 3s)"
  sleep 0.2
done
grep -q "event=node_forgotten node=[0-9]* name=node-3 " "$CLUSTER_DIR"/node-[12]/node.log ||
  fail "no node logged forgetting node 3"
setsid "$build/node/kagentd" --config "$CLUSTER_DIR/node-3/kagentd.yaml" \
  >> "$CLUSTER_DIR/node-3/node.log" 2>&1 < /dev/null &
PID[3]=$!
echo "${PID[3]}" > "$CLUSTER_DIR/node-3/pid"
t0=$(date +%s%N)
until [ "$(grep -c 'path=node-3 event=started' "$CLUSTER_DIR/node-3/node.log")" = 2 ]; do
  [ "$(ms_since "$t0")" -lt 60000 ] || fail "node 3 did not start again"
  sleep 0.1
done
port=$(sed -n 's/.*path=node-3 event=started.* listen=[0-9.]*:\([0-9]*\).*/\1/p' \
       "$CLUSTER_DIR/node-3/node.log" | tail -1)
API[3]=http://127.0.0.1:$port
until [ "$(alive_count 1)" = 3 ]; do
  [ "$(ms_since "$t0")" -lt 30000 ] || fail "node 3 did not rejoin"
  sleep 0.2
done
sleep 1
[ "$(node_field 1 node-3 incarnation)" -gt "$inc3" ] ||
  fail "node 3 back under incarnation $(node_field 1 node-3 incarnation), not above $inc3"
t0=$(date +%s%N)
while [ -e "$CLUSTER_DIR/node-3/state/sandboxes/$sbx" ]; do # kept, then taken over: discarded
  [ "$(ms_since "$t0")" -lt 10000 ] || fail "node 3 kept the /data of $sbx after it rejoined"
  sleep 0.1
done
# (node 1 may hold it by now: it took over node 2's sandboxes, the ones node 2 took from node 3)
[ "$(get 1 "$sbx" node)" != node-3 ] && [ "$(get 1 "$sbx" state)" = RUNTIME_STATE_FAILED ] ||
  fail "node 3 resurrected its old sandbox: $(get 1 "$sbx" node) $(get 1 "$sbx" state)"
s=$(create 1 solo placed-after-rejoin) || fail "create on node 3 after it rejoined"
[ "$(get 3 "$s" node)" = node-3 ] || fail "solo create after rejoin: $(k 3 sandbox get "$s" 2>&1)"

# ---- 7. a node under a name in use --------------------------------------------------------------
mkdir -p "$CLUSTER_DIR/dup/state"
dup_uids=$(test_uid_base) || fail "no uid range for a fourth node"
sed -e "s#stateDir: .*#stateDir: $CLUSTER_DIR/dup/state#" -e 's#port: [0-9]*#port: 0#' \
    -e "s#uidBase: .*#uidBase: $dup_uids#" \
    -e 's#tcp://127.0.0.1:[0-9]*#tcp://127.0.0.1:0#' \
    -e 's#name: node-2#name: node-1#' \
  "$CLUSTER_DIR/node-2/kagentd.yaml" > "$CLUSTER_DIR/dup/kagentd.yaml" # node 1's database
out=$(timeout 60 "$build/node/kagentd" --config "$CLUSTER_DIR/dup/kagentd.yaml" 2>&1) &&
  fail "a second node named node-1 started"
[[ $out == *'node.name "node-1" is node '*"'s in the node table (alive): names are unique"* ]] ||
  fail "a second node-1: $out"
id2=$(node_field 1 node-2 id)
sed -i "s#name: node-1#name: node-9\n  id: $id2#" "$CLUSTER_DIR/dup/kagentd.yaml"
out=$(timeout 60 "$build/node/kagentd" --config "$CLUSTER_DIR/dup/kagentd.yaml" 2>&1) &&
  fail "a node started under node 2's id"
[[ $out == *"node.id $id2 is node \"node-2\"'s, alive in the node table"* ]] ||
  fail "a node under node 2's id: $out"
[ "$(alive_count 1)" = 3 ] || fail "the refused nodes changed the table"
[ -z "$(node_field 1 node-9 id)" ] || fail "node-9 is in the table"

out=$("$src/deploy/cluster.sh" down 2>&1) || fail "cluster.sh down: $out"
echo "PASS"
