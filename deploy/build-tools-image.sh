#!/usr/bin/env bash
# Builds (once, then cached) the default tools image `kagent/tools`: a Debian bookworm minbase
# root file system with a shell and python3, made by debootstrap from Debian's archive and
# imported into STATE_DIR's image store. Prints NAME@sha256:<hex>.
#
# Usage: deploy/build-tools-image.sh STATE_DIR [BUILD_DIR]
#   BUILD_DIR defaults to $KAGENT_BUILD_DIR, then build/ beside this script.
#   KAGENT_DEBIAN_MIRROR overrides the mirror (default http://deb.debian.org/debian).
# Cached by the marker STATE_DIR/tools-image.ref: while it names an image the store still holds,
# nothing is rebuilt. Needs root (debootstrap). Takes about a minute and ~260 MB the first time.
set -euo pipefail

die() { echo "build-tools-image: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 STATE_DIR [BUILD_DIR]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
state=$1
build=${2:-${KAGENT_BUILD_DIR:-$here/../build}}
tool=$build/actors/images/kagent-image
mirror=${KAGENT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
marker=$state/tools-image.ref

[ -x "$tool" ] || die "$tool is missing: build the kagent-image target first"
mkdir -p "$state"
if [ -s "$marker" ]; then
  ref=$(cat "$marker")
  if "$tool" --state-dir "$state" verify "$ref" >/dev/null 2>&1; then
    echo "$ref"
    exit 0
  fi
  echo "build-tools-image: cached $ref is gone or damaged; rebuilding" >&2
fi

command -v debootstrap >/dev/null || die "debootstrap is required (apt-get install debootstrap)"
[ "$(id -u)" = 0 ] || die "debootstrap needs root"
work=$(mktemp -d "$state/tools-rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
debootstrap --variant=minbase --include=python3-minimal,python-is-python3 \
  bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
# What a tools image does not need: package caches and lists.
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"* \
       "$work/rootfs/var/log/"*.log
chroot "$work/rootfs" /bin/sh -c 'python -c "import sys; assert sys.version_info >= (3, 11)"' \
  || die "the root file system has no working python"
ref=$("$tool" --state-dir "$state" build --rootfs "$work/rootfs" --name kagent/tools 2>"$work/log") \
  || { cat "$work/log" >&2; die "image build failed"; }
echo "$ref" >"$marker.tmp" && mv "$marker.tmp" "$marker"
echo "build-tools-image: built $ref in $(( $(date +%s) - start )) s" >&2
echo "$ref"
