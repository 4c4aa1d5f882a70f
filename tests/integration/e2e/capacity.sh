#!/usr/bin/env bash
# Pool capacity on a real node (pools[].capacity: 2, warm: 1): creates through the CLI fill the
# pool (one of them served warm), the next is refused RESOURCE_EXHAUSTED naming the pool, the
# node and the counts, and leaves no sandbox; a replay of a created request id still answers;
# a full pool keeps none warm (and /metrics says it holds 2); a delete makes room and the
# refused request id then creates; a burst of concurrent creates never holds more than the
# capacity.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
NODE_EXTRA_YAML='pools:
  - name: kagent-default
    capacity: 2
    warm: 1'
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }
field() { /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', ''))"; }
uuids() { grep -oE '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' | sort -u || true; }
listed() { k sandbox list | uuids; }
full_re='pool kagent-default on node .* is full \(2 of 2 sandboxes\); delete one or retry later'
# a create expected to be refused: its output has the code and the message
refused() {
  local out rc
  set +e; out=$(k sandbox create scratch --request-id "$1" -o json 2>&1); rc=$?; set -e
  [ "$rc" != 0 ] || fail "create $1 went through a full pool: $out"
  grep -q "code = ResourceExhausted" <<< "$out" || fail "create $1: want RESOURCE_EXHAUSTED, got: $out"
  grep -qE "$full_re" <<< "$out" || fail "create $1: want the pool's message, got: $out"
}

a=$(k sandbox create scratch --request-id cap-a -o json | field id)
b=$(k sandbox create scratch --request-id cap-b -o json | field id)
refused cap-c
[ "$(listed | wc -l)" = 2 ] || fail "a refused create left a sandbox: $(listed)"
[ "$(k sandbox create scratch --request-id cap-a -o json | field id)" = "$a" ] || fail "a replay on a full pool"
sleep 1 # past the warm pool's quiet period: a full pool boots none
metrics=$(curl -sS "$API/metrics")
! grep -qE '^kagent_warm_pool_depth\{[^}]*\} [1-9]' <<< "$metrics" || fail "a full pool keeps sandboxes warm"
grep -q '^kagent_pool_in_use_sandboxes{pool="kagent-default"} 2$' <<< "$metrics" ||
  fail "the pool's in-use gauge is not its capacity's count (2): $(grep kagent_pool_in_use <<< "$metrics")"

k sandbox delete "$a" >/dev/null
c=$(k sandbox create scratch --request-id cap-c -o json | field id)
[ -n "$c" ] || fail "the refused request id after a delete"
refused cap-d

# a burst past the capacity: never more than 2
k sandbox delete "$b" >/dev/null
k sandbox delete "$c" >/dev/null
pids=()
for i in 1 2 3 4 5 6; do
  (k sandbox create scratch --request-id "burst-$i" -o json > "$WORK/burst-$i.out" 2>&1 || true) &
  pids+=($!)
done
wait "${pids[@]}" # (not the node's)
made=0 full=0
for f in "$WORK"/burst-*.out; do
  if grep -q "code = ResourceExhausted" "$f"; then full=$((full + 1))
  elif [ -n "$(field id < "$f" 2>/dev/null)" ]; then made=$((made + 1)); fi
done
[ "$made $full" = "2 4" ] || fail "burst: $made created, $full refused; want 2 and 4: $(cat "$WORK"/burst-*.out)"
[ "$(listed | wc -l)" = 2 ] || fail "burst left $(listed | wc -l) sandboxes"
for s in $(listed); do k sandbox delete "$s" >/dev/null; done
node_stop
echo "PASS capacity"
