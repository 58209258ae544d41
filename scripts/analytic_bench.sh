#!/usr/bin/env bash
# An analytic workload through shard-proxy over several shards, beside one database
# holding the same rows (docs/sql-sharding.md, "The coordinator database"): a schema of
# 7 tables shaped after TPC-H's (region and nation broadcast; customer, part, supplier,
# orders and lineitem sharded, orders and lineitem bound on the order key), a million
# orders and three million line items at --scale 1, and queries that join, aggregate
# and subquery across shards, and one write that joins across them (an idempotent
# UPDATE ... FROM). Each query runs --rounds times on each side, alternating;
# for each it records the time through the proxy and on the one database, the strategy
# the proxy's route preview names (one shard, the merge, the coordinator), the rows and
# bytes the coordinator read from the shards (SHOW COORDINATOR), and whether both
# answers are the same (an md5 of psql's output). Writes results/runs/analytic-<time>/:
# results.csv, summary.txt and run.txt.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/analytic_bench.sh [options]

  --scale S          size: S x 1,000,000 orders and S x 3,000,000 line items (default 1;
                     0.1 makes a quick run)
  --shards N         shard databases behind the proxy (default 4)
  --rounds N         runs of each query on each side, alternating (default 3)
  --server URL       PostgreSQL server, without a database (default
                     postgres://postgres@127.0.0.1:5432); N+1 scratch databases are made
                     there and dropped at the end
  --runs-dir DIR     where the run directory goes (default results/runs)
  -h, --help         this help (writes nothing)

Needs psql and go. At --scale 1 the databases take about 2 x 1.2 GB on disk, and the
load about 3 minutes on a 2-CPU machine.
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd -P)
. "$root/scripts/lib.sh"
scale=1 shards=4 rounds=3 server=postgres://postgres@127.0.0.1:5432 runs="$root/results/runs"
command_line="scripts/analytic_bench.sh$(quote_args "$@")"
while (($#)); do
	case $1 in
	--scale) scale=${2:?--scale needs a value}; shift 2 ;;
	--shards) shards=${2:?--shards needs a value}; shift 2 ;;
	--rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
	--server) server=${2:?--server needs a value}; shift 2 ;;
	--runs-dir) runs=${2:?--runs-dir needs a value}; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
	esac
done
if ! [[ $scale =~ ^[0-9]+(\.[0-9]+)?$ ]] || ! awk -v s="$scale" 'BEGIN { exit !(s > 0 && s <= 100) }'; then
	echo "--scale must be a number above 0 and at most 100, got $scale" >&2
	exit 2
fi
if ! [[ $shards =~ ^[0-9]+$ ]] || ((shards < 2 || shards > 16)); then
	echo "--shards must be 2..16, got $shards" >&2
	exit 2
fi
if ! [[ $rounds =~ ^[0-9]+$ ]] || ((rounds < 1)); then
	echo "--rounds must be a positive integer, got $rounds" >&2
	exit 2
fi
for tool in psql go; do
	command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
psql -X -q "$server/postgres" -c 'SELECT 1' >/dev/null || { echo "cannot reach PostgreSQL at $server" >&2; exit 1; }

n() { awk -v s="$scale" -v b="$1" 'BEGIN { v = int(s * b); print (v < 1 ? 1 : v) }'; }
orders=$(n 1000000) customers=$(n 100000) parts=$(n 200000) suppliers=$(n 10000)

