#!/usr/bin/env bash
# Measures what a large cross-shard answer costs shard-proxy in memory (docs/proxy.md,
# "Answers in bounded memory"): fills one table of about --rows x --pad bytes in a
# scratch database, copies it through a proxy onto two shard databases, then reads the
# whole table through a fresh proxy (as it is, ORDER BY id, SELECT DISTINCT, and GROUP BY
# id with an aggregate of the text) and directly from the one database. It also reads, in
# parts of --fetch rows (Execute with a row limit, as JDBC's fetch size), a copy of the
# table that lives on one data source (an unsharded table, on the first shard), and the
# sharded table. For each read it records the proxy's peak resident memory (VmHWM from
# /proc) above its resident memory before the read, and the time to the first row and
# to the end, beside a direct connection's. Writes results/runs/streammem-<time>/:
# results.csv, summary.txt and run.txt.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/stream_memory.sh [options]

  --rows N           rows of the table (default 1000000)
  --pad BYTES        bytes of text per row beside its bigint key (default 1000): the
                     defaults make an answer of about 1 GB
  --fetch N          rows a part for the reads fetched in parts (default 1000)
  --server URL       PostgreSQL server, without a database (default
                     postgres://postgres@127.0.0.1:5432); three scratch databases are
                     made there and dropped at the end
  --max-held-memory BYTES
                     the proxy's bound on what one statement holds (default 67108864),
                     for every read; the last read, groups sorted by an aggregate
                     (ORDER BY count(*)), must gather one row per group: past the bound
                     it is refused with SQLSTATE 54000, and the proxy's peak growth
                     shows the bound held
  --runs-dir DIR     where the run directory goes (default results/runs)
  -h, --help         this help (writes nothing)

Needs psql and go. The scratch databases take about three times the answer's size on disk.
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd -P)
. "$root/scripts/lib.sh"
rows=1000000 pad=1000 fetch=1000 server=postgres://postgres@127.0.0.1:5432 runs="$root/results/runs" held=67108864
command_line="scripts/stream_memory.sh$(quote_args "$@")"
while (($#)); do
	case $1 in
	--rows) rows=${2:?--rows needs a value}; shift 2 ;;
	--pad) pad=${2:?--pad needs a value}; shift 2 ;;
	--fetch) fetch=${2:?--fetch needs a value}; shift 2 ;;
	--server) server=${2:?--server needs a value}; shift 2 ;;
	--runs-dir) runs=${2:?--runs-dir needs a value}; shift 2 ;;
	--max-held-memory) held=${2:?--max-held-memory needs a value}; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
	esac
done
[[ $rows =~ ^[1-9][0-9]*$ ]] || { echo "--rows must be a positive integer, got $rows" >&2; exit 2; }
[[ $fetch =~ ^[1-9][0-9]*$ ]] && ((fetch <= 4294967295)) || { echo "--fetch must be a positive integer below 2^32, got $fetch" >&2; exit 2; }
[[ $pad =~ ^[0-9]+$ ]] || { echo "--pad must be a non-negative integer, got $pad" >&2; exit 2; }
[[ $held =~ ^[0-9]+$ ]] && ((held >= 1048576)) || { echo "--max-held-memory must be at least 1048576 bytes, got $held" >&2; exit 2; }
for tool in psql go; do
	command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
psql -X -q "$server/postgres" -c 'SELECT 1' >/dev/null || { echo "cannot reach PostgreSQL at $server" >&2; exit 1; }

