#!/usr/bin/env bash
# The MCP bridge on a real kagentd (the whole stack on one port; the database is the private
# PostgreSQL of tests/with-pg), driven by real MCP clients from npm (pinned in package-lock.json):
#   1. the official TypeScript SDK clients through an agent's whole flow: v1 on the
#      initialize-based revisions (agent_flow.mjs), v2 on 2026-07-28 (agent_flow_2026.mjs)
#   2. the MCP Inspector CLI (--cli) listing and calling tools
# (the official conformance suite runs in test_conformance.sh, once per revision)
# npm failing is a test failure. Everything created (processes, state, mounts) is removed.
set -euo pipefail
build=${KAGENT_BUILD_DIR:?}
src=${KAGENT_SOURCE_DIR:?}
here=$src/tests/integration/mcp
kagentd=$build/node/kagentd
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$kagentd" ] || fail "$kagentd is missing"
command -v node >/dev/null || fail "node is required (apt-get install nodejs npm)"
command -v npm >/dev/null || fail "npm is required"

# --- the npm clients (npm_deps.sh: from the committed lockfile into the build dir)
. "$here/npm_deps.sh"
. "$here/../../lib/uids.sh"
uid_base=$(test_uid_base)
mcp_npm_install
npmdir=$NPMDIR
cp "$here/agent_flow.mjs" "$here/agent_flow_2026.mjs" "$npmdir/"

work=$(mktemp -d /tmp/kagent-mcp-test.XXXXXX)
chmod 755 "$work"
pid=
proxy=
cleanup() {
  [ -n "$proxy" ] && kill "$proxy" 2>/dev/null
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kids=$(pgrep -P "$pid" || true) # helpers the node forked (they block SIGTERM)
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for k in $kids; do kill -KILL "$k" 2>/dev/null || true; done
  fi
  grep -q "$work" /proc/mounts && awk -v w="$work" '$2 ~ "^"w {print $2}' /proc/mounts | sort -r | xargs -r umount -l
  rm -rf "$work"
}
trap cleanup EXIT

# --- images: the guest image and a busybox tools image
state=$work/state
guest=$("$src/deploy/build-guest-image.sh" "$build" "$state")
rootfs=$work/tools-rootfs
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/data" "$rootfs/tmp"
cp /bin/busybox "$rootfs/bin/busybox"
for b in $("$rootfs/bin/busybox" --list); do [ "$b" = busybox ] || ln -sf busybox "$rootfs/bin/$b"; done
tools=$("$build/actors/images/kagent-image" --state-dir "$state" build --rootfs "$rootfs" --name test/tools)

# --- the node: whole stack on an ephemeral loopback port, database from tests/with-pg
cat > "$work/kagentd.yaml" <<YAML
node:
  name: node-1
  id: 1
  stateDir: $state
listen:
  address: 127.0.0.1
  port: 0
database:
  url: "host=${PGHOST:?NEEDS_PG} port=${PGPORT:?} user=${PGUSER:?} dbname=${PGDATABASE:?}"
sandbox:
  guestImage:
    digest: "$guest"
  memory: 256Mi
  uidBase: $uid_base
mcp:
  allowedHosts:
    - "localhost"
    - "127.0.0.1"
YAML
"$kagentd" --config "$work/kagentd.yaml" 2>"$work/log" &
pid=$!
for _ in $(seq 600); do grep -q 'path=node-1 event=started\|start_failed' "$work/log" && break; sleep 0.1; done
grep -q 'path=node-1 event=started' "$work/log" || { cat "$work/log"; fail "kagentd did not start"; }
port=$(sed -n 's/.*path=node-1 event=started.* listen=[0-9.]*:\([0-9]*\).*/\1/p' "$work/log")
url=http://127.0.0.1:$port/mcp
ping='{"jsonrpc":"2.0","id":1,"method":"ping"}'
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'content-type: application/json' \
  -H 'accept: application/json' -H 'x-user-id: alice@example.com' -d "$ping" "$url")
