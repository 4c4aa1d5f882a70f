#!/usr/bin/env bash
# deploy/ checked offline: the Kubernetes manifests (deploy/k8s) against the Kubernetes JSON
# schemas (npm kubernetes-models, pinned by package-lock.json, installed into the build dir)
# plus cross-document checks (validate.mjs); each deliberately broken copy in broken/ (named
# <manifest>--<defect>.yaml, its first line "# expect: <message>") must be refused with that
# message; the node configuration the pods render (ConfigMap start.sh, node 1 of 3) passes
# `kagentd --check-config`; the systemd unit passes `systemd-analyze verify`.
set -euo pipefail
src=${KAGENT_SOURCE_DIR:?}
build=${KAGENT_BUILD_DIR:?}
here=$src/tests/integration/deploy
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v npm >/dev/null || fail "npm is required (deploy/install-deps.sh)"
command -v systemd-analyze >/dev/null || fail "systemd-analyze is required (systemd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# npm dependencies from the lockfile, reused while it is unchanged
npmdir=$build/tests/integration/deploy/npm
. "${KAGENT_SOURCE_DIR:?}/tests/lib/npm.sh"
npm_from_lockfile "$here" "$npmdir" || fail "npm ci of the schema validator failed"
cp "$here/validate.mjs" "$npmdir/validate.mjs"
validate() { node "$npmdir/validate.mjs" "$@"; }

# 1. the manifests as shipped
validate "$src"/deploy/k8s/*.yaml || fail "deploy/k8s is refused"
echo "ok: deploy/k8s valid ($(ls "$src"/deploy/k8s/*.yaml | wc -l) files)"

# 2. each broken copy, in place of its original, is refused with its message
n=0
for bad in "$here"/broken/*.yaml; do
  name=$(basename "$bad")
  orig=${name%%--*}.yaml
  [ -f "$src/deploy/k8s/$orig" ] || fail "$name: no deploy/k8s/$orig"
  expect=$(sed -n '1s/^# expect: //p' "$bad")
  [ -n "$expect" ] || fail "$name: no '# expect:' line"
  files=()
  for f in "$src"/deploy/k8s/*.yaml; do [ "$(basename "$f")" = "$orig" ] || files+=("$f"); done
  if validate "${files[@]}" "$bad" 2>"$tmp/err"; then fail "$name was accepted"; fi
  grep -qF -- "$expect" "$tmp/err" || { cat "$tmp/err" >&2; fail "$name: refused, but not with: $expect"; }
  echo "ok: $name refused: $expect"
  n=$((n + 1))
done
[ "$n" -ge 5 ] || fail "only $n broken copies"

# 3. the configuration a pod renders is one kagentd accepts
node -e '
  const { parseAllDocuments } = require(process.argv[1] + "/node_modules/yaml");
  const fs = require("fs");
  const cm = parseAllDocuments(fs.readFileSync(process.argv[2], "utf8")).map(d => d.toJS())
    .find(o => o && o.metadata.name === "kagent-node");
  for (const [k, v] of Object.entries(cm.data)) fs.writeFileSync(process.argv[3] + "/" + k, v);
' "$npmdir" "$src/deploy/k8s/configmap.yaml" "$tmp"
mkdir -p "$tmp/secret" && : >"$tmp/secret/tokens"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kagent -keyout "$tmp/tls.key" \
  -out "$tmp/tls.crt" >/dev/null 2>&1 || fail "openssl could not make a test certificate"
sed -i -e "s|/etc/kagent/secret/tokens|$tmp/secret/tokens|" -e "s|/var/lib/kagent|$tmp/state|" \
  -e "s|/etc/kagent/tls/|$tmp/|" "$tmp/kagentd.yaml.in"
HOSTNAME=kagent-0 KAGENT_GUEST_DIGEST="sha256:$(printf '%064d' 0)" \
  KAGENT_CONFIG_DIR=$tmp KAGENT_RUN_DIR=$tmp/run KAGENTD=$build/node/kagentd \
  sh "$tmp/start.sh" --check-config || fail "the rendered node configuration is refused"
grep -q "^  advertise: tcp://kagent-0.kagent.kagent.svc.cluster.local:8084$" "$tmp/run/kagentd.yaml" &&
  grep -q "^  id: 1$" "$tmp/run/kagentd.yaml" || fail "node 1's id or mesh endpoint is not rendered"
echo "ok: rendered configuration of node 1 accepted by kagentd --check-config"

# 4. the systemd unit (with this build's kagentd in place of the installed path)
sed "s|/usr/local/bin/kagentd|$build/node/kagentd|g" "$src/deploy/systemd/kagentd.service" \
  >"$tmp/kagentd.service"
systemd-analyze verify "$tmp/kagentd.service" >"$tmp/verify" 2>&1 ||
  { cat "$tmp/verify" >&2; fail "systemd-analyze verify refused the unit"; }
if grep -v "^$" "$tmp/verify" | grep -q .; then cat "$tmp/verify" >&2; fail "systemd-analyze warned"; fi
echo "ok: systemd-analyze verify"
