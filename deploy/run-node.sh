#!/usr/bin/env bash
# `make run`: starts one kagentd node in the foreground with a working default.
#   deploy/run-node.sh BUILD_DIR
# State lives in ./var (images, sandboxes, the embedded PostgreSQL). The first run builds the
# guest image and writes its digest into var/kagentd.yaml; later runs reuse both.
# Ctrl-C (SIGINT) or SIGTERM stops the node cleanly.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
state=${KAGENT_STATE_DIR:-$top/var}
config=$state/kagentd.yaml
mkdir -p "$state"

kagentd=$build/node/kagentd
[ -x "$kagentd" ] || { echo "run-node: $kagentd is missing; run 'make build' first" >&2; exit 1; }

# The guest image: built once from the static guest binary; its digest pins the policy.
digest_file=$state/guest-image.digest
if [ ! -s "$digest_file" ] || [ "$build/actors/guest/kagent-sandbox-guest" -nt "$digest_file" ]; then
  echo "run-node: building the guest image..." >&2
  "$top/deploy/build-guest-image.sh" "$build" "$state" | tail -1 | sed 's/.*@//' > "$digest_file.tmp"
  mv "$digest_file.tmp" "$digest_file"
fi
digest=$(cat "$digest_file")

if [ ! -f "$config" ]; then
  sed -e "s|stateDir: /var/lib/kagent|stateDir: $state|" \
      -e "s|    digest: \"\"  |    digest: \"$digest\"|" \
      "$top/deploy/kagentd.example.yaml" > "$config"
  echo "run-node: wrote $config" >&2
else
  # keep the operator's file; only refresh the guest digest line
  sed -i -E "s|^(    digest: )\"?[^ #]*\"?|\1\"$digest\"|" "$config"
fi

"$kagentd" --config "$config" --check-config >/dev/null
echo "run-node: starting kagentd (config $config); Ctrl-C stops it" >&2
exec "$kagentd" --config "$config"
