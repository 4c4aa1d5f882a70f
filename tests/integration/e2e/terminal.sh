#!/usr/bin/env bash
# Interactive terminals through the real kagent CLI on a real node (TerminalService/Session):
# `exec -it` in a tmux pane (its own socket, killed at the end) runs busybox sh on a pseudo
# terminal: the prompt shows, `echo $((6*7))` prints 42, `stty size` follows a resize of the
# pane (SIGWINCH -> Resize), Ctrl-D exits 0. `exec -i` from a pipe: wc -l counts 2 lines, 3 MB
# arrive byte for byte (sha256), an exit code (7) is the CLI's; without -i the CLI reads no
# stdin (it is closed here). A CLI killed with SIGKILL hangs its process up (gone in the
# sandbox). `wait -i` attaches to a process started with StartProcess. Then the gRPC API with
# python3-grpcio (tests/integration/api/test_terminal.py).
set -euo pipefail
. "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
fail() { node_fail "$@"; }
command -v tmux >/dev/null || fail "tmux is not installed (deploy/install-deps.sh)"
TSOCK=kagent-e2e-tty-$$
T() { tmux -L "$TSOCK" -f /dev/null "$@"; }
tty_cleanup() { local s=$?; set +e; T kill-server 2>/dev/null; (exit $s); node_cleanup; }
node_start
trap tty_cleanup EXIT
node_apply_template scratch
k() { "$KAGENT" --api-url "$API" "$@"; }
id=$(k sandbox create scratch --request-id tty-test -o json 0<&- | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')

# until CMD succeeds, at most $1 seconds
until_ok() { local t=$1; shift; local end=$((SECONDS + t)); until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done; }
screen() { T capture-pane -p -t tty; }
shows() { screen | grep -- "$1" >/dev/null; }

# --- a shell on a terminal, in tmux -----------------------------------------------------------
T new-session -d -s tty -x 100 -y 30 \
  "'$KAGENT' --api-url '$API' sandbox exec -it '$id' -- sh -i; echo \$? > '$WORK/exit1'; sleep 600"
until_ok 20 shows 'workspace \$' || fail "no prompt on the terminal: $(screen)"
T send-keys -t tty 'echo $((6*7))' Enter
until_ok 10 eval 'screen | grep -x "42" >/dev/null' || fail "echo \$((6*7)) did not print 42: $(screen)"
T send-keys -t tty 'stty size' Enter
until_ok 10 eval 'screen | grep -x "30 100" >/dev/null' || fail "stty size is not 30 100: $(screen)"
T resize-window -t tty -x 120 -y 40
until_ok 10 eval '[ "$(T display -p -t tty "#{pane_height} #{pane_width}")" = "40 120" ]' ||
  fail "tmux did not resize"
T send-keys -t tty 'clear; stty size' Enter
until_ok 10 eval 'screen | grep -x "40 120" >/dev/null' || fail "stty size did not follow the resize: $(screen)"
T send-keys -t tty C-d
until_ok 10 test -s "$WORK/exit1" || fail "Ctrl-D did not end the session: $(screen)"
[ "$(cat "$WORK/exit1")" = 0 ] || fail "exec -it exited $(cat "$WORK/exit1") after Ctrl-D, want 0"
echo "ok: prompt, 42, stty size 30 100 -> 40 120, Ctrl-D exit 0"

# --- stdin from a pipe ------------------------------------------------------------------------
n=$(printf 'a\nb\n' | k sandbox exec -i "$id" -- wc -l)
[ "$(echo $n)" = 2 ] || fail "printf 'a\\nb\\n' | exec -i -- wc -l printed '$n', want 2"
head -c 3000000 /dev/urandom > "$WORK/big"
want=$(sha256sum < "$WORK/big" | cut -d' ' -f1)
got=$(k sandbox exec -i "$id" -- sha256sum < "$WORK/big" | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "3 MB through stdin: sha256 $got, want $want"
echo "ok: wc -l = 2, 3 MB sha256 equal"

set +e
k sandbox exec -i "$id" -- sh -c 'exit 7' < /dev/null; rc=$?
k sandbox exec -t "$id" -- sh -c 'exit 7' 0<&-; rc_t=$?
out=$(k sandbox exec -t "$id" -- sh -c 'test -t 0 && test -t 1 && echo on-a-tty' 0<&-); rc_tty=$?
set -e
[ $rc = 7 ] || fail "exec -i of exit 7 returned $rc"
[ $rc_t = 7 ] || fail "exec -t of exit 7 (stdin closed) returned $rc_t"
[ $rc_tty = 0 ] && [ "$(echo $out | tr -d '\r')" = on-a-tty ] || fail "exec -t: not on a terminal ($rc_tty '$out')"
echo "ok: exit code 7 passed through (-i and -t), -t without -i runs on a tty with stdin closed"

# --- attach: wait -i to a process started with StartProcess -----------------------------------
pid=$(k sandbox exec "$id" --wait=false -o json -- sh -c 'read line; echo "got $line"; exit 3' 0<&- |
  python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["process_id"])') ||
  fail "exec --wait=false gave no process id"
# (StartProcess without stdin: the process reads EOF; attach then only follows it)
set +e
out=$(echo hello | k sandbox wait -i "$id" "$pid"); rc=$?
set -e
[ $rc = 3 ] || fail "wait -i returned $rc, want 3 ($out)"
echo "ok: wait -i follows a process to its exit code"

# --- a CLI killed with SIGKILL hangs its process up --------------------------------------------
T new-session -d -s hup -x 80 -y 24 \
  "'$KAGENT' --api-url '$API' sandbox exec -it '$id' -- sh -c 'echo \$\$ > hup.pid; exec sleep 1000'; sleep 600"
until_ok 20 eval 'k sandbox exec "$id" -- cat hup.pid >/dev/null 2>&1 0<&-' || fail "the hang-up test process did not start"
rpid=$(k sandbox exec "$id" -- cat hup.pid 0<&-)
k sandbox exec "$id" -- kill -0 "$rpid" 0<&- || fail "process $rpid not running before the kill"
pane=$(T display -p -t hup '#{pane_pid}')
cli=$(pgrep -P "$pane" -x kagent) || fail "no kagent CLI under the tmux pane"
kill -KILL "$cli"
gone() { ! k sandbox exec "$id" -- kill -0 "$rpid" 0<&- 2>/dev/null; }
until_ok 15 gone || fail "process $rpid still runs 15 s after its CLI was killed"
echo "ok: SIGKILL of the CLI hung the process up"

# --- the gRPC API with a real client: bad messages, stdout/stderr, vanishing clients ------------
. "$KAGENT_SOURCE_DIR/tests/integration/api/stubs.sh"
stubs=$(api_stubs)
/usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/api/test_terminal.py" "127.0.0.1:$PORT" "$stubs" "$id" ||
  fail "test_terminal.py"
kill -0 "$NODE_PID" || fail "the node died"

T kill-server
k sandbox delete "$id" 0<&- >/dev/null
node_stop
echo "PASS e2e_terminal"
