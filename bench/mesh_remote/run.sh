#!/usr/bin/env bash
# Remote mesh benchmarks over tcp loopback beside two peers in the same run: plain ZeroMQ
# (inside bench_mesh_remote, each without and with CURVE) and then Erlang distribution
# (erl_dist_peer.erl: two BEAM nodes on this host, erl +S 2 each; distribution without TLS is
# plain TCP, so its figures stand beside our plain, non-CURVE ones).
# Usage: bench/mesh_remote/run.sh BUILD_DIR
# Prints the load average before and after (the figures depend on it on a shared machine).
# ratio = times better than the peer (peer/ours for latency, ours/peer for throughput).
# Starts epmd only if none is running (and then stops it); the two nodes are stopped on any exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR}
exe="$build/bench/mesh_remote/bench_mesh_remote"
if [ ! -x "$exe" ]; then
  echo "bench/mesh_remote: $exe not built" >&2
  exit 1
fi
for tool in erl erlc epmd; do
  if ! command -v "$tool" > /dev/null; then
    echo "bench/mesh_remote: $tool not installed (Debian erlang-base): no Erlang distribution peer" >&2
    exit 1
  fi
done

tmp=$(mktemp -d)
node_a_pid=
node_b_pid=
own_epmd=0
cleanup() {
  for pid in $node_a_pid $node_b_pid; do
    if kill -0 "$pid" 2> /dev/null; then
      kill "$pid"
      wait "$pid" || echo "bench/mesh_remote: Erlang node (pid $pid) stopped ($?)" >&2
    fi
  done
  if [ "$own_epmd" = 1 ]; then
    epmd -kill > /dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$exe" | tee "$tmp/ours"

# The Erlang distribution peer, after ours (not beside it on the same cores).
erlc -o "$tmp" "$here/erl_dist_peer.erl"
if ! epmd -names > /dev/null 2>&1; then
  epmd -daemon -relaxed_command_check # relaxed: -kill works even if a node is still registered
  own_epmd=1
fi
node_a="krt_bench_a_$$@127.0.0.1"
node_b="krt_bench_b_$$@127.0.0.1"
erl_args=(+S 2 -setcookie "krt_bench_$$_$RANDOM" -start_epmd false
          -kernel inet_dist_use_interface '{127,0,0,1}' -pa "$tmp")
# Both nodes in the background, so that the trap can stop them; node B halts once A is gone.
erl "${erl_args[@]}" -name "$node_b" -noinput -s erl_dist_peer serve < /dev/null >&2 &
node_b_pid=$!
erl "${erl_args[@]}" -name "$node_a" -noinput -s erl_dist_peer main "$node_b" \
  < /dev/null > "$tmp/peer" &
node_a_pid=$!
if ! wait "$node_a_pid" || ! wait "$node_b_pid"; then
  echo "bench/mesh_remote: the Erlang distribution peer failed" >&2
  exit 1
fi
node_a_pid=
node_b_pid=

awk -v peerfile="$tmp/peer" '
  BEGIN { while ((getline line < peerfile) > 0) { split(line, f, " "); peer[f[1]] = f[2] } }
  $1 == "BENCH" { split($2, n, "="); split($3, v, "="); ours[n[2]] = v[2] }
  END {
    rtt = ours["mesh_request_rtt_us"]; rate = ours["mesh_remote_msgs_per_s"]
    ert = peer["erl_dist_rtt_us"]; erate = peer["erl_dist_msgs_per_s"]
    if (!(rtt > 0 && rate > 0 && ert > 0 && erate > 0)) {
      print "bench/mesh_remote: a figure is missing (ours or the Erlang peer'"'"'s)" > "/dev/stderr"
      exit 1
    }
    printf "%-28s %6s %12s %12s %8s\n", "benchmark", "curve", "krt mesh", "erlang dist", "ratio"
    printf "%-28s %6s %12.1f %12.1f %7.2fx\n", "request rtt p50 (us)", "off", rtt, ert, ert / rtt
    printf "%-28s %6s %12.0f %12.0f %7.2fx\n", "one-way msgs/s", "off", rate, erate, rate / erate
    printf "BENCH name=mesh_request_rtt_us_vs_erlang value=%.1f unit=us peer=erlang_dist peer_value=%.1f ratio=%.2f\n", rtt, ert, ert / rtt
    printf "BENCH name=mesh_remote_msgs_per_s_vs_erlang value=%.1f unit=msgs/s peer=erlang_dist peer_value=%.1f ratio=%.2f\n", rate, erate, rate / erate
  }
' "$tmp/ours"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
