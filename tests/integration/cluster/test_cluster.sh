#!/usr/bin/env bash
# A local cluster (deploy/cluster.sh up 3): three kagentd nodes sharing node 1's PostgreSQL,
# each with its own state dir, ports and host-uid range.
#   1. every node's `kagent runtime nodes` lists the three, alive, each other's mesh peers;
#   2. a request across the mesh: node 2 answers `runtime tree --node <node 3>` with node 3's
#      actor tree (node 2's gRPC bridge -> krt_call_name("cluster@3") -> node 3's actor), and
#      `runtime tree` with every node's;
#   3. kill -9 of node 3: within 5 s nodes 1 and 2 show it not alive and their mesh declared it
#      down (node-down to monitors); once its lease lapsed they drop it as a peer;
#   4. SIGSTOP of node 2 past its lease, then SIGCONT: it is fenced (/readyz 503, node_fenced,
#      not a member) until it registers again under a new incarnation, and rejoins the mesh;
#   5. SIGTERM of node 2: it leaves (its lease ends at once), node 1 drops it well before a lease;
#   6. `down` stops the rest and leaves no process, mount or state behind.
set -euo pipefail
src=${KAGENT_SOURCE_DIR:?} build=${KAGENT_BUILD_DIR:?}
. "$src/tests/lib/uids.sh"
. "$src/tests/lib/cluster.sh"
KAGENT=$build/bridges/cli/kagent
CLUSTER_DIR=$(mktemp -d /tmp/kagent-cluster.XXXXXX)
export CLUSTER_DIR CLUSTER_API_PORT=0 CLUSTER_MESH_PORT=0
CLUSTER_UID_BASES="$(test_uid_base) $(test_uid_base) $(test_uid_base)" ||
  { echo "FAIL: no uid ranges" >&2; exit 1; }
export CLUSTER_UID_BASES
declare -A API PID

cleanup() {
  local status=$?
  if [ $status != 0 ]; then
    cluster_logs
  fi
  [ -z "${PID[2]:-}" ] || kill -CONT "${PID[2]}" 2>/dev/null || true
  "$src/deploy/cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$CLUSTER_DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# One line per node as node $1 sees the cluster: "name alive lease_held connected self incarnation id"
view() {
  "$KAGENT" --api-url "${API[$1]}" runtime nodes -o json 2>/dev/null | python3 -c '
import json, sys
for n in json.load(sys.stdin)["nodes"]:
    print(n["name"], *(int(bool(n.get(k))) for k in ("alive", "leaseHeld", "connected", "self")),
          n.get("incarnation", "0"), n["id"])'
}
# field $3 (2 alive, 3 lease_held, 4 connected, 6 incarnation, 7 id) of node $2 in node $1's view
seen() { view "$1" | awk -v n="$2" -v f="$3" '$1 == n { print $f }'; }
ready() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "${API[$1]}/readyz"; }

