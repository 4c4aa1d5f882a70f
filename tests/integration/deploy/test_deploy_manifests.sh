#!/usr/bin/env bash
# deploy/ checked offline (no cluster, no network but npm's registry for the pinned validator):
# 1. deploy/k8s against the Kubernetes OpenAPI schemas (npm kubernetes-models, pinned by
#    package-lock.json, installed into the build dir), unknown fields refused, plus the
#    cross-document checks of validate.mjs; every Secret the manifests use must be one that
#    deploy/k8s/README.md creates;
# 2. each case of broken.txt, a temporary copy of one manifest with one change, is refused with
#    its message (so the validator is shown to reject what it must);
# 3. the configuration a pod renders (ConfigMap start.sh as pod kagent-1, with this build's
#    kagent-image and guest) is accepted by `kagentd --check-config`, with the guest digest that
#    deploy/build-guest-image.sh gives for the same binary; a node started with it (embedded
#    database, ephemeral ports) gets ready and the StatefulSet's probe commands pass against it;
# 4. the systemd unit passes `systemd-analyze verify` without a warning, and copies with a
#    misspelt key or a bad value do not.
set -euo pipefail
src=${KAGENT_SOURCE_DIR:?}
build=${KAGENT_BUILD_DIR:?}
here=$src/tests/integration/deploy
k8s=$src/deploy/k8s
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in node npm systemd-analyze openssl curl; do
  command -v $tool >/dev/null || fail "$tool is required (deploy/install-deps.sh)"
done
for f in node/kagentd actors/images/kagent-image actors/guest/kagent-sandbox-guest; do
  [ -x "$build/$f" ] || fail "$build/$f is missing (make build)"
done
tmp=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true # teardown: it may have ended after the last check
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# the validator's npm dependencies from the lockfile, reused while it is unchanged
npmdir=$build/tests/integration/deploy/npm
. "$src/tests/lib/npm.sh"
npm_from_lockfile "$here" "$npmdir" || fail "npm ci of the schema validator failed"
cp "$here/validate.mjs" "$here/mutate.mjs" "$npmdir/"
[ -d "$npmdir/node_modules/kubernetes-models/apps/v1" ] || fail "kubernetes-models is not installed"

# the Secrets an operator creates first, as deploy/k8s/README.md says
secrets=() names=()
while read -r name; do secrets+=(--external-secret "$name") names+=("$name"); done < <(
  sed -n 's/.*kubectl -n kagent create secret [a-z]* \([a-z0-9-]*\).*/\1/p' "$k8s/README.md")
