# Test helper (source it): the npm clients of tests/integration/mcp, installed from the committed
# lockfile into the build dir and reused while the lockfile is unchanged (under a lock: the MCP
# tests may run at the same time). Sets NPMDIR. npm failing fails the test.
#   mcp_node22   prints the Node 22 binary deploy/install-deps.sh installs (KAGENT_NODE22
#                overrides), or fails
mcp_npm_fail() { echo "FAIL: $*" >&2; exit 1; }

mcp_npm_install() {
  local here=${KAGENT_SOURCE_DIR:?}/tests/integration/mcp lockhash
  command -v npm >/dev/null || mcp_npm_fail "npm is required (deploy/install-deps.sh)"
  NPMDIR=${KAGENT_BUILD_DIR:?}/tests/integration/mcp/npm
  mkdir -p "$(dirname "$NPMDIR")"
  lockhash=$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)
  exec {mcp_npm_lock}>"$NPMDIR.lock"
  flock "$mcp_npm_lock"
  if [ "$(cat "$NPMDIR/.lockhash" 2>/dev/null || true)" != "$lockhash" ] || [ ! -d "$NPMDIR/node_modules" ]; then
    rm -rf "$NPMDIR"
    mkdir -p "$NPMDIR"
    cp "$here/package.json" "$here/package-lock.json" "$NPMDIR/"
    (cd "$NPMDIR" && npm ci --no-audit --no-fund --ignore-scripts >"$NPMDIR/npm.log" 2>&1) ||
      { cat "$NPMDIR/npm.log" >&2; mcp_npm_fail "npm ci failed"; }
    echo "$lockhash" > "$NPMDIR/.lockhash"
  fi
  flock -u "$mcp_npm_lock"
}

mcp_node22() {
  local arch=x64 n
  [ "$(uname -m)" = aarch64 ] && arch=arm64
  n=${KAGENT_NODE22:-/opt/kagent/node-22/node_modules/node-linux-$arch/bin/node}
  [ -x "$n" ] || mcp_npm_fail "Node 22 is missing at $n: run deploy/install-deps.sh"
  case "$("$n" --version)" in v22.*) ;; *) mcp_npm_fail "$n is not Node 22";; esac
  echo "$n"
}