claim_run_dir "$runs" "$(new_run_id analytic-)"
echo "run directory: $(show_path "$run_dir")"
tag="analytic_$$"
one="${tag}_one"
dbs=("$one")
for ((i = 0; i < shards; i++)); do dbs+=("${tag}_s$i"); done
proxy_pid=""
bin=$(mktemp -d)
cleanup() {
	[[ -n $proxy_pid ]] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null
	for db in "${dbs[@]}" "${tag}_s0_coordinator"; do
		psql -X -q "$server/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	done
	rm -rf "$bin"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run_info_sample
echo "building shard-proxy and netprobe"
go build -o "$bin/shard-proxy" "$root/cmd/shard-proxy"
go build -o "$bin/netprobe" "$root/cmd/netprobe"
for db in "${dbs[@]}"; do
	psql -X -q "$server/postgres" -c "CREATE DATABASE $db" >/dev/null
done

# The rules: every table of the layout on every shard under its own name.
{
	printf 'broadcast = ["region", "nation"]\n\n'
	for ((i = 0; i < shards; i++)); do
		printf '[[data_source]]\nname = "ds_%d"\ndsn = "%s/%s_s%d?sslmode=disable"\n\n' "$i" "$server" "$tag" "$i"
	done
	for t in customer:c_custkey part:p_partkey supplier:s_suppkey orders:o_orderkey lineitem:l_orderkey; do
		printf '[[sharded_table]]\nname = "%s"\ncolumn = "%s"\n\n' "${t%%:*}" "${t#*:}"
	done
	printf '[[binding]]\ntables = ["orders", "lineitem"]\n'
} >"$run_dir/rules.toml"

rm -f "$run_dir/addr"
"$bin/shard-proxy" --database app --listen 127.0.0.1:0 --addr-file "$run_dir/addr" --config "$run_dir/rules.toml" \
	--admin-database shardlab --log-level warn 2>>"$run_dir/proxy.log" &
proxy_pid=$!
for _ in $(seq 100); do [[ -s $run_dir/addr ]] && break; sleep 0.1; done
[[ -s $run_dir/addr ]] || { echo "shard-proxy did not start; see $(show_path "$run_dir/proxy.log")" >&2; exit 1; }
proxy_url="postgres://postgres@$(cat "$run_dir/addr")/app?sslmode=disable"
run_info_start "$run_dir/run.txt" "$command_line" "$root"
admin_url="postgres://postgres@$(cat "$run_dir/addr")/shardlab?sslmode=disable"
one_url="$server/$one?sslmode=disable"

schema=(
	"CREATE TABLE region (r_regionkey int PRIMARY KEY, r_name text NOT NULL)"
	"CREATE TABLE nation (n_nationkey int PRIMARY KEY, n_name text NOT NULL, n_regionkey int NOT NULL)"
	"CREATE TABLE customer (c_custkey bigint PRIMARY KEY, c_name text NOT NULL, c_nationkey int NOT NULL,
		c_acctbal numeric(12,2) NOT NULL, c_mktsegment text NOT NULL)"
	"CREATE TABLE part (p_partkey bigint PRIMARY KEY, p_name text NOT NULL, p_brand text NOT NULL, p_type text NOT NULL,
		p_retailprice numeric(12,2) NOT NULL)"
	"CREATE TABLE supplier (s_suppkey bigint PRIMARY KEY, s_name text NOT NULL, s_nationkey int NOT NULL, s_acctbal numeric(12,2) NOT NULL)"
	"CREATE TABLE orders (o_orderkey bigint PRIMARY KEY, o_custkey bigint NOT NULL, o_orderstatus char(1) NOT NULL,
		o_totalprice numeric(12,2) NOT NULL, o_orderdate date NOT NULL, o_orderpriority text NOT NULL)"
	"CREATE TABLE lineitem (l_orderkey bigint NOT NULL, l_linenumber int NOT NULL, l_partkey bigint NOT NULL,
		l_suppkey bigint NOT NULL, l_quantity numeric(12,2) NOT NULL, l_extendedprice numeric(12,2) NOT NULL,
		l_discount numeric(12,2) NOT NULL, l_returnflag char(1) NOT NULL, l_linestatus char(1) NOT NULL,
		l_shipdate date NOT NULL, PRIMARY KEY (l_orderkey, l_linenumber))"
)
for stmt in "${schema[@]}"; do
	psql -X -q -v ON_ERROR_STOP=1 "$one_url" -c "$stmt" >/dev/null
	psql -X -q -v ON_ERROR_STOP=1 "$proxy_url" -c "$stmt" >/dev/null
done

echo "generating $orders orders, $((orders * 3)) line items, $customers customers, $parts parts, $suppliers suppliers"
psql -X -q -v ON_ERROR_STOP=1 "$one_url" >/dev/null <<SQL
SELECT setseed(0.42);
INSERT INTO region SELECT g, 'region ' || g FROM generate_series(0, 4) g;
INSERT INTO nation SELECT g, 'nation ' || g, g % 5 FROM generate_series(0, 24) g;
INSERT INTO customer SELECT g, 'customer ' || g, (g * 7) % 25, round((random() * 10000 - 1000)::numeric, 2),
	(ARRAY['AUTOMOBILE', 'BUILDING', 'FURNITURE', 'HOUSEHOLD', 'MACHINERY'])[1 + g % 5] FROM generate_series(1, $customers) g;
INSERT INTO part SELECT g, 'part ' || g, 'Brand#' || (1 + g % 25), (ARRAY['STEEL', 'BRASS', 'COPPER', 'TIN', 'NICKEL'])[1 + g % 5],
	round((900 + (g % 1000) + random() * 100)::numeric, 2) FROM generate_series(1, $parts) g;
