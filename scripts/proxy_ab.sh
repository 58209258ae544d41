#!/usr/bin/env bash
# Measures a change to shard-proxy side by side (docs/proxy.md, "Measuring a change"):
# builds the proxy at two git revisions, serves both at once over schema shards of a
# scratch database on a PostgreSQL server, and runs sysbench or pgbench through each in turn,
# alternating which goes first, for a number of rounds. Each run records throughput and
# the proxy's own CPU time per transaction (user and system, from /proc); the summary is
# the median over rounds of the per-round ratios new / old, with their range, which is
# what a shared, noisy machine allows. Writes results/runs/proxyab-<time>/: results.csv,
# summary.txt, run.txt and the clients' output under logs/.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/proxy_ab.sh [options] OLD_REF [NEW_REF]

  OLD_REF, NEW_REF   git revisions to build shard-proxy from; NEW_REF defaults to the
                     work tree as it is (uncommitted changes included)
  --workloads LIST   workloads, comma-separated (default oltp_write_only): sysbench's
                     oltp_* workloads, pgbench's select-only script (-S) as
                     pgbench_select_simple, pgbench_select_extended and
                     pgbench_select_prepared (its -M modes), and its TPC-B-like
                     script as pgbench_tpcb_simple, pgbench_tpcb_extended and
                     pgbench_tpcb_prepared
  --threads N        client threads: sysbench --threads, pgbench -c (default 32)
  --rounds N         interleaved rounds (default 3)
  --time SECONDS     length of each run (default 8)
  --tables N         sysbench --tables (default 4)
  --table-size N     sysbench --table-size (default 10000)
  --scale N          pgbench -i --scale, 100,000 accounts each (default 1)
  --shards N         schema shards (default 4); 1 measures the one-shard fast path
  --pool-size N      shard-proxy --pool-size (default 10)
  --aggregate        shard-proxy --aggregate (one pool for all the schemas)
  --server URL       PostgreSQL server, without a database (default
                     postgres://postgres@127.0.0.1:5432); a scratch database is made
                     there and dropped at the end
  --runs-dir DIR     where the run directory goes (default results/runs)
  -h, --help         this help (writes nothing)

Both proxies hold their pools at once, so the server must accept 2 x shards x pool size
connections (2 x pool size with --aggregate) beside its others; the script checks
before it starts. Needs psql, go, and sysbench or pgbench for the workloads chosen.
pgbench's tables are sharded by their account id (pgbench_accounts, pgbench_history)
or copied to every shard (pgbench_branches, pgbench_tellers). On a shared machine, wrap it:
flock /tmp/shardlab-heavy.lock scripts/proxy_ab.sh HEAD~1
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/proxy_ab.sh$(quote_args "$@")"
workloads=oltp_write_only threads=32 rounds=3 time_s=8 tables=4 table_size=10000 scale=1 shards=4 pool_size=10 aggregate=0
server=postgres://postgres@127.0.0.1:5432 runs_dir="$root/results/runs"
refs=()
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "proxy_ab.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--workloads) need "$@"; workloads=$2; shift 2 ;;
	--threads) need "$@"; threads=$2; shift 2 ;;
	--rounds) need "$@"; rounds=$2; shift 2 ;;
	--time) need "$@"; time_s=$2; shift 2 ;;
	--tables) need "$@"; tables=$2; shift 2 ;;
	--table-size) need "$@"; table_size=$2; shift 2 ;;
	--scale) need "$@"; scale=$2; shift 2 ;;
	--shards) need "$@"; shards=$2; shift 2 ;;
	--pool-size) need "$@"; pool_size=$2; shift 2 ;;
	--aggregate) aggregate=1; shift ;;
	--server) need "$@"; server=${2%/}; shift 2
		rest=${server#postgres://} rest=${rest#postgresql://}
		[[ $rest != "$server" && $rest != *[/?]* ]] || { echo "proxy_ab.sh: --server takes postgres://user@host:port, without a database or options, got '$server'" >&2; exit 2; } ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	-*) echo "proxy_ab.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
	*) refs+=("$1"); shift ;;
	esac
