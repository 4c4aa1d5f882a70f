#!/usr/bin/env bash
# The seed's walkthrough exactly as the product page writes it, with the real tools image of
# `make run` (Debian minbase + python3, built once by deploy/build-tools-image.sh and cached in
# var/e2e-tools beside the source; the first run takes a few minutes), moved into the node with
# `kagent image import`: templates, create ... -o json | jq -r '.id', exec -- python --version,
# upload -> exec -> download byte-exact, delete.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
cache=$KAGENT_SOURCE_DIR/var/e2e-tools
mkdir -p "$cache"
chmod 755 "$KAGENT_SOURCE_DIR/var" "$cache"
"$KAGENT_SOURCE_DIR/deploy/build-tools-image.sh" "$cache" "$KAGENT_BUILD_DIR" >/dev/null ||
  fail "the tools image could not be built (debootstrap from Debian's archive)"
node_start
k() { "$KAGENT" --api-url "$API" "$@"; }
skopeo copy -q "oci:$cache/images:kagent/tools" "oci-archive:$WORK/tools.tar" || fail "skopeo export"
TOOLS_REF=$(k image import "$WORK/tools.tar" --name kagent/tools -o json | jq -r '.reference // .image.reference')
[[ $TOOLS_REF == kagent/tools@sha256:* ]] || fail "image import gave '$TOOLS_REF'"
node_apply_template scratch

k sandbox templates | grep "^kagent  *scratch  *kagent/tools@sha256:" >/dev/null || fail "templates"
export SANDBOX_ID=$(k sandbox create scratch --request-id my-first-sandbox -o json | jq -r '.id')
[[ $SANDBOX_ID =~ ^[0-9a-f-]{36}$ ]] || fail "create gave '$SANDBOX_ID'"
k sandbox exec "$SANDBOX_ID" -- python --version 2>/dev/null | grep "^Python 3\." >/dev/null || fail "python --version"
printf 'b\na\nc\n' > "$WORK/in.txt"
k sandbox upload "$SANDBOX_ID" "$WORK/in.txt" in.txt >/dev/null || fail "upload"
k sandbox exec "$SANDBOX_ID" -- python -c \
  'open("out.txt","w").write("".join(sorted(open("in.txt"))))' >/dev/null 2>&1 || fail "exec python"
k sandbox download "$SANDBOX_ID" out.txt "$WORK/out.txt" >/dev/null || fail "download"
[ "$(cat "$WORK/out.txt")" = "$(printf 'a\nb\nc')" ] || fail "download content: $(cat "$WORK/out.txt")"
k sandbox delete "$SANDBOX_ID" | grep RUNTIME_STATE_DELETED >/dev/null || fail "delete"
node_stop
echo "PASS seed walkthrough with python"
