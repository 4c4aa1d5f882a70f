#!/usr/bin/env bash
# tests/lib/uids.sh under contention: 12 shells pick a range at once while six stale claims (dead
# holders, old) wait to be taken back; every shell gets a range of its own. Without the pickers'
# lock two shells took the same stale range back (the second removed the first's fresh claim),
# and two tests' nodes then shared host uids.
set -euo pipefail
src=${KAGENT_SOURCE_DIR:?}
dir=$(mktemp -d /tmp/kagent-uids-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
dead=$(bash -c 'echo $$') # a pid that has exited
for k in 0 1 2 3 4 5; do
  mkdir "$dir/$k" && echo "$dead" > "$dir/$k/pid" && touch -d '2 hours ago' "$dir/$k"
done
for round in 1 2 3; do
  for i in $(seq 12); do
    # each holder stays alive until every shell has picked
    bash -c ". '$src/tests/lib/uids.sh'; TEST_UIDS_DIR='$dir'; test_uid_base; sleep 3" \
      > "$dir/out.$i" 2>&1 &
  done
  wait
  got=$(cat "$dir"/out.* | sort)
  [ "$(wc -l <<< "$got")" = 12 ] || fail "round $round: $(wc -l <<< "$got") ranges for 12 shells: $got"
  dups=$(uniq -d <<< "$got")
  [ -z "$dups" ] || fail "round $round: ranges handed out twice: $dups"
  grep -qvE '^[0-9]+$' <<< "$got" && fail "round $round: not a uid: $got"
  rm -f "$dir"/out.*
  # the holders have exited: next round, their claims are stale too
done
echo "ok: 3 rounds of 12 concurrent pickers, no range shared"
