#!/usr/bin/env bash
# Warm pools on a real node (pools[].warm: 2): a create through the CLI is served by a pre-started
# sandbox (the hit counted in /metrics), written READY with the caller's owner and TTL; the
# template env is in its processes' environment and not in PID 1's; a replay of the request id
# returns the same sandbox; the pool refills; pooled sandboxes are in no list; a template update
# rebuilds the pool (the old warm sandboxes stopped); a clean stop and a kill -9 leave no pooled
# sandbox visible after the restart and nothing of them behind (directories, mounts, cgroups,
# markers); warm: 0 keeps none.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
PY=/usr/bin/python3
NODE_EXTRA_YAML='pools:
  - name: kagent-default
    warm: 2'
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }
field() { $PY -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', ''))"; }
metrics() { curl -sS "$API/metrics"; }
metric() { metrics | awk -v k="$1" '$1 == k { print $2 }'; }
# the warm depth of kagent/scratch and its revision label
depth() { metrics | sed -n 's/^kagent_warm_pool_depth{pool="kagent-default",template="kagent\/scratch",revision="\([0-9a-f]*\)"} \([0-9]*\)$/\2 \1/p'; }
wait_depth() {
  local d
  for _ in $(seq 400); do
    d=$(depth)
    [ "${d%% *}" = "$1" ] && { [ -z "${2:-}" ] || [ "${d#* }" != "$2" ]; } && return 0
    sleep 0.05
  done
  fail "warm depth is '$(depth)', want $1${2:+ of a revision other than $2}"
}
# no id at all is an empty list (grep's 1); a failing grep (2) fails the test
uuids() { { grep -oE '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' || [ $? = 1 ]; } | sort -u; }
# ids with a sandbox directory on this node (user sandboxes and warm ones)
dirs() { ls "$STATE/sandboxes" | uuids; }
listed() { k sandbox list | uuids; }
warm_ids() { comm -23 <(dirs) <(listed); }
left_of() { # what of sandbox $1 is still on the host
  local id=$1
  [ ! -e "$STATE/sandboxes/$id" ] || echo "directory $STATE/sandboxes/$id"
  [ ! -e "$STATE/sandboxes/.warm/$id" ] || echo "marker of $id"
  ! grep -q "$id" /proc/mounts || echo "mounts of $id"
  node_cgroup_of "$id"
}
wait_gone() {
  local left=
  for _ in $(seq 200); do
    left=$(for id in "$@"; do left_of "$id"; done)
    [ -z "$left" ] && return 0
    sleep 0.05
  done
  fail "left behind: $left"
}

# a template env of its own (the driver gives PID 1 a fixed PATH, HOME and LANG)
wait_depth 2
rev=$(depth); rev=${rev#* }
sed -i 's/^  env:$/  env:\n    - name: WARM_PROBE\n      value: one/' "$WORK/scratch.yaml"
k apply -f "$WORK/scratch.yaml" >/dev/null || fail "apply with WARM_PROBE"
wait_depth 2 "$rev"
[ -z "$(listed)" ] || fail "pooled sandboxes are listed: $(listed)"
[ "$(warm_ids | wc -l)" = 2 ] || fail "want 2 warm sandboxes on the host, have: $(warm_ids)"
pooled=$(warm_ids)

# a create is served warm: the hit, the owner, the TTL
hits0=$(metric kagent_warm_pool_hits_total)
misses0=$(metric kagent_warm_pool_misses_total)
k sandbox create scratch --request-id warm-1 --ttl 10m -o json > "$WORK/w1.json"
id=$(field id < "$WORK/w1.json")
grep -qx "$id" <<< "$pooled" || fail "sandbox $id is not one of the warm ones ($pooled)"
[ "$(metric kagent_warm_pool_hits_total)" = $((hits0 + 1)) ] || fail "hits $(metric kagent_warm_pool_hits_total), want $((hits0 + 1))"
[ "$(metric kagent_warm_pool_misses_total)" = "$misses0" ] || fail "a warm create counted a miss"
$PY - "$WORK/w1.json" <<'PY' || fail "record: $(cat "$WORK/w1.json")"
import json, sys, datetime
s = json.load(open(sys.argv[1]))
assert s["state"] == "RUNTIME_STATE_READY", s
ts = lambda v: datetime.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
ttl = ts(s["expiresAt"]) - ts(s["createdAt"])
assert abs(ttl - 600) < 2, ttl
PY
k --user-id bob@example.com sandbox get "$id" >/dev/null 2>&1 && fail "another user sees the warm-claimed sandbox"
k sandbox list | grep "$id" >/dev/null || fail "its owner does not list it"

# the template env reaches its processes, never PID 1
[ "$(k sandbox exec "$id" -- sh -c 'echo $WARM_PROBE')" = one ] || fail "WARM_PROBE not in the process env"
k sandbox exec "$id" -- cat /proc/self/environ | tr '\0' '\n' | grep -x WARM_PROBE=one >/dev/null || fail "WARM_PROBE not in /proc/self/environ"
cg=$(node_cgroup_of "$id")
[ -n "$cg" ] || fail "no cgroup for $id"
init=
for p in $(cat "$cg/cgroup.procs"); do # PID 1 of the sandbox, as the host sees it
  [ "$(awk '/^NSpid:/ { print $NF }' /proc/"$p"/status)" = 1 ] && init=$p
done
[ -n "$init" ] || fail "no PID 1 in the cgroup of $id"
tr '\0' '\n' < /proc/"$init"/environ > "$WORK/pid1.env"
[ -s "$WORK/pid1.env" ] || fail "PID 1's environ is empty or unreadable"
! grep -q '^WARM_PROBE=' "$WORK/pid1.env" || fail "the template env is in PID 1's environ: $(cat "$WORK/pid1.env")"

# a replay returns the same sandbox; the pool refills
again=$(k sandbox create scratch --request-id warm-1 --ttl 10m -o json | field id)
[ "$again" = "$id" ] || fail "replay gave $again, want $id"
[ "$(listed | wc -l)" = 1 ] || fail "a replay made another sandbox: $(listed)"
wait_depth 2
[ "$(metric kagent_warm_pool_refills_total)" -ge 3 ] || fail "refills $(metric kagent_warm_pool_refills_total)"
[ "$(warm_ids | wc -l)" = 2 ] || fail "after the refill: $(warm_ids)"
metrics > "$WORK/metrics" || fail "metrics" # (grep -q on a pipe: curl's SIGPIPE under pipefail)
grep -q '^kagent_warm_pool_refill_seconds_count{pool="kagent-default"} ' "$WORK/metrics" || fail "no refill latency"
grep -q '^kagent_warm_pool_hit_ratio ' "$WORK/metrics" || fail "no hit ratio"

# a template update rebuilds the pool for the new revision
rev=$(depth); rev=${rev#* }
before=$(warm_ids)
sed -i 's/value: one/value: two/' "$WORK/scratch.yaml"
k apply -f "$WORK/scratch.yaml" >/dev/null || fail "apply the update"
wait_depth 2 "$rev"
# shellcheck disable=SC2086 # ids are words
wait_gone $before
id2=$(k sandbox create scratch --request-id warm-2 -o json | field id)
[ "$(k sandbox exec "$id2" -- sh -c 'echo $WARM_PROBE')" = two ] || fail "the rebuilt pool runs the old revision"
[ "$(metric kagent_warm_pool_hits_total)" = $((hits0 + 2)) ] || fail "the create after the update was not warm"

# a clean stop leaves nothing of the pooled sandboxes; the restart shows none of them
wait_depth 2
pooled=$(warm_ids)
node_stop
# shellcheck disable=SC2086
wait_gone $pooled
node_restart
for w in $pooled; do
  k sandbox get "$w" >/dev/null 2>&1 && fail "pooled sandbox $w is visible after the restart"
done
[ "$(listed | sort | tr '\n' ' ')" = "$(printf '%s\n' "$id" "$id2" | sort | tr '\n' ' ')" ] || fail "list after restart: $(listed)"

# kill -9: the next start discards what the pooled sandboxes left
wait_depth 2
pooled=$(warm_ids)
kill -KILL "$NODE_PID"
rc=0
wait "$NODE_PID" || rc=$?
[ "$rc" = 137 ] || fail "kagentd exited $rc after kill -9, want 137"
node_restart
# shellcheck disable=SC2086
wait_gone $pooled
for w in $pooled; do
  k sandbox get "$w" >/dev/null 2>&1 && fail "pooled sandbox $w is visible after the crash"
done
[ "$(listed | wc -l)" = 2 ] || fail "list after the crash: $(listed)"
wait_depth 2

# warm: 0 keeps none
node_stop
sed -i 's/    warm: 2/    warm: 0/' "$WORK/kagentd.yaml"
node_restart
id3=$(k sandbox create scratch --request-id cold-1 -o json | field id)
[ "$(k sandbox get "$id3" -o json | field state)" = RUNTIME_STATE_READY ] || fail "cold create"
[ "$(metric kagent_warm_pool_hits_total)" = 0 ] || fail "warm 0 had a hit"
[ -z "$(depth)" ] || fail "warm 0 keeps a pool: $(depth)"
[ -z "$(warm_ids)" ] || fail "warm 0 left sandboxes booted: $(warm_ids)"
for s in "$id" "$id2" "$id3"; do k sandbox delete "$s" >/dev/null; done
node_stop
echo "PASS warm"
