# Test helper (source it): a host uid range of this test's own for the sandboxes of a node.
#   test_uid_base   prints the first uid of a free range of 65536 uids (2,000,000 + k*65536, k in
#                   0..999), held until this shell exits; ranges of dead holders are taken back.
# Kernel per-user pools (RLIMIT_NPROC counts, inotify instances, pipe buffers) are per host uid:
# two test nodes running at once must never share one, or one test's fork bomb or watches
# starve the other's sandboxes. The C tests use fixed ranges of their own from 100,000,000
# (test_control, test_substrate, test_guest, test_escape).
TEST_UIDS_DIR=/tmp/kagent-test-uids

# Whether a live kagentd holds a uid claim (actors/substrate/ka_uidrange.c) starting at $1.
s_uids_claimed() {
  local f
  for f in /run/kagent/uid-ranges/"$1"-*; do
    [ -e "$f" ] && ! flock -n -x "$f" true 2>/dev/null && return 0
  done
  return 1
}

# One picker at a time (test_uid_base): two tests that both found a range's holder dead would
# otherwise both take it back, the second removing the first's fresh claim.
s_uid_pick() {
  local k d holder
  for k in $(seq 0 999); do
    d=$TEST_UIDS_DIR/$k
    if ! mkdir "$d" 2>/dev/null; then
      holder=$(cat "$d/pid" 2>/dev/null || echo 0)
      [ "$holder" != 0 ] && kill -0 "$holder" 2>/dev/null && continue
      [ "$holder" = 0 ] && [ -n "$(find "$d" -maxdepth 0 -mmin -1 2>/dev/null)" ] && continue
      s_uids_claimed $((2000000 + k * 65536)) && continue # a node its test left still runs
      rm -rf "$d"
      mkdir "$d" 2>/dev/null || continue
    fi
    echo $$ > "$d/pid"
    echo $((2000000 + k * 65536))
    return 0
  done
  echo "test_uid_base: no free uid range in $TEST_UIDS_DIR" >&2
  return 1
}

test_uid_base() {
  mkdir -p "$TEST_UIDS_DIR"
  (flock -x 9 && s_uid_pick) 9> "$TEST_UIDS_DIR/.lock"
}