[ ${#secrets[@]} -ge 2 ] || fail "deploy/k8s/README.md creates no Secrets"
validate() { node "$npmdir/validate.mjs" "${secrets[@]}" "$@"; }

# 1. the manifests as shipped
validate "$k8s"/*.yaml || fail "deploy/k8s is refused"
echo "ok: deploy/k8s valid ($(ls "$k8s"/*.yaml | wc -l) files; Secrets created first: ${names[*]})"

# 2. each broken copy, in place of its original, is refused with its message
trim() { local s=${1#"${1%%[! ]*}"}; echo "${s%"${s##*[! ]}"}"; }
n=0
while IFS='|' read -r file object change expect; do
  file=$(trim "$file") object=$(trim "$object") change=$(trim "$change") expect=$(trim "$expect")
  read -r op path value <<<"$change"
  [ -f "$k8s/$file" ] || fail "broken.txt: no deploy/k8s/$file"
  mkdir -p "$tmp/case"
  rm -f "$tmp/case/"*
  cp "$k8s"/*.yaml "$tmp/case/"
  node "$npmdir/mutate.mjs" "$k8s/$file" "$tmp/case/$file" "$object" "$op" "$path" "$value" ||
    fail "broken.txt: cannot apply '$change' to $object in $file"
  if cmp -s "$k8s/$file" "$tmp/case/$file"; then fail "'$change': the copy is unchanged"; fi
  if validate "$tmp/case"/*.yaml 2>"$tmp/err"; then fail "$file with '$change' was accepted"; fi
  grep -qF -- "$expect" "$tmp/err" || { cat "$tmp/err" >&2; fail "$file with '$change': refused, but not with: $expect"; }
  echo "ok: $object with '$change' refused: $expect"
  n=$((n + 1))
done < <(grep -v '^#' "$here/broken.txt" | grep .)
[ "$n" -ge 15 ] || fail "only $n broken cases"

# 3. the configuration pod kagent-1 renders is one kagentd accepts
(cd "$npmdir" && node --input-type=module -e '
  import { parseAllDocuments } from "yaml";
  import { readFileSync, writeFileSync } from "node:fs";
  const [file, out] = process.argv.slice(1);
  const cm = parseAllDocuments(readFileSync(file, "utf8")).map(d => d.toJS())
    .find(o => o?.metadata?.name === "kagent-node");
  for (const [k, v] of Object.entries(cm.data)) writeFileSync(`${out}/${k}`, v);
' "$k8s/configmap.yaml" "$tmp") || fail "cannot extract the ConfigMap kagent-node"
[ -f "$tmp/start.sh" ] && [ -f "$tmp/kagentd.yaml.in" ] || fail "ConfigMap kagent-node lacks start.sh or kagentd.yaml.in"
mkdir -p "$tmp/tls" "$tmp/tokens"
: >"$tmp/tokens/tokens"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kagent -keyout "$tmp/tls/tls.key" \
  -out "$tmp/tls/tls.crt" >/dev/null 2>&1 || fail "openssl could not make a test certificate"
sed -i -e "s|/etc/kagent/tokens/|$tmp/tokens/|" -e "s|/etc/kagent/tls/|$tmp/tls/|" "$tmp/kagentd.yaml.in"
HOSTNAME=kagent-1 KAGENT_CONFIG_DIR=$tmp KAGENT_RUN_DIR=$tmp/run KAGENT_STATE_DIR=$tmp/state \
  KAGENT_IMAGE_TOOL=$build/actors/images/kagent-image \
  KAGENT_GUEST_BIN=$build/actors/guest/kagent-sandbox-guest KAGENTD=$build/node/kagentd \
  sh "$tmp/start.sh" --check-config >"$tmp/check" 2>&1 ||
  { cat "$tmp/check" >&2; fail "start.sh or the rendered node configuration failed"; }
conf=$tmp/run/kagentd.yaml
if grep -n '@[A-Z_]*@' "$conf" >&2; then fail "placeholders left in $conf"; fi
want=$("$src/deploy/build-guest-image.sh" "$build" "$tmp/state2")
grep -qx "    digest: \"$want\"" "$conf" || { cat "$conf" >&2; fail "guest digest is not $want"; }
grep -qx "  id: 2" "$conf" && grep -qx '  name: "kagent-1"' "$conf" &&
  grep -qx "  advertise: tcp://kagent-1.kagent.kagent.svc.cluster.local:8084" "$conf" &&
  grep -qx "  uidBase: 1065536" "$conf" && grep -qx "  stateDir: $tmp/state" "$conf" ||
  { cat "$conf" >&2; fail "pod kagent-1's id, name, mesh endpoint, uid range or state dir is wrong"; }
if HOSTNAME=kagent KAGENT_CONFIG_DIR=$tmp sh "$tmp/start.sh" 2>/dev/null; then
  fail "start.sh accepted a HOSTNAME without an ordinal"
fi
echo "ok: pod kagent-1's rendered configuration accepted by kagentd --check-config (guest $want)"

# 3b. a node started with that configuration, the embedded database and ephemeral ports in place
# of the cluster's, gets ready, and the StatefulSet's probe commands pass against it
sed -e 's|^  url: .*|  url: ""|' -e 's|^  port: 8083$|  port: 0|' \
    -e 's|^  bind: .*|  bind: tcp://127.0.0.1:*|' -e 's|^  advertise: .*|  advertise: ""|' \
    "$conf" >"$tmp/run/local.yaml"
chmod 755 "$tmp" # the embedded PostgreSQL runs as postgres
"$build/node/kagentd" --config "$tmp/run/local.yaml" >"$tmp/node.log" 2>&1 &
pid=$!
port=
for _ in $(seq 1200); do # 2 min: an embedded database's initdb on a loaded machine
  port=$(sed -n 's/.*"event":"started".*listen=[0-9.]*:\([0-9]*\).*/\1/p' "$tmp/node.log" | head -1)
  [ -n "$port" ] && curl -fsSk --http1.1 -o /dev/null "https://127.0.0.1:$port/readyz" && break
  kill -0 $pid 2>/dev/null || { cat "$tmp/node.log" >&2; fail "kagentd with pod kagent-1's configuration exited"; }
  sleep 0.1
done
[ -n "$port" ] || { tail -20 "$tmp/node.log" >&2; fail "kagentd with pod kagent-1's configuration did not start"; }
mkdir -p "$tmp/probes"
(cd "$npmdir" && node --input-type=module -e '
  import { parseAllDocuments } from "yaml";
  import { readFileSync, writeFileSync } from "node:fs";
  const [file, out] = process.argv.slice(1);
  const ss = parseAllDocuments(readFileSync(file, "utf8")).map(d => d.toJS())
    .find(o => o?.kind === "StatefulSet" && o.metadata.name === "kagent");
  const c = ss.spec.template.spec.containers[0];
  for (const k of ["startupProbe", "readinessProbe", "livenessProbe"])
    writeFileSync(`${out}/${k}`, c[k].exec.command.map(a => a + "\0").join(""));
' "$k8s/statefulset.yaml" "$tmp/probes") || fail "cannot read the probes of StatefulSet kagent"
for probe in startupProbe readinessProbe livenessProbe; do
  mapfile -d '' cmd <"$tmp/probes/$probe"
  [ "${cmd[0]}" = curl ] || fail "$probe does not run curl"
  "${cmd[@]/:8083\//:$port/}" || fail "$probe failed against the node: ${cmd[*]}"
done
kill -TERM $pid
wait $pid || { tail -20 "$tmp/node.log" >&2; fail "kagentd did not stop cleanly"; }
pid=
echo "ok: a node with that configuration got ready; startup, readiness and liveness probes pass"

# 4. the systemd unit (with this build's kagentd in place of the installed path)
unit() { sed "s|/usr/local/bin/kagentd|$build/node/kagentd|g" "$src/deploy/systemd/kagentd.service"; }
verify() { # FILE: 0 if systemd-analyze verify passes it without a word
  systemd-analyze verify "$1" >"$tmp/verify" 2>&1 && ! grep -q . "$tmp/verify"
}
unit >"$tmp/kagentd.service"
verify "$tmp/kagentd.service" || { cat "$tmp/verify" >&2; fail "systemd-analyze verify: kagentd.service"; }
for key in Type ExecStart Restart KillMode Delegate LimitNOFILE; do
  grep -q "^$key=" "$tmp/kagentd.service" || fail "kagentd.service has no $key="
done
unit | sed 's/^Restart=/Restrat=/' >"$tmp/kagentd.service"
if verify "$tmp/kagentd.service"; then fail "systemd-analyze verify passed a misspelt key"; fi
unit | sed 's/^KillMode=.*/KillMode=sometimes/' >"$tmp/kagentd.service"
if verify "$tmp/kagentd.service"; then fail "systemd-analyze verify passed a bad KillMode"; fi
echo "ok: systemd-analyze verify (and a misspelt key and a bad value refused)"
