#!/usr/bin/env bash
# /ui on a real node in tokens mode: the page, the login cookie, the Host check, and what each
# identity sees in /ui/api/state: a non-operator only their own sandboxes (and no other
# identity's sandbox actor in the tree), an operator every sandbox with its owner, cgroup usage
# and phase timings; templates with Ready, nodes, pools, live stats; deletes disappear.
set -euo pipefail
source "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
PY=/usr/bin/python3
fail() { node_fail "$*"; }

ALICE=alice-token-$RANDOM$RANDOM BOB=bob-token-$RANDOM$RANDOM OPS=ops-token-$RANDOM$RANDOM
node_prestart() { # the tokens file (hashes only) and the config naming it, once WORK exists
  for t in "alice $ALICE" "bob $BOB" "ops $OPS"; do
    set -- $t
    echo "$(printf %s "$2" | sha256sum | cut -d' ' -f1) $1@example.com"
  done > "$WORK/tokens"
  NODE_EXTRA_YAML="auth:
  mode: tokens
  tokensFile: $WORK/tokens
  operators: [ops@example.com]
pools: # cold creates: their phases add up within create_to_ready (a warm one booted earlier)
  - name: kagent-default
    warm: 0"
}
NODE_CLI_FLAGS="--token $OPS"
node_start
node_apply_template scratch

k() { "$KAGENT" --api-url "$API" "$@"; }
state() { curl -sS -H "Host: 127.0.0.1:$PORT" "$@" "$API/ui/api/state"; }

# the page: self-contained, nothing from outside
page=$(curl -sS -D "$WORK/page.h" "$API/ui")
grep -q '<title>kagent node</title>' <<<"$page" || fail "/ui is not the page"
grep -qi '^content-security-policy: default-src .none.' "$WORK/page.h" || fail "no CSP on /ui"
! grep -Eq '(src|href)="(https?:)?//' <<<"$page" || fail "/ui loads something from outside"

curl -sS -o /dev/null -D "$WORK/slash.h" "$API/ui/"
grep -qi '^location: /ui' "$WORK/slash.h" || fail "/ui/ does not lead to /ui"

# no identity: 401 saying how to sign in; a foreign Host: 403
code=$(curl -sS -o "$WORK/anon.json" -w '%{http_code}' "$API/ui/api/state")
[ "$code" = 401 ] || fail "anonymous state: $code"
grep -q '"mode":"tokens"' "$WORK/anon.json" || fail "401 body: $(cat "$WORK/anon.json")"
code=$(curl -sS -o /dev/null -w '%{http_code}' -H 'Host: evil.example' -H "Authorization: Bearer $OPS" "$API/ui/api/state")
[ "$code" = 403 ] || fail "foreign Host: $code"

# login: a wrong token sets nothing; the right one an HttpOnly cookie
curl -sS -o /dev/null -D "$WORK/bad.h" --data-urlencode "token=nope" "$API/ui/login"
grep -qi '^location: /ui?login=refused' "$WORK/bad.h" || fail "bad login: $(cat "$WORK/bad.h")"
! grep -qi '^set-cookie' "$WORK/bad.h" || fail "bad login set a cookie"
curl -sS -o /dev/null -D "$WORK/esc.h" -d 'token=%zz' "$API/ui/login"
grep -qi '^location: /ui?login=invalid' "$WORK/esc.h" || fail "bad escape: $(cat "$WORK/esc.h")"
curl -sS -o /dev/null -D "$WORK/sp.h" --data-urlencode "token=$ALICE x" "$API/ui/login"
grep -qi '^location: /ui?login=invalid' "$WORK/sp.h" || fail "cookie-unsafe token: $(cat "$WORK/sp.h")"
curl -sS -o /dev/null -D "$WORK/good.h" -c "$WORK/alice.jar" --data-urlencode "token=$ALICE" "$API/ui/login"
grep -qi '^set-cookie: kagent_ui=.*HttpOnly; SameSite=Strict' "$WORK/good.h" || fail "login cookie: $(cat "$WORK/good.h")"

