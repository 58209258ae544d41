# Helpers shared by the lab scripts. Source it (it only defines functions):
#
#   . "$root/scripts/lib.sh"
#
# Every run writes into a directory of its own, results/runs/<run-id>/, which git
# ignores; results/latest points at the newest. Published results are copied out of a
# run directory on purpose, by scripts/promote.sh.

# quote_args ARG...: the arguments shell-quoted, each after a space, and nothing at all
# for no arguments, so that "scripts/x.sh$(quote_args "$@")" runs again exactly as typed.
# (printf ' %q' with no arguments prints '' and records a command that fails.)
quote_args() {
	(($# == 0)) || printf ' %q' "$@"
}

# new_run_id [PREFIX]: a run id made of PREFIX and the UTC time, e.g. sweep-20261122T023016Z.
new_run_id() {
	printf '%s%s\n' "${1:-}" "$(date -u +%Y%m%dT%H%M%SZ)"
}

# claim_run_dir RUNS_DIR RUN_ID: creates RUNS_DIR/RUN_ID, or RUN_ID-2, RUN_ID-3 ... when
# that is taken (two runs started in the same second), and points "latest" beside
# RUNS_DIR at it. Sets run_id and run_dir (absolute).
claim_run_dir() {
	local runs=$1 base=$2 n=1
	mkdir -p "$runs" || return 1
	run_id=$base
	# mkdir without -p fails on an existing directory: the claim is atomic.
	until mkdir "$runs/$run_id" 2>/dev/null; do
		[[ -d $runs/$run_id ]] || { echo "cannot create the run directory $runs/$run_id" >&2; return 1; }
		n=$((n + 1))
		run_id="$base-$n"
	done
	run_dir=$(cd "$runs/$run_id" && pwd -P)
	local parent latest
	parent=$(cd "$runs/.." && pwd -P)
	latest="$parent/latest"
	if [[ -e $latest && ! -L $latest ]]; then
		echo "note: $latest exists and is not a symbolic link; left as it is" >&2
	else
		ln -sfn "$(basename "$(cd "$runs" && pwd -P)")/$run_id" "$latest"
	fi
}

# discard_run_dir: removes the directory claim_run_dir made, for a run that was refused
# before it measured anything, and the "latest" link when it points there.
discard_run_dir() {
	local latest
	latest="$(dirname "$run_dir")/../latest"
	if [[ -L $latest && $(cd "$latest" 2>/dev/null && pwd -P) == "$run_dir" ]]; then
		rm -f "$latest"
	fi
	rm -rf "$run_dir"
}

# show_path PATH: PATH relative to the current directory when it lies below it, for
# messages a user can copy.
show_path() {
	local here
	here=$(pwd -P)
	if [[ $1 == "$here"/* ]]; then printf '%s\n' "${1#"$here"/}"; else printf '%s\n' "$1"; fi
}

# git_commit ROOT: the short commit of the checkout at ROOT, with "-dirty" when tracked
# files differ from it. Files under results/ do not count: they are the lab's output,
# not its code, and a run must not call itself dirty because of what it wrote.
git_commit() {
	local commit
	commit=$(git -C "$1" rev-parse --short=12 HEAD 2>/dev/null) || { echo unknown; return 0; }
	if [[ -n $(git -C "$1" status --porcelain --untracked-files=no -- . ':(exclude)results' 2>/dev/null) ]]; then
		commit="$commit-dirty"
	fi
	printf '%s\n' "$commit"
}

# machine_cpu_s: CPU seconds the whole machine has been busy since boot, from
# /proc/stat (user, nice, system, irq, softirq and steal: all but idle and iowait).
machine_cpu_s() {
	awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { printf "%.2f\n", ($2 + $3 + $4 + $7 + $8 + $9) / hz; exit }' /proc/stat
}

# children_times FILE: writes the times builtin's output to FILE. Its second line is the
# CPU time used by the finished children of this shell and their waited-for descendants.
# times must run in this very shell, not in a pipe or $(...), which would fork and count
# nothing: call this function directly and read FILE with times_cpu_s.
children_times() {
	times >"$1"
}

# times_cpu_s FILE: the children's user + system seconds from a children_times FILE.
times_cpu_s() {
	awk 'NR == 2 {
		s = 0
		for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); s += p[1] * 60 + p[2] }
		printf "%.2f\n", s
	}' "$1"
}

# run_info_sample: notes the time, the load average and the CPU counters that a run is
# measured from. Scripts call it before they build the binaries, so that the load a
# build causes does not read as other work on the machine (the build's CPU time counts
# as the run's own). run_info_start samples if this was not called.
run_info_sample() {
	_run_info_tmp=$(mktemp "${TMPDIR:-/tmp}/shardlab-times.XXXXXX")
	_run_info_load0=$(cut -d' ' -f1-3 /proc/loadavg)
	_run_info_wall0=$(date +%s.%N)
	_run_info_machine0=$(machine_cpu_s)
	children_times "$_run_info_tmp"
	_run_info_lab0=$(times_cpu_s "$_run_info_tmp")
}

# run_info_start FILE COMMAND ROOT: writes the head of a run's run.txt: what ran, from
# which commit, on what machine, and how loaded the machine was. run_info_finish adds
# the end. The report reads this file; scripts/promote.sh requires its command line.
run_info_start() {
	local file=$1 command=$2 root=$3
	[[ -n ${_run_info_tmp:-} ]] || run_info_sample
	{
		echo "run_id: $run_id"
		echo "command: $command"
		echo "git_commit: $(git_commit "$root")"
		echo "started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "cpus: $(nproc)"
		echo "cpu_model: $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)"
		echo "loadavg_start: $_run_info_load0"
	} >"$file"
}

# run_info_finish FILE: appends the end time, the load average at the end, and the CPU
# time the machine and the run's own processes used since run_info_start, from which the
# report works out how much CPU other work took during the run.
run_info_finish() {
	local file=$1 wall machine lab
	wall=$(awk -v a="$_run_info_wall0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
	machine=$(awk -v a="$_run_info_machine0" -v b="$(machine_cpu_s)" 'BEGIN { printf "%.2f", b - a }')
	children_times "$_run_info_tmp"
	lab=$(awk -v a="$_run_info_lab0" -v b="$(times_cpu_s "$_run_info_tmp")" 'BEGIN { printf "%.2f", b - a }')
	rm -f "$_run_info_tmp"
	_run_info_tmp=""
	{
		echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "loadavg_end: $(cut -d' ' -f1-3 /proc/loadavg)"
		echo "wall_s: $wall"
		echo "machine_cpu_s: $machine"
		echo "lab_cpu_s: $lab"
	} >>"$file"
}

# server_flags turns a scenario's server column (- or a comma list such as
# sync=full,group-commit) into run_scenario.sh options, one a line; it fails on an unknown one.
server_flags() {
	[[ $1 == - ]] && return 0
	local o opts
	IFS=, read -r -a opts <<<"$1"
	for o in "${opts[@]}"; do
		case $o in
		sync=normal | sync=full) printf '%s\n' --sync "${o#sync=}" ;;
		journal=wal | journal=delete) printf '%s\n' --journal "${o#journal=}" ;;
		group-commit) printf '%s\n' --group-commit ;;
		one-conn) printf '%s\n' --one-conn ;;
		*) return 1 ;;
		esac
	done
}
