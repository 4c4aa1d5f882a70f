#!/usr/bin/env bash
# The operators' CLI on a real node: `runtime tree` drawn (and -o json, and --watch until
# Ctrl-C), `get sandboxtemplate|sandboxtemplates|st` in kubectl's shape with -o json, yaml and
# the seed's jsonpath, READY in the list, phase timings through jsonpath, bash completion.
set -euo pipefail
source "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
PY=/usr/bin/python3
fail() { node_fail "$*"; }
node_start
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }
id=$(k sandbox create scratch --request-id cli-ops -o json | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')

# runtime tree: drawn by default
k runtime tree > "$WORK/tree.txt"
[ "$(head -1 "$WORK/tree.txt")" = node-1 ] || fail "tree root: $(head -3 "$WORK/tree.txt")"
grep -q '^└── supervisor \[supervisor\] .* strategy=one_for_one children=5' "$WORK/tree.txt" ||
  fail "no root supervisor line: $(cat "$WORK/tree.txt")"
grep -q '^    └── cluster \[cluster\] .*  member=true incarnation=1 peers=0' "$WORK/tree.txt" ||
  fail "no cluster line under the supervisor: $(cat "$WORK/tree.txt")"
grep -q '^    ├── store \[store\] mailbox=[0-9]* handled=[0-9]* restarts=0 bytes=[0-9]*  db=ready' "$WORK/tree.txt" ||
  fail "no store line under the supervisor: $(cat "$WORK/tree.txt")"
grep -q "^[│ ]   [│ ]   └── $id \[sandbox\] .* creator=admin@kagent.dev state=RUNTIME_STATE_READY" "$WORK/tree.txt" ||
  fail "no sandbox line under sandboxes: $(cat "$WORK/tree.txt")"
# -o json keeps today's JSON
k runtime tree -o json | $PY -c '
import json, sys
t = json.load(sys.stdin)
def kinds(ns):
    for n in ns:
        yield n["kind"]
        yield from kinds(n.get("children", []))
assert "sandboxes" in set(kinds(t)), t' || fail "runtime tree -o json"
# --watch redraws until interrupted, then exits 0
"$KAGENT" --api-url "$API" runtime tree --watch --interval 200ms > "$WORK/watch.txt" 2>"$WORK/watch.err" &
w=$! # kagent itself (not a subshell): it gets the SIGINT
sleep 1.5
kill -INT $w
rc=0; wait $w || rc=$?
[ $rc = 0 ] || fail "tree --watch exited $rc: $(cat "$WORK/watch.err")"
n=$(grep -c '^node-1$' "$WORK/watch.txt")
[ "$n" -ge 3 ] || fail "tree --watch drew $n times"
k runtime tree --watch --interval 1ms >/dev/null 2>"$WORK/bad.err" && fail "interval 1ms accepted"
grep -q 'interval must be at least 100ms' "$WORK/bad.err" || fail "interval error: $(cat "$WORK/bad.err")"

# get sandboxtemplate and its aliases: the seed's jsonpath
seed='{range .status.conditions[?(@.type=="Ready")]}{.status} {.reason} {.message}{end}'
for alias in sandboxtemplate sandboxtemplates st; do
  out=$(k get "$alias" scratch -n kagent -o jsonpath="$seed")
  [ "$out" = "True Prepared Sandbox runtime is prepared" ] || fail "$alias jsonpath: '$out'"
done
out=$(k get st scratch -o "jsonpath='{.metadata.name}/{.spec.substrate.workerPoolRef.name}'")
[ "$out" = scratch/kagent-default ] || fail "quoted jsonpath: '$out'"
# -o json and -o yaml print the same Kubernetes object
k get st scratch -o json > "$WORK/st.json"
k get st scratch -o yaml > "$WORK/st.yaml"
$PY - "$WORK/st.json" "$WORK/st.yaml" <<'PY' || fail "json vs yaml: $(cat "$WORK/st.yaml")"
import json, sys, yaml
j = json.load(open(sys.argv[1]))
y = yaml.safe_load(open(sys.argv[2]))
assert j == y, (j, y)
assert j["kind"] == "SandboxTemplate" and j["metadata"]["name"] == "scratch", j
assert j["apiVersion"] == "api.kagent.dev/v1alpha3"
PY
# the list: READY, and a kubectl List for -o json
k get sandboxtemplates > "$WORK/list.txt"
head -1 "$WORK/list.txt" | grep '^NAMESPACE  *NAME  *READY  *REASON' >/dev/null || fail "list header: $(cat "$WORK/list.txt")"
grep -q '^kagent  *scratch  *True  *Prepared' "$WORK/list.txt" || fail "list row: $(cat "$WORK/list.txt")"
[ "$(k get st -o jsonpath='{.kind} {.items[*].metadata.name}')" = "List scratch" ] || fail "list jsonpath"
# errors: a bad template, an unknown template
k get st scratch -o 'jsonpath={.status' >/dev/null 2>"$WORK/e1" && fail "bad jsonpath accepted"
grep -q 'jsonpath: unclosed {' "$WORK/e1" || fail "jsonpath error: $(cat "$WORK/e1")"
k get st nope >/dev/null 2>"$WORK/e2" && fail "unknown template found"
grep -q 'NotFound' "$WORK/e2" || fail "not found: $(cat "$WORK/e2")"

# phase timings through jsonpath and yaml
t=$(k sandbox get "$id" -o jsonpath='{.phaseTimings.computeStart}')
$PY -c "import sys; assert 0 < float('$t') < 60" || fail "computeStart '$t'"
k sandbox get "$id" -o yaml | grep '^  guestReady: [0-9.e-]*$' >/dev/null || fail "yaml phaseTimings"

# bash completion knows the aliases and flags
bash -c "source <('$KAGENT' completion bash)
  COMP_WORDS=(kagent get s); COMP_CWORD=2; _kagent; echo \"\${COMPREPLY[*]}\"
  COMP_WORDS=(kagent runtime tree --w); COMP_CWORD=3; _kagent; echo \"\${COMPREPLY[*]}\"" > "$WORK/comp.txt"
[ "$(cat "$WORK/comp.txt")" = "$(printf 'sandboxtemplate sandboxtemplates st\n--watch')" ] ||
  fail "completion: $(cat "$WORK/comp.txt")"
k sandbox delete "$id" >/dev/null
node_stop
echo "PASS cli_operators"
