# Test helper (source it after node.sh): npm's s3rver on loopback, installed from
# tests/integration/snapshots/package-lock.json into the build dir (reused while it matches).
#   s3_install            npm ci once; sets S3RVER
#   s3_start / s3_stop    starts (bucket `snaps`, data in $WORK/s3) / stops it on $S3PORT
#   s3_aws ARGS...        Debian's awscli against it with s3rver's keys
#   s3_cut_start LIMIT    a proxy in front of it (tests/lib/s3cut.py) on $CUTPORT that dies
#                         once LIMIT bytes went through it: the storage killed mid-transfer
#   s3_cut_wait           waits for that proxy; fails unless it died of its cut
# Needs KAGENT_BUILD_DIR and KAGENT_SOURCE_DIR. Everything fails loudly (node_fail).
# shellcheck source=npm.sh
. "$(dirname "${BASH_SOURCE[0]}")/npm.sh"
S3_AWS=/usr/bin/aws # Debian's awscli (deploy/install-deps.sh), not whatever else is on PATH

s3_install() {
  local here=${KAGENT_SOURCE_DIR:?}/tests/integration/snapshots npmdir
  npmdir=${KAGENT_BUILD_DIR:?}/tests/integration/snapshots/npm
  command -v node >/dev/null || node_fail "node is required (apt-get install nodejs npm)"
  command -v npm >/dev/null || node_fail "npm is required"
  [ -x "$S3_AWS" ] || node_fail "awscli is required (apt-get install awscli)"
  npm_from_lockfile "$here" "$npmdir" || node_fail "npm ci of s3rver failed"
  S3RVER=$npmdir/node_modules/.bin/s3rver
  S3PORT=$(s3_free_port)
  S3PID=''
  S3_STARTED=''
}

s3_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Whether our s3rver (S3PID) serves $S3PORT: the port was free when picked, but a test beside
# this one may have bound it since (its node's listener takes any free port), and then an
# answer there is not s3rver's.
s3_up() {
  local _
  for _ in $(seq 100); do
    kill -0 "$S3PID" 2>/dev/null || return 1 # it could not listen
    curl -s "http://127.0.0.1:$S3PORT/" 2>/dev/null | grep -q ListAllMyBucketsResult && return 0
    sleep 0.1
  done
  return 1
}

# The first start picks another port if the one picked was taken meanwhile; a restart (the
# node already knows the port) fails loudly instead.
s3_start() {
  local _
  mkdir -p "$WORK/s3"
  for _ in 1 2 3 4 5; do
    "$S3RVER" -d "$WORK/s3" -a 127.0.0.1 -p "$S3PORT" --configure-bucket snaps --silent \
      >>"$WORK/s3rver.log" 2>&1 &
    S3PID=$!
    if s3_up; then
      S3_STARTED=1
      return 0
    fi
    kill "$S3PID" 2>/dev/null; wait "$S3PID" 2>/dev/null || true; S3PID=
    [ -z "$S3_STARTED" ] || node_fail "s3rver cannot serve port $S3PORT again (taken meanwhile?)"
    S3PORT=$(s3_free_port)
  done
  node_fail "s3rver did not start (see $WORK/s3rver.log)"
}

s3_stop() {
  [ -n "${S3PID:-}" ] || return 0
  kill "$S3PID"; wait "$S3PID" 2>/dev/null || true; S3PID=
  ! curl -s -o /dev/null "http://127.0.0.1:$S3PORT/" || node_fail "s3rver still answers"
}

s3_aws() {
  AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 \
    "$S3_AWS" --endpoint-url "http://127.0.0.1:$S3PORT" "$@"
}

s3_cut_start() {
  local lim=$1
  rm -f "$WORK/s3cut.port"
  python3 "${KAGENT_SOURCE_DIR:?}/tests/lib/s3cut.py" "$S3PORT" "$lim" >"$WORK/s3cut.port" \
    2>>"$WORK/s3cut.log" &
  CUTPID=$!
  for _ in $(seq 100); do
    CUTPORT=$(head -1 "$WORK/s3cut.port" 2>/dev/null || true)
    [ -n "$CUTPORT" ] && return 0
    kill -0 "$CUTPID" 2>/dev/null || break
    sleep 0.05
  done
  node_fail "the cutting proxy did not start: $(cat "$WORK/s3cut.log" 2>/dev/null)"
}

s3_cut_wait() { # (the call through it has ended: a cut proxy is gone or a zombie by now)
  local rc=0 st
  st=$(awk '{print $3}' "/proc/$CUTPID/stat" 2>/dev/null || true)
  if [ -n "$st" ] && [ "$st" != Z ]; then
    kill "$CUTPID"; wait "$CUTPID" 2>/dev/null || true; CUTPID=
    node_fail "the cutting proxy is still running: the transfer never reached its cut"
  fi
  wait "$CUTPID" || rc=$?
  CUTPID=
  [ $rc = 0 ] || node_fail "the cutting proxy ended with $rc before its cut: $(cat "$WORK/s3cut.log")"
}
