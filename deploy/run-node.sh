#!/usr/bin/env bash
# `make run`: one kagentd node in the foreground with a working default.
#   deploy/run-node.sh [--tls] BUILD_DIR
# --tls: the same node with TLS and tokens auth (var/kagentd-tls.yaml): a self-signed test CA,
# a server certificate (localhost, 127.0.0.1, ::1, this host's name, and KAGENT_TLS_SANS such as
# "DNS:kagent.example IP:10.0.0.5"), a client certificate for mTLS and a bearer token, all under
# var/tls/ (made once with openssl by deploy/gen-test-certs.sh); KAGENT_LISTEN_ADDRESS (default
# 127.0.0.1) may then be 0.0.0.0. It prints how to call it with the CLI, curl and MCP.
# State lives in ./var (images, sandboxes, the embedded PostgreSQL). The first run builds the
# guest image and the default tools image (Debian minbase + python3, a few minutes), writes
# var/kagentd.yaml, starts the node, applies the template `scratch` in namespace `kagent` and
# waits until it is Ready. Later runs reuse all of it. Ctrl-C (SIGINT) or SIGTERM stops the
# node cleanly.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tls=
if [ "${1:-}" = --tls ]; then tls=1; shift; fi
build=$(cd "${1:-$top/build}" && pwd)
state=${KAGENT_STATE_DIR:-$top/var}
config=$state/kagentd${tls:+-tls}.yaml
kagentd=$build/node/kagentd
kagent=$build/bridges/cli/kagent
say() { echo "run-node: $*" >&2; }

[ -x "$kagentd" ] && [ -x "$kagent" ] || { say "build first ('make build')"; exit 1; }
mkdir -p "$state"
chmod 755 "$state" # the embedded PostgreSQL runs as `postgres` and must reach it

# 1. images: the guest (seconds) and the tools image with python (minutes, once)
say "guest image..."
guest=$("$top/deploy/build-guest-image.sh" "$build" "$state")
say "tools image (first run: debootstrap of Debian minbase + python3; cached afterwards)..."
tools=$("$top/deploy/build-tools-image.sh" "$state" "$build" | tail -1)

# 2. config: written once, the guest digest refreshed on every run
if [ -n "$tls" ]; then
  tlsdir=$state/tls
  if [ ! -f "$tlsdir/server.pem" ]; then
    sans="DNS:localhost IP:127.0.0.1 IP:::1 DNS:$(hostname) ${KAGENT_TLS_SANS:-}"
    # shellcheck disable=SC2086 # one SAN per word
    "$top/deploy/gen-test-certs.sh" ca "$tlsdir" &&
      "$top/deploy/gen-test-certs.sh" server "$tlsdir" server $sans &&
      "$top/deploy/gen-test-certs.sh" client "$tlsdir" client admin@kagent.dev
    (umask 077 && openssl rand -hex 24 > "$tlsdir/token")
    printf '%s admin@kagent.dev\n' "$(tr -d '\n' < "$tlsdir/token" | sha256sum | cut -d' ' -f1)" \
      > "$tlsdir/tokens"
    say "wrote a test CA, server and client certificates and a token into $tlsdir"
  fi
fi
if [ ! -f "$config" ]; then
  sed -e "s|stateDir: /var/lib/kagent|stateDir: $state|" \
      -e "s|    digest: \"\"  |    digest: \"$guest\"|" \
      "$top/deploy/kagentd.example.yaml" > "$config"
  if [ -n "$tls" ]; then
    sed -i -e "s|^  address: 127.0.0.1|  address: ${KAGENT_LISTEN_ADDRESS:-127.0.0.1}|" \
        -e "s|^    certFile: \"\"|    certFile: $tlsdir/server.pem|" \
        -e "s|^    keyFile: \"\"|    keyFile: $tlsdir/server.key|" \
        -e "s|^    clientCAFile: \"\"|    clientCAFile: $tlsdir/ca.pem|" \
        -e "s|^  mode: user-header|  mode: tokens|" \
        -e "s|^  tokensFile: \"\"|  tokensFile: $tlsdir/tokens|" "$config"
  fi
  say "wrote $config"
