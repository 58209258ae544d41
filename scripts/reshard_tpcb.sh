#!/usr/bin/env bash
# reshard_tpcb.sh: the resharding measurement (issue 23, docs/reshard.md "The
# measurement"). pgbench's TPC-B runs through shard-proxy the whole time while the
# deployment grows from 2 data sources to 4 (or, with --shrink, moves from 4 to 3 new
# ones): start (the copy), verify, the proxy's RESHARD CUTOVER, RESHARD FINISH (or
# REVERT). A reader counts the accounts through the proxy throughout.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: scripts/reshard_tpcb.sh [options]

Starts a throwaway PostgreSQL cluster (wal_level = logical) on this machine, four
databases in it (rs_0 ... rs_3), and shard-proxy over the first two (pgbench_accounts
and pgbench_history sharded by aid, pgbench_branches and pgbench_tellers copied to
every data source); the move grows the deployment to all four. With --shrink, seven
databases, the proxy over the first four, and the move takes the sharded tables to
three new ones (rs_4 ... rs_6), rs_0 staying the default data source. Loads pgbench's tables through the proxy (pgbench -i), measures
the capacity (pgbench -M extended, --clients, --capacity-time seconds), then runs
pgbench's TPC-B at --rate-fraction of it (pgbench -R) the whole time while the move
runs: --before seconds of load, reshard start (--replica-identity-full: pgbench_history
has no primary key), until every stream is ready, reshard verify, the cutover through
the proxy's admin console, --after seconds, the finish (with --revert, the revert
back to the old data sources instead), --after seconds. A reader
counts pgbench_accounts through the proxy, waiting --read-every seconds after each count;
the replication
slots' lag is read every second. A bystander load updates a table of the default data
source (one the move leaves where it is) through the proxy, at --bystander-rate
transactions a second: the cutover's hold does not pause it.

The run directory (results/runs/reshard-tpcb-<time>/) gets the raw data (pgbench's
per-transaction logs, the reader's counts, the lag, each step's output, the proxy's
log) and what reshard timeline makes of it: summary.txt, timeline.csv, timeline.svg.

Options:
  --scale N           pgbench -i --scale (default 50: 5 million accounts)
  --clients N         pgbench -c (default 8)
  --rate-fraction F   pgbench -R as a fraction of the capacity measured (default 0.7)
  --capacity-time S   seconds of the capacity run (default 20)
  --before S          seconds of load before the move starts (default 15)
  --after S           seconds of load after the cutover, and after the finish (default 20)
  --revert            revert the move (RESHARD REVERT) instead of finishing it: the
                      deployment returns to its old data sources with every write
                      made since the cutover
  --shrink            move from 4 data sources to 3 new ones (twelve streams: each old
                      data source sends rows to each new one) instead of 2 to 4
  --copy-rate N       bound the copy to N rows a second (reshard start --copy-rate;
                      default 0: PostgreSQL's own table synchronization, unbounded)
  --copy-max-active N hold the copy while more than N other sessions run a statement
                      on its servers (reshard start --max-active; default 0: no hold)
  --verify-rate N     bound verify to N rows compared a second (reshard verify --rate;
                      default 0: no bound)
  --verify-max-active N
                      hold verify between chunks while more than N other sessions run
                      a statement on its servers (reshard verify --max-active;
                      default 0: no hold)
  --verify-pin D      pin verify's comparison of each table to one point of its
                      source's WAL, holding its writes at most D (reshard verify
                      --pin; default 2s; 0: not pinned, chunks that differ are
                      compared again for 10 s)
  --verify-pin-every D
                      with --verify-pin, pin a table again between chunks once its
                      snapshots have been open D (reshard verify --pin-every; default
                      0: one pin per table). The summary gives the oldest transaction
                      open on the servers during verify either way (snapshots.txt)
  --read-every S      seconds between the reader's counts (default 1; each count reads
                      every account, which at scale 50 costs a good part of a core)
  --bystander-rate N  the bystander load's transactions a second (pgbench -R, 2
                      clients; default 50; 0: none)
  --port N            the throwaway cluster's port (default 5491); the proxy takes N+1
  --runs-dir DIR      where run directories go (default results/runs)
  -h, --help          this text

