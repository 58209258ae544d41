#!/usr/bin/env bash
# Seed 001's experiment for the wire proxy (docs/proxy.md, "The sweep"): sysbench
# oltp_point_select, oltp_write_only and oltp_read_write through shard-proxy over 4
# schema shards, with pool aggregation off and on, beside direct PostgreSQL and
# pgbouncer, at 8 to 256 threads; and pgbench -S through a passthrough proxy beside
# pgbouncer in transaction mode and a byte relay in Go (go-relay, the floor of a Go
# middleware's CPU per transaction). It starts a PostgreSQL cluster of its own (never the
# shared server), counts backend connections from pg_stat_activity, and writes into the
# run's own directory, results/runs/proxysweep-<time>/ (results/latest points at it):
# results.csv, summary.csv, report.md, the charts, logs/, machine.txt and run.txt.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/proxy_sweep.sh [options] [proxysweep run flags]

  --quick            a short sweep: 2 tables x 2000 rows, threads 8,32,256, 3s runs
                     after 1s of warm-up, 1 trial, pgbench scale 1 (about 5 minutes)
  --threads LIST     sysbench thread counts (default 8,16,32,64,128,256)
  --trials N         interleaved trials (default 3)
  --time SECONDS     length of each client run (default 10)
  --warmup SECONDS   sysbench load before it, not measured (default 2)
  --tables N         sysbench --tables (default 10)
  --table-size N     sysbench --table-size (default 100000)
  --pool-size N      shard-proxy --pool-size, pgbouncer's transaction-mode pool (default 20)
  --proxy-procs N    shard-proxy --procs, the OS threads running its Go code (default 1,
                     as pgbouncer runs one thread; 0: Go's choice, one per CPU)
  --runs-dir DIR     where the run directory goes (default results/runs)
  --no-build         use bin/shard-proxy and bin/proxysweep instead of building them
  -h, --help         this help (writes nothing)

Any other flag goes to "proxysweep run" as given (--workloads, --shards, --proxy-arg,
--pgbench-clients, --pgbench-modes, --pgbench-scale, --pg-bindir). Needs sysbench,
pgbench, pgbouncer and PostgreSQL's initdb/pg_ctl; run as root, the servers run as the
"postgres" OS user. On a shared machine, wrap it: flock /tmp/shardlab-heavy.lock scripts/proxy_sweep.sh
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/proxy_sweep.sh$(quote_args "$@")"
threads=8,16,32,64,128,256 trials=3 time_s=10 warmup=2 tables=10 table_size=100000 pool_size=20 proxy_procs=1 scale=10
runs_dir="$root/results/runs" build=1 extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "proxy_sweep.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--quick) threads=8,32,256 trials=1 time_s=3 warmup=1 tables=2 table_size=2000 scale=1; shift ;;
	--threads) need "$@"; threads=$2; shift 2 ;;
	--trials) need "$@"; trials=$2; shift 2 ;;
	--time) need "$@"; time_s=$2; shift 2 ;;
	--warmup) need "$@"; warmup=$2; shift 2 ;;
	--tables) need "$@"; tables=$2; shift 2 ;;
	--table-size) need "$@"; table_size=$2; shift 2 ;;
	--pool-size) need "$@"; pool_size=$2; shift 2 ;;
	--proxy-procs) need "$@"; proxy_procs=$2; shift 2 ;;
	--pgbench-scale) need "$@"; scale=$2; shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) extra+=("$1"); shift ;;
	esac
done
for v in "$trials" "$time_s" "$tables" "$table_size" "$pool_size" "$scale"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || { echo "proxy_sweep.sh: --trials, --time, --tables, --table-size, --pool-size and --pgbench-scale take positive integers, got '$v'" >&2; exit 2; }
done
[[ $proxy_procs =~ ^[0-9]+$ ]] || { echo "proxy_sweep.sh: --proxy-procs takes 0 or a positive integer, got '$proxy_procs'" >&2; exit 2; }
[[ $threads =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "proxy_sweep.sh: --threads takes positive integers separated by commas, got '$threads'" >&2; exit 2; }
for prog in sysbench pgbench pgbouncer; do
	command -v "$prog" >/dev/null || { echo "proxy_sweep.sh: $prog is not installed" >&2; exit 2; }
done
shards=4
for ((i = 0; i < ${#extra[@]}; i++)); do
	[[ ${extra[i]} == --shards ]] && shards=${extra[i + 1]:-4}
	[[ ${extra[i]} == --shards=* ]] && shards=${extra[i]#--shards=}
done

run_info_sample # before the build, whose load is the run's own
if ((build)); then
	bin_dir=$(mktemp -d "${TMPDIR:-/tmp}/shardlab-proxysweep.XXXXXX")
	trap 'rm -rf "$bin_dir"' EXIT
	(cd "$root" && go build -o "$bin_dir/shard-proxy" ./cmd/shard-proxy && go build -o "$bin_dir/proxysweep" ./cmd/proxysweep)
else
	bin_dir="$root/bin"
	[[ -x $bin_dir/shard-proxy && -x $bin_dir/proxysweep ]] || { echo "proxy_sweep.sh: --no-build but bin/shard-proxy or bin/proxysweep is missing" >&2; exit 2; }
fi
args=(run --proxy "$bin_dir/shard-proxy" --threads "$threads" --trials "$trials" --time "${time_s}s" --warmup "${warmup}s"
	--tables "$tables" --table-size "$table_size" --pool-size "$pool_size" --proxy-procs "$proxy_procs" --pgbench-scale "$scale" "${extra[@]}")
claim_run_dir "$runs_dir" "$(new_run_id proxysweep-)" || exit 1
echo "run $run_id: writing to $(show_path "$run_dir")" >&2
run_info_start "$run_dir/run.txt" "$cmdline" "$root"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "nproc: $(nproc)"
	echo "cpu: $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
	echo "memory: $(awk '/MemTotal/ { print $2 / 1024 / 1024 " GiB" }' /proc/meminfo)"
	echo "sysbench: $(sysbench --version)"
	echo "pgbench: $(pgbench --version)"
	echo "pgbouncer: $(pgbouncer --version | head -n 1)"
	echo "postgres: $("${PG_BINDIR:-/usr/lib/postgresql/15/bin}/postgres" --version 2>/dev/null || echo unknown)"
	echo "loadavg at start: $(cat /proc/loadavg)"
	echo "command: $cmdline"
	echo "proxysweep:$(quote_args "${args[@]}" --out "$(show_path "$run_dir")")"
} >"$run_dir/machine.txt"

status=0
"$bin_dir/proxysweep" "${args[@]}" --out "$run_dir" || status=$?
if ((status == 2)); then
	discard_run_dir # a flag was refused: nothing ran, nothing to keep
	exit 2
fi
echo "loadavg at end: $(cat /proc/loadavg)" >>"$run_dir/machine.txt"
echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ) (exit $status)" >>"$run_dir/machine.txt"
((status == 0)) || exit "$status"
run_info_finish "$run_dir/run.txt"
"$bin_dir/proxysweep" report --dir "$run_dir" --pool-size "$pool_size" --proxy-procs "$proxy_procs" --shards "$shards"
echo "report: $(show_path "$run_dir/report.md")" >&2
echo "results: $(show_path "$run_dir")" >&2
