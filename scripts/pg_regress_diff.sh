#!/usr/bin/env bash
# Runs PostgreSQL's own regression SQL (src/test/regress of the PostgreSQL 15 source)
# through shard-proxy with one shard and no rules, and directly, and compares the
# outputs file by file (docs/proxy.md, "Transparency"). Each side gets a throwaway
# cluster of its own (roles and databases are cluster-wide), set up as pg_regress sets
# up its database; every file of parallel_schedule runs in order with
# `psql -X -a -q -f FILE`, as pg_regress runs it. A file is identical when both
# outputs are byte for byte the same. Writes results/runs/pgregress-<time>/:
# results.csv (mode, file, identical, first difference), summary.txt, run.txt, and
# both outputs of every file that differs under out/. A file that differs and is not
# in the list of expected differences (scripts/pg_regress_expected.txt, each with its
# reason) fails the run (exit status 1); a listed file found identical is reported, to
# be taken off the list.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/pg_regress_diff.sh [options]

  --source DIR       src/test/regress of a PostgreSQL 15 source tree; without it the
                     script downloads Debian's postgresql-15 source package with
                     apt-get source, through a private sources list (the machine's apt
                     setup stays as it is), into a temporary directory
  --modes LIST       pool modes of the proxy, comma-separated: session, transaction
                     (default session,transaction)
  --only LIST        run only these files of the schedule (comma-separated names,
                     e.g. test_setup,copy); the files a test needs first must be given too
  --timeout SECONDS  bound on one file (default 300)
  --expected FILE    the differences expected, one "MODE FILE REASON" a line
                     (default scripts/pg_regress_expected.txt)
  --runs-dir DIR     where the run directory goes (default results/runs)
  -h, --help         this help (writes nothing)

Needs root (the clusters run as the postgres OS user), PostgreSQL 15's server binaries
(SHARDLAB_PG_BINDIR, default /usr/lib/postgresql/15/bin), psql and go. Both modes take
about 3 minutes on a 2-CPU machine.
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd -P)
. "$root/scripts/lib.sh"
source_dir="" modes="session,transaction" only="" file_timeout=300 runs="$root/results/runs"
expected="$root/scripts/pg_regress_expected.txt"
pg_bin=${SHARDLAB_PG_BINDIR:-/usr/lib/postgresql/15/bin}
command_line="scripts/pg_regress_diff.sh$(quote_args "$@")"
while (($#)); do
	case $1 in
	--source) source_dir=${2:?--source needs a directory}; shift 2 ;;
	--modes) modes=${2:?--modes needs a list}; shift 2 ;;
	--only) only=${2:?--only needs a list}; shift 2 ;;
	--timeout) file_timeout=${2:?--timeout needs seconds}; shift 2 ;;
	--expected) expected=${2:?--expected needs a file}; shift 2 ;;
	--runs-dir) runs=${2:?--runs-dir needs a directory}; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
	esac
done
for m in ${modes//,/ }; do
	[[ $m == session || $m == transaction ]] || { echo "--modes: unknown pool mode $m (session or transaction)" >&2; exit 2; }
done
[[ -f $expected ]] || { echo "--expected: no file $expected" >&2; exit 2; }
[[ $file_timeout =~ ^[1-9][0-9]*$ ]] || { echo "--timeout must be a positive number of seconds, got $file_timeout" >&2; exit 2; }
((EUID == 0)) || { echo "needs root: the throwaway clusters run as the postgres OS user" >&2; exit 1; }
for p in initdb pg_ctl postgres; do
	[[ -x $pg_bin/$p ]] || { echo "$pg_bin/$p is missing: install postgresql-15 or set SHARDLAB_PG_BINDIR" >&2; exit 1; }
done
for tool in psql go runuser; do
	command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done

work=$(mktemp -d /tmp/pgregress.XXXXXX)
chmod 755 "$work"
proxy_pid=""
clusters=()
cleanup() {
	[[ -n $proxy_pid ]] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null
	for c in "${clusters[@]}"; do
		runuser -u postgres -- "$pg_bin/pg_ctl" -D "$c" -m immediate stop >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -z $source_dir ]]; then
	echo "downloading Debian's postgresql-15 source package"
	mkdir -p "$work/apt/lists/partial" "$work/src"
	codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
	printf 'deb-src http://deb.debian.org/debian %s main\n' "$codename" >"$work/apt/sources.list"
	apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$work/apt/lists")
	apt-get "${apt_opts[@]}" update >"$work/apt/update.log" 2>&1 || { cat "$work/apt/update.log" >&2; exit 1; }
	(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only postgresql-15 >"$work/apt/source.log" 2>&1) ||
		{ cat "$work/apt/source.log" >&2; exit 1; }
	tarball=$(ls "$work"/src/postgresql-15_*.orig.tar.*)
	tar -xf "$tarball" -C "$work/src" --wildcards '*/src/test/regress/*'
	source_dir=$(ls -d "$work"/src/postgresql-15*/src/test/regress)
fi
source_dir=$(cd "$source_dir" && pwd -P)
[[ -f $source_dir/parallel_schedule && -d $source_dir/sql ]] ||
	{ echo "$source_dir is not src/test/regress of a PostgreSQL source tree (no parallel_schedule or sql/)" >&2; exit 1; }
# The tests read their data files, and write some (a tablespace's directory, COPY TO
# files), below the source directory: each side gets a copy of its own, owned by the
# clusters' OS user.
for side in direct proxied; do
	cp -r "$source_dir" "$work/regress-$side"
	mkdir -p "$work/regress-$side/results" "$work/regress-$side/testtablespace"
	chown -R postgres "$work/regress-$side"
done
src="$work/regress-direct"

