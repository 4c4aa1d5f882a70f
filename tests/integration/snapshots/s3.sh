#!/usr/bin/env bash
# Suspend and resume through object storage: a real kagentd, a real S3 server on loopback
# (npm's s3rver, pinned by package-lock.json) and Debian's awscli as an independent client.
#   create, write /data (a text file, 64 MiB of random bytes, 10,000 small files, modes,
#   symlinks, empty dirs), suspend: the manifest and one archive are in the bucket; resume:
#   /data byte for byte, modes and links included (compared from the host); /metrics counts
#   the suspend's and the resume's file bytes (the manifest's) and durations; suspend again:
#   still one archive (the old one went after the new one was referenced);
#   S3 stopped: suspend fails clearly, the sandbox stays READY with its /data; S3 back,
#   suspend, S3 stopped: resume fails clearly, it stays SUSPENDED; S3 back: resume works;
#   storage killed mid-transfer (a proxy in front of S3 that dies after 24 MiB), during a
#   suspend: READY with its /data, the old snapshot still the one named; during a resume:
#   SUSPENDED, a later resume restores it;
#   wrong credentials (the node's credentials file, read per operation): a clear error on
#   suspend (READY) and on resume (SUSPENDED);
#   another identity's resume, get and delete: not found, nothing changes;
#   delete, and TTL expiry: every object of the sandbox is gone.
# Prints BENCH lines for the suspend and resume of that /data.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "${KAGENT_SOURCE_DIR:?}/tests/lib/s3rver.sh"
fail() { node_fail "$@"; }
s3_install
stop_all() {
  [ -n "${CUTPID:-}" ] && kill "$CUTPID" 2>/dev/null
  [ -n "${S3PID:-}" ] && kill "$S3PID" 2>/dev/null
  node_cleanup
}
creds() { # KEY_ID PORT: the node's credentials file (read at every operation)
  printf '[default]\naws_access_key_id = %s\naws_secret_access_key = S3RVER\nregion = us-east-1\nendpoint_url = http://127.0.0.1:%s\n' \
    "$1" "$2" > "$WORK/s3.credentials"
}
node_prestart() {
  trap stop_all EXIT
  s3_start
  # the right keys in the node's credentials file; the environment's are wrong, so passing
  # shows the file overrides them
  creds S3RVER "$S3PORT"
  chmod 600 "$WORK/s3.credentials"
  NODE_EXTRA_YAML="snapshots:
  credentialsFile: $WORK/s3.credentials"
}
export AWS_ACCESS_KEY_ID=NOPE AWS_SECRET_ACCESS_KEY=NOPE AWS_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:1
NODE_SNAPSHOT_LOCATION=s3://snaps/kagent/
node_start
node_apply_template s3tpl

