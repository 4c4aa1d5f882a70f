#!/usr/bin/env bash
# Runs every libFuzzer target of a KAGENT_FUZZ build for SECONDS each on its checked-in corpus
# (tests/fuzz/corpus/<name>/, read only: new inputs go to BUILD/fuzz/<name>/corpus) and its
# crash reproducers. A crash, leak, timeout or out-of-memory fails the run; the reproducer is
# left as BUILD/fuzz/<name>/crash-* (leak-*, timeout-*, oom-*). Prints exec/s and cov per target.
#   tests/fuzz/run.sh BUILD [SECONDS] [NAME...]
set -uo pipefail
build=${1:?usage: run.sh BUILD [SECONDS] [NAME...]}
secs=${2:-60}
shift 2 2>/dev/null || shift $#
src=$(cd "$(dirname "$0")" && pwd)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(template config mcp image pbjson proto guest oci h2 snapshot)

declare -A max_len=([template]=8192 [config]=8192 [mcp]=16384 [image]=65536 [pbjson]=8192 [proto]=4096
                    [guest]=65536 [oci]=65536 [h2]=16384 [snapshot]=65536)
failed=()
summary=()
for n in "${names[@]}"; do
  exe=$build/tests/fuzz/fuzz_$n
  out=$build/fuzz/$n
  [ -x "$exe" ] || { echo "run.sh: $exe is missing (build the kagent_fuzzers target)" >&2; exit 1; }
  [ -d "$src/corpus/$n" ] || { echo "run.sh: no corpus $src/corpus/$n" >&2; exit 1; }
  mkdir -p "$out/corpus"
  args=(-max_total_time="$secs" -max_len="${max_len[$n]:-8192}" -timeout=10 -rss_limit_mb=2048
        -print_final_stats=1 -artifact_prefix="$out/")
  [ -f "$src/dict/$n.dict" ] && args+=(-dict="$src/dict/$n.dict")
  dirs=("$out/corpus" "$src/corpus/$n")
  [ -d "$src/crashes/$n" ] && dirs+=("$src/crashes/$n")
  echo "=== fuzz_$n: ${secs}s"
  "$exe" "${args[@]}" "${dirs[@]}" >"$out/log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$out/log" | tail -1 | cut -d' ' -f2)
  line="fuzz_$n: exec/s=${execs:-?} cov=${cov:-?}"
  if [ $rc -ne 0 ]; then
    tail -60 "$out/log"
    line="$line FAILED (rc $rc): $(ls "$out" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | tr '\n' ' ')"
    failed+=("$n")
  fi
  echo "$line"
  summary+=("$line")
done
echo "=== fuzz summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (reproducers under $build/fuzz/<name>/)" >&2
  exit 1
fi
echo "fuzz: all targets clean"