else
  sed -i -E "s|^(    digest: )\"?[^ #\"]*\"?|\1\"$guest\"|" "$config"
fi
"$kagentd" --config "$config" --check-config >/dev/null

# 3. the node, in the foreground; signals go to it
"$kagentd" --config "$config" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' INT TERM
port=$(sed -n 's/^  port: *\([0-9]*\).*/\1/p' "$config" | head -1)
if [ -n "$tls" ]; then
  api=https://127.0.0.1:${port:-8083}
  cli=(--api-url "$api" --ca-file "$tlsdir/ca.pem" --token "$(cat "$tlsdir/token")")
  curlflags=(--cacert "$tlsdir/ca.pem" --http1.1)
else
  api=http://127.0.0.1:${port:-8083}
  cli=(--api-url "$api")
  curlflags=()
fi
for _ in $(seq 600); do
  curl -fsS "${curlflags[@]}" "$api/readyz" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { wait $pid; exit $?; }
  sleep 0.1
done

# 4. the template the seed's walkthrough uses
cat > "$state/scratch.yaml" <<YAML
apiVersion: api.kagent.dev/v1alpha3
kind: SandboxTemplate
metadata:
  name: scratch
  namespace: kagent
spec:
  workload:
    image: $tools
  env:
    - name: LANG
      value: C.UTF-8
  substrate:
    workerPoolRef:
      name: kagent-default
    snapshotPolicy:
      location: file://$state/snapshots/
YAML
"$kagent" "${cli[@]}" apply -f "$state/scratch.yaml" >&2
for _ in $(seq 600); do
  "$kagent" "${cli[@]}" get template scratch -o json 2>/dev/null | grep '"Prepared"' >/dev/null && break
  sleep 0.2
done
"$kagent" "${cli[@]}" get template scratch >&2 || true

if [ -n "$tls" ]; then
  cat >&2 <<MSG

kagentd is running with TLS and tokens on $api (state in $state, certificates in $tlsdir).
Try, in another terminal:

  export PATH=$build/bridges/cli:\$PATH
  kagent --api-url $api --ca-file $tlsdir/ca.pem --token \$(cat $tlsdir/token) sandbox templates
  # mutual TLS: the client certificate's CN (admin@kagent.dev) is the caller, no token needed
  kagent --api-url $api --ca-file $tlsdir/ca.pem --cert-file $tlsdir/client.pem --key-file $tlsdir/client.key sandbox list
  # from another machine (KAGENT_LISTEN_ADDRESS=0.0.0.0): the name must be in the certificate,
  # or name one it has: --server-name localhost
  curl --cacert $tlsdir/ca.pem --http1.1 $api/healthz
  # MCP: https://127.0.0.1:${port:-8083}/mcp with "authorization: Bearer <token>"; Node clients:
  #   NODE_EXTRA_CA_CERTS=$tlsdir/ca.pem

SIGHUP re-reads the certificate files; Ctrl-C stops the node.
MSG
else
  cat >&2 <<MSG

kagentd is running on $api (state in $state). Try, in another terminal:

  export PATH=$build/bridges/cli:\$PATH
  kagent sandbox templates
  export SANDBOX_ID=\$(kagent sandbox create scratch --request-id my-first-sandbox -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  kagent sandbox exec \$SANDBOX_ID -- python --version
  kagent sandbox delete \$SANDBOX_ID

Ctrl-C stops the node.
MSG
fi
rc=0
while :; do # a trapped signal interrupts wait: wait again until the node has stopped
  wait $pid && rc=0 || rc=$?
  kill -0 $pid 2>/dev/null || break
done
exit $rc
