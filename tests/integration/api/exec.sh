#!/usr/bin/env bash
# kagent.api.v1.ProcessService/Exec (one call, one guest round trip: started, output, exit)
# through Debian's python3-grpcio against a real kagentd: output order, stderr apart, exit
# codes and signals, refusals as StartProcess's, routing and ownership, cancellation, deadlines,
# several MiB under flow control (kagentd's RSS bounded while the streams are not read).
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
node_lean_asan_quarantine # its RSS bound
api_node exectest
/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/api/test_exec.py" "127.0.0.1:$PORT" \
  "$stubs" exectest "$NODE_PID"
node_stop
