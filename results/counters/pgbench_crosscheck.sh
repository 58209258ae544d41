#!/bin/sh
# Cross-check of counterbench with pgbench: the same statements on the same
# server, with pgbench as the client (C, -M prepared) instead of Go.
# Rounds are interleaved: every round runs every script once, in order.
# Usage: results/counters/pgbench_crosscheck.sh [rounds] [seconds] > pgbench_crosscheck.csv
set -eu
ROUNDS=${1:-5}
SECS=${2:-5}
PGHOST=${PGHOST:-127.0.0.1}
PGUSER=${PGUSER:-postgres}
export PGHOST PGUSER
DB=shardlab_pgbench_$$
DIR=$(mktemp -d)
trap 'psql -qd postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null; rm -rf "$DIR"' EXIT
psql -qd postgres -c "CREATE DATABASE $DB"
psql -qd "$DB" <<'SQL'
CREATE TABLE counter_row (key text PRIMARY KEY, count bigint NOT NULL, last_seen timestamptz NOT NULL);
CREATE TABLE counter_append (key text NOT NULL, seen_at timestamptz NOT NULL);
CREATE INDEX ON counter_append (key, seen_at);
CREATE TABLE counter_bucket (key text NOT NULL, bucket integer NOT NULL, count bigint NOT NULL, last_seen timestamptz NOT NULL, PRIMARY KEY (key, bucket));
SQL
UPSERT_BUCKET="INSERT INTO counter_bucket AS t (key, bucket, count, last_seen) VALUES ('hot', :b, 1, now()) ON CONFLICT (key, bucket) DO UPDATE SET count = t.count + EXCLUDED.count, last_seen = GREATEST(t.last_seen, EXCLUDED.last_seen);"
printf '%s\n' "INSERT INTO counter_row AS t (key, count, last_seen) VALUES ('hot', 1, now()) ON CONFLICT (key) DO UPDATE SET count = t.count + EXCLUDED.count, last_seen = GREATEST(t.last_seen, EXCLUDED.last_seen);" > "$DIR/row.sql"
printf '%s\n' "INSERT INTO counter_append (key, seen_at) VALUES ('hot', now());" > "$DIR/append.sql"
printf '%s\n%s\n' '\set b random(0, 99)' "$UPSERT_BUCKET" > "$DIR/bucket100random.sql"
printf '%s\n%s\n' '\set b random(0, 999)' "$UPSERT_BUCKET" > "$DIR/bucket1000random.sql"
# pgbench clients are numbered 0..19: client i owns bucket i, like --bucket-by worker.
printf '%s\n%s\n' '\set b :client_id % 100' "$UPSERT_BUCKET" > "$DIR/bucket100worker.sql"
echo "round,script,tps"
r=1
while [ "$r" -le "$ROUNDS" ]; do
	for s in row append bucket100random bucket1000random bucket100worker; do
		psql -qd "$DB" -c "TRUNCATE counter_row, counter_append, counter_bucket" -c CHECKPOINT
		tps=$(pgbench -n -M prepared -c 20 -j 2 -T "$SECS" -f "$DIR/$s.sql" "$DB" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
		echo "$r,$s,$tps"
	done
	r=$((r + 1))
done
