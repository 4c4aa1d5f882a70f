#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in
# package-lock.json, run on Node 22) against a real kagentd, at one revision's frozen
# requirements: `conformance server --requirements REVISION`. Every required scenario must pass
# except those in conformance/expected-failures-REVISION.yaml (each one says why it does not
# apply); a listed one that passes fails the run too, so the list stays exact.
# usage: test_conformance.sh 2026-07-28|2025-11-25
set -euo pipefail
rev=${1:?revision}
here=${KAGENT_SOURCE_DIR:?}/tests/integration/mcp
baseline=$here/conformance/expected-failures-$rev.yaml
[ -f "$baseline" ] || { echo "FAIL: no baseline for revision $rev" >&2; exit 1; }
. "$here/npm_deps.sh"
. "$KAGENT_SOURCE_DIR/tests/lib/node.sh"
mcp_npm_install
node22=$(mcp_node22)
conformance=$NPMDIR/node_modules/@modelcontextprotocol/conformance/dist/index.js
[ -f "$conformance" ] || node_fail "conformance suite missing from $NPMDIR"

node_start
# the suite sends no identity header: a proxy adds it, as a client would (identity_proxy.mjs)
node "$here/identity_proxy.mjs" "$PORT" conformance@example.com > "$WORK/proxy.port" &
proxy=$!
cleanup() {
  local st=$?
  kill "$proxy" 2>/dev/null || true
  if [ "$st" = 0 ]; then node_cleanup; else (exit "$st") || node_cleanup; fi
}
trap cleanup EXIT
for _ in $(seq 100); do [ -s "$WORK/proxy.port" ] && break; sleep 0.05; done
[ -s "$WORK/proxy.port" ] || node_fail "identity proxy did not start"
url=http://127.0.0.1:$(cat "$WORK/proxy.port")/mcp

set +e
(cd "$WORK" && "$node22" "$conformance" server --url "$url" --requirements "$rev" \
   --expected-failures "$baseline" -o "$WORK/results") > "$WORK/conformance.log" 2>&1
rc=$?
set -e
sed -n '/=== SUMMARY ===/,$p' "$WORK/conformance.log"
grep -q '=== SUMMARY ===' "$WORK/conformance.log" || { cat "$WORK/conformance.log"; node_fail "the suite did not run"; }
if [ $rc != 0 ]; then
  # the failing checks, from the results the suite wrote
  node -e '
    const fs = require("fs"), p = require("path"), d = process.argv[1];
    for (const s of fs.readdirSync(d))
      for (const c of JSON.parse(fs.readFileSync(p.join(d, s, "checks.json"))))
        if (c.status === "FAILURE" || c.status === "WARNING")
          console.error(`${s}: ${c.id} ${c.status}: ${c.errorMessage || ""}`);' "$WORK/results" || true
  node_fail "conformance --requirements $rev: exit $rc (see above)"
fi
node_stop
echo "PASS conformance --requirements $rev"
