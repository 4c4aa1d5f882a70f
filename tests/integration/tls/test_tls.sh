#!/usr/bin/env bash
# TLS on the node's one port, against a real kagentd with a test CA made by openssl at test time
# (deploy/gen-test-certs.sh) and tokens auth:
#   refusals at start (missing/bad/mismatched files, off-loopback without tokens or TLS),
#   the kagent CLI (--ca-file, --server-name, --cert-file/--key-file), Debian's python3-grpcio
#   (tls_grpcio.py), the official MCP TypeScript SDK over https (tls_mcp.mjs, the CA from
#   NODE_EXTRA_CA_CERTS), curl on /healthz /readyz /metrics /mcp, plaintext refused on the TLS
#   port, wrong CAs refused, a client certificate's CN as the caller, and a SIGHUP reload.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "${KAGENT_SOURCE_DIR:?}/tests/lib/npm.sh"
build=${KAGENT_BUILD_DIR:?}
src=$KAGENT_SOURCE_DIR
here=$src/tests/integration/tls
gen=$src/deploy/gen-test-certs.sh
for c in openssl curl node npm; do command -v $c >/dev/null || node_fail "$c is required"; done
/usr/bin/python3 -c 'import grpc' 2>/dev/null || node_fail "python3-grpcio (Debian) is required"

# --- the MCP SDK from npm, pinned by package-lock.json, into the build dir
npmdir=$build/tests/integration/tls/npm
npm_from_lockfile "$here" "$npmdir" || node_fail "npm ci of the MCP SDK failed"
cp "$here/tls_mcp.mjs" "$npmdir/"

sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
# Certificates, tokens and the config's TLS keys, once WORK exists (node_start calls this).
node_prestart() {
  T=$WORK/tls
  "$gen" ca "$T"
  "$gen" server "$T" server DNS:localhost DNS:kagent.test IP:127.0.0.1
  "$gen" server "$T" server2 DNS:localhost DNS:kagent.test IP:127.0.0.1
  "$gen" client "$T" alice alice@example.com
  "$gen" ca "$T/other"
  "$gen" client "$T/other" mallory alice@example.com # same CN, another CA
  cp "$T/other/ca.pem" "$T/other-ca.pem"
  cp "$T/other/mallory.pem" "$T/other/mallory.key" "$T/"
  mkdir -p "$T/live"
  cp "$T/server.pem" "$T/live/cert.pem"
  cp "$T/server.key" "$T/live/key.pem"
  printf '%s alice@example.com\n%s bob@example.com\n' "$(sha tok-alice)" "$(sha tok-bob)" > "$T/tokens"
  NODE_LISTEN_YAML="  address: 127.0.0.1
  tls:
    certFile: $T/live/cert.pem
    keyFile: $T/live/key.pem
    clientCAFile: $T/ca.pem"
  NODE_EXTRA_YAML="auth:
  mode: tokens
  tokensFile: $T/tokens"
  NODE_CLI_FLAGS="--ca-file $T/ca.pem --token tok-bob"
}
NODE_SCHEME=https
node_start
node_apply_template tlstest # apply and get over TLS, as bob
ok() { echo "PASS $*"; }
K() { "$KAGENT" --api-url "$API" --ca-file "$T/ca.pem" --timeout 60s "$@"; }

# --- 1. refusals at start: a clear message naming the file, nothing started
bad=$WORK/bad
mkdir -p "$bad"
refuse() { # refuse WHAT EXPECTED-TEXT: a config with the TLS lines $tls must not start
  local what=$1 want=$2
  cat > "$bad/k.yaml" <<YAML
node:
  stateDir: $bad/state
listen:
  port: 0
$tls
sandbox:
  guestImage:
    digest: "sha256:$(printf '0%.0s' $(seq 64))"
$auth
YAML
  local rc=0
  timeout 20 "$KAGENTD" --config "$bad/k.yaml" > "$bad/out" 2>&1 || rc=$?
  [ $rc = 1 ] || node_fail "$what: kagentd exited $rc, want 1: $(cat "$bad/out")"
  grep -qF -- "$want" "$bad/out" || node_fail "$what: want '$want' in: $(cat "$bad/out")"
  [ ! -d "$bad/state/postgres" ] || node_fail "$what: the database was started"
  ok "refused: $what ($(grep -o 'kagentd: .*' "$bad/out" | tail -1 | cut -c1-110))"
}
auth=
tls="  tls:
    certFile: $T/server.pem
    keyFile: $bad/missing.key"
refuse "missing key file" "key file $bad/missing.key: No such file or directory"
echo "not a certificate" > "$bad/garbage.pem"
tls="  tls:
    certFile: $bad/garbage.pem
    keyFile: $T/server.key"
refuse "bad certificate file" "certificate file $bad/garbage.pem: cannot be used"
tls="  tls:
    certFile: $T/server.pem
    keyFile: $T/alice.key"
