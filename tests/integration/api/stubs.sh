# Sourced after tests/lib/node.sh. api_stubs generates the Python gRPC stubs of proto/ (Debian's
# protoc and grpc_python_plugin) under $WORK/stubs (once node_start made $WORK) and prints that
# directory.
api_stubs() {
  local stubs=$WORK/stubs protos
  mkdir -p "$stubs"
  protos=$(cd "$KAGENT_SOURCE_DIR/proto" && ls kagent/api/v1/*.proto ateenv/v1alpha/*.proto \
    kagent/runtime/v1/*.proto kagent/files/v1/*.proto)
  (cd "$KAGENT_SOURCE_DIR/proto" && protoc -I. -I/usr/include --python_out="$stubs" \
    --grpc_out="$stubs" --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin $protos) >&2
  # reflection under another module name, so it cannot shadow the grpc package itself
  cp "$KAGENT_SOURCE_DIR/proto/grpc/reflection/v1alpha/reflection.proto" "$stubs/kreflection.proto"
  (cd "$stubs" && protoc -I. --python_out=. --grpc_out=. \
    --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin kreflection.proto) >&2
  for d in kagent kagent/api kagent/api/v1 kagent/runtime kagent/runtime/v1 kagent/files \
    kagent/files/v1 ateenv ateenv/v1alpha; do
    touch "$stubs/$d/__init__.py"
  done
  echo "$stubs"
}

# The start of a test through the stubs: python3-grpcio present, a node started (node_start:
# NODE_EXTRA_YAML and the like set before apply) with template $1 applied, and $stubs set.
api_node() {
  /usr/bin/python3 -c 'import grpc' 2>/dev/null || node_fail "python3-grpcio (Debian) is required"
  node_start
  node_apply_template "$1"
  stubs=$(api_stubs)
}