claim_run_dir "$runs" "$(new_run_id streammem-)"
echo "run directory: $(show_path "$run_dir")"
tag="streammem_$$"
one="${tag}_one" s0="${tag}_s0" s1="${tag}_s1"
proxy_pid=""
bin=$(mktemp -d)
cleanup() {
	[[ -n $proxy_pid ]] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null
	for db in "$one" "$s0" "$s1"; do
		psql -X -q "$server/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	done
	rm -rf "$bin"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building shard-proxy and netprobe"
go build -o "$bin/shard-proxy" "$root/cmd/shard-proxy"
go build -o "$bin/netprobe" "$root/cmd/netprobe"

for db in "$one" "$s0" "$s1"; do
	psql -X -q "$server/postgres" -c "CREATE DATABASE $db" >/dev/null
	psql -X -q "$server/$db" -c "CREATE TABLE big (id bigint PRIMARY KEY, pad text)" >/dev/null
done
echo "filling $rows rows of $pad bytes"
psql -X -q "$server/$one" -c "INSERT INTO big SELECT g, repeat('x', $pad) FROM generate_series(1, $rows) g; ANALYZE big" >/dev/null

# start_proxy: a fresh proxy over the two shards; sets proxy_pid and proxy_url.
start_proxy() {
	rm -f "$run_dir/addr"
	"$bin/shard-proxy" --database app --listen 127.0.0.1:0 --addr-file "$run_dir/addr" \
		--shard "$server/$s0?sslmode=disable" --shard "$server/$s1?sslmode=disable" \
		--sharded big=id --log-level warn --max-held-memory "$held" 2>>"$run_dir/proxy.log" &
	proxy_pid=$!
	for _ in $(seq 100); do [[ -s $run_dir/addr ]] && break; sleep 0.1; done
	[[ -s $run_dir/addr ]] || { echo "shard-proxy did not start; see $(show_path "$run_dir/proxy.log")" >&2; exit 1; }
	proxy_url="postgres://postgres@$(cat "$run_dir/addr")/app?sslmode=disable"
}
stop_proxy() {
	kill "$proxy_pid" && wait "$proxy_pid" 2>/dev/null || true
	proxy_pid=""
}
kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$proxy_pid/status"; }

echo "copying it through the proxy onto two shards"
start_proxy
psql -X -q "$server/$one" -c "COPY big TO STDOUT" | psql -X -q "$proxy_url" -c "COPY big FROM STDIN"
psql -X -q "$server/$s0" -c "ANALYZE big" >/dev/null
psql -X -q "$server/$s1" -c "ANALYZE big" >/dev/null
stop_proxy
# flat: the same rows in one table on one data source (unsharded tables live on the
# first shard); directly, a view of big.
psql -X -q "$server/$s0" -c "CREATE TABLE flat AS SELECT * FROM big WHERE false" >/dev/null
psql -X -q "$server/$one" -c "COPY big TO STDOUT" | psql -X -q "$server/$s0" -c "COPY flat FROM STDIN"
psql -X -q "$server/$one" -c "CREATE VIEW flat AS SELECT * FROM big" >/dev/null

echo "path,read,rows,bytes,first_row_ms,total_ms,proxy_rss_before_kib,proxy_hwm_kib,proxy_growth_kib" >"$run_dir/results.csv"
query_of() {
	case $1 in
	concatenated | sharded_in_parts) echo "SELECT id, pad FROM big" ;;
	ordered) echo "SELECT id, pad FROM big ORDER BY id" ;;
	distinct) echo "SELECT DISTINCT id, pad FROM big" ;;
	grouped) echo "SELECT id, count(*), max(pad) FROM big GROUP BY id" ;;
	one_shard_in_parts) echo "SELECT id, pad FROM flat" ;;
	esac
}
fetch_of() { case $1 in *_in_parts) echo "$fetch" ;; *) echo 0 ;; esac; }
for read in concatenated ordered distinct grouped one_shard_in_parts sharded_in_parts; do
	query=$(query_of "$read") f=$(fetch_of "$read")
	if ((f > 0)); then echo "reading: $query ($f rows a part)"; else echo "reading: $query"; fi
	out=$("$bin/netprobe" read --timeout 30m --fetch "$f" --query "$query" "$server/$one?sslmode=disable")
	eval "$(tr ' ' '\n' <<<"$out" | sed 's/^/r_/')"
	echo "direct,$read,$r_rows,$r_bytes,$r_first_row_ms,$r_total_ms,,," >>"$run_dir/results.csv"
	start_proxy
	"$bin/netprobe" sql --count 20 "$proxy_url" >/dev/null # pools and plans warm
	before=$(kib VmRSS)
	if out=$("$bin/netprobe" read --timeout 30m --fetch "$f" --query "$query" "$proxy_url" 2>&1); then
		hwm=$(kib VmHWM)
		stop_proxy
		eval "$(tr ' ' '\n' <<<"$out" | sed 's/^/r_/')"
		echo "proxy,$read,$r_rows,$r_bytes,$r_first_row_ms,$r_total_ms,$before,$hwm,$((hwm - before))" >>"$run_dir/results.csv"
	elif grep -q 54000 <<<"$out"; then
		# Read whole within the bound, past it refused (docs/proxy.md).
		hwm=$(kib VmHWM)
		stop_proxy
		echo "proxy,${read}_refused_54000,,,,,$before,$hwm,$((hwm - before))" >>"$run_dir/results.csv"
	else
		echo "$out" >&2
		exit 1
	fi
done

# The last read: one row per group gathered to be sorted, past the bound.
query="SELECT id, count(*) FROM big GROUP BY id ORDER BY count(*) DESC, id"
echo "reading: $query (--max-held-memory $held)"
start_proxy
"$bin/netprobe" sql --count 20 "$proxy_url" >/dev/null
before=$(kib VmRSS)
if out=$("$bin/netprobe" read --timeout 30m --query "$query" "$proxy_url" 2>&1); then
	outcome=answered
elif grep -q 54000 <<<"$out"; then
	outcome=refused_54000
else
	outcome=failed
fi
hwm=$(kib VmHWM)
stop_proxy
echo "proxy,gathered_$outcome,,,,,$before,$hwm,$((hwm - before))" >>"$run_dir/results.csv"

{
	echo "command: $command_line"
	echo "commit: $(git_commit "$root")"
	echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$run_dir/run.txt"
awk -F, -v held="$held" -v fetch="$fetch" -v q1="$(query_of concatenated)" -v q2="$(query_of ordered)" -v q3="$(query_of distinct)" -v q4="$(query_of grouped)" -v q5="$(query_of one_shard_in_parts)" '
BEGIN {
	query["concatenated"] = q1; query["ordered"] = q2; query["distinct"] = q3; query["grouped"] = q4
	query["one_shard_in_parts"] = q5 ", " fetch " rows a part"; query["sharded_in_parts"] = q1 ", " fetch " rows a part"
}
NR > 1 {
	if ($1 == "direct") { first[$2] = $5; total[$2] = $6; next }
	if ($2 ~ /_refused_54000$/ && $2 !~ /^gathered_/) {
		r = substr($2, 1, length($2) - 14)
		printf "%s (%s, --max-held-memory %.0f MB): refused_54000; proxy peak growth %.1f MB\n", r, query[r], held / 1048576, $9 / 1024
		next
	}
	if ($2 ~ /^gathered_/) {
		printf "gathered (SELECT id, count(*) FROM big GROUP BY id ORDER BY count(*) DESC, id, --max-held-memory %.0f MB): %s; proxy peak growth %.1f MB\n", held / 1048576, substr($2, 10), $9 / 1024
		next
	}
	printf "%s (%s): %d rows, %.0f MB; proxy peak growth %.1f MB; first row %.1f ms (direct %.1f ms); whole answer %.1f s (direct %.1f s)\n",
		$2, query[$2], $3, $4 / 1e6, $9 / 1024, $5, first[$2], $6 / 1000, total[$2] / 1000
}' "$run_dir/results.csv" | tee "$run_dir/summary.txt"
