#!/usr/bin/env bash
# Warm pools as a person at a terminal sees them: the real `kagent` CLI against a node started
# the way `make run` starts one (deploy/run-node.sh: embedded PostgreSQL with fsync on, the
# Debian tools image, cgroup limits, the template `scratch` in pool kagent-default, warm: 2),
# plus a second pool `bench-cold` with warm: 0 and the same template under the name
# `scratch-cold`, so warm and cold creates alternate on one node under the same load, and a
# third, `bench-deep` with warm: 100 (template `scratch-deep`), a pool as deep as the burst:
#   1. create -> READY (`kagent sandbox create ... -o json`), warm (a warm sandbox ready before
#      each run, checked by the hit counter) and cold, p50/p99;
#   2. a burst of 100 concurrent creates (100 CLI processes at once): warm: 2 (2 hits, 98 cold),
#      cold, and deep (warm: 100, every create a hit);
#   3. sustained creates/s: 8 CLI processes creating one after another for 10 s, cold and from
#      the deep pool; then a cold burst again, right after the sustained steps' deletes;
#   4. bubblewrap (`bwrap ... true`) in the same run as the peer, alone, 100 at once, sustained.
# Usage: bench/warm/run.sh BUILD_DIR. BENCH_WARM_RUNS runs per figure (100). State in
# var/bench-warm (the tools image is built there once, or copied from var/bench-cli).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
kagent=$build/bridges/cli/kagent
state=$here/var/bench-warm
say() { echo "bench/warm: $*" >&2; }
command -v bwrap >/dev/null || { say "bwrap is missing (deploy/install-deps.sh installs bubblewrap)"; exit 1; }

mkdir -p "$state"
for cache in "$here/var/bench-cli" "$here/var/e2e-tools"; do
  if [ ! -s "$state/tools-image.ref" ] && [ -s "$cache/tools-image.ref" ]; then
    cp -a "$cache/images" "$state/" && cp "$cache/tools-image.ref" "$state/"
  fi
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# BENCH_UID_BASE: another host uid range than the example's (a test node may hold that one)
sed -e "s|stateDir: /var/lib/kagent|stateDir: $state|" -e "s|^  port: 8083|  port: $port|" \
    -e "s|uidBase: 1000000|uidBase: ${BENCH_UID_BASE:-1000000}|" \
  "$here/deploy/kagentd.example.yaml" > "$state/kagentd.yaml"
# the cold pool and the deep one: right after the default pool's entry; room for a sustained
# step's creates (the node refuses a create past its pool's capacity, and the step keeps them
# until it ends: ~700 in 10 s here)
sed -i "s|^    warm: 2 .*|&\n  - name: bench-cold\n    class: namespaces\n    capacity: 4000\n    warm: 0\n  - name: bench-deep\n    class: namespaces\n    capacity: 4000\n    warm: 100|" \
  "$state/kagentd.yaml"
grep -q 'name: bench-deep' "$state/kagentd.yaml" || { say "cannot add the cold and deep pools"; exit 1; }
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
for pool in cold deep; do
  sed -e "s/^  name: scratch\$/  name: scratch-$pool/" \
      -e "s/^      name: kagent-default\$/      name: bench-$pool/" \
    "$state/scratch.yaml" > "$state/scratch-$pool.yaml"
  "$kagent" --api-url "$api" apply -f "$state/scratch-$pool.yaml" >/dev/null
  for _ in $(seq 600); do
    "$kagent" --api-url "$api" get template "scratch-$pool" -o json 2>/dev/null |
      grep -q '"Prepared"' && break
    sleep 0.2
  done
done
python3 "$here/bench/warm/warmbench.py" "$kagent" "$api" "$state/kagentd.yaml"
