#!/usr/bin/env bash
# kagentd as a user meets it: --help, --version, config errors naming key and line,
# --check-config / --print-config, and a node that starts and stops cleanly on SIGTERM and SIGINT.
set -euo pipefail
kagentd=${KAGENT_BUILD_DIR:?}/node/kagentd
src=${KAGENT_SOURCE_DIR:?}
work=$(mktemp -d /tmp/kagentd-test.XXXXXX)
pid=
trap 'if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || :; fi; rm -rf "$work"' EXIT # a failed run leaves no node
chmod 755 "$work" # the embedded PostgreSQL runs as `postgres` and must reach the state dir
fail() { echo "FAIL: $*" >&2; exit 1; }
digest=sha256:$(printf '%064d' 7)
build=${KAGENT_BUILD_DIR:?}
. "$src/tests/lib/uids.sh"
uid_base=$(test_uid_base)

# --help / --version / bad flag
"$kagentd" --help | grep -- '--config FILE' >/dev/null || fail "--help lacks --config"
"$kagentd" --version | grep -E '^kagentd [0-9]+\.[0-9]+\.[0-9]+$' >/dev/null || fail "--version"
set +e; "$kagentd" --bogus 2>"$work/err"; rc=$?; set -e
[ $rc = 2 ] || fail "unknown flag exits $rc, want 2"

# the example config, with a digest, is valid as shipped (given this test's own uid range and
# port: a node of the example's defaults may run on this machine)
sed "s|    digest: \"\"|    digest: \"$digest\"|; s|stateDir: /var/lib/kagent|stateDir: $work/state|
     s|port: 8083|port: 0|; s|uidBase: 1000000|uidBase: $uid_base|" \
  "$src/deploy/kagentd.example.yaml" > "$work/good.yaml"
grep -q "uidBase: $uid_base" "$work/good.yaml" || fail "the example config has no uidBase line to set"
"$kagentd" --config "$work/good.yaml" --check-config | grep valid >/dev/null || fail "example config refused"
"$kagentd" --config "$work/good.yaml" --print-config | grep "digest: \"$digest\"" >/dev/null || fail "--print-config"

# a misspelt key and a wrong type are refused with key and line
printf 'sandbox:\n  guestImage:\n    digest: %s\nlisten:\n  prot: 80\n' "$digest" > "$work/typo.yaml"
set +e; "$kagentd" --config "$work/typo.yaml" --check-config 2>"$work/err"; rc=$?; set -e
[ $rc = 1 ] || fail "misspelt key exits $rc"
grep -q "typo.yaml:5: listen.prot: unknown key" "$work/err" || fail "typo message: $(cat "$work/err")"
printf 'sandbox:\n  guestImage:\n    digest: %s\n  memory: plenty\n' "$digest" > "$work/type.yaml"
set +e; "$kagentd" --config "$work/type.yaml" 2>"$work/err"; rc=$?; set -e
[ $rc = 1 ] || fail "wrong type exits $rc"
grep -q "type.yaml:4: sandbox.memory: expected a size" "$work/err" || fail "type message: $(cat "$work/err")"
set +e; "$kagentd" --config "$work/missing.yaml" 2>"$work/err"; rc=$?; set -e
[ $rc = 1 ] && grep -q "missing.yaml: No such file" "$work/err" || fail "missing file: $(cat "$work/err")"

# a node that cannot find its guest image refuses to start, saying what to do
set +e; "$kagentd" --config "$work/good.yaml" 2>"$work/err"; rc=$?; set -e
[ $rc = 1 ] || fail "missing guest image exits $rc"
grep -q "guest image $digest is not usable" "$work/err" || fail "guest image message: $(cat "$work/err")"

# with the real guest image: start (embedded PostgreSQL created), serve, stop on each signal:
# exit 0, "stopped" logged, no child, database or mount left behind
real=$("$src/deploy/build-guest-image.sh" "$build" "$work/state")
sed -i "s|$digest|$real|" "$work/good.yaml"
for sig in TERM INT; do
  : >"$work/log" # emptied before the start: the loop must not read the last run's lines
  "$kagentd" --config "$work/good.yaml" 2>>"$work/log" &
  pid=$!
  for _ in $(seq 300); do grep -q 'path=node-1 event=started\|start_failed' "$work/log" && break; sleep 0.1; done
  grep -q 'path=node-1 event=started' "$work/log" || { cat "$work/log"; fail "node did not start"; }
  port=$(sed -n 's/.*path=node-1 event=started.* listen=[0-9.]*:\([0-9]*\).*/\1/p' "$work/log")
  [ "$(curl -fsS "http://127.0.0.1:$port/healthz")" = ok ] || { cat "$work/log"; fail "healthz on port $port"; }
  # not `curl | grep -q`: grep quits at the match and curl, still writing, fails on SIGPIPE
  curl -fsS "http://127.0.0.1:$port/metrics" > "$work/metrics" || fail "metrics"
  grep -q '^kagent_actors_live ' "$work/metrics" || fail "metrics: no kagent_actors_live"
  if [ $sig = TERM ]; then
    # a second node with another state dir but overlapping host uids is refused before it
    # starts anything (its tenants would share the kernel's per-user pools with ours)
    # (the very same range: a range beside ours may be another test node's)
    sed "s|stateDir: $work/state|stateDir: $work/state2|" "$work/good.yaml" > "$work/second.yaml"
    set +e; timeout 30 "$kagentd" --config "$work/second.yaml" 2>"$work/err2"; rc=$?; set -e
    [ $rc = 1 ] || fail "an overlapping uid range exits $rc: $(cat "$work/err2")"
    grep -q "held by another kagentd (pid and state: $pid $work/state)" "$work/err2" &&
      grep -q "give each node on a machine a range of its own" "$work/err2" ||
      fail "overlap message: $(cat "$work/err2")"
    [ ! -d "$work/state2/postgres" ] || fail "the refused node started a database"
  fi
  kill -$sig $pid
  set +e; wait $pid; rc=$?; set -e
  [ $rc = 0 ] || { cat "$work/log"; fail "SIG$sig: exit $rc"; }
  grep -q 'event=stopped' "$work/log" || fail "SIG$sig: no stopped line"
  ! pgrep -P "$pid" >/dev/null || fail "SIG$sig: children left"
  ! pgrep -f "$work/state/postgres" >/dev/null || fail "SIG$sig: PostgreSQL left running"
  ! grep -q "$work" /proc/mounts || fail "SIG$sig: mounts left"
done
# the database outlived both runs: the second start reused it
[ -s "$work/state/postgres/data/PG_VERSION" ] || fail "embedded database not kept"
echo "PASS kagentd"
