#!/usr/bin/env bash
# The public gRPC API through Debian's python3-grpcio (a real client, /usr/bin/python3) against a
# real kagentd. Python stubs are generated from proto/ at test time.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
/usr/bin/python3 -c 'import grpc' 2>/dev/null || node_fail "python3-grpcio (Debian) is required"
node_start
node_apply_template apitest
stubs=$WORK/stubs
mkdir -p "$stubs"
protos=$(cd "$KAGENT_SOURCE_DIR/proto" && ls kagent/api/v1/*.proto ateenv/v1alpha/*.proto \
  kagent/runtime/v1/*.proto)
(cd "$KAGENT_SOURCE_DIR/proto" && protoc -I. -I/usr/include --python_out="$stubs" \
  --grpc_out="$stubs" --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin $protos)
# reflection under another module name, so it cannot shadow the grpc package itself
cp "$KAGENT_SOURCE_DIR/proto/grpc/reflection/v1alpha/reflection.proto" "$stubs/kreflection.proto"
(cd "$stubs" && protoc -I. --python_out=. --grpc_out=. \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin kreflection.proto)
for d in kagent kagent/api kagent/api/v1 kagent/runtime kagent/runtime/v1 ateenv ateenv/v1alpha; do touch "$stubs/$d/__init__.py"; done
/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/api/test_api.py" "127.0.0.1:$PORT" "$stubs" apitest
node_stop
