#!/usr/bin/env bash
# Suspend and resume through object storage: a real kagentd, a real S3 server on loopback
# (npm's s3rver, pinned by package-lock.json) and Debian's awscli as an independent client.
#   create, write /data (a text file and 64 MiB of random bytes), suspend: the manifest and one
#   archive are in the bucket; resume: /data byte for byte; suspend again: still one archive
#   (the old one went after the new one was referenced);
#   S3 stopped: suspend fails clearly, the sandbox stays READY with its /data; S3 back,
#   suspend, S3 stopped: resume fails clearly, it stays SUSPENDED; S3 back: resume works;
#   wrong credentials (the node's credentials file, read per operation): a clear error, READY;
#   another identity's resume: not found, nothing changes;
#   delete, and TTL expiry: every object of the sandbox is gone.
# Prints BENCH lines for the 64 MiB suspend and resume.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "${KAGENT_SOURCE_DIR:?}/tests/lib/s3rver.sh"
fail() { node_fail "$@"; }
s3_install
stop_all() { [ -n "${S3PID:-}" ] && kill "$S3PID" 2>/dev/null; node_cleanup; }
node_prestart() {
  trap stop_all EXIT
  s3_start
  # the right keys in the node's credentials file; the environment's are wrong, so passing
  # shows the file overrides them
  creds="[default]
aws_access_key_id = S3RVER
aws_secret_access_key = S3RVER
region = us-east-1
endpoint_url = http://127.0.0.1:$S3PORT"
  echo "$creds" > "$WORK/s3.credentials"
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
awsls() { s3_aws s3 ls "s3://snaps/kagent/$1/" --recursive 2>/dev/null | awk '{print $4}' || true; }
ms() { date +%s%3N; }
sum() { k sandbox exec "$1" -- sh -c 'sha256sum /data/workspace/big | cut -d" " -f1; cat /data/workspace/note.txt' 2>/dev/null; }

id=$(k sandbox create s3tpl --request-id s3-1 -o json | field id)
[ -n "$id" ] || fail "create"
k sandbox exec "$id" -- sh -c 'mkdir -p /data/workspace/d/e && echo hello-s3 > /data/workspace/note.txt &&
  head -c 67108864 /dev/urandom > /data/workspace/big && ln -s /etc/passwd /data/workspace/link' \
  >/dev/null 2>&1 || fail "write /data"
before=$(sum "$id")
[ -n "$before" ] || fail "no checksum"

# --- suspend: objects written, checked by awscli
t0=$(ms)
k sandbox suspend "$id" | grep -q RUNTIME_STATE_SUSPENDED || fail "suspend"
t1=$(ms)
keys=$(awsls "$id")
echo "$keys" | grep -qx "kagent/$id/manifest.json" || fail "no manifest in the bucket: $keys"
[ "$(echo "$keys" | grep -c '\.tar\.zst$')" = 1 ] || fail "want one archive: $keys"
s3_aws s3 cp "s3://snaps/kagent/$id/manifest.json" "$WORK/manifest.json" >/dev/null || fail "aws s3 cp"
python3 - "$WORK/manifest.json" "$id" <<'PY' || fail "manifest contents"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["format"] == "kagent-snapshot/1" and m["sandbox"] == sys.argv[2], m
assert m["bytes"] >= 64 << 20 and m["archiveBytes"] > 64 << 20 and len(m["sha256"]) == 64, m
PY
first=$(echo "$keys" | grep '\.tar\.zst$')

# --- another identity cannot reach the snapshot (nor learn the sandbox exists)
set +e; k --user-id bob@example.com sandbox resume "$id" >/dev/null 2>"$WORK/err"; rc=$?; set -e
[ $rc != 0 ] && grep -qi 'not found' "$WORK/err" || fail "another user resumed it: $(cat "$WORK/err")"
[ "$(state "$id")" = RUNTIME_STATE_SUSPENDED ] || fail "another user's resume changed it"

# --- resume: /data byte for byte
t2=$(ms)
k sandbox resume "$id" | grep -q RUNTIME_STATE_READY || fail "resume"
t3=$(ms)
[ "$(sum "$id")" = "$before" ] || fail "/data differs after resume"
k sandbox exec "$id" -- sh -c '[ -L /data/workspace/link ] && [ -d /data/workspace/d/e ]' >/dev/null 2>&1 ||
  fail "symlink or empty dir lost"
echo "BENCH name=snapshot_s3_suspend_64MiB value=$((t1 - t0)) unit=ms"
echo "BENCH name=snapshot_s3_resume_64MiB value=$((t3 - t2)) unit=ms"

# --- a second suspend replaces the archive (the old one deleted after the new is referenced)
k sandbox suspend "$id" | grep -q RUNTIME_STATE_SUSPENDED || fail "suspend 2"
keys=$(awsls "$id")
[ "$(echo "$keys" | grep -c '\.tar\.zst$')" = 1 ] || fail "want one archive after the second suspend: $keys"
echo "$keys" | grep -qx "$first" && fail "the old archive is still there"
k sandbox resume "$id" | grep -q RUNTIME_STATE_READY || fail "resume 2"

# --- storage unreachable during suspend: clear error, READY, /data intact
s3_stop
out=$(k sandbox suspend "$id" 2>&1) && fail "suspend without storage succeeded: $out"
echo "$out" | grep -qi 'unreachable' || fail "unclear suspend error: $out"
echo "suspend without storage: $out"
[ "$(state "$id")" = RUNTIME_STATE_READY ] || fail "after a failed suspend the sandbox is $(state "$id")"
[ "$(sum "$id")" = "$before" ] || fail "/data changed by the failed suspend"
s3_start

# --- storage unreachable during resume: clear error, SUSPENDED; back: resume works
k sandbox suspend "$id" | grep -q RUNTIME_STATE_SUSPENDED || fail "suspend 3"
s3_stop
out=$(k sandbox resume "$id" 2>&1) && fail "resume without storage succeeded: $out"
echo "$out" | grep -qi 'unreachable' || fail "unclear resume error: $out"
echo "resume without storage: $out"
[ "$(state "$id")" = RUNTIME_STATE_SUSPENDED ] || fail "after a failed resume the sandbox is $(state "$id")"
s3_start
k sandbox resume "$id" | grep -q RUNTIME_STATE_READY || fail "resume after storage came back"
[ "$(sum "$id")" = "$before" ] || fail "/data differs after the late resume"

# --- wrong credentials: a clear error, READY
cp "$WORK/s3.credentials" "$WORK/s3.credentials.good"
sed -i 's/aws_access_key_id = S3RVER/aws_access_key_id = WRONGKEY/' "$WORK/s3.credentials"
out=$(k sandbox suspend "$id" 2>&1) && fail "suspend with wrong credentials succeeded: $out"
echo "$out" | grep -q 'InvalidAccessKeyId' || fail "unclear credentials error: $out"
echo "wrong credentials: $out"
[ "$(state "$id")" = RUNTIME_STATE_READY ] || fail "after refused credentials the sandbox is $(state "$id")"
cp "$WORK/s3.credentials.good" "$WORK/s3.credentials"

# --- delete removes every object of the sandbox
k sandbox suspend "$id" | grep -q RUNTIME_STATE_SUSPENDED || fail "suspend 4"
[ -n "$(awsls "$id")" ] || fail "objects missing before delete"
k sandbox delete "$id" | grep -q RUNTIME_STATE_DELETED || fail "delete"
[ -z "$(awsls "$id")" ] || fail "objects left after delete: $(awsls "$id")"

# --- expiry removes the objects too
# (a TTL that outlasts the exec, suspend and listing below on a loaded machine: 15 s did not)
short=$(k sandbox create s3tpl --request-id s3-short --ttl 45s -o json | field id)
k sandbox exec "$short" -- sh -c 'echo x > /data/workspace/x' >/dev/null 2>&1 || fail "write short"
k sandbox suspend "$short" | grep -q RUNTIME_STATE_SUSPENDED || fail "suspend short"
[ -n "$(awsls "$short")" ] || fail "no objects for the short-lived sandbox"
[ "$(state "$short")" = RUNTIME_STATE_SUSPENDED ] || fail "the short-lived sandbox expired before its objects were listed"
for _ in $(seq 900); do [ "$(state "$short")" = RUNTIME_STATE_DELETED ] && break; sleep 0.1; done
[ "$(state "$short")" = RUNTIME_STATE_DELETED ] || fail "the short-lived sandbox did not expire"
[ -z "$(awsls "$short")" ] || fail "objects left after expiry: $(awsls "$short")"

node_stop
echo "PASS snapshots_s3"
