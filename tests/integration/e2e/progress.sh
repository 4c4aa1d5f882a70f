#!/usr/bin/env bash
# The CLI's progress line for long snapshot transfers and forks: in a real terminal (tmux) a
# suspend, resume and fork of a sandbox with 16,000 files and 16 MiB in /data show one line on
# stderr that updates while the call runs ("suspend ID ... 0.4s") and ends "done in"; with
# stderr a pipe or a file, none of it appears.
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
command -v tmux >/dev/null || fail "tmux is missing (deploy/install-deps.sh installs it)"
node_start
node_apply_template progress
k() { "$KAGENT" --api-url "$API" "$@"; }
id=$(k sandbox create progress --request-id progress-1 -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
k sandbox exec "$id" -- sh -c 'mkdir many && cd many && seq 1 16000 | xargs -n 2000 touch &&
  dd if=/dev/urandom of=../big bs=1M count=16 2>/dev/null' >/dev/null || fail "filling /data"
[ "$(k sandbox exec "$id" -- sh -c 'ls many | wc -l')" = 16000 ] || fail "16,000 files were not made"

SOCK=kagent-progress-$$
tmx() { tmux -L "$SOCK" "$@"; }
trap 'st=$?; tmx kill-server 2>/dev/null || true; (exit $st); node_cleanup' EXIT
in_terminal() { # VERB ARGS...: runs `kagent sandbox VERB ARGS` in the tmux pane; asserts the line
  local verb=$1 done=$WORK/done.$1; shift
  rm -f "$done"
  tmx send-keys -t p "clear; $KAGENT --api-url $API sandbox $verb $* >/dev/null; echo \$? > $done" Enter
  local seen=
  for _ in $(seq 1200); do
    tmx capture-pane -p -t p > "$WORK/pane"
    grep -q "^$verb .* \.\.\. [0-9]*\.[0-9]s$" "$WORK/pane" && seen=1
    [ -f "$done" ] && break
    sleep 0.05
  done
  [ -f "$done" ] && [ "$(cat "$done")" = 0 ] || fail "$verb in the terminal did not end well: $(cat "$WORK/pane")"
  tmx capture-pane -p -t p > "$WORK/pane"
  grep -q "^$verb .* \.\.\. done in [0-9]*\.[0-9]s$" "$WORK/pane" || fail "$verb: no final progress line: $(cat "$WORK/pane")"
  [ -n "$seen" ] || fail "$verb: the line was never seen while the call ran: $(cat "$WORK/pane")"
}
tmx -f /dev/null new-session -d -s p -x 200 -y 20
in_terminal suspend "$id"
in_terminal resume "$id"
in_terminal fork "$id" --request-id progress-fork-1
# the same calls with stderr a pipe and a file: nothing of the line
k sandbox suspend "$id" 2>&1 >/dev/null | cat > "$WORK/pipe.err"
k sandbox resume "$id" 2>"$WORK/file.err" >/dev/null
k sandbox fork "$id" --request-id progress-fork-2 2>&1 >/dev/null | cat >> "$WORK/pipe.err"
[ ! -s "$WORK/pipe.err" ] && [ ! -s "$WORK/file.err" ] || fail "progress output without a terminal: $(cat "$WORK/pipe.err" "$WORK/file.err")"
[ "$(k sandbox exec "$id" -- sh -c 'ls many | wc -l; wc -c < big')" = "16000
16777216" ] || fail "/data changed across the transfers"
tmx kill-server
node_stop
echo "PASS e2e_progress"
