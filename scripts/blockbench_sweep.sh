#!/usr/bin/env bash
# Threshold sweep of the autoshard block store, as published in docs/autoshard.md.
# Bounded for a shared 2-core machine: 5 thresholds x 3 rounds, each run stops at the
# target or after the maximum duration. It writes into the run's own directory,
# results/runs/blockbench-<time>/ (results/latest points at it): the per-run CSVs,
# summary.csv, the charts, machine.txt and run.txt.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/blockbench_sweep.sh [options] [blockbench sweep flags]

  --thresholds LIST   comma-separated thresholds, never/k/M allowed (default never,125k,250k,500k,1M)
  --target-blocks N   stop each run once N blocks are written (default 3000000)
  --max-duration D    stop each run after D at the latest (default 4m)
  --rounds N          repetitions, thresholds rotated each round (default 3)
  --runs-dir DIR      where the run directory goes (default results/runs); the run writes
                      DIR/blockbench-<time>/ and DIR/../latest points at it
  --no-build          use bin/blockbench instead of building it
  -h, --help          this help

Any other flag goes to "blockbench sweep" as given (e.g. --sync full, --seed 7); see
"go run ./cmd/blockbench sweep -h". The environment variables THRESHOLDS, TARGET,
MAX_DURATION and ROUNDS set the defaults of the first four options.
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/blockbench_sweep.sh$(quote_args "$@")"
thresholds=${THRESHOLDS:-never,125k,250k,500k,1M}
target=${TARGET:-3000000}
max_duration=${MAX_DURATION:-4m}
rounds=${ROUNDS:-3}
runs_dir="$root/results/runs" build=1 extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "blockbench_sweep.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--thresholds) need "$@"; thresholds=$2; shift 2 ;;
	--target-blocks) need "$@"; target=$2; shift 2 ;;
	--max-duration) need "$@"; max_duration=$2; shift 2 ;;
	--rounds) need "$@"; rounds=$2; shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	--results) echo "blockbench_sweep.sh: --results is the run directory's job; use --runs-dir DIR" >&2; exit 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) extra+=("$1"); shift ;;
	esac
done
[[ $target =~ ^[1-9][0-9]*$ ]] || { echo "blockbench_sweep.sh: --target-blocks must be a positive integer, got '$target'" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "blockbench_sweep.sh: --rounds must be a positive integer, got '$rounds'" >&2; exit 2; }
# When the environment set the defaults, the recorded command says so: it must rerun
# the same sweep.
[[ -n ${THRESHOLDS:-}${TARGET:-}${MAX_DURATION:-}${ROUNDS:-} ]] &&
	cmdline="THRESHOLDS=$thresholds TARGET=$target MAX_DURATION=$max_duration ROUNDS=$rounds $cmdline"

run_info_sample # before the build, whose load is the run's own
if ((build)); then
	bin_dir=$(mktemp -d "${TMPDIR:-/tmp}/shardlab-blockbench.XXXXXX")
	trap 'rm -rf "$bin_dir"' EXIT
	(cd "$root" && go build -o "$bin_dir/blockbench" ./cmd/blockbench)
	bin="$bin_dir/blockbench"
else
	bin="$root/bin/blockbench"
	[[ -x $bin ]] || { echo "blockbench_sweep.sh: --no-build but there is no $bin (make build)" >&2; exit 2; }
fi
args=(sweep --thresholds "$thresholds" --target-blocks "$target" --max-duration "$max_duration"
	--rounds "$rounds" "${extra[@]}")
claim_run_dir "$runs_dir" "$(new_run_id blockbench-)" || exit 1
echo "run $run_id: writing to $(show_path "$run_dir")" >&2
run_info_start "$run_dir/run.txt" "$cmdline" "$root"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "nproc: $(nproc)"
	echo "cpu: $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
	echo "memory: $(awk '/MemTotal/ { print $2 / 1024 / 1024 " GiB" }' /proc/meminfo)"
	"$bin" env
	echo "driver: github.com/mattn/go-sqlite3 $(cd "$root" && go list -m -f '{{.Version}}' github.com/mattn/go-sqlite3 2>/dev/null || echo unknown)"
	echo "loadavg at start: $(cat /proc/loadavg)"
	echo "command: $cmdline"
	# Exactly what ran: the flags above with every value the sweep used.
	echo "blockbench:$(quote_args "${args[@]}" --results "$(show_path "$run_dir")")"
	echo "target blocks: $target"
} >"$run_dir/machine.txt"

status=0
"$bin" "${args[@]}" --results "$run_dir" || status=$?
if ((status == 2)); then
	discard_run_dir # blockbench refused a flag: nothing ran, nothing to keep
	exit 2
fi
echo "loadavg at end: $(cat /proc/loadavg)" >>"$run_dir/machine.txt"
echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ) (exit $status)" >>"$run_dir/machine.txt"
((status == 0)) || exit "$status"
run_info_finish "$run_dir/run.txt"
echo "results: $(show_path "$run_dir")" >&2
