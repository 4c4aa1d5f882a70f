#!/usr/bin/env bash
# Transfers as a user sees them: `kagent sandbox upload` and `kagent sandbox download` of one
# TRANSFER_MIB (64: the product's per-file cap) file on a node configured as `make run` does
# (bench/lib/makerun_node.sh), beside `cat FILE | cat > OUT` and `cp` of the same file in the
# same run; MB/s p50 over TRANSFER_RUNS (7) runs, and the guest's peak and current RSS after.
# Usage: bench/transfer/run.sh BUILD_DIR   (needs root)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/bench/lib/makerun_node.sh"
makerun_start "${1:?usage: run.sh BUILD_DIR}"
id=$(makerun_kagent sandbox create scratch --request-id "bench-transfer-$$" -o json |
     python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
work=$MR_STATE/transfer
mkdir -p "$work"
python3 "$here/bench/transfer/xferbench.py" "$KAGENT" "$MR_API" "$id" "$work" \
  "${TRANSFER_MIB:-64}" "${TRANSFER_RUNS:-7}" "$MR_PID"
makerun_kagent sandbox delete "$id" >/dev/null
makerun_stop
