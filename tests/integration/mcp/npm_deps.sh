# Test helper (source it): the npm clients of tests/integration/mcp, installed from the committed
# lockfile into the build dir and reused while the lockfile is unchanged (under a lock: the MCP
# tests may run at the same time). Sets NPMDIR. npm failing fails the test.
#   mcp_node22   prints the Node 22 binary deploy/install-deps.sh installs (KAGENT_NODE22
#                overrides), or fails
# shellcheck source=../../lib/npm.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../lib/npm.sh"
mcp_npm_fail() { echo "FAIL: $*" >&2; exit 1; }

mcp_npm_install() {
  NPMDIR=${KAGENT_BUILD_DIR:?}/tests/integration/mcp/npm
  npm_from_lockfile "${KAGENT_SOURCE_DIR:?}/tests/integration/mcp" "$NPMDIR" ||
    mcp_npm_fail "npm ci of the MCP clients failed"
}

mcp_node22() {
  local arch=x64 n
  [ "$(uname -m)" = aarch64 ] && arch=arm64
  n=${KAGENT_NODE22:-/opt/kagent/node-22/node_modules/node-linux-$arch/bin/node}
  [ -x "$n" ] || mcp_npm_fail "Node 22 is missing at $n: run deploy/install-deps.sh"
  case "$("$n" --version)" in v22.*) ;; *) mcp_npm_fail "$n is not Node 22";; esac
  echo "$n"
}
