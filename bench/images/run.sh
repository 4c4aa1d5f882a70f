#!/usr/bin/env bash
# Images benchmark: build and import throughput (MB/s), layer unpack beside plain `tar -x` of the
# same layer in the same run, first vs cached rootfs preparation (ms).
# Source tree: busybox plus a copy of the host's python3 standard library (a tools-image-like
# mix of ~1500 small and large files). Usage: bench/images/run.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
bin=$build/bench/images/bench_images
[ -x "$bin" ] || { echo "missing $bin (build first)" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "missing /bin/busybox (busybox-static)" >&2; exit 1; }
py=$(ls -d /usr/lib/python3.[0-9]* 2>/dev/null | head -1)
[ -n "$py" ] || { echo "no /usr/lib/python3.X to use as bench data" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/ka-images-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/bin" "$work/src/usr/lib"
cp /bin/busybox "$work/src/bin/"
cp -a "$py" "$work/src/usr/lib/"
"$bin" "$work" "$work/src" "${IMAGES_BENCH_CACHED:-1000}"
