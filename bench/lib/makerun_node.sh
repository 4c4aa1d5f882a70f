# shellcheck shell=bash
# Bench helper (source it): a kagentd node configured exactly as `make run` configures one, so a
# benchmark measures what a user gets through the real `kagent` CLI.
#   makerun_start BUILD_DIR   deploy/run-node.sh itself on deploy/kagentd.example.yaml (embedded
#                             PostgreSQL with fsync on, cgroup limits, the Debian tools image with
#                             python3, the template `scratch` in namespace kagent), in its own temp
#                             state dir and on a free port; returns once the node is ready. Sets
#                             MR_STATE, MR_PORT, MR_API, MR_RUNNER (run-node.sh), MR_PID (kagentd),
#                             KAGENT (the CLI), and MR_LOG.
#                             MR_CAPACITY (optional): the pool's capacity in place of the
#                             example's 1000 (a density bench holds more sandboxes)
#   makerun_kagent ARGS...    the CLI against that node
#   makerun_stop              SIGTERM as Ctrl-C would, waits, checks that nothing is left behind
#                             (mounts, loop devices, PostgreSQL, kagentd), removes the state dir
# The only differences from `make run`: the state dir (not ./var), the port (not 8083) and, if
# MR_CAPACITY is set, the pool's capacity. The
# tools image is built once by deploy/build-tools-image.sh into var/e2e-tools beside the source
# (the cache the e2e tests use; the first run takes a few minutes) and copied into the state dir,
# where run-node.sh finds it already built. Everything fails loudly.
set -euo pipefail

mr_fail() {
  echo "makerun_node: $*" >&2
  [ -f "${MR_LOG:-/nonexistent}" ] && tail -30 "$MR_LOG" >&2
  exit 1
}

makerun_start() {
  local build src cache
  build=$(cd "${1:?usage: makerun_start BUILD_DIR}" && pwd)
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  KAGENT=$build/bridges/cli/kagent
  if [ ! -x "$build/node/kagentd" ] || [ ! -x "$KAGENT" ]; then mr_fail "kagentd or kagent not built in $build"; fi
  cache=$src/var/e2e-tools
  mkdir -p "$cache"
  chmod 755 "$src/var" "$cache"
  "$src/deploy/build-tools-image.sh" "$cache" "$build" >/dev/null ||
    mr_fail "the tools image could not be built (debootstrap from Debian's archive)"
  MR_STATE=$(mktemp -d /tmp/kagent-makerun.XXXXXX)
  chmod 755 "$MR_STATE" # the embedded PostgreSQL runs as `postgres` and must reach it
  trap makerun_cleanup EXIT
  cp -a "$cache/images" "$MR_STATE/" && cp "$cache/tools-image.ref" "$MR_STATE/"
  MR_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  MR_API=http://127.0.0.1:$MR_PORT
  sed -e "s|stateDir: /var/lib/kagent|stateDir: $MR_STATE|" -e "s|^  port: 8083|  port: $MR_PORT|" \
    -e "s|^    capacity: 1000 |    capacity: ${MR_CAPACITY:-1000} |" \
    "$src/deploy/kagentd.example.yaml" >"$MR_STATE/kagentd.yaml"
  grep -q "^    capacity: ${MR_CAPACITY:-1000} " "$MR_STATE/kagentd.yaml" ||
    mr_fail "the pool's capacity line of deploy/kagentd.example.yaml changed"
  MR_LOG=$MR_STATE/run-node.log
  KAGENT_STATE_DIR=$MR_STATE "$src/deploy/run-node.sh" "$build" >"$MR_LOG" 2>&1 &
  MR_RUNNER=$!
  for _ in $(seq 3000); do
    grep -q 'kagentd is running' "$MR_LOG" && break
    kill -0 "$MR_RUNNER" 2>/dev/null || mr_fail "run-node.sh exited"
    sleep 0.2
  done
  grep -q 'kagentd is running' "$MR_LOG" || mr_fail "the node did not become ready"
  MR_PID=$(pgrep -P "$MR_RUNNER" -x kagentd) || mr_fail "no kagentd under run-node.sh"
}

makerun_kagent() {
  "$KAGENT" --api-url "$MR_API" "$@"
}

makerun_stop() {
  [ -n "${MR_RUNNER:-}" ] || return 0
  kill -TERM "$MR_RUNNER"
  local rc=0
  wait "$MR_RUNNER" || rc=$?
  MR_RUNNER=
  [ $rc = 0 ] || mr_fail "run-node.sh exited $rc on SIGTERM"
  ! grep -q "$MR_STATE" /proc/mounts || mr_fail "mounts left behind under $MR_STATE"
  ! pgrep -f "$MR_STATE/postgres" >/dev/null || mr_fail "PostgreSQL left running"
  ! kill -0 "$MR_PID" 2>/dev/null || mr_fail "kagentd $MR_PID still running"
  # Loop devices go with their file systems' last references, which the kernel drops after the
  # unmounts return (5,000 of them took ~1 min after a stop of 7,100 sandboxes). Not `grep -q`:
  # it quits at the first match, losetup dies of SIGPIPE and pipefail made the check pass.
  local left
  for _ in $(seq 300); do
    left=$(losetup -a | grep -c "$MR_STATE" || true)
    [ "$left" = 0 ] && break
    sleep 1
  done
  [ "$left" = 0 ] || mr_fail "$left loop devices left behind on $MR_STATE"
  rm -rf "$MR_STATE"
  MR_STATE=
  trap - EXIT
}

# On any exit before makerun_stop: the node and what it left go.
makerun_cleanup() {
  local status=$?
  if [ -n "${MR_RUNNER:-}" ]; then
    [ $status = 0 ] || { echo "--- run-node.sh log (last 40 lines):" >&2; tail -40 "$MR_LOG" >&2; }
    kill -TERM "$MR_RUNNER" 2>/dev/null || true
    wait "$MR_RUNNER" 2>/dev/null || true
  fi
  if [ -n "${MR_STATE:-}" ]; then
    pkill -f "$MR_STATE/postgres" 2>/dev/null || true
    grep "$MR_STATE" /proc/mounts | awk '{print $2}' | sort -r | xargs -r umount -l 2>/dev/null || true
    rm -rf "$MR_STATE"
  fi
}