refuse "key of another certificate" "does not match certificate file $T/server.pem"
tls="  tls:
    certFile: $T/server.pem
    keyFile: $T/server.key
    clientCAFile: $bad/missing-ca.pem"
refuse "missing client CA file" "client CA file $bad/missing-ca.pem: No such file or directory"
tls="  address: 0.0.0.0
  tls:
    certFile: $T/server.pem
    keyFile: $T/server.key"
refuse "off loopback in user-header mode" "must be loopback (use auth.mode: tokens"
auth="auth:
  mode: tokens
  tokensFile: $T/tokens"
tls="  address: 0.0.0.0"
refuse "off loopback without TLS" "listen.tls: required when listen.address (0.0.0.0) is not loopback"

# --- 2. the kagent CLI
K --help | grep -- '--cert-file' >/dev/null && K --help | grep -- '--server-name' >/dev/null &&
  K --help | grep -- '--ca-file' >/dev/null && K --help | grep -- '--key-file' >/dev/null || node_fail "--help lacks TLS flags"
K --token tok-bob sandbox templates | grep tlstest >/dev/null || node_fail "CLI over TLS"
K --token tok-bob --server-name kagent.test sandbox templates | grep tlstest >/dev/null ||
  node_fail "CLI --server-name kagent.test"
! K --token tok-bob --server-name wrong.test --timeout 10s sandbox list 2>"$WORK/err" ||
  node_fail "CLI --server-name wrong.test succeeded"
ok "CLI --ca-file, --server-name ($(head -c 100 "$WORK/err"))"
! "$KAGENT" --api-url "$API" --ca-file "$T/other-ca.pem" --token tok-bob --timeout 10s sandbox list 2>"$WORK/err" ||
  node_fail "CLI with another CA succeeded"
grep -q 'Unavailable' "$WORK/err" || node_fail "CLI wrong CA: $(cat "$WORK/err")"
ok "CLI wrong CA refused"
! "$KAGENT" --api-url "http://127.0.0.1:$PORT" --token tok-bob --timeout 10s sandbox list 2>"$WORK/err" ||
  node_fail "CLI cleartext gRPC on the TLS port succeeded"
ok "CLI cleartext gRPC refused"
M=(--cert-file "$T/alice.pem" --key-file "$T/alice.key")
sid=$(K "${M[@]}" sandbox create tlstest --request-id tls-cli -o json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])') || node_fail "CLI mTLS create"
[ "$(K "${M[@]}" sandbox exec "$sid" -- echo hi-over-tls)" = hi-over-tls ] || node_fail "CLI mTLS exec"
K --token tok-alice sandbox get "$sid" >/dev/null || node_fail "the certificate's sandbox is not alice's"
! K --token tok-bob sandbox get "$sid" >/dev/null 2>&1 || node_fail "bob sees alice's sandbox"
ok "CLI --cert-file/--key-file: CN alice@example.com is the caller"

# --- 3. HTTP/1.1 over TLS (curl), and MCP with a client certificate
C=(curl -sS --cacert "$T/ca.pem" --http1.1 -m 10)
[ "$("${C[@]}" "$API/healthz")" = ok ] || node_fail "https /healthz"
"${C[@]}" -f "$API/readyz" >/dev/null || node_fail "https /readyz"
"${C[@]}" -f "$API/metrics" > "$WORK/metrics" || node_fail "https /metrics" # (not a pipe: SIGPIPE)
grep -q kagent_grpc_calls_total "$WORK/metrics" || node_fail "https /metrics: no kagent_grpc_calls_total"
# /ui over TLS: a Secure login cookie; a client certificate is an identity there as on the API
"${C[@]}" -o /dev/null -D "$WORK/ui.h" --data-urlencode token=tok-bob "$API/ui/login"
grep -qi '^set-cookie: kagent_ui=tok-bob; Path=/ui; HttpOnly; SameSite=Strict; Secure' "$WORK/ui.h" ||
  node_fail "/ui login cookie over TLS: $(cat "$WORK/ui.h")"
"${C[@]}" --cert "$T/alice.pem" --key "$T/alice.key" "$API/ui/api/state" > "$WORK/ui.json"
grep -q '"identity":"alice@example.com"' "$WORK/ui.json" || node_fail "/ui with alice's certificate: $(head -c 300 "$WORK/ui.json")"
mcp() { "${C[@]}" -o "$WORK/mcp.out" -D "$WORK/mcp.hdr" -w '%{http_code}' -X POST -H 'content-type: application/json' \
  -H 'accept: application/json, text/event-stream' "$@" "$API/mcp"; }
