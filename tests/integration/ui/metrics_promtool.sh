#!/usr/bin/env bash
# /metrics of a live node after real work (create, exec, suspend, resume, fork, delete, a refused
# call, MCP): `promtool check metrics` (Debian's prometheus package) finds nothing to say, the
# histograms count what happened, the pool/node gauges and process_* metrics are there, and
# `kagent sandbox get -o json` carries the sandbox's phase timings.
set -euo pipefail
source "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
PY=/usr/bin/python3
fail() { node_fail "$*"; }
command -v promtool >/dev/null || fail "promtool is missing (deploy/install-deps.sh installs prometheus)"
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }

id=$(k sandbox create scratch --request-id metrics-1 -o json | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
k sandbox exec "$id" -- sh -c 'echo hi > f' >/dev/null
k sandbox suspend "$id" >/dev/null
k sandbox resume "$id" >/dev/null
fork=$(k sandbox fork "$id" --request-id metrics-fork -o json | $PY -c 'import json,sys; print(json.load(sys.stdin)["sandboxes"][0]["id"])')
k sandbox delete "$fork" >/dev/null
k sandbox get "$id" -o json > "$WORK/get.json"
$PY - "$WORK/get.json" <<'PY' || fail "sandbox get -o json phases: $(cat "$WORK/get.json")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["state"] == "RUNTIME_STATE_READY", s["state"]
p = s["phaseTimings"]
for k in ("storeIntent", "computeStart", "guestReady", "suspendUpload", "resumeDownload", "createToReady"):
    assert 0 < p[k] < 60, (k, p)
PY
! k sandbox get 00000000-0000-7000-8000-000000000000 >/dev/null 2>&1 || fail "get of nothing worked"
curl -sS -o /dev/null -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
  -H 'x-user-id: admin@kagent.dev' -H "Host: 127.0.0.1:$PORT" \
  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}' \
  "$API/mcp"
k sandbox delete "$id" >/dev/null

curl -sS "$API/metrics" > "$WORK/metrics.txt"
promtool check metrics < "$WORK/metrics.txt" > "$WORK/promtool.txt" 2>&1 || fail "promtool: $(cat "$WORK/promtool.txt")"
[ ! -s "$WORK/promtool.txt" ] || fail "promtool has remarks: $(cat "$WORK/promtool.txt")"

count() { # the value of one sample line, by its exact name and labels
  awk -v k="$1" '$1 == k { print $2 }' "$WORK/metrics.txt"
}
positive() { local v; v=$(count "$1"); [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v > 0) }' || fail "$1 is '${v}'"; }
positive 'kagent_sandbox_create_seconds_count'
for p in store_intent compute_start guest_ready suspend_upload resume_download; do
  positive "kagent_sandbox_phase_seconds_count{phase=\"$p\"}"
done
positive 'kagent_guest_call_seconds_count{op="start",code="OK"}'
positive 'kagent_grpc_request_seconds_count{method="/kagent.api.v1.SandboxService/CreateSandbox",code="OK"}'
positive 'kagent_grpc_request_seconds_count{method="/kagent.api.v1.SandboxService/GetSandbox",code="NOT_FOUND"}'
positive 'kagent_mcp_request_seconds_count{method="initialize",code="200"}'
grep -q '^kagent_store_query_seconds_count{query="sb_create",result="ok"} ' "$WORK/metrics.txt" ||
  grep -q '^kagent_store_query_seconds_count{query=".*",result="ok"} ' "$WORK/metrics.txt" || fail "no store query latency"
positive 'kagent_sandbox_create_seconds_bucket{le="+Inf"}'
positive 'kagent_snapshot_seconds_count{op="suspend",result="ok"}'
positive 'kagent_snapshot_seconds_count{op="resume",result="ok"}'
positive 'kagent_snapshot_bytes_total{op="suspend"}'
positive 'kagent_snapshot_bytes_total{op="resume"}'
positive 'kagent_sandbox_fork_seconds_count{result="ok"}'
positive 'kagent_sandbox_fork_bytes_total'
positive 'kagent_pool_capacity_sandboxes{pool="kagent-default",class="namespaces"}'
grep -q '^kagent_pool_in_use_sandboxes{pool="kagent-default"} 0$' "$WORK/metrics.txt" || fail "pool in use"
grep -q '^kagent_node_info{node="node-1",id="1",version="' "$WORK/metrics.txt" || fail "node info"
for m in process_cpu_seconds_total process_resident_memory_bytes process_virtual_memory_bytes \
         process_open_fds process_max_fds process_start_time_seconds; do
  positive "$m"
done
node_stop
echo "PASS metrics_promtool"