done
((${#refs[@]} >= 1 && ${#refs[@]} <= 2)) || { echo "proxy_ab.sh: give OLD_REF and optionally NEW_REF (see --help)" >&2; exit 2; }
for v in "$threads" "$rounds" "$time_s" "$tables" "$table_size" "$scale" "$pool_size" "$shards"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || { echo "proxy_ab.sh: --threads, --rounds, --time, --tables, --table-size, --scale, --shards and --pool-size take positive integers, got '$v'" >&2; exit 2; }
done
workload_re='(oltp_[a-z_]+|pgbench_(select|tpcb)_(simple|extended|prepared))'
[[ $workloads =~ ^$workload_re(,$workload_re)*$ ]] || { echo "proxy_ab.sh: --workloads takes sysbench oltp_* workloads and pgbench_{select,tpcb}_{simple,extended,prepared}, separated by commas, got '$workloads'" >&2; exit 2; }
use_sysbench=0 use_pgbench=0
[[ ,$workloads, == *,oltp_* ]] && use_sysbench=1
[[ ,$workloads, == *,pgbench_* ]] && use_pgbench=1
progs=(psql go)
((use_sysbench)) && progs+=(sysbench)
((use_pgbench)) && progs+=(pgbench)
for prog in "${progs[@]}"; do
	command -v "$prog" >/dev/null || { echo "proxy_ab.sh: $prog is not installed" >&2; exit 2; }
done
old_ref=${refs[0]} new_ref=${refs[1]:-}
for ref in "$old_ref" ${new_ref:+"$new_ref"}; do
	git -C "$root" rev-parse --verify --quiet "$ref^{commit}" >/dev/null || { echo "proxy_ab.sh: '$ref' is not a git revision here" >&2; exit 2; }
done
psql_server() { psql "$server/$1" -X -q -v ON_ERROR_STOP=1 -At "${@:2}"; }
max_conn=$(psql_server postgres -c 'SHOW max_connections') || { echo "proxy_ab.sh: cannot reach the server at $server" >&2; exit 2; }
in_use=$(psql_server postgres -c 'SELECT count(*) FROM pg_stat_activity WHERE backend_type = '\''client backend'\''')
pools=$shards
((aggregate)) && pools=1
wanted=$((2 * pools * pool_size + 2))
if ((in_use + wanted > max_conn)); then
	echo "proxy_ab.sh: the two proxies may open $wanted connections and $in_use are in use, but the server allows $max_conn; lower --pool-size or --shards, or use --aggregate" >&2
	exit 2
fi

run_info_sample
work=$(mktemp -d "${TMPDIR:-/tmp}/shardlab-proxyab.XXXXXX")
db="shardlab_ab_$$"
pids=()
run_dir=""
cleanup() {
	local status=$? pid
	trap '' INT TERM # a second interrupt must not cut the cleanup short
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	# A proxy drains its clients before it exits; one that has not exited within ten
	# seconds is killed, so that cleanup never hangs.
	for pid in "${pids[@]}"; do
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
	done
	wait 2>/dev/null || true
	if [[ -n $run_dir && -f $run_dir/run.txt ]] && ! grep -q '^finished: ' "$run_dir/run.txt"; then
		# promote.sh refuses a run without "finished:"; say why it stopped.
		echo "incomplete: the script stopped with status $status before the last round" >>"$run_dir/run.txt"
		echo "proxy_ab.sh: the run stopped early; what it measured is in $(show_path "$run_dir") (incomplete)" >&2
	fi
	psql_server postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" ||
		echo "proxy_ab.sh: could not drop the scratch database $db; drop it by hand" >&2
	rm -rf "$work"
	git -C "$root" worktree prune 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# build SIDE REF: builds shard-proxy at REF (the work tree when empty) into $work/SIDE.
build() {
	local side=$1 ref=$2 src=$root
	if [[ -n $ref ]]; then
		src="$work/src-$side"
		git -C "$root" worktree add --quiet --detach "$src" "$ref"
	fi
	(cd "$src" && go build -o "$work/$side" ./cmd/shard-proxy)
	if [[ -n $ref ]]; then git -C "$root" worktree remove --force "$src"; fi
}
echo "building shard-proxy at $old_ref and at ${new_ref:-the work tree}" >&2
build old "$old_ref"
build new "$new_ref"
old_commit=$(git -C "$root" rev-parse --short=12 "$old_ref^{commit}")
new_commit=$(if [[ -n $new_ref ]]; then git -C "$root" rev-parse --short=12 "$new_ref^{commit}"; else git_commit "$root"; fi)

psql_server postgres -c "CREATE DATABASE $db"
for ((i = 0; i < shards; i++)); do psql_server "$db" -c "CREATE SCHEMA s$i"; done

# start SIDE: serves the proxy built for SIDE on a free port; sets port_SIDE and pid_SIDE.
start() {
	local side=$1 args=()
	for ((i = 0; i < shards; i++)); do args+=(--shard "$server/$db?sslmode=disable&search_path=s$i"); done
	((aggregate)) && args+=(--aggregate)
	# 3>&- : the proxy must not keep a caller's flock on the heavy-jobs lock.
	"$work/$side" --listen 127.0.0.1:0 --addr-file "$work/addr-$side" --database app --sharded 'sbtest*=id' \
		--sharded pgbench_accounts=aid --sharded pgbench_history=aid --broadcast pgbench_branches --broadcast pgbench_tellers "${args[@]}" \
		--pool-size "$pool_size" --procs 1 --log-level warn --stats-interval 0 >"$work/proxy-$side.log" 2>&1 3>&- &
	pids+=($!)
	printf -v "pid_$side" %s "$!"
	for _ in $(seq 100); do
		local addr
		if read -r addr 2>/dev/null <"$work/addr-$side"; then # a whole line: written
			printf -v "port_$side" %s "${addr##*:}"
			return 0
		fi
		kill -0 "$!" 2>/dev/null || break
		sleep 0.1
	done
	echo "proxy_ab.sh: the $side proxy did not start:" >&2
	cat "$work/proxy-$side.log" >&2
	exit 1
}
start old
start new

sb() { # PORT WORKLOAD COMMAND [ARGS]
	sysbench "$2" --db-driver=pgsql --pgsql-host=127.0.0.1 --pgsql-port="$1" --pgsql-user=postgres --pgsql-db=app \
		--tables="$tables" --table-size="$table_size" --auto_inc=off --rand-type=uniform --range_selects=off "${@:4}" "$3"
}
pgb() { # PORT ARGS...: pgbench through a proxy
	pgbench -h 127.0.0.1 -p "$1" -U postgres "${@:2}" app
}
if ((use_sysbench)); then
	echo "sysbench prepare: $tables tables x $table_size rows through the proxy over $shards schemas" >&2
	sb "$port_new" oltp_read_write prepare --threads=2 >"$work/prepare.txt" 2>&1 || { cat "$work/prepare.txt" >&2; exit 1; }
fi
if ((use_pgbench)); then
	echo "pgbench -i --scale $scale through the proxy over $shards schemas" >&2
	pgb "$port_new" -i -q --scale "$scale" >"$work/pgbench-init.txt" 2>&1 || { cat "$work/pgbench-init.txt" >&2; exit 1; }
fi

claim_run_dir "$runs_dir" "$(new_run_id proxyab-)" || exit 1
mkdir -p "$run_dir/logs"
run_info_start "$run_dir/run.txt" "$cmdline" "$root"
{
	echo "old: $old_ref ($old_commit)"
	echo "new: ${new_ref:-work tree} ($new_commit)"
	((use_sysbench)) && echo "sysbench: $(sysbench --version)"
	((use_pgbench)) && echo "pgbench: $(pgbench --version)"
	echo "server: $(psql_server postgres -c 'SELECT version()')"
} >>"$run_dir/run.txt"
echo "run $run_id: writing to $(show_path "$run_dir")" >&2

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
echo "round,workload,threads,side,commit,tps,cpu_us_per_tx,errors,status" >"$run_dir/results.csv"
IFS=, read -ra wl <<<"$workloads"
for ((r = 1; r <= rounds; r++)); do
	for w in "${wl[@]}"; do
		order=(old new)
		((r % 2 == 0)) && order=(new old)
		for side in "${order[@]}"; do
			port_var="port_$side" pid_var="pid_$side" commit_var="${side}_commit"
			out="$run_dir/logs/r${r}_${w}_${side}.txt"
			c0=$(cpu_ticks "${!pid_var}")
			status=ok
			if [[ $w == pgbench_* ]]; then
				script=() # TPC-B-like, pgbench's default
				[[ $w == pgbench_select_* ]] && script=(-S)
				pgb "${!port_var}" "${script[@]}" -M "${w##*_}" -c "$threads" -j "$(((threads + 1) / 2))" -T "$time_s" -n >"$out" 2>&1 || status=failed
				c1=$(cpu_ticks "${!pid_var}")
				n=$(grep -oP 'number of transactions actually processed: \K[0-9]+' "$out" || echo 0)
				tps=$(grep -oP 'tps = \K[0-9.]+' "$out" | tail -n 1 || echo 0)
				errors=$(grep -oP 'number of failed transactions: \K[0-9]+' "$out" || echo 0)
			else
				sb "${!port_var}" "$w" run --threads="$threads" --time="$time_s" --report-interval=0 >"$out" 2>&1 || status=failed
				c1=$(cpu_ticks "${!pid_var}")
				n=$(grep -oP 'transactions:\s+\K[0-9]+' "$out" || echo 0)
				tps=$(grep -oP 'transactions:\s+[0-9]+\s+\(\K[0-9.]+' "$out" || echo 0)
				errors=$(grep -oP 'ignored errors:\s+\K[0-9]+' "$out" || echo 0)
			fi
			cpu=$(awk -v c="$((c1 - c0))" -v n="$n" -v hz="$hz" 'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }')
			echo "$r,$w,$threads,$side,${!commit_var},$tps,$cpu,$errors,$status" >>"$run_dir/results.csv"
			echo "round $r/$rounds $w $side: $tps tps, $cpu µs proxy CPU per transaction, $errors client errors ($status)" >&2
		done
	done
done
run_info_finish "$run_dir/run.txt"

# The median over rounds of the per-round ratios new / old, with the range.
awk -F, -v old="$old_ref ($old_commit)" -v new="${new_ref:-work tree} ($new_commit)" '
	NR == 1 { next }
	$9 != "ok" { failed++; next } # a failed run has no ratio
	{ v[$1, $2, $4, "tps"] = $6; v[$1, $2, $4, "cpu"] = $7; if (!($2 in seen)) { seen[$2] = 1; order[++nw] = $2 } ; rounds = $1 > rounds ? $1 : rounds }
	function median(a, n,   i, j, t) {
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	END {
		printf "new %s / old %s, medians of per-round ratios [min-max] over %d rounds\n", new, old, rounds
		if (failed) printf "%d failed runs left out (see results.csv and logs/)\n", failed
		for (k = 1; k <= nw; k++) {
			w = order[k]
			for (m = 1; m <= 2; m++) {
				metric = m == 1 ? "tps" : "cpu"
				n = 0
				for (r = 1; r <= rounds; r++) {
					o = v[r, w, "old", metric]; x = v[r, w, "new", metric]
					if (o + 0 > 0 && x != "nan" && o != "nan") r_[++n] = x / o
				}
				if (n == 0) { printf "%s %s: no ratio\n", w, metric == "tps" ? "throughput" : "proxy CPU per transaction"; continue }
				lo = hi = r_[1]; for (i = 2; i <= n; i++) { lo = r_[i] < lo ? r_[i] : lo; hi = r_[i] > hi ? r_[i] : hi }
				printf "%s %s: %.2fx [%.2f-%.2f]\n", w, metric == "tps" ? "throughput" : "proxy CPU per transaction", median(r_, n), lo, hi
			}
		}
	}' "$run_dir/results.csv" | tee "$run_dir/summary.txt"
echo "results: $(show_path "$run_dir")" >&2
