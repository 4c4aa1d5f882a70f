#!/usr/bin/env bash
# kill -9 of the node while creates are in flight, several rounds: nothing of the node outlives
# it. A sandbox child that had not yet started its guest used to survive (parent 1, still named
# kagentd) holding the node's listening socket and client connections, so new calls waited 20 s
# for a SETTINGS timeout instead of being refused. Now: within 2 s no process of this node is
# left, the port refuses connections at once, and the node restarts and serves.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }
# so that an empty answer means "no such cgroup", the search must first find a live sandbox's
probe=$(k sandbox create scratch --request-id probe -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
[ -n "$(node_cgroup_of "$probe")" ] || fail "the cgroup search does not find a live sandbox's cgroup"
k sandbox delete "$probe" >/dev/null

for round in 1 2 3 4 5 6; do
  loaders=()
  for i in 1 2 3 4 5 6; do
    # load: creates cut off by the kill fail by design; what is checked is the store after it
    (for j in $(seq 50); do k sandbox create scratch --request-id "r$round-$i-$j" -o json \
        >/dev/null 2>&1 || true; done) &
    loaders+=($!)
  done
  sleep "0.$((3 + round))"
  # the search below must see the live node, or its empty answer after the kill proves nothing
  pgrep -f -- "--config $WORK/kagentd.yaml" | grep -qx "$NODE_PID" ||
    fail "round $round: the process search does not find the live kagentd ($NODE_PID)"
  kill -KILL "$NODE_PID"
  rc=0
  wait "$NODE_PID" 2>/dev/null || rc=$?
  [ "$rc" = 137 ] || fail "round $round: kagentd ended $rc before its kill -9, want 137"
  left=
  for _ in $(seq 20); do
    rc=0
    left=$(pgrep -f -- "--config $WORK/kagentd.yaml") || rc=$?
    [ "$rc" -le 1 ] || fail "round $round: pgrep failed ($rc)" # 1: nothing matched
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || fail "round $round: processes of the killed node still run: $(ps -o pid,ppid,comm,args -p "${left//$'\n'/,}")"
  rc=0
  t0=$(date +%s%N)
  curl -s --max-time 5 -o /dev/null "$API/healthz" || rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$rc" = 7 ] || fail "round $round: the dead node's port answered curl exit $rc after $ms ms, want 7 (refused)"
  kill "${loaders[@]}" 2>/dev/null || true # a loader may have finished its 50 creates already
  for l in "${loaders[@]}"; do # each ended by itself (0) or by that kill (143), nothing else
    rc=0
    wait "$l" || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 143 ] || fail "round $round: a loader ended $rc"
  done
  ids=$(ls "$STATE/sandboxes")
  [ -n "$ids" ] || fail "round $round: no sandbox was under way when the node was killed"
  node_restart
  k sandbox list >/dev/null || fail "round $round: the restarted node does not serve"
  # the start-up cleanup removed every cgroup of the sandboxes the kill cut off, even those
  # killed between their directory and their cgroups
  for id in $ids; do
    cg=$(node_cgroup_of "$id")
    [ -z "$cg" ] || fail "round $round: cgroup $cg of a dead sandbox left behind"
  done
  echo "round $round: nothing left, port refused in $ms ms, restarted"
done
node_stop
echo "PASS kill_under_load"
