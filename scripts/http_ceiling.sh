#!/usr/bin/env bash
# Measures the demo-server's read throughput (single mode, SQLite, preloaded keys) as a
# share of a trivial net/http handler's (cmd/http-ceiling), both driven by the same
# loadgen, trials interleaved. Prints one line per trial and the median ratio.
set -euo pipefail
usage() {
	cat <<'USAGE'
Usage: scripts/http_ceiling.sh [--trials N] [--ops N] [--concurrency N] [--no-build]
  --trials N        interleaved trials (default 5)
  --ops N           read requests per measurement (default 30000)
  --concurrency N   loadgen workers (default 32)
  --no-build        use the binaries already in bin/
USAGE
}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
trials=5 ops=30000 conc=32 build=1
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "http_ceiling.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--trials) need "$@"; trials=$2; shift 2 ;;
	--ops) need "$@"; ops=$2; shift 2 ;;
	--concurrency) need "$@"; conc=$2; shift 2 ;;
	--no-build) build=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "http_ceiling.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
for v in "$trials" "$ops" "$conc"; do [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "http_ceiling.sh: numbers must be positive integers" >&2; exit 2; }; done
if ((build)); then
	(cd "$root" && mkdir -p bin && go build -o bin/ ./cmd/demo-server ./cmd/loadgen ./cmd/http-ceiling)
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/shardlab-ceiling.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
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
	printf 'trial %d: http ceiling %s ops/s, demo-server single %s ops/s, ratio %s\n' "$t" "$c" "$d" "$r"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "median ratio %.3f (min %.3f, max %.3f) over %d trials\n", m, a[1], a[NR], NR }'