Needs root (the cluster runs as the postgres user through runuser), psql, pgbench,
initdb and pg_ctl ($SHARDLAB_PG_BINDIR, default /usr/lib/postgresql/15/bin), and go.
Run one heavy benchmark at a time on a shared machine.
EOF
}

root=$(cd "$(dirname "$0")/.." && pwd -P)
. "$root/scripts/lib.sh"
scale=50 clients=8 fraction=0.7 capacity_time=20 before=15 after=20 read_every=1 port=5491 runs="$root/results/runs" end=finish shrink=0 copy_rate=0 copy_max_active=0 verify_max_active=0 verify_rate=0 verify_pin=2s verify_pin_every=0 bystander_rate=50
args=("$@")
while (($#)); do
	case $1 in
	--scale) scale=$2; shift 2 ;;
	--clients) clients=$2; shift 2 ;;
	--rate-fraction) fraction=$2; shift 2 ;;
	--capacity-time) capacity_time=$2; shift 2 ;;
	--before) before=$2; shift 2 ;;
	--after) after=$2; shift 2 ;;
	--revert) end=revert; shift ;;
	--shrink) shrink=1; shift ;;
	--copy-rate) copy_rate=$2; shift 2 ;;
	--copy-max-active) copy_max_active=$2; shift 2 ;;
	--verify-max-active) verify_max_active=$2; shift 2 ;;
	--verify-rate) verify_rate=$2; shift 2 ;;
	--verify-pin) verify_pin=$2; shift 2 ;;
	--verify-pin-every) verify_pin_every=$2; shift 2 ;;
	--read-every) read_every=$2; shift 2 ;;
	--bystander-rate) bystander_rate=$2; shift 2 ;;
	--port) port=$2; shift 2 ;;
	--runs-dir) runs=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "reshard_tpcb.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
	esac
done
for v in scale clients capacity_time before after read_every port; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "reshard_tpcb.sh: --${v//_/-} takes a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ $copy_max_active =~ ^(0|[1-9][0-9]*)$ ]] || { echo "reshard_tpcb.sh: --copy-max-active takes a number of sessions (0: no hold), got '$copy_max_active'" >&2; exit 2; }
[[ $verify_max_active =~ ^(0|[1-9][0-9]*)$ ]] || { echo "reshard_tpcb.sh: --verify-max-active takes a number of sessions (0: no hold), got '$verify_max_active'" >&2; exit 2; }
[[ $copy_rate =~ ^(0|[1-9][0-9]*)$ ]] || { echo "reshard_tpcb.sh: --copy-rate takes a number of rows a second (0: no bound), got '$copy_rate'" >&2; exit 2; }
[[ $bystander_rate =~ ^(0|[1-9][0-9]*)$ ]] || { echo "reshard_tpcb.sh: --bystander-rate takes a number of transactions a second (0: none), got '$bystander_rate'" >&2; exit 2; }
[[ $verify_pin =~ ^0$|^[1-9][0-9]*(ms|s)$ ]] || { echo "reshard_tpcb.sh: --verify-pin takes a duration such as 2s or 500ms (0: not pinned), got '$verify_pin'" >&2; exit 2; }
[[ $verify_pin_every =~ ^0$|^[1-9][0-9]*(ms|s)$ ]] || { echo "reshard_tpcb.sh: --verify-pin-every takes a duration such as 5s or 500ms (0: one pin per table), got '$verify_pin_every'" >&2; exit 2; }
[[ $verify_pin_every == 0 || $verify_pin != 0 ]] || { echo "reshard_tpcb.sh: --verify-pin-every needs --verify-pin" >&2; exit 2; }
[[ $verify_rate =~ ^(0|[1-9][0-9]*)$ ]] || { echo "reshard_tpcb.sh: --verify-rate takes a number of rows a second (0: no bound), got '$verify_rate'" >&2; exit 2; }
[[ $fraction =~ ^0?\.[0-9]+$|^1(\.0*)?$ ]] || { echo "reshard_tpcb.sh: --rate-fraction takes a number in (0, 1], got '$fraction'" >&2; exit 2; }
((port < 65000)) || { echo "reshard_tpcb.sh: --port must be below 65000" >&2; exit 2; }
pg_bin=${SHARDLAB_PG_BINDIR:-/usr/lib/postgresql/15/bin}
for p in "$pg_bin/initdb" "$pg_bin/pg_ctl"; do [[ -x $p ]] || { echo "reshard_tpcb.sh: $p is missing: install postgresql-15 or set SHARDLAB_PG_BINDIR" >&2; exit 2; }; done
for p in psql pgbench go runuser; do command -v "$p" >/dev/null || { echo "reshard_tpcb.sh: $p is missing" >&2; exit 2; }; done
((EUID == 0)) || { echo "reshard_tpcb.sh: run it as root (the cluster runs as postgres through runuser)" >&2; exit 2; }
pport=$((port + 1))
for p in $port $pport; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		echo "reshard_tpcb.sh: port $p is in use (--port)" >&2
		exit 2
	fi
