# Test helper (source it): a real kagentd node in a temp dir, with a busybox tools image.
#   node_start            builds the guest and tools images, writes a config, starts kagentd,
#                         waits until it serves; sets WORK, STATE, PORT, API, TOOLS_REF, KAGENT
#   node_apply_template NAME   applies and waits for Ready=True (namespace kagent); its
#                         snapshotPolicy.location is NODE_SNAPSHOT_LOCATION (default file://)
#   node_restart          starts kagentd again on the same config and state (after a kill)
#   node_stop             SIGTERM, waits, checks nothing is left behind
# Needs KAGENT_BUILD_DIR and KAGENT_SOURCE_DIR (set by ctest). Everything fails loudly.
# Hooks: a function node_prestart, if defined, runs once WORK exists (before the config is
# written); NODE_LISTEN_YAML is added under `listen:` and NODE_EXTRA_YAML at the end of the
# config; NODE_SCHEME (http) starts API; NODE_CLI_FLAGS are passed to every kagent call here.
# Under pipefail a check is `cmd | grep X >/dev/null`, never `| grep -q`: grep -q quits at the
# first match, cmd can then die of SIGPIPE and fail the check although the text matched.
set -euo pipefail
# shellcheck source=uids.sh
. "$(dirname "${BASH_SOURCE[0]}")/uids.sh"

node_fail() { echo "FAIL: $*" >&2; [ -f "${WORK:-/nonexistent}/node.log" ] && tail -30 "$WORK/node.log" >&2; exit 1; }

# For a test that bounds the node's RSS: an ASan build's quarantine keeps 256 MB of freed blocks
# resident, which such a bound would count; 16 MB still catches a use after free of what passed
# recently. No effect on other builds. Call before node_start.
node_lean_asan_quarantine() {
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16
}

node_start() {
  local build=${KAGENT_BUILD_DIR:?} src=${KAGENT_SOURCE_DIR:?}
  KAGENTD=$build/node/kagentd
  KAGENT=$build/bridges/cli/kagent
  [ -x "$KAGENTD" ] && [ -x "$KAGENT" ] || node_fail "kagentd or kagent not built"
  WORK=$(mktemp -d /tmp/kagent-node.XXXXXX)
  chmod 755 "$WORK" # the embedded PostgreSQL runs as `postgres` and must reach the state dir
  STATE=$WORK/state
  trap node_cleanup EXIT
  if declare -F node_prestart >/dev/null; then node_prestart; fi
  NODE_UID_BASE=$(test_uid_base) || node_fail "no uid range"
  local guest rootfs=$WORK/tools-rootfs
  guest=$("$src/deploy/build-guest-image.sh" "$build" "$STATE")
  mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  "$rootfs/bin/busybox" --install -s "$rootfs/bin"
  for b in "$rootfs"/bin/*; do [ -L "$b" ] && ln -sf busybox "$b"; done
  TOOLS_REF=$("$build/actors/images/kagent-image" --state-dir "$STATE" build --rootfs "$rootfs" \
              --name test/tools) || node_fail "tools image build"
  cat > "$WORK/kagentd.yaml" <<YAML
node:
  stateDir: $STATE
listen:
  port: 0
${NODE_LISTEN_YAML:-}
sandbox:
  guestImage:
    digest: "$guest"
  memory: 256Mi
  uidBase: $NODE_UID_BASE
${NODE_EXTRA_YAML:-}
YAML
  node_restart
}

node_restart() {
  # emptied here, not by the child's redirection: the loop below could otherwise read the last
  # run's "started" before the child truncates the file (and then find it empty)
  : >"$WORK/node.log"
  "$KAGENTD" --config "$WORK/kagentd.yaml" 2>>"$WORK/node.log" &
  NODE_PID=$!
  local i why="no started line in 60 s"
  for ((i = 0; i < 600; i++)); do
    if grep -q 'path=node-1 event=\(started\|start_failed\) ' "$WORK/node.log"; then
      why=start_failed
      break
    fi
    if ! kill -0 "$NODE_PID" 2>/dev/null; then why="gone after $i checks"; break; fi
    sleep 0.1
  done
  if ! grep -q 'path=node-1 event=started' "$WORK/node.log"; then
    node_reap # not in $(...): a subshell cannot wait for this shell's child
    node_fail "kagentd did not start ($why; $NODE_END)"
  fi
  PORT=$(sed -n 's/.*path=node-1 event=started.* listen=[0-9.]*:\([0-9]*\).*/\1/p' "$WORK/node.log")
  API=${NODE_SCHEME:-http}://127.0.0.1:$PORT
}

