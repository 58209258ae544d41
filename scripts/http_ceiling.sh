#!/usr/bin/env bash
# Measures the demo-server's read throughput (single mode, SQLite, preloaded keys) as a
# share of a trivial net/http handler's (cmd/http-ceiling), both driven by the same
# client, trials interleaved. The clients are our loadgen (random preloaded keys) and wrk,
# a client we did not write, which reads one record over and over; loadgen shares the two
# cores with the server and so hides part of the server's cost, wrk is lighter. Prints
# one line per trial and client and the median ratio per client, and keeps them in the
# run's own directory results/runs/ceiling-<time>/ (http_ceiling.txt and run.txt;
# results/latest points at it).
set -euo pipefail
usage() {
	cat <<'USAGE'
Usage: scripts/http_ceiling.sh [--trials N] [--ops N] [--concurrency N] [--client C] [--duration S]
                               [--baseline-bin PATH] [--runs-dir DIR] [--no-build]
  --trials N        interleaved trials (default 5)
  --ops N           loadgen: read requests per measurement (default 30000)
  --concurrency N   loadgen workers and wrk connections (default 32)
  --client C        loadgen, wrk or both (default both)
  --duration S      wrk: seconds per measurement (default 5)
  --baseline-bin P  also measure this demo-server binary (e.g. built from an older commit)
                    in the same trials, reported as "baseline"
  --runs-dir DIR    where the run directory goes (default results/runs); the run writes
                    DIR/ceiling-<time>/ and DIR/../latest points at it
  --no-build        use the binaries already in bin/
  -h, --help        this help
USAGE
}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/http_ceiling.sh$(quote_args "$@")"
trials=5 ops=30000 conc=32 build=1 runs_dir="$root/results/runs" client=both duration=5 baseline=""
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "http_ceiling.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--trials) need "$@"; trials=$2; shift 2 ;;
	--ops) need "$@"; ops=$2; shift 2 ;;
	--concurrency) need "$@"; conc=$2; shift 2 ;;
	--client) need "$@"; client=$2; shift 2 ;;
	--duration) need "$@"; duration=$2; shift 2 ;;
	--baseline-bin) need "$@"; baseline=$2; shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "http_ceiling.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
[[ $client == loadgen || $client == wrk || $client == both ]] || { echo "http_ceiling.sh: --client must be loadgen, wrk or both, got '$client'" >&2; exit 2; }
[[ -z $baseline || -x $baseline ]] || { echo "http_ceiling.sh: --baseline-bin $baseline is not an executable" >&2; exit 2; }
if [[ $client != loadgen ]] && ! command -v wrk >/dev/null; then
	echo "http_ceiling.sh: wrk is not installed (apt-get install wrk), or use --client loadgen" >&2
	exit 2
fi
for v in "$trials" "$ops" "$conc" "$duration"; do [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "http_ceiling.sh: numbers must be positive integers" >&2; exit 2; }; done
run_info_sample # before the build, whose load is the run's own
if ((build)); then
	(cd "$root" && mkdir -p bin && go build -o bin/ ./cmd/demo-server ./cmd/loadgen ./cmd/http-ceiling)
fi
claim_run_dir "$runs_dir" "$(new_run_id ceiling-)" || exit 1
echo "run $run_id: writing to $(show_path "$run_dir")" >&2
run_info_start "$run_dir/run.txt" "$cmdline" "$root"
say() { printf '%s\n' "$*" | tee -a "$run_dir/http_ceiling.txt"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/shardlab-ceiling.XXXXXX")
pids=()
stop_servers() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
cleanup() { stop_servers; rm -rf "$work"; }
trap cleanup EXIT
url=""
start() { # name cmd... ; sets url (not a subshell, so cleanup knows the pid)
	local name=$1; shift
	"$@" --addr 127.0.0.1:0 --addr-file "$work/$name.addr" >"$work/$name.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 200); do [[ -s $work/$name.addr ]] && break; sleep 0.05; done
	[[ -s $work/$name.addr ]] || { cat "$work/$name.log" >&2; echo "http_ceiling.sh: $name did not start" >&2; exit 1; }
	url="http://$(cat "$work/$name.addr")"
}
start ceiling "$root/bin/http-ceiling"
ceiling=$url
start demo "$root/bin/demo-server" --mode single --data "$work/data"
demo=$url
"$root/bin/loadgen" --target "$demo" --wait-ready 10s --ops 1 --keys 10000 --preload --concurrency "$conc" --quiet >/dev/null
base=""
if [[ -n $baseline ]]; then
	start baseline "$baseline" --mode single --data "$work/base"
	base=$url
	"$root/bin/loadgen" --target "$base" --wait-ready 10s --ops 1 --keys 10000 --preload --concurrency "$conc" --quiet >/dev/null
fi
clients=(loadgen wrk)
[[ $client == both ]] || clients=("$client")
load=(--ops "$ops" --concurrency "$conc" --writeRatio 0 --keys 10000 --dist uniform --quiet --warmup 1s)
measure() { # client url trial -> requests/s
	case $1 in
	loadgen) "$root/bin/loadgen" --target "$2" "${load[@]}" --seed "$3" | sed -E 's/.*: ([0-9.]+) ops\/s.*/\1/' ;;
	# One record, the same for both servers' /get; a 1 s warm-up first, unmeasured.
	wrk)
		wrk -t1 -c"$conc" -d1s "$2/get?user_id=user1" >/dev/null
		wrk -t1 -c"$conc" -d"${duration}s" "$2/get?user_id=user1" | awk '/^Requests\/sec:/ { print $2 }'
		;;
	esac
}
declare -A ratios=()
for ((t = 1; t <= trials; t++)); do
	for cl in "${clients[@]}"; do
		c=$(measure "$cl" "$ceiling" "$t")
		d=$(measure "$cl" "$demo" "$t")
		r=$(awk -v d="$d" -v c="$c" 'BEGIN { printf "%.3f", d / c }')
		ratios[$cl]+=" $r"
		line="trial $t, client $cl: http ceiling $c req/s, demo-server single $d req/s, ratio $r"
		if [[ -n $base ]]; then
			b=$(measure "$cl" "$base" "$t")
			rb=$(awk -v b="$b" -v c="$c" 'BEGIN { printf "%.3f", b / c }')
			ratios[$cl-baseline]+=" $rb"
			line+="; baseline $b req/s, ratio $rb"
		fi
		say "$line"
	done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "median ratio %.3f (min %.3f, max %.3f) over %d trials", m, a[1], a[NR], NR }'; }
for cl in "${clients[@]}"; do
	say "client $cl: demo-server / http ceiling: $(median <<<"${ratios[$cl]}")"
	[[ -n $base ]] && say "client $cl: baseline ($baseline) / http ceiling: $(median <<<"${ratios[$cl-baseline]}")"
done
# The servers' CPU time counts as the run's own only once they have been waited for.
stop_servers
run_info_finish "$run_dir/run.txt"
echo "results: $(show_path "$run_dir/http_ceiling.txt")" >&2
