#!/usr/bin/env bash
# Runs one lab experiment: builds the binaries, starts a demo-server on a free loopback
# port with a fresh data directory, waits for /healthz, runs loadgen, stops the server and
# appends one row per trial to the results CSV: by default that of a new run directory,
# results/runs/<run-id>/results.csv (results/latest points at it).
#
#   scripts/run_scenario.sh --ops 50000 --concurrency 150 --writeRatio 0.5 --shards 4
#
# --shards 1 means single mode. Run with --help for every option.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/run_scenario.sh [options]

Seed options:
  --ops N            requests in the measured phase (default 10000)
  --concurrency N    concurrent simulated users (default 50)
  --writeRatio F     share of writes, 0..1 (default 0.5)
  --shards N         shard count; 1 = single mode (default 1)

More options:
  --scenario NAME    label in the CSV (default adhoc)
  --dist D           key distribution: uniform, zipfian, hotspot (default uniform)
  --keys N           key-space size (default 10000)
  --preload          write every key once before measuring, so reads hit
  --warmup D         unmeasured warm-up, e.g. 2s (default 0)
  --duration D       measure for a duration instead of --ops
  --rate R           open loop at R requests/s (default 0 = closed loop)
  --arrival A        open-loop spacing: constant or poisson
  --sync S           SQLite durability: normal or full (default normal)
  --router R         crc32 or jump (default crc32)
  --read-conns N     read connections per shard (default: server default)
  --group-commit     SQLite: commit the writes waiting for a shard together (demo-server --group-commit)
  --journal J        SQLite journal: wal (default) or delete, the rollback journal (naive variant)
  --one-conn         SQLite: one connection per shard for reads and writes (naive variant)
  --backend B        sqlite (default) or postgres
  --dsn URL          postgres: one per shard, repeat the option; or base DSNs with --create
                     (one server, or one per shard host: shard i on the (i mod servers)-th).
                     Without --dsn, SHARDLAB_PG_DSN is the base DSN and --create is implied
  --create           postgres: create (or reuse) databases <prefix>0..N-1 from the base DSN(s)
  --db-prefix P      postgres with --create: database name prefix (default shardlab_lab_s<N>_,
                     one set per shard count)
  --reset            postgres with --create: DROP those databases first for a fresh start
                     (destroys their data and ends other sessions on them)
  --pool N           postgres: connections per shard
  --trials N         repeat the run N times (default 1)
  --first-trial K    number the trials from K (default 1), for interleaved runs
  --seed N           workload seed (default 1)
  --run-id ID        groups rows in the CSV (default: a timestamp)
  --runs-dir DIR     where the run directory goes (default results/runs): this run writes
                     DIR/<run-id>/results.csv, timeseries/ and run.txt, and DIR/../latest
                     points at it
  --out FILE         append to this results CSV instead, with no run directory (the other
                     scripts use this to gather their runs' rows in one file)
  --timeseries-dir D write per-second samples under D/<run-id>/ (default: timeseries/ next
                     to the CSV)
  --command STR      the command line recorded in the CSV (default: this script's own)
  --no-build         use the binaries already in bin/
  -h, --help         this help
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ops=10000 concurrency=50 write_ratio=0.5 shards=1 scenario=adhoc dist=uniform keys=10000
preload=0 warmup=0s duration="" rate=0 arrival=constant sync=normal router=crc32 read_conns=0 group_commit=0 journal=wal one_conn=0
backend=sqlite dsns=() create=0 reset=0 db_prefix="" pool=0 trials=1 first_trial=1 seed=1 run_id="" out=""
runs_dir="$root/results/runs" ts_dir="" build=1 command=""
. "$root/scripts/lib.sh"
self_command="scripts/run_scenario.sh$(quote_args "$@")"

need() { [[ $# -ge 2 && -n "$2" ]] || { echo "run_scenario.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--ops) need "$@"; ops=$2; shift 2 ;;
	--concurrency) need "$@"; concurrency=$2; shift 2 ;;
	--writeRatio | --write-ratio) need "$@"; write_ratio=$2; shift 2 ;;
	--shards) need "$@"; shards=$2; shift 2 ;;
	--scenario) need "$@"; scenario=$2; shift 2 ;;
	--dist) need "$@"; dist=$2; shift 2 ;;
	--keys) need "$@"; keys=$2; shift 2 ;;
	--preload) preload=1; shift ;;
	--warmup) need "$@"; warmup=$2; shift 2 ;;
	--duration) need "$@"; duration=$2; shift 2 ;;
	--rate) need "$@"; rate=$2; shift 2 ;;
	--arrival) need "$@"; arrival=$2; shift 2 ;;
	--sync) need "$@"; sync=$2; shift 2 ;;
	--router) need "$@"; router=$2; shift 2 ;;
	--read-conns) need "$@"; read_conns=$2; shift 2 ;;
	--group-commit) group_commit=1; shift ;;
	--journal) need "$@"; journal=$2; shift 2 ;;
	--one-conn) one_conn=1; shift ;;
	--backend) need "$@"; backend=$2; shift 2 ;;
	--dsn) need "$@"; dsns+=("$2"); shift 2 ;;
	--create) create=1; shift ;;
	--reset) reset=1; shift ;;
	--db-prefix) need "$@"; db_prefix=$2; shift 2 ;;
	--command) need "$@"; command=$2; shift 2 ;;
	--pool) need "$@"; pool=$2; shift 2 ;;
	--trials) need "$@"; trials=$2; shift 2 ;;
	--first-trial) need "$@"; first_trial=$2; shift 2 ;;
	--seed) need "$@"; seed=$2; shift 2 ;;
	--run-id) need "$@"; run_id=$2; shift 2 ;;
	--out) need "$@"; out=$2; shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	--timeseries-dir) need "$@"; ts_dir=$2; shift 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "run_scenario.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done

