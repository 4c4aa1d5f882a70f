#!/usr/bin/env bash
# The Files API end to end against a real kagentd: gRPC (python3-grpcio, test_files_grpc.py),
# then the same sandbox through MCP over HTTP (curl) and the kagent CLI.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
/usr/bin/python3 -c 'import grpc' 2>/dev/null || node_fail "python3-grpcio (Debian) is required"
command -v curl >/dev/null || node_fail "curl is required"
node_start
node_apply_template filestest
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
stubs=$(api_stubs)
mkdir -p "$stubs/kagent/files/v1"
(cd "$KAGENT_SOURCE_DIR/proto" && protoc -I. -I/usr/include --python_out="$stubs" \
  --grpc_out="$stubs" --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin \
  kagent/files/v1/files.proto) >&2
touch "$stubs/kagent/files/__init__.py" "$stubs/kagent/files/v1/__init__.py"
sid=$(/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/files/test_files_grpc.py" \
  "127.0.0.1:$PORT" "$stubs" filestest | tail -1)
echo "gRPC: ok ($sid)"