mapfile -t files < <(awk '$1 == "test:" { for (i = 2; i <= NF; i++) print $i }' "$src/parallel_schedule")
if [[ -n $only ]]; then
	files=(${only//,/ })
	for f in "${files[@]}"; do
		[[ -f $src/sql/$f.sql ]] || { echo "--only: no file $f.sql in $source_dir/sql" >&2; exit 2; }
	done
fi

claim_run_dir "$runs" "$(new_run_id pgregress-)"
echo "run directory: $(show_path "$run_dir")"
mkdir -p "$run_dir/out"

go build -o "$work/shard-proxy" "$root/cmd/shard-proxy"

# free_port: a TCP port nothing listens on now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# new_cluster NAME: a throwaway cluster set up as pg_regress sets one up, with a
# database "regression"; sets port.
new_cluster() {
	local dir="$work/$1"
	port=$(free_port)
	mkdir -p "$dir" && chown postgres "$dir"
	runuser -u postgres -- "$pg_bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale --no-sync \
		--no-instructions >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
	clusters+=("$dir/data")
	runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o \
		"-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_prepared_transactions=10 -c max_connections=200" \
		start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
	psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 >/dev/null <<-SQL
		CREATE DATABASE regression TEMPLATE=template0;
		ALTER DATABASE regression SET lc_messages TO 'C';
		ALTER DATABASE regression SET lc_monetary TO 'C';
		ALTER DATABASE regression SET lc_numeric TO 'C';
		ALTER DATABASE regression SET lc_time TO 'C';
		ALTER DATABASE regression SET bytea_output TO 'hex';
		ALTER DATABASE regression SET timezone_abbreviations TO 'Default';
		ALTER DATABASE regression SET timezone TO 'America/Los_Angeles';
		ALTER DATABASE regression SET datestyle TO 'Postgres, MDY';
	SQL
}

# run_file SIDE URL FILE OUT: runs one file of the suite as pg_regress does.
run_file() {
	local src="$work/regress-$1"
	shift
	(cd "$src" && PG_ABS_SRCDIR=$src PG_ABS_BUILDDIR=$src PG_LIBDIR=$pg_bin/../lib PG_DLSUFFIX=.so \
		PGAPPNAME=pg_regress LC_MESSAGES=C PGTZ=America/Los_Angeles PGDATESTYLE="Postgres, MDY" \
		timeout "$file_timeout" psql -X -a -q -d "$1" <"sql/$2.sql" >"$3" 2>&1) || true
}

echo "mode,file,identical,first_difference" >"$run_dir/results.csv"
for mode in ${modes//,/ }; do
	new_cluster "direct-$mode"
	direct="postgres://postgres@127.0.0.1:$port/regression?sslmode=disable"
	new_cluster "behind-$mode"
	behind="postgres://postgres@127.0.0.1:$port/regression?sslmode=disable"
	rm -f "$work/addr"
	"$work/shard-proxy" --database regression --listen 127.0.0.1:0 --addr-file "$work/addr" \
		--shard "$behind" --pool-mode "$mode" --log-level warn 2>>"$run_dir/proxy-$mode.log" &
	proxy_pid=$!
	for _ in $(seq 100); do [[ -s $work/addr ]] && break; sleep 0.1; done
	[[ -s $work/addr ]] || { echo "shard-proxy did not start; see $(show_path "$run_dir/proxy-$mode.log")" >&2; exit 1; }
	proxied="postgres://postgres@$(cat "$work/addr")/regression?sslmode=disable"
	same=0 n=0
	for f in "${files[@]}"; do
		n=$((n + 1))
		run_file direct "$direct" "$f" "$work/direct.out"
		run_file proxied "$proxied" "$f" "$work/proxied.out"
		if cmp -s "$work/direct.out" "$work/proxied.out"; then
			same=$((same + 1))
			echo "$mode,$f,yes," >>"$run_dir/results.csv"
		else
			first=$({ diff "$work/direct.out" "$work/proxied.out" || true; } | awk '/^[<>]/ { print substr($0, 1, 200); exit }' | tr -d '\r' | sed 's/"/""/g')
			echo "$mode,$f,no,\"$first\"" >>"$run_dir/results.csv"
			cp "$work/direct.out" "$run_dir/out/$mode-$f.direct"
			cp "$work/proxied.out" "$run_dir/out/$mode-$f.proxied"
		fi
		if ((n % 20 == 0)); then echo "$mode: $n of ${#files[@]} files, $same identical"; fi
	done
	kill "$proxy_pid" && wait "$proxy_pid" 2>/dev/null || true
	proxy_pid=""
	echo "$mode: $same of ${#files[@]} files identical" >>"$run_dir/summary.txt"
done

{
	echo "command: $command_line"
	echo "commit: $(git_commit "$root")"
	echo "source: $source_dir"
	echo "server: $("$pg_bin/postgres" --version)"
	echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$run_dir/run.txt"
# is_expected MODE FILE: whether the list of expected differences names it.
is_expected() { awk -v m="$1" -v f="$2" '$1 == m && $2 == f { found = 1 } END { exit !found }' "$expected"; }
unexpected=0
while IFS=, read -r mode f same _; do
	[[ $mode == mode ]] && continue
	if [[ $same == no ]] && ! is_expected "$mode" "$f"; then
		echo "unexpected difference: $mode $f (see $(show_path "$run_dir/out/$mode-$f.direct") and .proxied)" >>"$run_dir/summary.txt"
		unexpected=$((unexpected + 1))
	elif [[ $same == yes ]] && is_expected "$mode" "$f"; then
		echo "now identical, take it off $(show_path "$expected"): $mode $f" >>"$run_dir/summary.txt"
	fi
done <"$run_dir/results.csv"
cat "$run_dir/summary.txt"
((unexpected == 0))
