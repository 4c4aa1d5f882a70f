#!/usr/bin/env bash
# Installs every Debian 12 package the build, the tests and the benchmarks need.
# Idempotent and quick: it asks dpkg first and calls apt only for what is missing.
# Usage: deploy/install-deps.sh [--check]   (--check: list what is missing, exit 1 if anything)
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake pkg-config clang-format clang-tidy cppcheck
  # fuzzing (make fuzz): clang with its libFuzzer and sanitizer runtimes
  clang libclang-rt-14-dev
  # libraries named by the design card and chosen beside them
  libzmq3-dev libczmq-dev libmsgpack-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  libpq-dev libyaml-dev libcmocka-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev
  libmicrohttpd-dev libjansson-dev libarchive-dev libseccomp-dev libcurl4-openssl-dev libssl-dev
  # the embedded database and test database
  postgresql postgresql-contrib
  # isolation and images
  busybox-static iproute2 util-linux debootstrap skopeo docker-registry zstd curl binutils jq bubblewrap
  # per-sandbox disk volumes (mkfs.ext4; ext4 on loop devices)
  e2fsprogs
  # test clients and benchmark peers
  python3 python3-grpcio python3-protobuf erlang-base
  # object storage snapshots: the independent S3 client of tests/integration/snapshots
  awscli
  # TLS: test certificates (deploy/gen-test-certs.sh, run-node.sh --tls)
  openssl
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# Node.js and npm (the MCP and gRPC-js test clients) come with the machine, or from Debian.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if [ "${1:-}" = "--check" ]; then
  [ ${#missing[@]} -eq 0 ] && { echo "all dependencies present"; exit 0; }
  echo "missing: ${missing[*]}"; exit 1
fi

[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