# The first cgroup directory named $1 (a sandbox id) on the host, or nothing. Other tests'
# cgroups come and go under find: its complaints and status are theirs.
node_cgroup_of() { find /sys/fs/cgroup -type d -name "$1" 2>/dev/null | head -1 || true; }

# Sets NODE_END to how the node process ended (reaping it) or that it still runs.
node_reap() {
  local rc=0
  if kill -0 "$NODE_PID" 2>/dev/null; then NODE_END="pid $NODE_PID still runs"; return; fi
  wait "$NODE_PID" 2>/dev/null || rc=$?
  if [ $rc -gt 128 ]; then NODE_END="pid $NODE_PID killed by SIG$(kill -l $((rc - 128)))"
  else NODE_END="pid $NODE_PID exited $rc"; fi
  NODE_PID=
}

node_apply_template() {
  local name=$1
  cat > "$WORK/$name.yaml" <<YAML
apiVersion: api.kagent.dev/v1alpha3
kind: SandboxTemplate
metadata:
  name: $name
  namespace: kagent
spec:
  workload:
    image: $TOOLS_REF
  env:
    - name: LANG
      value: C.UTF-8
  substrate:
    workerPoolRef:
      name: kagent-default
    snapshotPolicy:
      location: ${NODE_SNAPSHOT_LOCATION:-file://$WORK/snapshots/}
YAML
  # shellcheck disable=SC2086 # NODE_CLI_FLAGS are words
  "$KAGENT" ${NODE_CLI_FLAGS:-} --api-url "$API" apply -f "$WORK/$name.yaml" >/dev/null ||
    node_fail "apply $name"
  for _ in $(seq 300); do
    # shellcheck disable=SC2086
    "$KAGENT" ${NODE_CLI_FLAGS:-} --api-url "$API" get template "$name" -o json 2>/dev/null | grep '"Prepared"' >/dev/null && return 0
    sleep 0.1
  done
  node_fail "template $name never became Ready"
}

node_stop() {
  [ -n "${NODE_PID:-}" ] || return 0
  kill -TERM "$NODE_PID"
  local rc=0
  wait "$NODE_PID" || rc=$?
  NODE_PID=
  [ $rc = 0 ] || node_fail "kagentd exited $rc on SIGTERM"
  ! grep -q "$WORK" /proc/mounts || node_fail "mounts left behind"
  ! pgrep -f "$STATE/postgres" >/dev/null || node_fail "PostgreSQL left running"
}

node_cleanup() {
  local status=$?
  if [ $status != 0 ] && [ -f "${WORK:-/nonexistent}/node.log" ]; then
    echo "--- kagentd log (last 60 lines), the test failed with status $status:" >&2
    tail -60 "$WORK/node.log" >&2
  fi
  if [ -n "${NODE_PID:-}" ]; then kill -KILL "$NODE_PID" 2>/dev/null || true; wait "$NODE_PID" 2>/dev/null || true; fi
  if [ -n "${WORK:-}" ]; then
    pkill -f "$STATE/postgres" 2>/dev/null || true
    grep "$WORK" /proc/mounts | awk '{print $2}' | sort -r | xargs -r umount -l 2>/dev/null || true
    rm -rf "$WORK"
  fi
}
