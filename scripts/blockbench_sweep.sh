#!/usr/bin/env bash
# Threshold sweep of the autoshard block store, as published in docs/autoshard.md.
# Bounded for a shared 2-core machine: 5 thresholds x ROUNDS rounds, each run
# stops at TARGET blocks or MAX_DURATION. Override with environment variables.
set -euo pipefail
cd "$(dirname "$0")/.."

THRESHOLDS=${THRESHOLDS:-never,125k,250k,500k,1M}
TARGET=${TARGET:-3000000}
MAX_DURATION=${MAX_DURATION:-4m}
ROUNDS=${ROUNDS:-3}
RESULTS=${RESULTS:-results/blockbench}

bin=$(mktemp -d)/blockbench
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./cmd/blockbench

mkdir -p "$RESULTS"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "nproc: $(nproc)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "memory: $(grep MemTotal /proc/meminfo | awk '{print $2/1024/1024 " GiB"}')"
	"$bin" env
	echo "driver: modernc.org/sqlite $(go list -m -f '{{.Version}}' modernc.org/sqlite)"
	echo "loadavg at start: $(cat /proc/loadavg)"
	echo "command: scripts/blockbench_sweep.sh, that is: blockbench sweep --thresholds $THRESHOLDS --target-blocks $TARGET --max-duration $MAX_DURATION --rounds $ROUNDS --results $RESULTS"
} > "$RESULTS/machine.txt"

"$bin" sweep --thresholds "$THRESHOLDS" --target-blocks "$TARGET" \
	--max-duration "$MAX_DURATION" --rounds "$ROUNDS" --results "$RESULTS" "$@"
echo "loadavg at end: $(cat /proc/loadavg)" >> "$RESULTS/machine.txt"
echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$RESULTS/machine.txt"