done

run_info_sample
claim_run_dir "$runs" "$(new_run_id reshard-tpcb-)"
echo "run directory: $run_dir" >&2
echo "scripts/reshard_tpcb.sh$(quote_args "${args[@]}")" >"$run_dir/command.txt"
run_info_start "$run_dir/run.txt" "scripts/reshard_tpcb.sh$(quote_args "${args[@]}")" "$root"
note() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
event() { printf '%s %s\n' "$(date +%s%3N)" "$1" >>"$run_dir/events.txt"; note "$1"; }

pids=()
cleanup() {
	local rc=$?
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "${bin_dir:-/nonexistent}"
	if [[ -d $run_dir/pg/data ]]; then
		runuser -u postgres -- "$pg_bin/pg_ctl" -D "$run_dir/pg/data" -m immediate stop >/dev/null 2>&1 || true
		rm -rf "$run_dir/pg/data"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

note "building shard-proxy and reshard"
bin_dir=$(mktemp -d)
(cd "$root" && go build -o "$bin_dir/" ./cmd/shard-proxy ./cmd/reshard)

note "a throwaway cluster on port $port"
mkdir -p "$run_dir/pg"
chown postgres: "$run_dir/pg"
(cd "$run_dir/pg" && runuser -u postgres -- "$pg_bin/initdb" -D "$run_dir/pg/data" -U postgres -A trust -E UTF8 --locale=C --no-instructions \
	>"$run_dir/pg/initdb.log" 2>&1) || { cat "$run_dir/pg/initdb.log" >&2; exit 1; }
cat >>"$run_dir/pg/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = ''
max_connections = 200
shared_buffers = 256MB
wal_level = logical
max_wal_senders = 40
max_replication_slots = 40
max_logical_replication_workers = 40
max_worker_processes = 48
EOF
(cd "$run_dir/pg" && runuser -u postgres -- "$pg_bin/pg_ctl" -D "$run_dir/pg/data" -l "$run_dir/pg/postgres.log" -w -t 60 start >/dev/null) ||
	{ cat "$run_dir/pg/postgres.log" >&2; exit 1; }
pg() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }
# The move: the old layout's databases, and the target's, rs_<i> as data source ds_<i>.
# A target's sharded tables on part of its data sources only name them (data_sources).
if ((shrink)); then
	old=(0 1 2 3) new=(0 4 5 6) sharded_on=(4 5 6)
else
	old=(0 1) new=(0 1 2 3) sharded_on=()
