#!/usr/bin/env bash
# Runs every scenario of scripts/scenarios.conf at each of its shard counts, repeated
# --trials times with the configurations interleaved, in alternating order (1,3 then 3,1
# then 1,3 ...) so that machine drift hits every side alike. Everything the run writes
# goes into its own directory, results/runs/<run-id>/ (git ignores it; results/latest
# points at it): results.csv, timeseries/, run.txt and report.md with its charts/.
# scripts/promote.sh publishes a run on purpose.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/run_all_scenarios.sh [options]

  --trials N        repetitions of every configuration, interleaved (default 6: the fewest
                    that give a confidence interval of each median; 4 is the fewest with
                    which the report's Mann-Whitney U test can call a difference)
  --warmup D        unmeasured warm-up before each measurement (default 1s)
  --quick           a fast smoke run: ops / 10, keys / 5, 1 trial, warm-up 0.3s (under a minute);
                    it checks that the lab works and cannot conclude anything
  --scenarios FILE  scenario definitions (default scripts/scenarios.conf)
  --only NAME       run only this scenario (repeatable)
  --runs-dir DIR    where the run directory goes (default results/runs); the run writes
                    DIR/<run-id>/ and DIR/../latest points at it
  --no-report       do not generate report.md
  --sync S          SQLite durability: normal or full (default normal)
  --router R        crc32 or jump (default crc32)
  --backend B       sqlite (default) or postgres: postgres creates databases shardlab_lab_s<N>_*
                    on the server SHARDLAB_PG_DSN names and DROPS and recreates them before
                    every measurement, for a fresh start
  --dsn URL         postgres: a server to put shards on instead, repeatable: shard i of a
                    configuration goes to the (i mod servers)-th, so with as many servers
                    as shards each shard has a server of its own (scripts/netlab.sh run
                    scenarios gives one per shard host)
  --no-build        use the binaries already in bin/
  -h, --help        this help
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/run_all_scenarios.sh$(quote_args "$@")"
build=1 trials=6 warmup=1s quick=0 scenarios="$root/scripts/scenarios.conf" only=() runs_dir="$root/results/runs"
report=1 sync=normal router=crc32 backend=sqlite pg_servers=()
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "run_all_scenarios.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;; # --opt=value is --opt value
	--trials) need "$@"; trials=$2; shift 2 ;;
	--quick) quick=1; shift ;;
	--warmup) need "$@"; warmup=$2; shift 2 ;;
	--scenarios) need "$@"; scenarios=$2; shift 2 ;;
	--only) need "$@"; only+=("$2"); shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	--no-report) report=0; shift ;;
	--sync) need "$@"; sync=$2; shift 2 ;;
	--router) need "$@"; router=$2; shift 2 ;;
	--backend) need "$@"; backend=$2; shift 2 ;;
	--dsn) need "$@"; pg_servers+=("$2"); shift 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "run_all_scenarios.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done
[[ $trials =~ ^[0-9]+$ ]] && ((trials >= 1)) || { echo "run_all_scenarios.sh: --trials must be a positive integer" >&2; exit 2; }
[[ -r $scenarios ]] || { echo "run_all_scenarios.sh: cannot read $scenarios" >&2; exit 2; }
# Checked here too, before a run directory exists, so that a typo leaves nothing behind.
[[ $sync == normal || $sync == full ]] || { echo "run_all_scenarios.sh: --sync must be normal or full, got '$sync'" >&2; exit 2; }
[[ $router == crc32 || $router == jump ]] || { echo "run_all_scenarios.sh: --router must be crc32 or jump, got '$router'" >&2; exit 2; }
[[ $backend == sqlite || $backend == postgres ]] || { echo "run_all_scenarios.sh: --backend must be sqlite or postgres, got '$backend'" >&2; exit 2; }
[[ $warmup =~ ^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$ || $warmup == 0 ]] || { echo "run_all_scenarios.sh: --warmup must be a duration such as 2s, got '$warmup'" >&2; exit 2; }
if ((quick)); then trials=1 warmup=0.3s; fi