INSERT INTO supplier SELECT g, 'supplier ' || g, (g * 11) % 25, round((random() * 10000)::numeric, 2) FROM generate_series(1, $suppliers) g;
INSERT INTO orders SELECT g, 1 + (g * 7919) % $customers, (ARRAY['F', 'O', 'P'])[1 + g % 3], 0,
	date '1992-01-01' + (g % 2400)::int, (ARRAY['1-URGENT', '2-HIGH', '3-MEDIUM', '4-NOT SPECIFIED', '5-LOW'])[1 + g % 5]
	FROM generate_series(1::bigint, $orders) g;
INSERT INTO lineitem SELECT o, l, 1 + (o * 31 + l) % $parts, 1 + (o * 17 + l) % $suppliers, 1 + (o + l) % 50,
	round(((1 + (o + l) % 50) * (900 + (o * 31 + l) % 1000))::numeric, 2), ((o + l) % 11) / 100.0,
	(ARRAY['A', 'N', 'R'])[1 + (o + l) % 3], (ARRAY['F', 'O'])[1 + o % 2], date '1992-01-02' + (o % 2400)::int + l * 7
	FROM generate_series(1::bigint, $orders) o, generate_series(1, 3) l;
UPDATE orders SET o_totalprice = t.s FROM (SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) s FROM lineitem GROUP BY 1) t
	WHERE t.l_orderkey = o_orderkey;
ANALYZE;
SQL
echo "copying the rows through the proxy onto $shards shards"
for t in region nation customer part supplier orders lineitem; do
	psql -X -q "$one_url" -c "COPY $t TO STDOUT" | psql -X -q -v ON_ERROR_STOP=1 "$proxy_url" -c "COPY $t FROM STDIN"
done
psql -X -q "$proxy_url" -c "ANALYZE" >/dev/null

# The queries: name|SQL. Each is answered exactly, by one shard, the merge or the
# coordinator; the answer's md5 on both sides says so.
queries=(
	"point|SELECT * FROM orders WHERE o_orderkey = 4242"
	"pricing_summary|SELECT l_returnflag, l_linestatus, sum(l_quantity), sum(l_extendedprice), avg(l_discount), count(*) FROM lineitem WHERE l_shipdate <= date '1998-09-01' GROUP BY 1, 2 ORDER BY 1, 2"
	"colocated_join|SELECT o_orderpriority, count(*), sum(l_quantity) FROM orders JOIN lineitem ON l_orderkey = o_orderkey WHERE o_orderdate >= date '1996-01-01' AND o_orderdate < date '1996-04-01' GROUP BY 1 ORDER BY 1"
	"shipping_priority|SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate FROM customer, orders, lineitem WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate < date '1995-03-15' AND l_shipdate > date '1995-03-15' GROUP BY l_orderkey, o_orderdate ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10"
	"nation_revenue|SELECT n_name, sum(o_totalprice) AS revenue FROM customer JOIN orders ON o_custkey = c_custkey JOIN nation ON n_nationkey = c_nationkey JOIN region ON r_regionkey = n_regionkey WHERE r_name = 'region 2' AND o_orderdate >= date '1994-01-01' AND o_orderdate < date '1995-01-01' GROUP BY n_name ORDER BY revenue DESC, n_name"
	"busy_customers_cte|WITH per_customer AS (SELECT o_custkey, count(*) AS n FROM orders GROUP BY o_custkey) SELECT n, count(*) FROM per_customer GROUP BY n HAVING count(*) > 10 ORDER BY n"
	"sum_over_lineitem|SELECT coalesce(sum(l_quantity), 0), round(avg(l_extendedprice), 2), count(*)::int FROM lineitem WHERE l_shipdate >= date '1995-01-01'"
	"priority_having|SELECT o_orderpriority, count(*), round(avg(o_totalprice), 2) FROM orders GROUP BY o_orderpriority HAVING count(*) > 1000 ORDER BY 1"
	"distinct_customers|SELECT count(DISTINCT o_custkey) FROM orders WHERE o_orderdate >= date '1997-01-01'"
	"top_balance_window|SELECT c_nationkey, c_custkey, c_acctbal FROM (SELECT c_nationkey, c_custkey, c_acctbal, rank() OVER (PARTITION BY c_nationkey ORDER BY c_acctbal DESC, c_custkey) AS r FROM customer) s WHERE r <= 2 ORDER BY 1, 2"
	"big_spenders_semijoin|SELECT count(*), round(avg(c_acctbal), 2) FROM customer WHERE c_custkey IN (SELECT o_custkey FROM orders WHERE o_totalprice > 180000)"
	"supplier_nation_join|SELECT s_nationkey, count(*), sum(l_extendedprice) FROM lineitem JOIN supplier ON s_suppkey = l_suppkey WHERE l_shipdate >= date '1996-01-01' GROUP BY s_nationkey ORDER BY s_nationkey"
	"part_supplier_join|SELECT p_brand, count(DISTINCT l_suppkey) FROM lineitem JOIN part ON p_partkey = l_partkey WHERE p_type = 'BRASS' AND l_shipdate >= date '1996-01-01' AND l_shipdate < date '1996-02-01' GROUP BY p_brand ORDER BY p_brand"
	# A write that reads another table across shards, whose SET list reads it: each run
	# writes the values the rows hold, so the rounds change nothing.
	"update_from_join|UPDATE orders SET o_custkey = c_custkey FROM customer WHERE c_custkey = o_custkey AND c_mktsegment = 'BUILDING'"
)

