#!/usr/bin/env bash
# Runs one scenario of scripts/scenarios.conf over a list of shard counts, trials
# interleaved in alternating order (1,2,...,8 then 8,...,2,1 ...), fits the Universal
# Scalability Law to the measured throughput and writes a report of the sweep with its
# charts, all in the run's own directory results/runs/sweep-<time>/ (results/latest
# points at it): results.csv, timeseries/, usl_points.csv, usl.txt, run.txt, report.md
# and charts/.
#
#   scripts/sweep.sh --scenario shard_scaling_base [--shards 1,2,3,4,5,6,8] [--trials 6]
set -euo pipefail
usage() {
	cat <<'USAGE'
Usage: scripts/sweep.sh --scenario NAME [options]

  --scenario NAME   a scenario of the scenario file (required)
  --shards LIST     shard counts, comma-separated (default 1,2,3,4,5,6,8; at least 6 for the fit)
  --trials N        interleaved repetitions (default 6, as run_all_scenarios.sh)
  --ops N           override the scenario's request count
  --warmup D        unmeasured warm-up before each measurement (default 1s)
  --scenarios FILE  scenario definitions (default scripts/scenarios.conf)
  --runs-dir DIR    where the run directory goes (default results/runs); the run writes
                    DIR/sweep-<time>/ and DIR/../latest points at it
  --sync S          SQLite durability: normal or full (default normal)
  --no-build        use the binaries already in bin/
  -h, --help        this help
USAGE
}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/sweep.sh$(quote_args "$@")"
build=1 scenario="" shards=1,2,3,4,5,6,8 warmup=1s trials=6 ops_override="" scenarios="$root/scripts/scenarios.conf"
runs_dir="$root/results/runs" sync=normal
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "sweep.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--scenario) need "$@"; scenario=$2; shift 2 ;;
	--shards) need "$@"; shards=$2; shift 2 ;;
	--trials) need "$@"; trials=$2; shift 2 ;;
	--ops) need "$@"; ops_override=$2; shift 2 ;;
	--warmup) need "$@"; warmup=$2; shift 2 ;;
	--scenarios) need "$@"; scenarios=$2; shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	--sync) need "$@"; sync=$2; shift 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "sweep.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done
[[ -n $scenario ]] || { echo "sweep.sh: --scenario is required (see --help)" >&2; exit 2; }
[[ $shards =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "sweep.sh: --shards must be a list like 1,2,3,4,5,6,8" >&2; exit 2; }
[[ $trials =~ ^[1-9][0-9]*$ ]] || { echo "sweep.sh: --trials must be a positive integer" >&2; exit 2; }
[[ -z $ops_override || $ops_override =~ ^[1-9][0-9]*$ ]] || { echo "sweep.sh: --ops must be a positive integer" >&2; exit 2; }
IFS=, read -r -a shard_list <<<"$shards"
distinct=$(printf '%s\n' "${shard_list[@]}" | sort -u | wc -l)
if ((distinct < 6)); then
	echo "sweep.sh: the USL fit needs at least 6 distinct shard counts, got $distinct ($shards)" >&2
	exit 2
fi
line=$(awk -v s="$scenario" '$1 == s && $1 !~ /^#/ { print; exit }' "$scenarios")
[[ -n $line ]] || { echo "sweep.sh: no scenario '$scenario' in $scenarios" >&2; exit 2; }
read -r name ops conc wr keys dist preload _ server _ <<<"$line"
own=()
mapfile -t own < <(server_flags "${server:--}") || true # the scenario's own server options win over --sync
[[ -n $ops_override ]] && ops=$ops_override
[[ $sync == normal || $sync == full ]] || { echo "sweep.sh: --sync must be normal or full, got '$sync'" >&2; exit 2; }
[[ $warmup =~ ^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$ || $warmup == 0 ]] || { echo "sweep.sh: --warmup must be a duration such as 2s, got '$warmup'" >&2; exit 2; }
pre=()
[[ $preload == yes ]] && pre=(--preload)

run_info_sample # before the build, whose load is the run's own
if ((build)); then
	(cd "$root" && mkdir -p bin && go build -o bin/ ./cmd/demo-server ./cmd/loadgen ./cmd/report ./cmd/usl)
fi
claim_run_dir "$runs_dir" "$(new_run_id sweep-)" || exit 1
out="$run_dir/results.csv"
echo "sweep $run_id: $scenario at shards $shards, $trials trial(s), interleaved" >&2
echo "sweep $run_id: writing to $(show_path "$run_dir")" >&2
run_info_start "$run_dir/run.txt" "$cmdline" "$root"
for ((trial = 1; trial <= trials; trial++)); do
	order=("${shard_list[@]}")
	if ((trial % 2 == 0)); then
		order=()
		for ((i = ${#shard_list[@]} - 1; i >= 0; i--)); do order+=("${shard_list[i]}"); done
	fi
	for n in "${order[@]}"; do
		"$root/scripts/run_scenario.sh" --scenario "$name" --ops "$ops" --concurrency "$conc" \
			--writeRatio "$wr" --keys "$keys" --dist "$dist" --shards "$n" --seed "$trial" \
			--first-trial "$trial" --sync "$sync" --out "$out" --run-id "$run_id" --warmup "$warmup" \
			--command "$cmdline" --no-build "${pre[@]}" "${own[@]}"
	done
done

run_info_finish "$run_dir/run.txt"

# Fit: every trial's throughput is one point. The points stay in the run directory, the
# raw data behind the fit.
points="$run_dir/usl_points.csv"
awk -F, -v run="$run_id" -v sc="$scenario" '
	NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; print "n,throughput"; next }
	$col["run_id"] == run && $col["scenario"] == sc { print $col["shards"] "," $col["throughput_ops_s"] }
' "$out" >"$points"
charts="$run_dir/charts"
mkdir -p "$charts"
echo "USL fit of $scenario (run $run_id):"
# usl prints its coefficients, and a warning when the fit is poor: keep both with the run.
status=0
"$root/bin/usl" --chart "$charts/usl.png,$charts/usl.svg" --title "$scenario: throughput vs shards" "$points" \
	>"$run_dir/usl.txt" 2>&1 || status=$?
cat "$run_dir/usl.txt"
((status == 0)) || exit "$status"
"$root/bin/report" --csv "$out" --out "$run_dir/report.md" --run-id "$run_id"
echo "sweep report: $(show_path "$run_dir/report.md")" >&2