init='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}'
[ "$(mcp -d "$init")" = 401 ] || node_fail "/mcp without identity: not 401"
[ "$(mcp --cert "$T/alice.pem" --key "$T/alice.key" -d "$init")" = 200 ] || node_fail "/mcp with alice's certificate"
session=$(sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: *\([^\r]*\).*/\1/p' "$WORK/mcp.hdr")
[ -n "$session" ] || node_fail "no Mcp-Session-Id: $(cat "$WORK/mcp.hdr")"
mcp --cert "$T/alice.pem" --key "$T/alice.key" -H "mcp-session-id: $session" \
  -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
[ "$(mcp --cert "$T/alice.pem" --key "$T/alice.key" -H "mcp-session-id: $session" \
  -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sandboxes","arguments":{}}}')" = 200 ] ||
  node_fail "/mcp tools/call: $(cat "$WORK/mcp.out")"
grep -q "$sid" "$WORK/mcp.out" || node_fail "/mcp as alice's certificate does not list alice's sandbox: $(cat "$WORK/mcp.out")"
ok "curl over https: /healthz /readyz /metrics, /mcp as the client certificate's identity"
! "${C[@]}" --cert "$T/mallory.pem" --key "$T/mallory.key" "$API/healthz" >/dev/null 2>&1 ||
  node_fail "a client certificate of another CA was accepted"
ok "curl: client certificate of another CA refused at the handshake"

# --- 4. plaintext on the TLS port gets nothing useful and is closed
/usr/bin/python3 - "$PORT" <<'PY' || node_fail "plaintext HTTP/1.1 on the TLS port"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
got = b""
try:
    while True:
        b = s.recv(4096)
        if not b:
            break
        got += b
except ConnectionResetError:
    pass
assert b"HTTP/" not in got and b"ok" not in got, got
print(f"PASS plaintext HTTP/1.1 refused (closed; {len(got)} bytes back, no HTTP answer)")
PY
! curl -sS -m 10 "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 || node_fail "curl http:// on the TLS port succeeded"

# --- 5. python3-grpcio
stubs=$WORK/stubs
mkdir -p "$stubs"
protos=$(cd "$src/proto" && ls kagent/api/v1/*.proto)
(cd "$src/proto" && protoc -I. -I/usr/include --python_out="$stubs" --grpc_out="$stubs" \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin $protos)
for d in kagent kagent/api kagent/api/v1; do touch "$stubs/$d/__init__.py"; done
/usr/bin/python3 "$here/tls_grpcio.py" "127.0.0.1:$PORT" "$stubs" "$T" tlstest || node_fail "grpcio over TLS"

# --- 6. the MCP TypeScript SDK over https, trusting the test CA through NODE_EXTRA_CA_CERTS
(cd "$npmdir" && NODE_EXTRA_CA_CERTS="$T/ca.pem" node tls_mcp.mjs "$API/mcp" tok-bob tlstest) ||
  node_fail "MCP SDK over https"
! (cd "$npmdir" && node tls_mcp.mjs "$API/mcp" tok-bob tlstest) >/dev/null 2>&1 ||
  node_fail "MCP SDK trusted the test CA without NODE_EXTRA_CA_CERTS"
ok "MCP SDK without the CA refused"

# --- 7. SIGHUP: new connections get the new certificate; a broken file changes nothing
served() { openssl s_client -connect "127.0.0.1:$PORT" -alpn http/1.1 </dev/null 2>/dev/null |
           openssl x509 -noout -serial; }
serial() { openssl x509 -in "$1" -noout -serial; }
[ "$(served)" = "$(serial "$T/server.pem")" ] || node_fail "served certificate is not server.pem"
cp "$T/server2.pem" "$T/live/cert.pem"
cp "$T/server2.key" "$T/live/key.pem"
kill -HUP "$NODE_PID"
for _ in $(seq 50); do grep -q 'event=reloaded' "$WORK/node.log" && break; sleep 0.1; done
grep -q 'event=reloaded' "$WORK/node.log" || node_fail "no reload logged after SIGHUP"
[ "$(served)" = "$(serial "$T/server2.pem")" ] || node_fail "after SIGHUP the old certificate is still served"
K --token tok-bob sandbox templates | grep tlstest >/dev/null || node_fail "CLI after the reload"
ok "SIGHUP reload: $(serial "$T/server.pem") -> $(served)"
echo garbage > "$T/live/cert.pem"
kill -HUP "$NODE_PID"
for _ in $(seq 50); do grep -q 'event=reload_failed' "$WORK/node.log" && break; sleep 0.1; done
grep 'event=reload_failed' "$WORK/node.log" | grep -F "certificate file $T/live/cert.pem" >/dev/null ||
  node_fail "a broken certificate did not log reload_failed naming the file"
[ "$(served)" = "$(serial "$T/server2.pem")" ] || node_fail "a failed reload changed the served certificate"
kill -0 "$NODE_PID" || node_fail "kagentd died on a failed reload"
ok "SIGHUP with a broken certificate: logged, previous certificate kept"

K "${M[@]}" sandbox delete "$sid" >/dev/null || node_fail "delete"
node_stop
echo "PASS test_tls"