# one sandbox each for alice and bob
a=$(k --token "$ALICE" sandbox create scratch --request-id ui-a -o json | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
b=$(k --token "$BOB" sandbox create scratch --request-id ui-b -o json | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
k --token "$ALICE" sandbox exec "$a" -- true >/dev/null

state -b "$WORK/alice.jar" > "$WORK/alice.json"
A=$a B=$b $PY - "$WORK/alice.json" <<'PY' || fail "alice's view"
import json, os, sys
s = json.load(open(sys.argv[1]))
a, b = os.environ["A"], os.environ["B"]
assert s["identity"] == "alice@example.com" and s["operator"] is False, s["identity"]
ids = [x["id"] for x in s["sandboxes"]]
assert ids == [a], ids
assert "owner" not in s["sandboxes"][0]
def walk(nodes):
    for n in nodes:
        yield n
        yield from walk(n["children"])
sb = [n for n in walk(s["tree"]) if n["kind"] == "sandbox"]
assert [n["state"]["id"] for n in sb] == [a], sb
assert b not in json.dumps(s), "bob's sandbox leaks into alice's view"
assert s["stats"]["exec_seconds"]["count"] >= 1, s["stats"]["exec_seconds"]
PY

state -H "Authorization: Bearer $OPS" > "$WORK/ops.json"
A=$a B=$b PORT=$PORT $PY - "$WORK/ops.json" <<'PY' || fail "the operator's view"
import json, os, sys
s = json.load(open(sys.argv[1]))
a, b = os.environ["A"], os.environ["B"]
assert s["operator"] is True
by = {x["id"]: x for x in s["sandboxes"]}
assert set(by) == {a, b}, by.keys()
assert by[a]["owner"] == "alice@example.com" and by[b]["owner"] == "bob@example.com"
x = by[a]
assert x["state"] == "RUNTIME_STATE_READY" and x["template"] == "scratch" and x["revision"], x
assert x["usage"]["memory_bytes"] > 0 and x["usage"]["pids"] >= 1, x["usage"]
for p in ("store_intent", "compute_start", "guest_ready", "create_to_ready"):
    assert 0 < x["phases"][p] < 60, (p, x["phases"])
assert x["phases"]["compute_start"] + x["phases"]["guest_ready"] < x["phases"]["create_to_ready"]
t = [t for t in s["templates"] if t["name"] == "scratch"][0]
assert t["ready"] == {"status": "True", "reason": "Prepared", "message": "Sandbox runtime is prepared"}, t
assert t["latest_revision"] and t["observed_generation"] == t["generation"]
assert s["nodes"][0]["name"] == "node-1" and s["nodes"][0]["alive"] and s["nodes"][0]["sandboxes"] == 2
assert s["nodes"][0]["endpoint"] == "127.0.0.1:" + os.environ["PORT"], s["nodes"][0]
assert s["pools"][0]["name"] == "kagent-default" and s["pools"][0]["in_use"] == 2
st = s["stats"]
assert st["sandboxes_live"] == 2 and st["rss_bytes"] > 1 << 20 and st["actors_live"] > 5
assert st["create_seconds"]["count"] >= 2 and st["create_seconds"]["buckets"][-1] == st["create_seconds"]["count"]
PY

# the gRPC actor tree follows the same rule
k --token "$ALICE" runtime tree -o json > "$WORK/alice-tree.json"
grep -q "$a" "$WORK/alice-tree.json" || fail "alice's tree lacks her sandbox"
! grep -q "$b" "$WORK/alice-tree.json" || fail "alice's tree shows bob's sandbox"
k --token "$OPS" runtime tree | grep "$b \[sandbox\]" >/dev/null || fail "the operator's tree lacks bob's sandbox"

# delete: gone from the view; logout clears the cookie
k --token "$ALICE" sandbox delete "$a" >/dev/null
k --token "$BOB" sandbox delete "$b" >/dev/null
state -H "Authorization: Bearer $OPS" | $PY -c 'import json,sys; s=json.load(sys.stdin); assert s["sandboxes"] == [], s["sandboxes"]' ||
  fail "deleted sandboxes still listed"
curl -sS -o /dev/null -D "$WORK/out.h" -b "$WORK/alice.jar" -X POST "$API/ui/logout"
grep -qi '^set-cookie: kagent_ui=;.*Max-Age=0' "$WORK/out.h" || fail "logout: $(cat "$WORK/out.h")"
node_stop
echo "PASS ui_state"
