#!/usr/bin/env bash
# Runtime benchmarks beside the Erlang/OTP peer (bench/runtime/krt_peer.erl, erl +S 2).
# Usage: bench/runtime/run.sh BUILD_DIR   (BUILD_DIR holds bench/runtime/bench_runtime)
# Prints a table and one BENCH line per figure; ratio = how many times better we are
# (peer/ours for ns and bytes, ours/peer for messages per second).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
bin="$build/bench/runtime/bench_runtime"
if [ ! -x "$bin" ]; then
  echo "bench/runtime: $bin not built" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" > "$tmp/ours"
status=0
if command -v erlc > /dev/null && command -v erl > /dev/null; then
  erlc -o "$tmp" "$here/krt_peer.erl"
  if ! erl +S 2 +P 4000000 -noshell -pa "$tmp" -s krt_peer main > "$tmp/peer"; then
    echo "bench/runtime: the Erlang peer failed" >&2
    : > "$tmp/peer"
    status=1
  fi
else
  echo "bench/runtime: erl/erlc not installed (Debian erlang-base): no peer figures" >&2
  : > "$tmp/peer"
  status=1
fi

awk -v peerfile="$tmp/peer" '
  BEGIN {
    unit["spawn_skynet_1m"] = "ns/actor";      low["spawn_skynet_1m"] = 1
    unit["pingpong_1m"] = "msgs/s";            low["pingpong_1m"] = 0
    unit["request_reply_1m"] = "reqs/s";       low["request_reply_1m"] = 0
    unit["counting_1m"] = "msgs/s";            low["counting_1m"] = 0
    unit["counting_1m_first"] = "msgs/s";      low["counting_1m_first"] = 0
    unit["ring_100x100k"] = "msgs/s";          low["ring_100x100k"] = 0
    unit["timers_1m_arm_cancel"] = "ns/op";    low["timers_1m_arm_cancel"] = 1
    unit["idle_actor_bytes"] = "bytes";        low["idle_actor_bytes"] = 1
    while ((getline line < peerfile) > 0) { split(line, f, " "); peer[f[1]] = f[2] }
    printf "| %-22s | %14s | %14s | %8s | %-8s |\n", "benchmark", "krt", "erlang +S 2", "ratio", "unit"
    printf "|%s|%s|%s|%s|%s|\n", "------------------------", "----------------", "----------------", "----------", "----------"
  }
  NF == 2 {
    n = $1; v = $2
    if (n in peer && peer[n] > 0 && v > 0) {
      r = low[n] ? peer[n] / v : v / peer[n]
      rows[++k] = sprintf("BENCH name=%s value=%s unit=%s peer=erlang peer_value=%s ratio=%.2f", n, v, unit[n], peer[n], r)
      printf "| %-22s | %14s | %14s | %7.2fx | %-8s |\n", n, v, peer[n], r, unit[n]
    } else {
      rows[++k] = sprintf("BENCH name=%s value=%s unit=%s", n, v, unit[n])
      printf "| %-22s | %14s | %14s | %8s | %-8s |\n", n, v, "-", "-", unit[n]
    }
  }
  END { for (i = 1; i <= k; i++) print rows[i] }
' "$tmp/ours"
exit $status
