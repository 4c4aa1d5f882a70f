#!/usr/bin/env bash
# A local cluster: N kagentd nodes on this machine sharing one PostgreSQL.
#   deploy/cluster.sh up N [BUILD_DIR]   starts nodes 1..N, prints `node-<i> <api-url> <pid>`
#   deploy/cluster.sh down               stops them (SIGTERM, then SIGKILL after 60 s) and
#                                        removes everything: processes, mounts, state; fails if
#                                        a running node did not stop cleanly
# Node 1 runs the embedded PostgreSQL (or every node uses KAGENT_DATABASE_URL when set); each
# node has its own state dir, API port, mesh port (CURVE, peers found in the node table) and
# host-uid range. Environment (defaults):
#   CLUSTER_DIR        ./var/cluster     where the nodes' configs, state and logs live
#   CLUSTER_API_PORT   8183              node i serves the API on CLUSTER_API_PORT + i - 1
#   CLUSTER_MESH_PORT  8283              ... and the mesh on 127.0.0.1:CLUSTER_MESH_PORT + i - 1
#                                        (0 for either: ephemeral ports, read from the log)
#   CLUSTER_UID_BASES  "4000000 4065536 ..."  node i's sandbox uid range (65536 uids each)
#   CLUSTER_LEASE      5s                the nodes' lease (mesh.lease; a lapsed node's sandboxes
#   CLUSTER_RENEW      1s                are taken over) and how often it is renewed (mesh.renew)
#   CLUSTER_FORGET     1h                a dead node's row goes this long after its lease lapsed
#                                        (mesh.forget)
#   CLUSTER_NODE<i>_YAML  ""             more configuration for node i, appended (e.g. pools:)
#   KAGENT_DATABASE_URL  ""              a shared PostgreSQL instead of node 1's embedded one
# Needs root (the sandboxes and the embedded database do).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${CLUSTER_DIR:-$top/var/cluster}
say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }

# The started line of node i's log: its API port (0 while it has not started).
s_port() {
  sed -n 's/.*path=node-'"$1"' event=started.* listen=[0-9.]*:\([0-9]*\).*/\1/p' \
    "$dir/node-$1/node.log" 2>/dev/null | tail -1
}

s_config() { # i guest database_url
  local i=$1 api=${CLUSTER_API_PORT:-8183} mesh=${CLUSTER_MESH_PORT:-8283} bases uid
  read -r -a bases <<< "${CLUSTER_UID_BASES:-}"
  uid=${bases[$((i - 1))]:-$((4000000 + (i - 1) * 65536))}
  [ "$api" = 0 ] || api=$((api + i - 1))
  if [ "$mesh" = 0 ]; then mesh='*'; else mesh=$((mesh + i - 1)); fi
  cat <<YAML
node:
  name: node-$i
  stateDir: $dir/node-$i/state
listen:
  port: $api
database:
  url: "$3"
sandbox:
  guestImage:
    digest: "$2"
  uidBase: $uid
mesh:
  bind: tcp://127.0.0.1:$mesh
  lease: ${CLUSTER_LEASE:-5s}
  renew: ${CLUSTER_RENEW:-1s}
  forget: ${CLUSTER_FORGET:-1h}
YAML
  local extra="CLUSTER_NODE${i}_YAML"
  [ -z "${!extra:-}" ] || printf '%s\n' "${!extra}"
}

s_start() { # i database_url
  local i=$1 node=$dir/node-$1 guest pid
  mkdir -p "$node/state"
  chmod 755 "$dir" "$node" "$node/state" # the embedded PostgreSQL runs as `postgres`
  guest=$("$top/deploy/build-guest-image.sh" "$build" "$node/state")
  s_config "$i" "$guest" "$2" > "$node/kagentd.yaml"
  : >"$node/node.log" # emptied before the start: the wait must not read the last run's port
  setsid "$build/node/kagentd" --config "$node/kagentd.yaml" >> "$node/node.log" 2>&1 < /dev/null &
  pid=$!
  echo $pid > "$node/pid"
  for _ in $(seq 1200); do # 120 s: a first start creates the database
    [ -n "$(s_port "$i")" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$(s_port "$i")" ] || { tail -20 "$node/node.log" >&2; die "node-$i did not start"; }
  echo "node-$i http://127.0.0.1:$(s_port "$i") $pid"
}

s_up() {
  local n=$1 url=${KAGENT_DATABASE_URL:-}
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "up N: N must be a positive number"
  [ -x "$build/node/kagentd" ] || die "build first ('make build')"
  [ ! -e "$dir/node-1/pid" ] || die "$dir holds a cluster already: deploy/cluster.sh down first"
  mkdir -p "$dir"
  s_start 1 "$url"
  [ -n "$url" ] || url="host=$dir/node-1/state/postgres port=5432 user=postgres dbname=kagent"
  for i in $(seq 2 "$n"); do s_start "$i" "$url"; done
}

# Stops one node: SIGTERM, SIGKILL after 60 s; a node that did not log its clean stop is
# reported (unclean=1, with its log's tail). Its pid file goes either way.
unclean=0
s_stop() {
  local pidfile=$1 pid node
  pid=$(cat "$pidfile") node=$(basename "$(dirname "$pidfile")")
  if kill -0 "$pid" 2>/dev/null && grep -q kagentd "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { say "$node: no exit 60 s after SIGTERM, killing"; kill -KILL "$pid"; }
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    if ! grep -q "path=$node event=stopped" "$(dirname "$pidfile")/node.log"; then
      say "$node did not stop cleanly; the end of its log:"
      tail -20 "$(dirname "$pidfile")/node.log" >&2
      unclean=1
    fi
  fi
  rm -f "$pidfile"
}

s_down() {
  [ -d "$dir" ] || return 0
  local f
  # the nodes using node 1's database first, node 1 (its database) last
  for f in $(ls -d "$dir"/node-*/pid 2>/dev/null | sort -t- -k2 -n -r); do s_stop "$f"; done
  # a node killed earlier leaves its embedded database or mounts: take them down too
  if [ -f "$dir/node-1/state/postgres/data/postmaster.pid" ]; then
    local pg
    pg=$(head -1 "$dir/node-1/state/postgres/data/postmaster.pid")
    kill -TERM "$pg" 2>/dev/null || true
    while kill -0 "$pg" 2>/dev/null; do sleep 0.1; done
  fi
  { grep " $dir/" /proc/mounts || true; } | awk '{print $2}' | sort -r | xargs -r umount -l
  rm -rf "$dir"
  ! grep -q " $dir/" /proc/mounts || die "mounts left under $dir"
  [ $unclean = 0 ] || die "a node did not stop cleanly (above)"
}

case "${1:-}" in
  up)
    build=$(cd "${3:-$top/build}" && pwd)
    s_up "${2:-3}" ;;
  down) s_down ;;
  *) die "usage: deploy/cluster.sh up N [BUILD_DIR] | down" ;;
esac
