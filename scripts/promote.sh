#!/usr/bin/env bash
# Publishes one finished run: copies its run directory, raw data and all, to
# results/published/<name>/, where git tracks it. Runs write only to ignored run
# directories (results/runs/<run-id>/), so nothing becomes a published result by accident.
#
#   scripts/promote.sh results/latest
#   scripts/promote.sh --as sync_full results/runs/20261122T023245Z
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/promote.sh [--as NAME] [--force] RUN_DIR

Copies RUN_DIR (a run directory such as results/runs/<run-id>, or results/latest) with
everything in it (results CSV, per-second samples, charts, report, logs, run.txt) to
results/published/NAME/, NAME being the run id unless --as gives another. Review and
commit it yourself afterwards; the script prints the command.

It refuses a run directory that does not record the command that made it (a
"command:" line in run.txt, machine.txt or meta_*.txt), a run that did not finish
(run.txt without "finished:"), and a destination that exists, unless --force
replaces it.

  --as NAME   name of the published directory (letters, digits, _ . -)
  --force     replace results/published/NAME if it exists
  -h, --help  this help
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
name="" force=0 src=""
while [[ $# -gt 0 ]]; do
	case "$1" in
	--as)
		[[ $# -ge 2 && -n $2 ]] || { echo "promote.sh: --as needs a value" >&2; exit 2; }
		name=$2
		shift 2
		;;
	--force) force=1; shift ;;
	-h | --help) usage; exit 0 ;;
	-*) echo "promote.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	*)
		[[ -z $src ]] || { echo "promote.sh: one run directory at a time (see --help)" >&2; exit 2; }
		src=$1
		shift
		;;
	esac
done
[[ -n $src ]] || { echo "promote.sh: which run directory? (see --help)" >&2; exit 2; }
[[ -d $src ]] || { echo "promote.sh: $src is not a directory" >&2; exit 2; }
src=$(cd "$src" && pwd -P) # results/latest is a link: publish what it points at
[[ -n $name ]] || name=$(basename "$src")
[[ $name =~ ^[A-Za-z0-9_.-]+$ && $name != . && $name != .. ]] || { echo "promote.sh: --as may hold letters, digits, _ . - only" >&2; exit 2; }

# What made this run: without the command, a published number cannot be reproduced.
command_line=$(grep -h -m1 '^command: ' "$src"/run.txt "$src"/machine.txt "$src"/meta_*.txt 2>/dev/null | head -n 1 || true)
[[ -n $command_line ]] || { echo "promote.sh: $src records no command (no \"command:\" line in run.txt, machine.txt or meta_*.txt); not a run directory?" >&2; exit 2; }
if [[ -f $src/run.txt ]] && ! grep -q '^finished: ' "$src/run.txt"; then
	echo "promote.sh: $src/run.txt has no \"finished:\" line: the run did not finish (or is still running)" >&2
	exit 2
fi

dest="$root/results/published/$name"
if [[ -e $dest ]]; then
	((force)) || { echo "promote.sh: results/published/$name exists; choose another name with --as, or --force to replace it" >&2; exit 2; }
	rm -rf "$dest"
fi
mkdir -p "$root/results/published"
tmp=$(mktemp -d "$root/results/published/.promote.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -R "$src/." "$tmp/"
mv "$tmp" "$dest"
trap - EXIT

echo "published $src"
echo "       as results/published/$name ($(find "$dest" -type f | wc -l) files)"
echo "$command_line"
grep -h -m1 '^git_commit: ' "$dest/run.txt" 2>/dev/null || true
if grep -q -- '-dirty' "$dest/run.txt" 2>/dev/null; then
	echo "warning: the run's code had uncommitted changes (git_commit ends in -dirty): a checkout of that commit will not reproduce it" >&2
fi
echo "review it, then: git add results/published/$name && git commit"