fi
for i in $(printf '%s\n' "${old[@]}" "${new[@]}" | sort -u); do pg -d postgres -c "CREATE DATABASE rs_$i"; done

layout() { # the indexes of the layout's databases
	echo 'broadcast = ["pgbench_branches", "pgbench_tellers"]'
	for i in "$@"; do
		printf '\n[[data_source]]\nname = "ds_%d"\ndsn = "postgres://postgres@127.0.0.1:%d/rs_%d?sslmode=disable"\n' "$i" "$port" "$i"
	done
	for t in pgbench_accounts pgbench_history; do
		printf '\n[[sharded_table]]\nname = "%s"\ncolumn = "aid"\n' "$t"
		if [[ $* == "${new[*]}" && ${#sharded_on[@]} -gt 0 ]]; then
			names=$(printf '"ds_%d", ' "${sharded_on[@]}")
			printf 'data_sources = [%s]\n' "${names%, }"
		fi
	done
}
from_file=$run_dir/layout${#old[@]}.toml to_file=$run_dir/layout$((${#sharded_on[@]} ? ${#sharded_on[@]} : ${#new[@]})).toml
layout "${old[@]}" >"$from_file"
layout "${new[@]}" >"$to_file"
# The databases the target shards the accounts over, and those the move adds.
((${#sharded_on[@]})) || sharded_on=("${new[@]}")
added=()
for i in "${new[@]}"; do [[ " ${old[*]} " == *" $i "* ]] || added+=("$i"); done

note "shard-proxy on port $pport over rs_${old[0]} ... rs_${old[-1]}"
"$bin_dir/shard-proxy" --config "$from_file" --listen "127.0.0.1:$pport" --database app --admin-database shardlab_admin \
	>"$run_dir/proxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	psql -X -h 127.0.0.1 -p "$pport" -U postgres -d app -Atc 'SELECT 1' >/dev/null 2>&1 && break
	sleep 0.1
done
app() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pport" -U postgres -d app "$@"; }
pgb() { pgbench -h 127.0.0.1 -p "$pport" -U postgres "$@" app; }
reshard() { "$bin_dir/reshard" "$1" --from "$from_file" --to "$to_file" "${@:2}"; }
admin_dsn="postgres://postgres@127.0.0.1:$pport/shardlab_admin?sslmode=disable"

note "pgbench -i --scale $scale through the proxy"
pgb -i -q --scale "$scale" >"$run_dir/pgbench-init.txt" 2>&1 || { cat "$run_dir/pgbench-init.txt" >&2; exit 1; }
accounts=$((scale * 100000))

note "capacity: pgbench -M extended -c $clients for $capacity_time s"
pgb -n -M extended -c "$clients" -j 2 -T "$capacity_time" >"$run_dir/capacity.txt" 2>&1 || { cat "$run_dir/capacity.txt" >&2; exit 1; }
tps=$(awk '/^tps = / { print int($3); exit }' "$run_dir/capacity.txt")
rate=$(awk -v t="$tps" -v f="$fraction" 'BEGIN { r = int(t * f); print (r < 1 ? 1 : r) }')
note "capacity $tps tps; the load runs at $rate tps (pgbench -R)"
echo "$tps $rate" >"$run_dir/rate.txt"
# The capacity run's transactions are part of the TPC-B invariant, as the load's.

(while :; do
	n=$(app -Atc 'SELECT count(*) FROM pgbench_accounts' 2>&1 | tr '\n' ' ')
	printf '%s %s\n' "$(date +%s%3N)" "$n"
	sleep "$read_every"
done >"$run_dir/reader.txt") &
pids+=($!)
(while :; do
	# Slots are the cluster's: one database's view lists them all.
	pg -d rs_0 -AtF ' ' -c "SELECT (extract(epoch FROM now()) * 1000)::bigint, slot_name, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name LIKE 'shardlab_reshard%'" 2>/dev/null
	sleep 1
done >"$run_dir/lag.txt") &
pids+=($!)

event load
# Started directly, not through pgb (a function would run in a subshell), so that $!
# is pgbench itself.
pgbench -h 127.0.0.1 -p "$pport" -U postgres -n -M extended -c "$clients" -j 2 -R "$rate" -T 86400 -l --log-prefix="$run_dir/pgbench_log" app \
	>"$run_dir/pgbench.txt" 2>"$run_dir/pgbench.stderr" &
pgbench_pid=$!
pids+=("$pgbench_pid")
bystander_pid=
if ((bystander_rate > 0)); then
	# A table no rule names: it stays on the default data source, rs_0, which the
	# move keeps.
	app -c 'CREATE TABLE bystander (id int PRIMARY KEY, n bigint NOT NULL)' -c 'INSERT INTO bystander SELECT g, 0 FROM generate_series(1, 100) g'
	printf '%s\n' '\set id random(1, 100)' 'UPDATE bystander SET n = n + 1 WHERE id = :id;' >"$run_dir/bystander.sql"
	pgbench -h 127.0.0.1 -p "$pport" -U postgres -n -M extended -c 2 -j 1 -R "$bystander_rate" -T 86400 -f "$run_dir/bystander.sql" \
		-l --log-prefix="$run_dir/bystander_log" app >"$run_dir/bystander.txt" 2>"$run_dir/bystander.stderr" &
	bystander_pid=$!
	pids+=("$bystander_pid")
fi
sleep "$before"

event copy_start
reshard start --replica-identity-full --copy-rate "$copy_rate" --max-active "$copy_max_active" >"$run_dir/start.txt" 2>&1 || { cat "$run_dir/start.txt" >&2; exit 1; }
until reshard status >"$run_dir/status.txt" 2>&1 && grep -q 'ready for the cutover' "$run_dir/status.txt"; do
	kill -0 "$pgbench_pid" 2>/dev/null || { echo "pgbench stopped during the copy:" >&2; cat "$run_dir/pgbench.stderr" >&2; exit 1; }
	sleep 2
done
event copy_ready
for i in "${added[@]}"; do
	pg -d "rs_$i" -Atc 'SELECT count(*) FROM pgbench_accounts'
done >"$run_dir/copied-accounts.txt"

event verify_start
# The oldest transaction open on the servers, each second while verify runs: a pinned
# verify's snapshots (the load's transactions last milliseconds, the reader's count a
# second or two), which hold back VACUUM.
(while :; do
	pg -d rs_0 -AtF ' ' -c "SELECT (extract(epoch FROM now()) * 1000)::bigint, coalesce(round(max(extract(epoch FROM now() - xact_start))::numeric, 1), 0)
		FROM pg_stat_activity WHERE backend_type = 'client backend' AND xact_start IS NOT NULL AND pid <> pg_backend_pid()" 2>/dev/null
	sleep 1
done >"$run_dir/snapshots.txt") &
snapshots_pid=$!
pids+=("$snapshots_pid")
verify_rc=0
reshard verify --settle 10s --rate "$verify_rate" --pin "$verify_pin" --pin-every "$verify_pin_every" --max-active "$verify_max_active" >"$run_dir/verify.txt" 2>"$run_dir/verify.stderr" || verify_rc=$?
kill "$snapshots_pid" 2>/dev/null || true
event verify_end
echo "$verify_rc" >"$run_dir/verify-rc.txt"

sleep 5
event cutover_start
reshard cutover --proxy-admin "$admin_dsn" >"$run_dir/cutover.txt" 2>&1 || { cat "$run_dir/cutover.txt" >&2; exit 1; }
event cutover_end
sleep "$after"
event "${end}_start"
reshard "$end" --proxy-admin "$admin_dsn" >"$run_dir/$end.txt" 2>&1 || { cat "$run_dir/$end.txt" >&2; exit 1; }
event "${end}_end"
sleep "$after"
event stop
# pgbench has no graceful stop: its per-transaction logs are what is read, and what
# it had not flushed (the last moments, after the finish) is lost.
for p in "$pgbench_pid" $bystander_pid; do
	kill "$p" 2>/dev/null || true
	wait "$p" 2>/dev/null || true
done
# The reader and the lag poller stop too: the sums below are read with nothing running.
for p in "${pids[@]}"; do
	[[ $p == "${pids[0]}" ]] || kill "$p" 2>/dev/null || true
done
sleep 1

note "the TPC-B invariant, and where the rows are"
# One statement per table: the proxy refuses subqueries over tables sharded apart.
for q in 'sum(abalance) FROM pgbench_accounts' 'sum(bbalance) FROM pgbench_branches' 'sum(tbalance) FROM pgbench_tellers' \
	'sum(delta) FROM pgbench_history' 'count(*) FROM pgbench_accounts'; do
	app -Atc "SELECT $q"
done | paste -sd ' ' >"$run_dir/invariant.txt"
# The databases the layout in force at the end shards the accounts over (the target's
# after a finish, the old ones after a revert), and those it does not (every account
# there is misplaced).
if [[ $end == finish ]]; then on=("${sharded_on[@]}") all=("${new[@]}"); else on=("${old[@]}") all=("${old[@]}"); fi
n=${#on[@]}
for i in $(printf '%s\n' "${old[@]}" "${new[@]}" | sort -u); do
	[[ $(pg -d "rs_$i" -Atc "SELECT to_regclass('pgbench_accounts') IS NOT NULL") == t ]] || continue
	k=-1
	for j in "${!on[@]}"; do [[ ${on[j]} == "$i" ]] && k=$j; done
	# The branches (broadcast) of a data source the layout no longer names are not kept
	# current: "-".
	branches="'-'"
	[[ " ${all[*]} " == *" $i "* ]] && branches='(SELECT sum(bbalance) FROM pgbench_branches)::text'
	# PostgreSQL's own hash partitioning of modulus n says where each account belongs.
	pg -d "rs_$i" -c 'CREATE TABLE shardlab_layout_check (k int) PARTITION BY HASH (k)'
	pg -d "rs_$i" -AtF ' ' -c "SELECT $i, (SELECT count(*) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_accounts
		WHERE $k < 0 OR NOT satisfies_hash_partition('shardlab_layout_check'::regclass, $n, greatest($k, 0), aid)), $branches,
		(SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_subscription) + (SELECT count(*) FROM pg_publication)"
done >"$run_dir/placement.txt"
names=$(printf 'rs_%s, ' "${on[@]}")
echo "the $n data sources the layout in force at the end shards them over (${names%, }; rows anywhere else count as misplaced)" >"$run_dir/placement-of.txt"
if [[ $end == revert ]]; then
	# What the revert left on the data sources the move added: their tables were the
	# move's, and are dropped.
	for i in "${added[@]}"; do
		pg -d "rs_$i" -Atc "SELECT 'rs_$i: ' || count(*) || ' pgbench tables' FROM pg_tables WHERE tablename LIKE 'pgbench%'"
	done | paste -sd ',' | sed 's/,/, /g' >"$run_dir/added.txt"
fi
# A newline after each file: a thread's last line, cut short when pgbench stopped, must
# not run into the next file's first.
for log in pgbench_log:transactions bystander_log:bystander; do
	n=0
	for f in "$run_dir/${log%%:*}"*; do
		[[ -e $f ]] || continue
		cat "$f"
		echo
		n=$((n + 1))
	done >"$run_dir/${log#*:}.log"
	rm -f "$run_dir/${log%%:*}"*
	if ((n)); then gzip -f "$run_dir/${log#*:}.log"; else rm -f "$run_dir/${log#*:}.log"; fi
done

(cd "$root" && "$bin_dir/reshard" timeline --run "$run_dir" --accounts "$accounts") | tee "$run_dir/summary.txt"
run_info_finish "$run_dir/run.txt"
