#!/usr/bin/env bash
# Every kind of guest stream (ReadFile, StreamProcessOutput, Exec, WatchFiles, WriteFile,
# WriteProcessInput) opened and cancelled at random moments, 60 rounds, through Debian's
# python3-grpcio: kagentd survives, every call still works, none stays open, and (under ASan)
# no call state is used after it was freed or leaked (kagentd's clean exit).
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
api_node storm
/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/api/test_cancel_storm.py" \
  "127.0.0.1:$PORT" "$stubs" storm "$NODE_PID"
node_stop