k() { "$KAGENT" --api-url "$API" "$@"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', ''))"; }
state() { k sandbox get "$1" -o json | field state; }
# The keys under a sandbox's prefix. `aws s3 ls` exits 1 when nothing matched; any other failure
# prints a line no check can take for "no objects" (this runs inside $(...), where fail cannot stop
# the test).
awsls() {
  local out rc=0
  out=$(s3_aws s3 ls "s3://snaps/kagent/$1/" --recursive 2>"$WORK/awsls.err") || rc=$?
  if [ "$rc" = 0 ] || { [ "$rc" = 1 ] && [ -z "$out" ]; }; then
    printf '%s\n' "$out" | awk 'NF {print $4}'
  else
    echo "aws-s3-ls-failed rc=$rc: $out $(cat "$WORK/awsls.err")"
  fi
}
ms() { date +%s%3N; }
# /data/workspace as the host sees it: every entry's path, type, mode, size and link target,
# and every file's bytes (the listing's sizes delimit them)
sum() {
  local d=$STATE/sandboxes/$1/data/workspace
  [ -d "$d" ] || fail "no /data of $1 on the host ($d)"
  (cd "$d" && find . -printf '%P|%y|%m|%s|%l\n' | LC_ALL=C sort | sha256sum &&
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 cat | sha256sum)
}
metric() { # the value of one sample of /metrics, by its exact name and labels (0 if absent)
  curl -sS "$API/metrics" | awk -v k="$1" '$1 == k { v = $2 } END { print v == "" ? 0 : v }'
}
metrics_now() { # the snapshot samples this test follows, one per line
  for op in suspend resume; do
    metric "kagent_snapshot_bytes_total{op=\"$op\"}"
    metric "kagent_snapshot_seconds_count{op=\"$op\",result=\"ok\"}"
    metric "kagent_snapshot_seconds_sum{op=\"$op\",result=\"ok\"}"
  done
}
metrics_check() { # BEFORE AFTER OP BYTES: one more OP, ok, of BYTES file bytes, that took time
  python3 - "$1" "$2" "$3" "$4" <<'PY' || fail "snapshot metrics: $1 -> $2 for $3 of $4 bytes"
import sys
b, a = ([float(x) for x in s.split()] for s in sys.argv[1:3])
i = 0 if sys.argv[3] == "suspend" else 3
assert a[i] - b[i] == float(sys.argv[4]), ("bytes", a[i] - b[i])
assert a[i + 1] - b[i + 1] == 1, ("count", a[i + 1] - b[i + 1])
assert a[i + 2] > b[i + 2], ("duration sum", a[i + 2], b[i + 2])
PY
}

id=$(k sandbox create s3tpl --request-id s3-1 -o json | field id)
[ -n "$id" ] || fail "create"
k sandbox exec "$id" -- sh -c 'mkdir -p /data/workspace/d/e && echo hello-s3 > /data/workspace/note.txt &&
  head -c 67108864 /dev/urandom > /data/workspace/big && ln -s /etc/passwd /data/workspace/link' \
  >/dev/null 2>&1 || fail "write /data"
# 10,000 small files in 100 dirs, modes of every kind a sandbox user can set, relative and
# dangling symlinks, empty files and dirs, a name with spaces
k sandbox exec "$id" -- sh -c 'mkdir /data/workspace/many && cd /data/workspace/many &&
  for d in $(seq 100); do mkdir d$d; for f in $(seq 100); do echo "$d-$f" > d$d/$f; done; done &&
  chmod 0600 d1/* && chmod 0755 d2/* && chmod 0444 d3/* && chmod 0640 d4/1 && chmod 0700 d5 &&
  chmod 0750 d6 && chmod 1777 d7 && chmod 0555 d8 && : > "empty file" && chmod 0604 "empty file" &&
  mkdir -p empty/deeper && chmod 0711 empty && ln -s d2/1 rel && ln -s nowhere dangling' \
  >/dev/null 2>&1 || fail "write the small files"
before=$(sum "$id")
[ -n "$before" ] || fail "no checksum"
m0=$(metrics_now)

# --- suspend: objects written, checked by awscli
t0=$(ms)
k sandbox suspend "$id" | grep RUNTIME_STATE_SUSPENDED >/dev/null || fail "suspend"
t1=$(ms)
keys=$(awsls "$id")
grep -qx "kagent/$id/manifest.json" <<< "$keys" || fail "no manifest in the bucket: $keys"
[ "$(echo "$keys" | grep -c '\.tar\.zst$')" = 1 ] || fail "want one archive: $keys"
s3_aws s3 cp "s3://snaps/kagent/$id/manifest.json" "$WORK/manifest.json" >/dev/null || fail "aws s3 cp"
python3 - "$WORK/manifest.json" "$id" <<'PY' || fail "manifest contents"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["format"] == "kagent-snapshot/1" and m["sandbox"] == sys.argv[2], m
assert m["bytes"] >= 64 << 20 and m["archiveBytes"] > 64 << 20 and len(m["sha256"]) == 64, m
assert m["files"] >= 10000 + 3 and m["symlinks"] >= 3, m
PY
first=$(echo "$keys" | grep '\.tar\.zst$')
# /metrics: the suspend's file bytes are the manifest's (what was archived), its duration counted
bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$WORK/manifest.json")
m1=$(metrics_now)
metrics_check "$m0" "$m1" suspend "$bytes"

# --- another identity cannot reach the snapshot (nor learn the sandbox exists)
set +e; k --user-id bob@example.com sandbox resume "$id" >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] && grep -qi 'not found' "$WORK/err" || fail "another user resumed it: $(cat "$WORK/err")"
for verb in get delete; do
  set +e; k --user-id bob@example.com sandbox $verb "$id" >/dev/null 2>"$WORK/err"; rc=$?; set -e
  [ $rc != 0 ] && grep -qi 'not found' "$WORK/err" || fail "another user's $verb: $(cat "$WORK/err")"
done
[ "$(state "$id")" = RUNTIME_STATE_SUSPENDED ] || fail "another user's calls changed it"
[ "$(awsls "$id")" = "$keys" ] || fail "another user's calls changed the objects: $(awsls "$id")"
m1=$(metrics_now)

# --- resume: /data byte for byte
t2=$(ms)
k sandbox resume "$id" | grep RUNTIME_STATE_READY >/dev/null || fail "resume"
t3=$(ms)
[ "$(sum "$id")" = "$before" ] || fail "/data differs after resume"
k sandbox exec "$id" -- sh -c '[ -L /data/workspace/link ] && [ -d /data/workspace/d/e ] &&
  [ "$(cat /data/workspace/many/rel)" = 2-1 ]' >/dev/null 2>&1 || fail "symlink or empty dir lost"
metrics_check "$m1" "$(metrics_now)" resume "$bytes"
echo "BENCH name=snapshot_s3_suspend_64MiB_10kfiles value=$((t1 - t0)) unit=ms"
echo "BENCH name=snapshot_s3_resume_64MiB_10kfiles value=$((t3 - t2)) unit=ms"

# --- a second suspend replaces the archive (the old one deleted after the new is referenced)
k sandbox suspend "$id" | grep RUNTIME_STATE_SUSPENDED >/dev/null || fail "suspend 2"
keys=$(awsls "$id")
[ "$(echo "$keys" | grep -c '\.tar\.zst$')" = 1 ] || fail "want one archive after the second suspend: $keys"
grep -qx "$first" <<< "$keys" && fail "the old archive is still there"
k sandbox resume "$id" | grep RUNTIME_STATE_READY >/dev/null || fail "resume 2"
[ "$(sum "$id")" = "$before" ] || fail "/data differs after the second resume"
# the failures below need the big file only: the small files go (they cost each transfer time)
k sandbox exec "$id" -- sh -c 'chmod -R u+rwx many && rm -rf many' >/dev/null 2>&1 || fail "rm the small files"
before=$(sum "$id")

# --- storage unreachable during suspend: clear error, READY, /data intact
s3_stop
out=$(k sandbox suspend "$id" 2>&1) && fail "suspend without storage succeeded: $out"
grep -qi 'unreachable' <<< "$out" || fail "unclear suspend error: $out"
echo "suspend without storage: $out"
[ "$(state "$id")" = RUNTIME_STATE_READY ] || fail "after a failed suspend the sandbox is $(state "$id")"
[ "$(sum "$id")" = "$before" ] || fail "/data changed by the failed suspend"
s3_start

# --- storage unreachable during resume: clear error, SUSPENDED; back: resume works
k sandbox suspend "$id" | grep RUNTIME_STATE_SUSPENDED >/dev/null || fail "suspend 3"
s3_stop
out=$(k sandbox resume "$id" 2>&1) && fail "resume without storage succeeded: $out"
grep -qi 'unreachable' <<< "$out" || fail "unclear resume error: $out"
echo "resume without storage: $out"
[ "$(state "$id")" = RUNTIME_STATE_SUSPENDED ] || fail "after a failed resume the sandbox is $(state "$id")"
s3_start

# --- storage killed mid-transfer (24 MiB into a ~64 MiB archive) during a resume: a clear
# error, SUSPENDED
s3_cut_start $((24 << 20))
creds S3RVER "$CUTPORT"
out=$(k sandbox resume "$id" 2>&1) && fail "resume through a killed storage succeeded: $out"
s3_cut_wait
creds S3RVER "$S3PORT"
grep -qi 'unreachable' <<< "$out" || fail "unclear error of a resume cut off: $out"
echo "storage killed during resume: $out"
[ "$(state "$id")" = RUNTIME_STATE_SUSPENDED ] || fail "after a resume cut off the sandbox is $(state "$id")"

# --- wrong credentials (the node's credentials file, read per operation): a clear error, it
# stays SUSPENDED; with the right ones (and storage back) the resume restores /data
creds WRONGKEY "$S3PORT"
out=$(k sandbox resume "$id" 2>&1) && fail "resume with wrong credentials succeeded: $out"
grep -q 'InvalidAccessKeyId' <<< "$out" || fail "unclear credentials error on resume: $out"
echo "wrong credentials on resume: $out"
[ "$(state "$id")" = RUNTIME_STATE_SUSPENDED ] || fail "after refused credentials on resume the sandbox is $(state "$id")"
creds S3RVER "$S3PORT"
k sandbox resume "$id" | grep RUNTIME_STATE_READY >/dev/null || fail "resume after the failed ones"
[ "$(sum "$id")" = "$before" ] || fail "/data differs after the resume that followed the failed ones"

# --- storage killed mid-transfer during a suspend: a clear error, READY with its /data, the
# snapshot saved before (suspend 3) still the one the manifest names
s3_aws s3 cp "s3://snaps/kagent/$id/manifest.json" "$WORK/manifest.before" >/dev/null || fail "aws s3 cp"
s3_cut_start $((24 << 20))
creds S3RVER "$CUTPORT"
out=$(k sandbox suspend "$id" 2>&1) && fail "suspend through a killed storage succeeded: $out"
s3_cut_wait
creds S3RVER "$S3PORT"
grep -qi 'unreachable' <<< "$out" || fail "unclear error of a suspend cut off: $out"
echo "storage killed during suspend: $out"
[ "$(state "$id")" = RUNTIME_STATE_READY ] || fail "after a suspend cut off the sandbox is $(state "$id")"
[ "$(sum "$id")" = "$before" ] || fail "/data changed by the suspend cut off"
s3_aws s3 cp "s3://snaps/kagent/$id/manifest.json" "$WORK/manifest.after" >/dev/null || fail "aws s3 cp"
cmp -s "$WORK/manifest.before" "$WORK/manifest.after" || fail "the manifest changed in a suspend cut off"
named=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["object"])' "$WORK/manifest.after")
awsls "$id" | grep -x "kagent/$named" >/dev/null || fail "the archive the manifest names is gone: $(awsls "$id")"

# --- wrong credentials on a suspend: a clear error, READY
creds WRONGKEY "$S3PORT"
out=$(k sandbox suspend "$id" 2>&1) && fail "suspend with wrong credentials succeeded: $out"
grep -q 'InvalidAccessKeyId' <<< "$out" || fail "unclear credentials error: $out"
echo "wrong credentials on suspend: $out"
[ "$(state "$id")" = RUNTIME_STATE_READY ] || fail "after refused credentials the sandbox is $(state "$id")"
creds S3RVER "$S3PORT"

# --- delete removes every object of the sandbox
k sandbox suspend "$id" | grep RUNTIME_STATE_SUSPENDED >/dev/null || fail "suspend 4"
[ -n "$(awsls "$id")" ] || fail "objects missing before delete"
k sandbox delete "$id" | grep RUNTIME_STATE_DELETED >/dev/null || fail "delete"
[ -z "$(awsls "$id")" ] || fail "objects left after delete: $(awsls "$id")"

# --- expiry removes the objects too
# (a TTL that outlasts the exec, suspend and listing below on a loaded machine: 15 s did not)
short=$(k sandbox create s3tpl --request-id s3-short --ttl 45s -o json | field id)
k sandbox exec "$short" -- sh -c 'echo x > /data/workspace/x' >/dev/null 2>&1 || fail "write short"
k sandbox suspend "$short" | grep RUNTIME_STATE_SUSPENDED >/dev/null || fail "suspend short"
[ -n "$(awsls "$short")" ] || fail "no objects for the short-lived sandbox"
[ "$(state "$short")" = RUNTIME_STATE_SUSPENDED ] || fail "the short-lived sandbox expired before its objects were listed"
for _ in $(seq 900); do [ "$(state "$short")" = RUNTIME_STATE_DELETED ] && break; sleep 0.1; done
[ "$(state "$short")" = RUNTIME_STATE_DELETED ] || fail "the short-lived sandbox did not expire"
[ -z "$(awsls "$short")" ] || fail "objects left after expiry: $(awsls "$short")"

node_stop
echo "PASS snapshots_s3"