admin() { psql -X -At -F, "$admin_url" -c "$1"; }
strategy() {
	local route
	route=$(admin "SHOW ROUTE $1" 2>&1 || true)
	if grep -q "each shard aggregates" <<<"$route"; then echo shard_aggregates
	elif grep -q "coordinator database evaluates" <<<"$route"; then echo coordinator
	elif grep -q "merge:" <<<"$route"; then echo merge
	elif grep -q "(1 target)" <<<"$route"; then echo one_shard
	elif grep -q " in steps: " <<<"$route"; then echo steps
	else echo "refused"; fi
}
moved() { admin "SHOW COORDINATOR" | awk -F, '{ print $2 "," $5 "," $6 }'; }
# read_once SQL URL: runs SQL once, reading its answer as it comes; prints rows,total_ms.
read_once() {
	"$bin/netprobe" read --timeout 30m --query "$1" "$2" |
		tr ' ' '\n' | awk -F= '$1 == "rows" { r = $2 } $1 == "total_ms" { t = $2 } END { print r "," t }'
}
echo "query,strategy,round,path,rows,total_ms,rows_moved,bytes_moved,same_answer" >"$run_dir/results.csv"
for entry in "${queries[@]}"; do
	name=${entry%%|*} sql=${entry#*|}
	how=$(strategy "$sql")
	a=$(psql -X -At "$one_url" -c "$sql" | md5sum | cut -c1-32)
	b=$(psql -X -At "$proxy_url" -c "$sql" 2>>"$run_dir/proxy.log" | md5sum | cut -c1-32)
	same=$([[ $a == "$b" ]] && echo yes || echo no)
	echo "$name: $how, answers $([[ $same == yes ]] && echo equal || echo DIFFERENT)"
	for ((r = 1; r <= rounds; r++)); do
		echo "$name,$how,$r,one,$(read_once "$sql" "$one_url"),,,$same" >>"$run_dir/results.csv"
		before=$(moved | cut -d, -f1)
		timed=$(read_once "$sql" "$proxy_url")
		IFS=, read -r after last_rows last_bytes <<<"$(moved)"
		if ((after == before)); then last_rows=0 last_bytes=0; fi
		echo "$name,$how,$r,proxy,$timed,$last_rows,$last_bytes,$same" >>"$run_dir/results.csv"
	done
done
run_info_finish "$run_dir/run.txt"
{
	echo "scale $scale: $orders orders, $((orders * 3)) line items, $customers customers, $parts parts, $suppliers suppliers; $shards shards"
	awk -F, 'NR > 1 {
		k = $1; strat[k] = $2; same[k] = $9
		if ($4 == "one") one[k] = one[k] " " $6; else { prx[k] = prx[k] " " $6; rows[k] = $7; bytes[k] = $8 }
		if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	}
	function median(s,    a, m, i, j, t) {
		m = split(s, a, " ")
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
	}
	END {
		printf "%-24s %-16s %12s %12s %8s %12s %14s %s\n", "query", "strategy", "one_db_ms", "proxy_ms", "ratio", "rows_moved", "bytes_moved", "same"
		for (i = 1; i <= n; i++) {
			k = order[i]; o = median(one[k]); p = median(prx[k])
			printf "%-24s %-16s %12.1f %12.1f %8.2f %12d %14d %s\n", k, strat[k], o, p, (o > 0 ? p / o : 0), rows[k], bytes[k], same[k]
		}
	}' "$run_dir/results.csv"
} | tee "$run_dir/summary.txt"
