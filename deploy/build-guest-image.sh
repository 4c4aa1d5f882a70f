#!/usr/bin/env bash
# Builds the guest image: an OCI image holding the static kagent-sandbox-guest at
# /run/kagent/guest, stored in STATE_DIR's image store. Prints the image digest (sha256:<hex>).
#
# Usage: deploy/build-guest-image.sh BUILD_DIR STATE_DIR
#   KAGENT_GUEST_BIN=PATH overrides the binary (default BUILD_DIR/actors/guest/kagent-sandbox-guest).
# The binary must be statically linked (no ELF interpreter), so it runs inside any tools image
# whatever its libc. The same binary always gives the same digest (the build is deterministic).
set -euo pipefail

die() { echo "build-guest-image: $*" >&2; exit 1; }
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR STATE_DIR" >&2; exit 2; }
build=$1
state=$2
tool=$build/actors/images/kagent-image
guest=${KAGENT_GUEST_BIN:-$build/actors/guest/kagent-sandbox-guest}

[ -x "$tool" ] || die "$tool is missing: build the kagent-image target first"
[ -f "$guest" ] || die "guest binary $guest is missing: build the kagent-sandbox-guest target first"
command -v readelf >/dev/null || die "readelf (binutils) is required"
if readelf -l "$guest" 2>/dev/null | grep 'Requesting program interpreter' >/dev/null; then
  die "$guest is dynamically linked; the guest must be static to run in any tools image"
fi
readelf -h "$guest" >/dev/null 2>&1 || die "$guest is not an ELF executable"

mkdir -p "$state"
work=$(mktemp -d "${TMPDIR:-/tmp}/kagent-guest-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs/run/kagent"
chmod 0755 "$work/rootfs" "$work/rootfs/run" "$work/rootfs/run/kagent"
cp "$guest" "$work/rootfs/run/kagent/guest"
chmod 0555 "$work/rootfs/run/kagent/guest"
chown -R 0:0 "$work/rootfs" 2>/dev/null || true

ref=$("$tool" --state-dir "$state" build --rootfs "$work/rootfs" --name kagent/guest 2>"$work/log") \
  || { cat "$work/log" >&2; die "image build failed"; }
echo "${ref#*@}"