die() { echo "run_scenario.sh: $*" >&2; exit 2; }
is_int() { [[ $1 =~ ^[0-9]+$ ]]; }
is_num() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
is_dur() { [[ $1 =~ ^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$ || $1 == 0 ]]; }
is_int "$shards" && ((shards >= 1)) || die "--shards must be a positive integer, got '$shards'"
is_int "$ops" && ((ops >= 1)) || die "--ops must be a positive integer, got '$ops'"
is_int "$concurrency" && ((concurrency >= 1)) || die "--concurrency must be a positive integer, got '$concurrency'"
is_int "$keys" && ((keys >= 1)) || die "--keys must be a positive integer, got '$keys'"
is_num "$write_ratio" && awk -v w="$write_ratio" 'BEGIN { exit !(w <= 1) }' || die "--writeRatio must be a number between 0 and 1, got '$write_ratio'"
is_num "$rate" || die "--rate must be a non-negative number, got '$rate'"
is_int "$read_conns" || die "--read-conns must be a positive integer, got '$read_conns'"
is_int "$pool" || die "--pool must be a positive integer, got '$pool'"
is_int "$seed" || die "--seed must be a non-negative integer, got '$seed'"
is_dur "$warmup" || die "--warmup must be a duration such as 2s, got '$warmup'"
[[ -z $duration ]] || is_dur "$duration" || die "--duration must be a duration such as 30s, got '$duration'"
[[ $dist == uniform || $dist == zipfian || $dist == hotspot ]] || die "--dist must be uniform, zipfian or hotspot, got '$dist'"
[[ $arrival == constant || $arrival == poisson ]] || die "--arrival must be constant or poisson, got '$arrival'"
[[ $sync == normal || $sync == full ]] || die "--sync must be normal or full, got '$sync'"
[[ $journal == wal || $journal == delete ]] || die "--journal must be wal or delete, got '$journal'"
[[ $router == crc32 || $router == jump ]] || die "--router must be crc32 or jump, got '$router'"
case $backend in
sqlite)
	((${#dsns[@]} == 0 && !create && !reset)) && [[ -z $db_prefix ]] || die "--dsn, --create, --reset and --db-prefix are for --backend postgres"
	((one_conn && read_conns > 0)) && die "--one-conn and --read-conns exclude each other"
	;;
postgres)
	((!group_commit && !one_conn)) && [[ $journal == wal ]] || die "--group-commit, --journal and --one-conn are for --backend sqlite"
	if ((${#dsns[@]} == 0)); then
		[[ -n ${SHARDLAB_PG_DSN:-} ]] || die "--backend postgres needs --dsn (or SHARDLAB_PG_DSN)"
		dsns=("$SHARDLAB_PG_DSN")
		create=1
	fi
	((!reset || create)) || die "--reset only works with --create"
	[[ -n $db_prefix ]] || db_prefix="shardlab_lab_s${shards}_"
	;;
*) die "--backend must be sqlite or postgres, got '$backend'" ;;
esac
[[ -n $command ]] || command=$self_command
is_int "$trials" && ((trials >= 1)) || { echo "run_scenario.sh: --trials must be a positive integer, got '$trials'" >&2; exit 2; }
is_int "$first_trial" && ((first_trial >= 1)) || { echo "run_scenario.sh: --first-trial must be a positive integer" >&2; exit 2; }
[[ $scenario =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "run_scenario.sh: --scenario may hold letters, digits, _ . - only" >&2; exit 2; }
[[ -n $run_id ]] || run_id=$(new_run_id)
[[ $run_id =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "run_scenario.sh: --run-id may hold letters, digits, _ . - only" >&2; exit 2; }

[[ -n $out ]] || run_info_sample # a run of its own: measured from before the build
if ((build)); then
	mkdir -p "$root/bin"
	(cd "$root" && go build -o bin/demo-server ./cmd/demo-server && go build -o bin/loadgen ./cmd/loadgen)
fi
commit=$(git_commit "$root")
own_run_dir=0
if [[ -z $out ]]; then
	# A run of its own: a new directory, said where, with its run.txt.
	claim_run_dir "$runs_dir" "$run_id" || exit 1
	own_run_dir=1
	out="$run_dir/results.csv"
	echo "run $run_id: writing to $(show_path "$run_dir")" >&2
	run_info_start "$run_dir/run.txt" "$command" "$root"
fi
[[ -n $ts_dir ]] || ts_dir="$(dirname "$out")/timeseries"

if ((shards == 1)); then mode_args=(--mode single); mode=single; else mode_args=(--mode sharded --shards "$shards"); mode=sharded; fi
server_args=("${mode_args[@]}" --router "$router" --backend "$backend")
if [[ $backend == sqlite ]]; then
	server_args+=(--sync "$sync")
	((read_conns > 0)) && server_args+=(--read-conns "$read_conns")
	((group_commit)) && server_args+=(--group-commit)
	((one_conn)) && server_args+=(--one-conn)
	server_args+=(--journal "$journal")
else
	for d in "${dsns[@]}"; do server_args+=(--dsn "$d"); done
	((create)) && server_args+=(--create --db-prefix "$db_prefix")
	((reset)) && server_args+=(--reset)
	((pool > 0)) && server_args+=(--pool "$pool")
fi
load_args=(--ops "$ops" --concurrency "$concurrency" --writeRatio "$write_ratio" --keys "$keys" --dist "$dist"
	--warmup "$warmup" --rate "$rate" --arrival "$arrival" --seed "$seed" --scenario "$scenario"
	--mode "$mode" --shards "$shards" --run-id "$run_id" --git-commit "$commit" --out "$out" --quiet
	--command "$command")
[[ -n $duration ]] && load_args+=(--duration "$duration")
((preload)) && load_args+=(--preload)

mkdir -p "$(dirname "$out")"
work=$(mktemp -d "${TMPDIR:-/tmp}/shardlab-run.XXXXXX")
server_pid=""
cleanup() {
	if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

for ((trial = first_trial; trial < first_trial + trials; trial++)); do
	data="$work/data-$trial"
	rm -f "$work/addr"
	"$root/bin/demo-server" "${server_args[@]}" --data "$data" --addr 127.0.0.1:0 --addr-file "$work/addr" >"$work/server.log" 2>&1 &
	server_pid=$!
	for _ in $(seq 1 200); do
		[[ -s $work/addr ]] && break
		kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "run_scenario.sh: demo-server failed to start" >&2; exit 1; }
		sleep 0.05
	done
	[[ -s $work/addr ]] || { echo "run_scenario.sh: demo-server did not report its address" >&2; exit 1; }
	addr=$(cat "$work/addr")
	printf '[%s] %s: %s, %s shard(s), trial %d ... ' "$(date -u +%H:%M:%S)" "$scenario" "$mode" "$shards" "$trial" >&2
	status=0
	"$root/bin/loadgen" --target "http://$addr" --wait-ready 10s --trial "$trial" \
		--timeseries "$ts_dir/$run_id/${scenario}_${mode}_${shards}_t${trial}.csv" "${load_args[@]}" >"$work/load.out" 2>&1 || status=$?
	cat "$work/load.out" >&2
	kill -TERM "$server_pid"
	wait "$server_pid" || { echo "run_scenario.sh: demo-server did not stop cleanly:" >&2; cat "$work/server.log" >&2; exit 1; }
	server_pid=""
	rm -rf "$data"
	((status == 0)) || { echo "run_scenario.sh: loadgen failed (exit $status)" >&2; exit "$status"; }
done
if ((own_run_dir)); then
	run_info_finish "$run_dir/run.txt"
	echo "run $run_id: rows in $(show_path "$out")" >&2
fi
