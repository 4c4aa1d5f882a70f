#!/usr/bin/env bash
# The public gRPC API through Debian's python3-grpcio (a real client, /usr/bin/python3) against a
# real kagentd. Python stubs are generated from proto/ at test time.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
api_node apitest
/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/api/test_api.py" "127.0.0.1:$PORT" "$stubs" apitest
# every invalid input through both bridges, the same message from each
/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/api/test_validation.py" "127.0.0.1:$PORT" "$stubs" apitest
node_stop
