#!/usr/bin/env bash
# What a person at a terminal sees, timed around the real `kagent` process:
#   1. its start: first byte on the wire and `kagent --help` (no node);
#   2. against a node started the way `make run` starts one (deploy/run-node.sh: embedded
#      PostgreSQL with fsync on, the Debian tools image with python3, the template `scratch`):
#      `kagent sandbox exec ID -- true` and create -> READY.
# Usage: bench/cli/run.sh BUILD_DIR [PEER_KAGENT]
#   PEER_KAGENT: another kagent binary (e.g. main's, on gRPC core) timed in alternation.
#   PEER_NAME names it in the BENCH lines (default kagent-grpc-core).
#   BENCH_CLI_RUNS runs per figure (200). The node's state lives in var/bench-cli (the tools
#   image is built there once, or taken from the e2e tests' var/e2e-tools cache); the node
#   listens on a free port and is stopped at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [PEER_KAGENT]}" && pwd)
peer=${2:-}
kagent=$build/bridges/cli/kagent
bench=$here/bench/cli/clibench.py
export RUNS=${BENCH_CLI_RUNS:-200}
state=$here/var/bench-cli
say() { echo "bench/cli: $*" >&2; }

python3 "$bench" start "$kagent" ${peer:+"$peer"}

# the make-run node, on its own state dir and a free port
mkdir -p "$state"
cache=$here/var/e2e-tools
if [ ! -s "$state/tools-image.ref" ] && [ -s "$cache/tools-image.ref" ]; then
  cp -a "$cache/images" "$state/" && cp "$cache/tools-image.ref" "$state/"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed -e "s|stateDir: /var/lib/kagent|stateDir: $state|" -e "s|^  port: 8083|  port: $port|" \
  "$here/deploy/kagentd.example.yaml" > "$state/kagentd.yaml"
: >"$state/run-node.log" # emptied before the start: the wait must not read the last run's lines
KAGENT_STATE_DIR=$state "$here/deploy/run-node.sh" "$build" >> "$state/run-node.log" 2>&1 &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null || true' EXIT
for _ in $(seq 3000); do
  grep -q 'kagentd is running' "$state/run-node.log" && break
  kill -0 $node 2>/dev/null || { tail -30 "$state/run-node.log" >&2; exit 1; }
  sleep 0.2
done
grep -q 'kagentd is running' "$state/run-node.log" || { say "node not ready"; exit 1; }
api=http://127.0.0.1:$port
id=$("$kagent" --api-url "$api" sandbox create scratch --request-id "bench-cli-$$" -o json |
     python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
python3 "$bench" exec "$kagent" "$api" "$id" ${peer:+"$peer"}
"$kagent" --api-url "$api" sandbox delete "$id" >/dev/null
python3 "$bench" create "$kagent" "$api" scratch ${peer:+"$peer"}