# ---- up --------------------------------------------------------------------------------------
t0=$(date +%s%N)
out=$("$src/deploy/cluster.sh" up 3 "$build") || fail "cluster.sh up 3"
echo "CLUSTER up_3_nodes_ms=$(ms_since "$t0")"
[ "$(echo "$out" | wc -l)" = 3 ] || fail "up printed: $out"
while read -r name url pid; do
  [[ $url =~ ^http://127\.0\.0\.1:[0-9]+$ && $pid =~ ^[0-9]+$ && $name =~ ^node-([123])$ ]] ||
    fail "not 'node-<i> <api-url> <pid>': $name $url $pid"
  i=${BASH_REMATCH[1]}
  API[$i]=$url
  PID[$i]=$pid
  kill -0 "$pid" || fail "$name: pid $pid is not running"
done <<< "$out"

# ---- 1. every node sees all three alive and peered ---------------------------------------------
all_joined() {
  local i v
  for i in 1 2 3; do
    v=$(view "$i")
    [ "$(echo "$v" | awk '$2 == 1' | wc -l)" = 3 ] || return 1
    [ "$(echo "$v" | awk '$5 == 0 && $4 == 1' | wc -l)" = 2 ] || return 1 # the others: peers
    [ "$(echo "$v" | awk '$5 == 1' | cut -d' ' -f1)" = "node-$i" ] || return 1
  done
}
t0=$(date +%s%N)
until all_joined; do [ "$(ms_since "$t0")" -lt 30000 ] || fail "not all joined: $(view 1)"; sleep 0.2; done
echo "CLUSTER all_joined_ms=$(ms_since "$t0")"
table=$("$KAGENT" --api-url "${API[2]}" runtime nodes)
[ "$(echo "$table" | grep -c ' true ')" = 3 ] || fail "runtime nodes table: $table"
grep -q '^ID  *NAME  *ENDPOINT  *MESH  *ALIVE  *LEASE  *INCARNATION  *POOLS  *CAPACITY  *SANDBOXES' <<< "$table" ||
  fail "runtime nodes header: $table"
for i in 1 2 3; do [ "$(ready "$i")" = 200 ] || fail "node-$i /readyz $(ready "$i")"; done
id3=$(seen 1 node-3 7)
[ "$(ls -l "$CLUSTER_DIR/node-3/state/cluster/mesh.key" | cut -c1-10)" = "-rw-------" ] ||
  fail "mesh.key is not 0600"
[ "$(cat "$CLUSTER_DIR/node-3/state/cluster/node-id")" = "$id3" ] || fail "node-id file vs table"

# ---- 2. a request across the mesh: node 3's actor tree from node 2 ----------------------------
tree=$("$KAGENT" --api-url "${API[2]}" runtime tree --node "$id3" -o json) || fail "remote tree"
echo "$tree" | python3 -c '
import json, sys
t = json.load(sys.stdin)
paths = []
def walk(a):
    for n in a:
        paths.append(n["path"]); walk(n.get("children", []))
walk(t)
assert all(p.startswith("node-3/") for p in paths), paths
assert "node-3/supervisor/cluster" in paths and "node-3/supervisor/store" in paths, paths
' || fail "node 2 did not answer with node 3's tree: $tree"
# without --node: every live node's tree, the answering node's first
"$KAGENT" --api-url "${API[2]}" runtime tree -o json | python3 -c '
import json, sys
roots = [n["path"].split("/")[0] for n in json.load(sys.stdin)]
assert roots[0] == "node-2" and set(roots) == {"node-1", "node-2", "node-3"}, roots
' || fail "runtime tree across the cluster"
"$KAGENT" --api-url "${API[2]}" runtime tree | grep '^node-3' >/dev/null ||
  fail "the drawn cluster tree has no node-3: $("$KAGENT" --api-url "${API[2]}" runtime tree | head)"
err=$("$KAGENT" --api-url "${API[2]}" runtime tree --node 999 2>&1) && fail "a tree of node 999"
[[ $err == *"code = Unavailable desc = node 999 did not answer"* ]] || fail "node 999: $err"

# ---- 3. kill -9 of node 3 ------------------------------------------------------------------------
# Detection is timed from the kill to the node_down line each survivor's mesh logs (the log's
# wall clock, ms); the views are read after it (a `runtime nodes` round trip here takes
# 0.1-1 s on the loaded test machine, too coarse to time a deadline by).
log_ms() { # the wall-clock ms of the first line of log $1 matching $2
  grep -m1 "$2" "$1" | sed -n 's/^ts=\([^ ]*\) .*/\1/p' | xargs -I{} date -d {} +%s%3N
}
inc3=$(seen 1 node-3 6)
kill_ms=$(date +%s%3N)
kill -KILL "${PID[3]}"
t0=$(date +%s%N)
detect=0
for i in 1 2; do
  log=$CLUSTER_DIR/node-$i/node.log pat="path=node-$i/mesh event=node_down node=$id3 "
  until grep -q "$pat" "$log"; do
    [ "$(ms_since "$t0")" -lt 5000 ] || fail "node-$i's mesh did not declare node-3 down in 5 s"
    sleep 0.05
  done
  ms=$(( $(log_ms "$log" "$pat") - kill_ms ))
  [ "$ms" -le 5000 ] || fail "node-$i declared node-3 down $ms ms after the kill"
  [ "$ms" -gt "$detect" ] && detect=$ms
  [ "$(seen "$i" node-3 2)" = 0 ] || fail "node-$i still shows node-3 alive after its node_down"
done
echo "CLUSTER kill9_detect_ms=$detect"
# Once node 3's lease lapsed (5 s after its last renewal) the next read of the table drops it.
dropped=0
for i in 1 2; do
  log=$CLUSTER_DIR/node-$i/node.log
  pat="path=node-$i/cluster event=peer_disconnected node=$id3 incarnation=$inc3 reason=lease_lapsed"
  until grep -q "$pat" "$log"; do
    [ "$(ms_since "$t0")" -lt 15000 ] || fail "node-$i did not drop node-3 as a peer: $(view "$i")"
    sleep 0.1
  done
  ms=$(( $(log_ms "$log" "$pat") - kill_ms ))
  [ "$ms" -gt "$dropped" ] && dropped=$ms
  [ "$(seen "$i" node-3 4)" = 0 ] && [ "$(seen "$i" node-3 3)" = 0 ] ||
    fail "node-$i: node-3 still a peer or leased: $(view "$i")"
done
echo "CLUSTER kill9_peer_dropped_ms=$dropped"

# ---- 4. SIGSTOP of node 2 past its lease, SIGCONT: fenced until a new incarnation ---------------
inc=$(seen 1 node-2 6) id2=$(seen 1 node-2 7)
kill -STOP "${PID[2]}"
t0=$(date +%s%N)
until [ "$(seen 1 node-2 3)" = 0 ]; do # its lease lapsed (node 1 sees it)
  [ "$(ms_since "$t0")" -lt 10000 ] || fail "node-2's lease still held 10 s after SIGSTOP"
  sleep 0.2
done
[ "$(seen 1 node-2 4)" = 0 ] || sleep 1.5 # node 1 reads the table every second
[ "$(seen 1 node-2 4)" = 0 ] || fail "node-1 kept node-2 as a peer after its lease lapsed"
kill -CONT "${PID[2]}"
t0=$(date +%s%N)
code=$(ready 2)
[ "$code" = 503 ] || fail "node-2 answered /readyz $code right after SIGCONT (its lease had lapsed)"
until grep -q "path=node-2/cluster event=node_fenced incarnation=$inc reason=lease_lapsed" \
        "$CLUSTER_DIR/node-2/node.log"; do
  [ "$(ms_since "$t0")" -lt 3000 ] || fail "node-2 logged no node_fenced"
  sleep 0.1
done
until [ "$(ready 2)" = 200 ]; do
  [ "$(ms_since "$t0")" -lt 15000 ] || fail "node-2 not ready 15 s after SIGCONT"
  sleep 0.1
done
echo "CLUSTER fenced_until_ready_ms=$(ms_since "$t0")"
new=$(seen 2 node-2 6)
[ "$new" -gt "$inc" ] || fail "node-2 came back under incarnation $new (was $inc)"
grep -q "path=node-2/cluster event=node_registered node=$id2 name=node-2 incarnation=$new " \
  "$CLUSTER_DIR/node-2/node.log" || fail "node-2 logged no registration of incarnation $new"
metrics=$(curl -fsS "${API[2]}/metrics") || fail "node-2 /metrics"
grep -q '^kagent_cluster_fenced_total 1$' <<< "$metrics" || fail "kagent_cluster_fenced_total"
grep -q "^kagent_cluster_incarnation $new\$" <<< "$metrics" || fail "kagent_cluster_incarnation"
until [ "$(seen 1 node-2 2)" = 1 ] && [ "$(seen 1 node-2 4)" = 1 ] && [ "$(seen 2 node-1 4)" = 1 ]; do
  [ "$(ms_since "$t0")" -lt 20000 ] || fail "node-2 did not rejoin: $(view 1)"
  sleep 0.2
done
"$KAGENT" --api-url "${API[1]}" runtime tree --node "$id2" -o json | grep '"node-2/supervisor"' >/dev/null ||
  fail "node 1 cannot reach node 2's tree after it rejoined"

# ---- 5. a clean stop (SIGTERM) of node 2 ends its lease at once, not a lease later ------------
term_ms=$(date +%s%3N)
kill -TERM "${PID[2]}"
t0=$(date +%s%N)
log=$CLUSTER_DIR/node-1/node.log
pat="path=node-1/cluster event=peer_disconnected node=$id2 incarnation=$new reason=lease_lapsed"
until grep -q "$pat" "$log"; do
  [ "$(ms_since "$t0")" -lt 15000 ] || fail "node-1 did not drop node-2 after its SIGTERM"
  sleep 0.1
done
left=$(( $(log_ms "$log" "$pat") - term_ms ))
# without the leave its lease would hold 5 s after its last renewal (at most 1 s before SIGTERM)
[ "$left" -lt 4000 ] || fail "node-2's lease ended $left ms after its SIGTERM (it did not leave)"
grep -q "path=node-2/cluster event=node_left incarnation=$new lease=ended" \
  "$CLUSTER_DIR/node-2/node.log" || fail "node-2 logged no node_left"
echo "CLUSTER clean_stop_dropped_ms=$left"
while kill -0 "${PID[2]}" 2>/dev/null; do
  [ "$(ms_since "$t0")" -lt 60000 ] || fail "node-2 still runs 60 s after SIGTERM"
  sleep 0.1
done
grep -q "path=node-2 event=stopped" "$CLUSTER_DIR/node-2/node.log" || fail "node-2 did not stop cleanly"

# ---- 6. down leaves nothing behind ---------------------------------------------------------------
"$src/deploy/cluster.sh" down || fail "cluster.sh down"
for i in 1 2 3; do ! kill -0 "${PID[$i]}" 2>/dev/null || fail "node-$i (pid ${PID[$i]}) still runs"; done
! pgrep -f "$CLUSTER_DIR" >/dev/null || fail "processes left: $(pgrep -af "$CLUSTER_DIR")"
! grep -q "$CLUSTER_DIR" /proc/mounts || fail "mounts left under $CLUSTER_DIR"
[ ! -e "$CLUSTER_DIR" ] || fail "$CLUSTER_DIR left behind"
echo "PASS"