# Parse and check the scenario file before running anything.
names=() lines=()
lineno=0
while IFS= read -r line || [[ -n $line ]]; do
	lineno=$((lineno + 1))
	[[ $line =~ ^[[:space:]]*(#|$) ]] && continue
	read -r name ops conc wr keys dist preload shards server extra <<<"$line"
	if [[ -z ${shards:-} || -n ${extra:-} ]]; then
		echo "run_all_scenarios.sh: $scenarios:$lineno: want 8 or 9 columns (name ops concurrency write_ratio keys dist preload shards [server])" >&2
		exit 2
	fi
	server_flags "${server:--}" >/dev/null || { echo "run_all_scenarios.sh: $scenarios:$lineno: server options are - or a comma list of sync=normal|full, group-commit, journal=wal|delete, one-conn; got '$server'" >&2; exit 2; }
	if [[ $backend != sqlite && ${server:--} != - ]]; then
		echo "run_all_scenarios.sh: skipping $name: its server options ($server) are SQLite's" >&2
		continue
	fi
	[[ $ops =~ ^[0-9]+$ && $conc =~ ^[0-9]+$ && $keys =~ ^[0-9]+$ ]] || { echo "run_all_scenarios.sh: $scenarios:$lineno: ops, concurrency and keys must be integers" >&2; exit 2; }
	[[ $wr =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v w="$wr" 'BEGIN { exit !(w <= 1) }' || { echo "run_all_scenarios.sh: $scenarios:$lineno: write_ratio must be between 0 and 1" >&2; exit 2; }
	[[ $dist == uniform || $dist == zipfian || $dist == hotspot ]] || { echo "run_all_scenarios.sh: $scenarios:$lineno: dist must be uniform, zipfian or hotspot" >&2; exit 2; }
	[[ $preload == yes || $preload == no ]] || { echo "run_all_scenarios.sh: $scenarios:$lineno: preload must be yes or no" >&2; exit 2; }
	[[ $shards =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "run_all_scenarios.sh: $scenarios:$lineno: shards must be a list like 1,3,5" >&2; exit 2; }
	if ((${#only[@]})); then
		keep=0
		for o in "${only[@]}"; do [[ $o == "$name" ]] && keep=1; done
		((keep)) || continue
	fi
	names+=("$name")
	lines+=("$line")
done <"$scenarios"
((${#lines[@]})) || { echo "run_all_scenarios.sh: no scenario to run" >&2; exit 2; }

if [[ $backend == postgres ]] && ((${#pg_servers[@]} == 0)); then
	[[ -n ${SHARDLAB_PG_DSN:-} ]] || { echo "run_all_scenarios.sh: --backend postgres needs --dsn or SHARDLAB_PG_DSN" >&2; exit 2; }
	pg_servers=("$SHARDLAB_PG_DSN")
fi
((${#pg_servers[@]} == 0)) || [[ $backend == postgres ]] || { echo "run_all_scenarios.sh: --dsn is for --backend postgres" >&2; exit 2; }
run_info_sample # before the build, whose load is the run's own
if ((build)); then
	(cd "$root" && mkdir -p bin && go build -o bin/ ./cmd/demo-server ./cmd/loadgen ./cmd/report)
fi
prefix=""
((quick)) && prefix=quick-
claim_run_dir "$runs_dir" "$(new_run_id "$prefix")" || exit 1
out="$run_dir/results.csv"
extra_args=(--sync "$sync" --router "$router" --backend "$backend" --out "$out" --run-id "$run_id"
	--warmup "$warmup" --command "$cmdline" --no-build)
[[ $backend != postgres ]] || extra_args+=(--create --reset)
# servers N: the --dsn arguments of an N-shard configuration, at most one server a shard.
servers() {
	local b
	for ((b = 0; b < ${#pg_servers[@]} && b < $1; b++)); do printf '%s\0%s\0' --dsn "${pg_servers[b]}"; done
}

echo "run $run_id: ${#lines[@]} scenario(s), $trials trial(s) each, configurations interleaved" >&2
echo "run $run_id: writing to $(show_path "$run_dir")" >&2
run_info_start "$run_dir/run.txt" "$cmdline" "$root"
start=$(date +%s)
for ((trial = 1; trial <= trials; trial++)); do
	for line in "${lines[@]}"; do
		read -r name ops conc wr keys dist preload shards server <<<"$line"
		((quick)) && ops=$((ops / 10)) && keys=$(((keys + 4) / 5))
		mapfile -t own < <(server_flags "${server:--}") # after extra_args: a scenario's sync wins
		pre=()
		[[ $preload == yes ]] && pre=(--preload)
		IFS=, read -r -a shard_list <<<"$shards"
		if ((trial % 2 == 0)); then # alternate the order: no configuration always goes first
			reversed=()
			for ((i = ${#shard_list[@]} - 1; i >= 0; i--)); do reversed+=("${shard_list[i]}"); done
			shard_list=("${reversed[@]}")
		fi
		for n in "${shard_list[@]}"; do
			mapfile -d '' -t dsn_args < <(servers "$n")
			"$root/scripts/run_scenario.sh" --scenario "$name" --ops "$ops" --concurrency "$conc" \
				--writeRatio "$wr" --keys "$keys" --dist "$dist" --shards "$n" --seed "$trial" \
				--first-trial "$trial" "${pre[@]}" "${extra_args[@]}" "${dsn_args[@]}" "${own[@]}"
		done
	done
done
run_info_finish "$run_dir/run.txt"
echo "run $run_id finished in $(($(date +%s) - start))s; rows in $(show_path "$out")" >&2
if ((report)); then
	"$root/bin/report" --csv "$out" --out "$run_dir/report.md" --run-id "$run_id"
	echo "report: $(show_path "$run_dir/report.md")" >&2
fi
if ((quick)); then
	echo "a --quick run only checks that the lab works: one short trial per configuration cannot show a difference (make lab runs 6)" >&2
fi
