#!/usr/bin/env bash
# Flow control and stream ends on a real node through Debian's python3-grpcio: eight 60 MiB
# downloads that are never read keep kagentd's RSS bounded while the node serves other calls;
# one is then read fully and checked; streams whose sandbox is deleted end with an error;
# 64 MiB upload/download throughput and the guest's RSS are reported (BENCH lines).
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
# cold sandboxes only: the test finds its one sandbox's guest among the node's children
NODE_EXTRA_YAML="pools:
  - name: kagent-default
    warm: 0"
node_lean_asan_quarantine # its RSS bound
api_node streams
/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/api/test_streams.py" "127.0.0.1:$PORT" \
  "$stubs" streams "$NODE_PID"
node_stop
