#!/usr/bin/env bash
# Measures the demo-server's read throughput (single mode, SQLite, preloaded keys) as a
# share of a trivial net/http handler's (cmd/http-ceiling), both driven by the same
# loadgen, trials interleaved. Prints one line per trial and the median ratio, and keeps
# them in the run's own directory results/runs/ceiling-<time>/ (http_ceiling.txt and
# run.txt; results/latest points at it).
set -euo pipefail
usage() {
	cat <<'USAGE'
Usage: scripts/http_ceiling.sh [--trials N] [--ops N] [--concurrency N] [--runs-dir DIR] [--no-build]
  --trials N        interleaved trials (default 5)
  --ops N           read requests per measurement (default 30000)
  --concurrency N   loadgen workers (default 32)
  --runs-dir DIR    where the run directory goes (default results/runs); the run writes
                    DIR/ceiling-<time>/ and DIR/../latest points at it
  --no-build        use the binaries already in bin/
  -h, --help        this help
USAGE
}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/http_ceiling.sh$(quote_args "$@")"
trials=5 ops=30000 conc=32 build=1 runs_dir="$root/results/runs"
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "http_ceiling.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--trials) need "$@"; trials=$2; shift 2 ;;
	--ops) need "$@"; ops=$2; shift 2 ;;
	--concurrency) need "$@"; conc=$2; shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "http_ceiling.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
for v in "$trials" "$ops" "$conc"; do [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "http_ceiling.sh: numbers must be positive integers" >&2; exit 2; }; done
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
load=(--ops "$ops" --concurrency "$conc" --writeRatio 0 --keys 10000 --dist uniform --quiet --warmup 1s)
ratios=()
for ((t = 1; t <= trials; t++)); do
	c=$("$root/bin/loadgen" --target "$ceiling" "${load[@]}" --seed "$t" | sed -E 's/.*: ([0-9.]+) ops\/s.*/\1/')
	d=$("$root/bin/loadgen" --target "$demo" "${load[@]}" --seed "$t" | sed -E 's/.*: ([0-9.]+) ops\/s.*/\1/')
	r=$(awk -v d="$d" -v c="$c" 'BEGIN { printf "%.3f", d / c }')
	ratios+=("$r")
	say "trial $t: http ceiling $c ops/s, demo-server single $d ops/s, ratio $r"
done
say "$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "median ratio %.3f (min %.3f, max %.3f) over %d trials\n", m, a[1], a[NR], NR }')"
# The servers' CPU time counts as the run's own only once they have been waited for.
stop_servers
run_info_finish "$run_dir/run.txt"
echo "results: $(show_path "$run_dir/http_ceiling.txt")" >&2