[ "$code" = 200 ] || fail "POST /mcp answered $code: kagentd does not serve the MCP bridge (kb_mcp_new)"
# no identity is no one's: refused, never a default user
code=$(curl -s -o "$work/anon.json" -w '%{http_code}' -X POST -H 'content-type: application/json' \
  -H 'accept: application/json' -d "$ping" "$url")
[ "$code" = 401 ] && grep -q 'identity required' "$work/anon.json" ||
  fail "a request without x-user-id answered $code: $(cat "$work/anon.json")"
echo "PASS no identity refused"
# the Inspector CLI and the conformance suite cannot send headers: they go through a proxy
# that adds the identity, as the kagent CLI would
node "$here/identity_proxy.mjs" "$port" alice@example.com > "$work/proxy.port" &
proxy=$!
for _ in $(seq 100); do [ -s "$work/proxy.port" ] && break; sleep 0.05; done
purl=http://127.0.0.1:$(cat "$work/proxy.port")/mcp

cat > "$work/template.yaml" <<YAML
apiVersion: api.kagent.dev/v1alpha3
kind: SandboxTemplate
metadata:
  name: busybox
  namespace: kagent
spec:
  workload:
    image: $tools
  substrate:
    workerPoolRef:
      name: kagent-default
    snapshotPolicy:
      location: file://$work/snapshots/
YAML
"$build/bridges/cli/kagent" --api-url "http://127.0.0.1:$port" apply -f "$work/template.yaml" >/dev/null ||
  { cat "$work/log"; fail "kagent apply"; }

# --- 1. the SDK clients: an agent's whole flow, on the initialize-based revisions (SDK v1) and
#     on 2026-07-28 (SDK v2, stateless; it also reads a large image re-encoded for the model)
(cd "$npmdir" && node agent_flow.mjs "$url" kagent busybox) || { tail -50 "$work/log"; fail "agent flow"; }
(cd "$npmdir" && node agent_flow_2026.mjs "$url" kagent busybox) || { tail -50 "$work/log"; fail "agent flow 2026-07-28"; }

# --- 2. the Inspector CLI
insp=$npmdir/node_modules/.bin/mcp-inspector-cli
[ -x "$insp" ] || fail "mcp-inspector-cli missing from node_modules"
(cd "$npmdir" && node_modules/.bin/mcp-inspector --cli "$purl" --transport http --method tools/list) \
  > "$work/insp-list.json" 2>"$work/insp.err" || { cat "$work/insp.err"; fail "inspector tools/list"; }
node -e 'const t=JSON.parse(require("fs").readFileSync(process.argv[1])).tools;
  if (t.length !== 21 || !t.some(x => x.name === "read_sandbox_outputs") ||
      !t.some(x => x.name === "pause_sandbox")) process.exit(1)' "$work/insp-list.json" ||
  fail "inspector tools/list: $(head -c 300 "$work/insp-list.json")"
(cd "$npmdir" && node_modules/.bin/mcp-inspector --cli "$purl" --transport http --method tools/call \
  --tool-name list_sandbox_templates --tool-arg namespace=kagent) > "$work/insp-call.json" 2>"$work/insp.err" ||
  { cat "$work/insp.err"; fail "inspector tools/call"; }
grep -q '\\"name\\":\\"busybox\\"' "$work/insp-call.json" || fail "inspector tools/call: $(cat "$work/insp-call.json")"
(cd "$npmdir" && node_modules/.bin/mcp-inspector --cli "$purl" --transport http --method tools/call \
  --tool-name get_sandbox --tool-arg sandbox_id=nope) > "$work/insp-err.json" 2>"$work/insp.err" || true
grep -q '"isError": true' "$work/insp-err.json" && grep -q 'Sandbox ID must be a UUID' "$work/insp-err.json" ||
  fail "inspector error result: $(cat "$work/insp-err.json" "$work/insp.err")"
echo "PASS inspector"

kill -TERM "$pid"
set +e; wait "$pid"; rc=$?; set -e
pid=
[ $rc = 0 ] || { tail -30 "$work/log"; fail "kagentd exit $rc"; }
echo "PASS mcp"
