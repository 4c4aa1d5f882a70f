#!/usr/bin/env bash
# `make run`: one kagentd node in the foreground with a working default.
#   deploy/run-node.sh BUILD_DIR
# State lives in ./var (images, sandboxes, the embedded PostgreSQL). The first run builds the
# guest image and the default tools image (Debian minbase + python3, a few minutes), writes
# var/kagentd.yaml, starts the node, applies the template `scratch` in namespace `kagent` and
# waits until it is Ready. Later runs reuse all of it. Ctrl-C (SIGINT) or SIGTERM stops the
# node cleanly.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
state=${KAGENT_STATE_DIR:-$top/var}
config=$state/kagentd.yaml
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
if [ ! -f "$config" ]; then
  sed -e "s|stateDir: /var/lib/kagent|stateDir: $state|" \
      -e "s|    digest: \"\"  |    digest: \"$guest\"|" \
      "$top/deploy/kagentd.example.yaml" > "$config"
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
api=http://127.0.0.1:${port:-8083}
for _ in $(seq 600); do
  curl -fsS "$api/readyz" >/dev/null 2>&1 && break
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
"$kagent" --api-url "$api" apply -f "$state/scratch.yaml" >&2
for _ in $(seq 600); do
  "$kagent" --api-url "$api" get template scratch -o json 2>/dev/null | grep -q '"Prepared"' && break
  sleep 0.2
done
"$kagent" --api-url "$api" get template scratch >&2 || true

cat >&2 <<MSG

kagentd is running on $api (state in $state). Try, in another terminal:

  export PATH=$build/bridges/cli:\$PATH
  kagent sandbox templates
  export SANDBOX_ID=\$(kagent sandbox create scratch --request-id my-first-sandbox -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  kagent sandbox exec \$SANDBOX_ID -- python --version
  kagent sandbox delete \$SANDBOX_ID

Ctrl-C stops the node.
MSG
rc=0
while :; do # a trapped signal interrupts wait: wait again until the node has stopped
  wait $pid && rc=0 || rc=$?
  kill -0 $pid 2>/dev/null || break
done
exit $rc
