# Test helper (source it) for tests that drive deploy/cluster.sh with CLUSTER_DIR set.
#   cluster_logs   the last 40 lines of every node's log, to stderr: a failed test's evidence
cluster_logs() {
  local l
  for l in "$CLUSTER_DIR"/node-*/node.log; do
    [ -f "$l" ] && { echo "--- $l (last 40 lines)" >&2; tail -40 "$l" >&2; }
  done
  return 0
}
