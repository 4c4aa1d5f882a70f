#!/usr/bin/env bash
# bench/store/run.sh BUILD_DIR
# Persisted sandbox-record creates per second through the store actor, with fsync and
# synchronous_commit on, beside pgbench running the same INSERT statement with the same number
# of clients against the same server in this run.
# Env: STORE_BENCH_CLIENTS (64), STORE_BENCH_SECONDS (5).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
BIN=$BUILD/bench/store/store_bench
CLIENTS=${STORE_BENCH_CLIENTS:-64}
SECS=${STORE_BENCH_SECONDS:-5}
[ -x "$BIN" ] || { echo "store bench: $BIN not built" >&2; exit 1; }
command -v pgbench >/dev/null || { echo "store bench: pgbench not found (postgresql-contrib)" >&2; exit 1; }

export PG_BASE
PG_BASE=$(mktemp -d /tmp/kagent-bench-pg.XXXXXX)
script=$(mktemp /tmp/kagent-bench-pgbench.XXXXXX)
trap '"$here/deploy/pg-private" stop; rm -f "$script"' EXIT
eval "$(PG_SYNC=1 "$here/deploy/pg-private" start)"
[ "$(psql -Atqc 'SHOW synchronous_commit')" = on ] || { echo "store bench: synchronous_commit is not on" >&2; exit 1; }
[ "$(psql -Atqc 'SHOW fsync')" = on ] || { echo "store bench: fsync is not on" >&2; exit 1; }

# The store actor (it applies the schema migrations first).
store_out=$("$BIN" "$CLIENTS" "$SECS")
store_rate=$(sed -n 's/.* rate=\([0-9.]*\).*/\1/p' <<<"$store_out")
per_commit=$(sed -n 's/.* per_commit=\([0-9.]*\).*/\1/p' <<<"$store_out")

# pgbench: the same statement as the store's create ("sb_create" in actors/store/store_sql.c:
# insert, or return the receipt's row), one transaction per create, same client count.
cols="id::text, creator, request_id, name, template_namespace, template_name, revision, state, operation, failure_reason, failure_message, node, (extract(epoch FROM created_at) * 1000)::int8, (extract(epoch FROM updated_at) * 1000)::int8, (extract(epoch FROM expires_at) * 1000)::int8, coalesce((extract(epoch FROM deleted_at) * 1000)::int8, 0)"
cat >"$script" <<EOF
\set r random(1, 2000000000)
WITH ins AS (INSERT INTO ka_sandboxes (creator, request_id, name, template_namespace, template_name, revision, node, expires_at) VALUES ('pgbench', 'pb-' || :client_id || '-' || :r, 'bench', 'default', 'python', CASE WHEN '' = '' THEN coalesce((SELECT latest_revision FROM ka_templates WHERE namespace = 'default' AND name = 'python'), '') ELSE '' END, '', now() + 3600000::int8 * interval '1 millisecond') ON CONFLICT ON CONSTRAINT ka_sandboxes_receipt DO NOTHING RETURNING *) SELECT $cols, true FROM ins UNION ALL SELECT $cols, false FROM ka_sandboxes WHERE creator = 'pgbench' AND request_id = 'pb-' || :client_id || '-' || :r AND NOT EXISTS (SELECT FROM ins);
EOF
pgb_out=$(pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$script" 2>&1)
[ -n "${STORE_BENCH_VERBOSE:-}" ] && echo "$pgb_out"
pgb_rate=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time).*/\1/p' <<<"$pgb_out")
[ -n "$store_rate" ] && [ -n "$pgb_rate" ] || { echo "$store_out"; echo "$pgb_out"; echo "store bench: no result" >&2; exit 1; }
ratio=$(awk -v a="$store_rate" -v b="$pgb_rate" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
pgb_int=$(awk -v b="$pgb_rate" 'BEGIN { printf "%.0f", b }')

printf '%-34s %12s %10s\n' "store creates (synchronous_commit=on)" "creates/s" "clients"
printf '%-34s %12s %10s\n' "store actor (pipelined, group commit)" "$store_rate" "$CLIENTS"
printf '%-34s %12s %10s\n' "pgbench, same statements" "$pgb_int" "$CLIENTS"
printf '%-34s %12s\n' "creates per commit (store)" "$per_commit"
echo "BENCH name=store_creates_per_s value=$store_rate unit=creates/s peer=pgbench peer_value=$pgb_int ratio=$ratio"
