#!/usr/bin/env bash
# The network lab (docs/netlab.md): a small network of hosts on this machine, made of
# Linux network namespaces joined by veth pairs and a bridge, with every link shaped
# (delay, jitter, loss, rate), a PostgreSQL cluster on each shard host, and the
# middleware on a host of its own. It brings the network up and down, runs experiments
# over it and injects faults. Needs root, iproute2, nftables and PostgreSQL's server
# programs.
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: scripts/netlab.sh COMMAND [options]

Commands:
  up [--shards N] [--preset NAME | --rtt D | --delay D] [--jitter D] [--loss PCT] [--rate RATE]
        brings the network up: a client host, a middleware host (mw) and N shard
        hosts (shard0 ... shardN-1), each a network namespace, each shard running a
        PostgreSQL cluster of its own; then measures the round trip of every shard
        link and fails (tearing everything down) when it is not the one asked for.
        Defaults: --shards 2 --preset zone.
  down  tears the network down: processes, clusters, namespaces (and with them every
        link, qdisc and nftables table), and the state directory. It also cleans up
        after an up, run or crash that left things behind; with nothing there it
        says so and succeeds.
  status
        the hosts, their addresses and services, the shaping, the last measured
        round trips and the faults in force.
  run ping [--count N]
        measures every link: ICMP ping (the kernel's path: rate and loss, no delay,
        since the delay line carries TCP only) and SQL round trips ("SELECT 1") from
        mw to each shard through the shaped path, beside the same on the shard host
        itself. Writes results/runs/netlab-ping-<time>/.
  run pgbench [--clients N] [--time S] [--mode simple|extended|prepared] [--scale N]
              [--pool-size N] [--proxy-arg ARG]...
        shard-proxy on mw over the shard hosts, pgbench's tables loaded through it
        from the client (pgbench_accounts and pgbench_history sharded by aid, the
        others on every shard), then pgbench -S from the client. Records throughput,
        latency, and the CPU per transaction of the proxy and of the delay lines
        (read from /proc/PID/stat). Verifies the round trips first. Defaults: 8
        clients, 10 s, prepared, scale 1, pool size 10. Writes
        results/runs/netlab-pgbench-<time>/.
  run tail [--shard-counts LIST] [--trials N] [--count N] [--qps N] [--rows N]
           [--jitter-host HOST] [--extra-jitter D]
        the tail across hosts: for each shard count (default 1,2,4,8) a shard-proxy
        on mw over that many shard hosts, and through it, from the client, a point
        select and a cross-shard ORDER BY ... LIMIT 10, N of each (default 1000) at
        --qps a second (default 100 / the round trip in ms, at most 200) on one
        connection, timed from when each was due; then the per-shard statement sent by mw straight to each of those hosts at
        once, the samples of the "slowest of N" model. One host (default shard0)
        gets extra jitter: its delay line holds each chunk the delay ± D (default
        the delay itself). Trials (default 3) interleave the shard counts in random
        order. Writes p50, p99 and p99.9 beside the model's, per shard count and
        query, to results/runs/netlab-tail-<time>/results.csv, with every sample
        (go run ./cmd/report --netlab CSV --out FILE draws them). Brought up by the
        run, the network has as many shard hosts as the largest count (default 8).
  run routerbench [--routerbench-arg ARG]...
        seed 004's experiment as the seed had it, across hosts: routerbench (the
        database/sql driver) on mw, its two databases on shard0 and shard1 through
        the shaped path, its limit experiment unless an ARG names another; each ARG
        goes to routerbench as given, e.g. --routerbench-arg=--trials=8 (see go run
        ./cmd/routerbench --help).
        Brought up by the run, the network has 2 shard hosts. Writes
        results/runs/netlab-routerbench-<time>/, routerbench's report in routerbench/.
  run sweep [--sweep-arg ARG]...
        seed 001's proxy sweep across three hosts, as the seed had it: sysbench and
        pgbench on the client, shard-proxy, pgbouncer and a byte relay on mw (one at
        a time, behind mw's delay line), PostgreSQL on shard0; the direct target is
        the client straight to shard0 (one shaped link where the others cross two).
        The sweep's defaults here are a short one: --workloads
        oltp_point_select,oltp_read_write --threads 8,32 --tables 4 --table-size
        25000 --time 10s --warmup 2s --trials 3 --pgbench-clients 8 --pgbench-modes
        extended --pgbench-scale 1 --pool-size 20 --shards 4 (schema shards on
        shard0, as the local sweep has them); each ARG goes to proxysweep run as
        given and replaces the default it names, e.g. --sweep-arg=--threads=8,32,64
        (see go run ./cmd/proxysweep run --help; shard0's max_connections is 300,
        which bounds the thread and pgbench client counts and --pool-size x --shards
        to 295). Brought up by the run, the network has 1 shard
        host. Writes results/runs/netlab-sweep-<time>/, the sweep's results and
        report.md in sweep/.
  run scenarios [--scenario-arg ARG]...
        the lab's scenarios on PostgreSQL shards across hosts: run_all_scenarios.sh
        --backend postgres on mw (the demo-server and loadgen there), shard i of
        each configuration on shard host i (5 hosts when the run brings the network
        up, as scripts/scenarios.conf goes up to 5 shards); each ARG goes to
        run_all_scenarios.sh as given, e.g. --scenario-arg=--trials=3
        --scenario-arg=--only=read_heavy_cachelike. Its report (findings table,
        charts) is under scenarios/ in results/runs/netlab-scenarios-<time>/.
  run faults [--faults LIST] [--faulty HOST] [--hold S] [--settle S] [--workers N]
             [--bound D] [--two-phase] [--vanish-bound S] [--pool-size N]
             [--proxy-arg ARG]...
        the proxy's reliability across the network: shard-proxy on mw over the
        shard hosts (4 when the run brings the network up), traffic through it from
        the client (faultload: --workers connections, each on the keys of one shard,
        reading fault_items and inserting into fault_acks, half the writes two-key
        transactions with --two-phase), and one shard host (default shard1) failing in turn in each
        way of LIST (default partition,oneway,slow,loss: both ways; what it sends
        dropped; 200 ms added to its answers; 5% of its packets lost; oneway-in is
        what it is sent dropped), each held --hold seconds (default 40, longer than
        the proxy's --tcp-user-timeout of 30 s), healed,
        and watched --settle seconds (default 15). Per fault: the other shards'
        statements and latency beside before, the faulty shard's failures, the
        time to detect and to recover, the longest a failing statement took,
        hangs (no answer within --bound, default 60s) and the errors seen. Then:
        every acknowledged write read back, no two-key transaction torn, nothing
        in doubt (pg_prepared_xacts), and a client host that vanishes in a
        transaction holding a row lock, timed until the lock is released (at
        most --vanish-bound seconds, default 120). Writes
        results/runs/netlab-faults-<time>/results.csv, events.csv and run.txt;
        fails when a write is lost, a pair torn or a transaction left in doubt.
  With the network down, run brings one up with up's options and tears it down
  when it ends, however it ends. One up, down or run at a time on a network: a
  second one, or a down during a run, is refused (fault, status and exec are not).
  fault partition HOST      drops every packet to and from HOST (no reset: peers
                            time out)
  fault oneway HOST [out|in]
                            drops what HOST sends (out, the default: it hears but is
                            not heard) or what it is sent (in)
  fault slow HOST [D]       holds every answer of HOST's delay line D longer
                            (default 50ms); for mw and the shard hosts
  fault loss HOST PCT       drops PCT percent of the packets HOST sends
  fault heal HOST|all       ends HOST's faults: back to the shaping of up
  exec HOST -- COMMAND...   runs COMMAND inside HOST's namespace

HOST is client, mw or shardI.

Shaping (up, and run when it brings the network up):
  --preset NAME   rack          ~0.1 ms round trip, 10gbit: the delay line's own cost
                  zone          0.5 ms, jitter 25us, 10gbit (the default)
                  cross-zone    2 ms, jitter 100us, 5gbit
                  cross-region  30 ms, jitter 1ms, 1gbit
                  none of them loses packets
  --rtt D         the round trip to reach, as a preset does: up measures the path
                  without delay, sets the delay line to make up the difference, and
                  measures again
  --delay D       instead of --rtt: the delay added in each direction of every link,
                  as given (round trip about 2 x D plus the path's own)
  --jitter D      each chunk of data is held the delay ± up to D (uniform)
  --loss PCT      percent of the packets every host sends that are dropped
  --rate RATE     every host's outgoing rate, tc's units: 100mbit, 1gbit, 10gbit
  Values given with a preset replace the preset's. D is a duration: 250us,
  0.5ms, 2ms, 1s, or 0.

Other options:
  --shards N        shard hosts, 1 to 16 (default 2)
  --count N         run ping: samples per link (default 200)
  --probes N        SQL round trips per link when verifying (default: about a
                    second's worth, 30 to 200)
  --no-verify       measure and record the round trips, but do not fail when they
                    are off the preset's
  --lab NAME        the network's name, [a-z0-9]{1,12} (default netlab): several can
                    exist at once; their namespaces are nl-NAME-ID-HOST, ID eight hex
                    digits of the state directory's path, so that labs of one name
                    in two state directories are apart too
  --state-dir DIR   where the networks' state lives (default /run/shardlab-netlab,
                    or $SHARDLAB_NETLAB_STATE): each lab in DIR/NAME, which up
                    creates and down removes (only a directory up made: one whose
                    lab.env names the lab); down finds everything there
  --bin-dir DIR     take netprobe, delayline and shard-proxy from DIR instead of
                    building them (go build) into the state directory
  --runs-dir DIR    where run directories go (default results/runs)
  -h, --help        this help (does nothing else)

Addresses: 198.18.0.0/24 (RFC 2544's range for benchmarking), on a bridge in a
namespace of its own that nothing else joins: client .2, mw .3, shardI .(10+I).
PostgreSQL listens on its host's address, port 5433, which answers only from the
host itself (others get a reset); port 5432 is the delay line in front of it, the
shaped path. On mw, port 6432 is the delay line in front of whatever listens on
6433 (shard-proxy during run pgbench). Every host has routes to 198.18.0.0/24 only
and drops anything else it would send (nftables), IPv6 included.

Exit status: 0 done, 1 failed (including round trips off the preset), 2 bad
input or something missing (root, tools).
Example:
  scripts/netlab.sh up --shards 2 --preset cross-zone
  scripts/netlab.sh run pgbench --clients 8 --time 10
  scripts/netlab.sh fault partition shard1; scripts/netlab.sh fault heal shard1
  scripts/netlab.sh down
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/lib.sh"
cmdline="scripts/netlab.sh$(quote_args "$@")"

die() { echo "netlab.sh: $*" >&2; exit 1; }
bad() { echo "netlab.sh: $*" >&2; exit 2; }
note() { echo "netlab: $*" >&2; }

# --- the network's fixed shape -----------------------------------------------------
subnet=198.18.0.0/24
client_addr=198.18.0.2
mw_addr=198.18.0.3
shard_addr() { echo "198.18.0.$((10 + $1))"; }
pg_port=5432 pg_raw_port=5433 # the shaped path, and PostgreSQL itself
mw_port=6432 mw_raw_port=6433
api=127.0.0.1:8474 # each delay line's Toxiproxy API, inside its host
max_shards=16

# preset NAME: prints "rtt jitter loss rate" for a preset, or fails.
preset() {
	case $1 in
	rack) echo "100us 0 0 10gbit" ;;
	zone) echo "500us 25us 0 10gbit" ;;
	cross-zone) echo "2ms 100us 0 5gbit" ;;
	cross-region) echo "30ms 1ms 0 1gbit" ;;
	*) return 1 ;;
	esac
}

# duration_us D: D (250us, 0.5ms, 2ms, 1s or 0) in whole microseconds, or fails.
duration_us() {
	[[ $1 =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ || $1 == 0 ]] || return 1
	[[ $1 == 0 ]] && { echo 0; return 0; }
	awk -v v="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
		'BEGIN { m = u == "us" ? 1 : u == "ms" ? 1000 : 1000000; printf "%d\n", v * m + 0.5 }'
}

# loss_ppm PCT: PCT percent (0 to 100, a trailing % allowed) in parts per million.
loss_ppm() {
	[[ $1 =~ ^([0-9]+(\.[0-9]+)?)%?$ ]] || return 1
	awk -v v="${BASH_REMATCH[1]}" 'BEGIN { if (v > 100) exit 1; printf "%d\n", v * 10000 + 0.5 }'
}

# rate_bps RATE: tc's kbit/mbit/gbit rate in bits per second.
rate_bps() {
	[[ $1 =~ ^([1-9][0-9]*)(kbit|mbit|gbit)$ ]] || return 1
	local m
	case ${BASH_REMATCH[2]} in kbit) m=1000 ;; mbit) m=1000000 ;; gbit) m=1000000000 ;; esac
	echo $((BASH_REMATCH[1] * m))
}

us_ms() { awk -v u="$1" 'BEGIN { printf "%.3f\n", u / 1000 }'; }

# --- options ---------------------------------------------------------------------
[[ $# -gt 0 ]] || { usage >&2; exit 2; }
case $1 in -h | --help) usage; exit 0 ;; esac
command=$1
shift
case $command in up | down | status | run | fault | exec) ;; *) bad "unknown command '$command' (see --help)" ;; esac

lab=netlab state_root=${SHARDLAB_NETLAB_STATE:-/run/shardlab-netlab} bin_dir="" runs_dir="$root/results/runs"
shards="" preset_name="" rtt_opt="" delay_opt="" jitter_opt="" loss_opt="" rate_opt=""
count=200 probes="" verify=1
clients=8 time_s=10 mode=prepared scale=1 pool_size=10 proxy_args=() routerbench_args=() scenario_args=() sweep_args=()
fault_kinds=(partition oneway slow loss) fault_hold=40 fault_settle=15 fault_warm=10 fault_workers=8 fault_keys=10000
fault_bound=60s faulty_host=shard1 two_phase=0 vanish_bound=120
qps=200 trials=3 shard_counts=1,2,4,8 jitter_host=shard0 extra_jitter="" extra_jitter_us="" tail_rows=100000
up_opts=() run_opts=() positional=() exec_cmd=()
need() { [[ $# -ge 2 && -n $2 && $2 != --* ]] || bad "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
	case $1 in
	--shards) need "$@"; shards=$2; up_opts+=("$1"); shift 2 ;;
	--preset) need "$@"; preset_name=$2; up_opts+=("$1"); shift 2 ;;
	--rtt) need "$@"; rtt_opt=$2; up_opts+=("$1"); shift 2 ;;
	--delay) need "$@"; delay_opt=$2; up_opts+=("$1"); shift 2 ;;
	--jitter) need "$@"; jitter_opt=$2; up_opts+=("$1"); shift 2 ;;
	--loss) need "$@"; loss_opt=$2; up_opts+=("$1"); shift 2 ;;
	--rate) need "$@"; rate_opt=$2; up_opts+=("$1"); shift 2 ;;
	--probes) need "$@"; probes=$2; shift 2 ;;
	--no-verify) verify=0; shift ;;
	--count) need "$@"; count=$2; run_opts+=("$1"); shift 2 ;;
	--clients) need "$@"; clients=$2; run_opts+=("$1"); shift 2 ;;
	--qps) need "$@"; qps=$2; run_opts+=("$1"); shift 2 ;;
	--faults) need "$@"; IFS=, read -ra fault_kinds <<<"$2"; run_opts+=("$1"); shift 2 ;;
	--hold) need "$@"; fault_hold=$2; run_opts+=("$1"); shift 2 ;;
	--settle) need "$@"; fault_settle=$2; run_opts+=("$1"); shift 2 ;;
	--faulty) need "$@"; faulty_host=$2; run_opts+=("$1"); shift 2 ;;
	--workers) need "$@"; fault_workers=$2; run_opts+=("$1"); shift 2 ;;
	--bound) need "$@"; fault_bound=$2; run_opts+=("$1"); shift 2 ;;
	--vanish-bound) need "$@"; vanish_bound=$2; run_opts+=("$1"); shift 2 ;;
	--two-phase) two_phase=1; run_opts+=("$1"); shift ;;
	--trials) need "$@"; trials=$2; run_opts+=("$1"); shift 2 ;;
	--shard-counts) need "$@"; shard_counts=$2; run_opts+=("$1"); shift 2 ;;
	--jitter-host) need "$@"; jitter_host=$2; run_opts+=("$1"); shift 2 ;;
	--extra-jitter) need "$@"; extra_jitter=$2; run_opts+=("$1"); shift 2 ;;
	--rows) need "$@"; tail_rows=$2; run_opts+=("$1"); shift 2 ;;
	--time) need "$@"; time_s=$2; run_opts+=("$1"); shift 2 ;;
	--mode) need "$@"; mode=$2; run_opts+=("$1"); shift 2 ;;
	--scale) need "$@"; scale=$2; run_opts+=("$1"); shift 2 ;;
	--pool-size) need "$@"; pool_size=$2; run_opts+=("$1"); shift 2 ;;
	--proxy-arg) [[ $# -ge 2 && -n $2 ]] || bad "--proxy-arg needs a value"; proxy_args+=("$2"); run_opts+=("$1"); shift 2 ;;
	--proxy-arg=*) proxy_args+=("${1#--proxy-arg=}"); run_opts+=(--proxy-arg); shift ;;
	--routerbench-arg) [[ $# -ge 2 && -n $2 ]] || bad "--routerbench-arg needs a value"; routerbench_args+=("$2"); run_opts+=("$1"); shift 2 ;;
	--routerbench-arg=*) routerbench_args+=("${1#--routerbench-arg=}"); run_opts+=(--routerbench-arg); shift ;;
	--scenario-arg) [[ $# -ge 2 && -n $2 ]] || bad "--scenario-arg needs a value"; scenario_args+=("$2"); run_opts+=("$1"); shift 2 ;;
	--scenario-arg=*) scenario_args+=("${1#--scenario-arg=}"); run_opts+=(--scenario-arg); shift ;;
	--sweep-arg) [[ $# -ge 2 && -n $2 ]] || bad "--sweep-arg needs a value"; sweep_args+=("$2"); run_opts+=("$1"); shift 2 ;;
	--sweep-arg=*) sweep_args+=("${1#--sweep-arg=}"); run_opts+=(--sweep-arg); shift ;;
	--lab) need "$@"; lab=$2; shift 2 ;;
	--state-dir) need "$@"; state_root=$2; shift 2 ;;
	--bin-dir) need "$@"; bin_dir=$2; shift 2 ;;
	--runs-dir) need "$@"; runs_dir=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	--) shift; exec_cmd=("$@"); break ;;
	-*) bad "unknown option $1 (see --help)" ;;
	*) positional+=("$1"); shift ;;
	esac
done

[[ $lab =~ ^[a-z0-9]{1,12}$ ]] || bad "--lab takes 1 to 12 characters of a-z and 0-9, got '$lab'"
# One spelling of the state directory (absolute, no symlinks, no /./ or //), since its
# path names the lab's processes and namespaces. pg_ctl puts it between double quotes
# in a shell command, so those characters that a shell reads there are refused.
state_root=$(realpath -m -- "$state_root")
[[ $state_root != / ]] || bad "--state-dir / : give a directory for the labs' state, such as /run/shardlab-netlab"
[[ ! $state_root =~ [\"\$\`\\] && $state_root != *$'\n'* ]] ||
	bad "--state-dir cannot contain \", \$, \`, \\ or a newline (pg_ctl runs a shell command with it), got '$state_root'"
state="$state_root/$lab"
# The namespaces are named after the lab and its state directory: two labs of one
# name with their state in two directories neither see nor tear down each other's.
ns_prefix="nl-$lab-$(printf '%s' "$state" | sha256sum | cut -c1-8)-"
[[ -z $bin_dir || -d $bin_dir ]] || bad "--bin-dir $bin_dir is not a directory"
[[ -z $bin_dir ]] || bin_dir=$(cd "$bin_dir" && pwd)

posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || bad "$1 takes a positive integer, got '$2'"; }
if ((${#up_opts[@]})) && [[ $command != up && $command != run ]]; then
	bad "${up_opts[0]} is for up (or run, which brings the network up when it is down)"
fi
if ((${#run_opts[@]})) && [[ $command != run ]]; then
	bad "${run_opts[0]} is for run"
fi
[[ -z $probes ]] || posint --probes "$probes"

# The shaping asked for, from the preset and the values given: sets rtt_us (empty when
# --delay sets the delay itself), delay_us, jitter_us, loss, loss_ppm, rate, rate_bps.
resolve_shaping() {
	[[ -z $rtt_opt || -z $delay_opt ]] || bad "--rtt and --delay exclude each other: --rtt is a round trip to reach, --delay the delay to add"
	local p_rtt p_jitter p_loss p_rate
	[[ -n $preset_name ]] || { [[ -n $rtt_opt || -n $delay_opt ]] || preset_name=zone; }
	if [[ -n $preset_name ]]; then
		read -r p_rtt p_jitter p_loss p_rate < <(preset "$preset_name") ||
			bad "unknown preset '$preset_name': rack, zone, cross-zone or cross-region"
	else
		preset_name=custom p_rtt="" p_jitter=0 p_loss=0 p_rate=10gbit
	fi
	rtt_us="" delay_us=""
	if [[ -n $delay_opt ]]; then
		delay_us=$(duration_us "$delay_opt") || bad "--delay takes a duration such as 250us, 0.5ms or 2ms, got '$delay_opt'"
	else
		local r=${rtt_opt:-$p_rtt}
		rtt_us=$(duration_us "$r") || bad "--rtt takes a duration such as 250us, 0.5ms or 2ms, got '$r'"
	fi
	local j=${jitter_opt:-$p_jitter}
	jitter_us=$(duration_us "$j") || bad "--jitter takes a duration such as 25us or 1ms, got '$j'"
	loss=${loss_opt:-$p_loss}
	loss_ppm=$(loss_ppm "$loss") || bad "--loss takes a percentage from 0 to 100, got '$loss'"
	rate=${rate_opt:-$p_rate}
	rate_bps=$(rate_bps "$rate") || bad "--rate takes a rate in tc's units such as 100mbit, 1gbit or 10gbit, got '$rate'"
	shards=${shards:-2}
	[[ $shards =~ ^[1-9][0-9]*$ ]] && ((shards <= max_shards)) || bad "--shards takes 1 to $max_shards, got '$shards'"
}

# --- hosts, namespaces and state -----------------------------------------------------
ns() { echo "$ns_prefix$1"; }
in_ns() { local h=$1; shift; ip netns exec "$(ns "$h")" "$@"; }
lab_namespaces() { ip netns list 2>/dev/null | awk -v p="$ns_prefix" 'index($1, p) == 1 { print $1 }'; }
state_get() { [[ -f $state/lab.env ]] && awk -F= -v k="$1" '$1 == k { v = substr($0, length(k) + 2) } END { print v }' "$state/lab.env"; }
state_set() {
	local k=$1 v=$2 tmp
	tmp=$(mktemp "$state/.lab.env.XXXXXX")
	{ [[ -f $state/lab.env ]] && awk -F= -v k="$k" '$1 != k' "$state/lab.env"; echo "$k=$v"; } >"$tmp"
	mv "$tmp" "$state/lab.env"
}
lab_is_up() { [[ $(state_get ready) == 1 ]] && [[ -n $(lab_namespaces) ]]; }
# owns_state: the state directory is one up made for this lab (its lab.env names it,
# written before anything else), not a directory that happens to be at that path.
owns_state() { [[ -f $state/lab.env ]] && grep -qxF "lab=$lab" "$state/lab.env"; }
host_addr() {
	case $1 in
	client) echo "$client_addr" ;;
	mw) echo "$mw_addr" ;;
	shard*) shard_addr "${1#shard}" ;;
	esac
}
server_hosts() { # the hosts with a delay line
	echo mw
	local i
	for ((i = 0; i < $(state_get shards); i++)); do echo "shard$i"; done
}
all_hosts() { echo client; server_hosts; }
# check_host HOST: fails with status 2 unless HOST is a host of the network that is up.
check_host() {
	local h=$1 n
	n=$(state_get shards)
	case $h in
	client | mw) return 0 ;;
	shard*) [[ ${h#shard} =~ ^(0|[1-9][0-9]*)$ ]] && ((${h#shard} < n)) && return 0 ;;
	esac
	bad "no host '$h': the hosts are client, mw and shard0 to shard$((n - 1))"
}

need_root_and_tools() {
	((EUID == 0)) || bad "needs root (network namespaces, nftables, tc); run it as root"
	local prog
	for prog in ip nft tc runuser curl setsid flock "$@"; do
		command -v "$prog" >/dev/null || bad "$prog is not installed (iproute2, nftables, curl, util-linux; see .ci/run)"
	done
}

pg_bin=${SHARDLAB_PG_BINDIR:-/usr/lib/postgresql/15/bin}
pg_as() { local h=$1; shift; in_ns "$h" runuser -u postgres -- "$@"; }

# pid_is_ours PID: the process is one this network started (an argument on its command
# line is a path in the state directory), so that a stale pid file never kills someone
# else's process.
pid_is_ours() {
	[[ -r /proc/$1/cmdline ]] &&
		tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | awk -v p="$state/" 'index($0, p) == 1 { f = 1 } END { exit !f }'
}
# pid_in_ns NS PID: the process runs in the lab's namespace NS.
pid_in_ns() { [[ /proc/$2/ns/net -ef /run/netns/$1 ]]; }

# alive PID: the process runs (a zombie, which only waits for its parent, does not).
alive() { [[ -r /proc/$1/stat ]] && [[ $(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) != Z ]]; }

# stop_pids CHECK PID...: SIGTERM, up to 5 s to exit, then SIGKILL. CHECK (a command
# to which a pid is appended: pid_is_ours, or pid_in_ns NS) is asked right before each
# signal, so that a pid that ended and was given to another process is left alone.
stop_pids() {
	local check=$1 pid left
	shift
	# shellcheck disable=SC2086 # CHECK is a command and its arguments
	for pid in "$@"; do alive "$pid" && $check "$pid" && kill "$pid" 2>/dev/null; done
	for _ in $(seq 50); do
		left=0
		# shellcheck disable=SC2086
		for pid in "$@"; do alive "$pid" && $check "$pid" && left=1; done
		((left)) || return 0
		sleep 0.1
	done
	# shellcheck disable=SC2086
	for pid in "$@"; do alive "$pid" && $check "$pid" && kill -KILL "$pid" 2>/dev/null; done
	return 0
}

# teardown: removes everything of this network, from its namespaces and its state
# directory alike, so that it works after a crash at any point. It never stops on an
# error, and a Ctrl-C (or SIGTERM, SIGHUP) while it runs is ignored, by it and by the
# programs it runs, so that a second one cannot leave half of the lab behind; the
# signals' traps are restored when it returns.
teardown() {
	# What restores the signals' traps: each as it was, set straight from ignored (a
	# reset to the default first would let a Ctrl-C in between kill the script before
	# its caller's cleanup, such as down's removal of the lock file).
	local restore="" sig t
	for sig in INT TERM HUP; do
		t=$(trap -p "$sig")
		restore+="${t:-trap - $sig}; "
	done
	trap '' INT TERM HUP
	set +e
	local n h pids found=0 ours_state=0
	# Only a state directory up made is read or removed: a --state-dir and --lab that
	# point at some other directory (--state-dir / --lab usr) must not have its
	# programs' processes stopped nor its files removed.
	owns_state && ours_state=1
	for n in $(lab_namespaces); do
		found=1
		h=${n#"$ns_prefix"}
		if ((ours_state)) && [[ -f $state/$h/data/postmaster.pid ]]; then
			pg_as "$h" "$pg_bin/pg_ctl" -D "$state/$h/data" -m fast -w -t 10 stop >/dev/null 2>&1
		fi
		# Whatever still runs inside the namespace: delay lines, proxies, clients.
		pids=$(ip netns pids "$n" 2>/dev/null | tr '\n' ' ')
		# shellcheck disable=SC2086
		stop_pids "pid_in_ns $n" $pids
		ip netns delete "$n" 2>/dev/null || note "could not delete namespace $n"
	done
	if ((ours_state)); then
		# Processes outside the namespaces: initdb of an up that crashed, or anything
		# whose namespace went away without it. They run the lab's programs or
		# PostgreSQL's, with a path in the state directory on their command line.
		local f pid exe ours=() progs
		progs=${bin_dir:-$state/bin}
		for f in $(grep -laF "$state/" /proc/[0-9]*/cmdline 2>/dev/null); do
			pid=${f#/proc/}
			pid=${pid%/cmdline}
			exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
			[[ $exe == "$pg_bin"/* || $exe == "$progs"/* ]] && pid_is_ours "$pid" && ours+=("$pid")
		done
		if ((${#ours[@]})); then
			stop_pids pid_is_ours "${ours[@]}"
		fi
		found=1
		rm -rf -- "$state"
	elif [[ -e $state ]]; then
		note "$state is not lab $lab's state directory (no lab.env naming the lab): left alone"
	fi
	((found)) && note "lab $lab is down" || note "lab $lab: nothing to tear down"
	set -e
	eval "$restore"
	return 0
}

# down: teardown, and the lock file beside the state directory (held by this process).
down() {
	teardown
	rm -f -- "$state_root/$lab.lock"
}

# lock: one up, down or run of a network at a time; held until the script exits
# (programs it leaves running are started with the lock's descriptor closed).
locked=0
lock() {
	((locked == 0)) || return 0
	# A directory that exists keeps its mode: it may be /tmp or someone's home.
	if [[ ! -d $state_root ]]; then
		mkdir -p -- "$state_root"
		chmod 755 -- "$state_root" # the clusters' postgres passes through it
	fi
	local f="$state_root/$lab.lock"
	while :; do
		exec 9>"$f"
		flock -n 9 || die "another netlab.sh is bringing lab $lab up or down, or running on it; wait for it"
		# A down that held it removed the file: lock the one that is there now.
		[[ /dev/fd/9 -ef $f ]] && break
	done
	locked=1
}

# The EXIT trap of up and run: what they started that must not outlive them. A signal
# exits through it (a Ctrl-C, SIGTERM, or SIGHUP when the terminal goes away).
exit_down=0 exit_proxy_pid=""
# What a run started or changed that its end must undo, however it ends: process groups
# of its background jobs, the host a fault is applied to, an nftables rule it added.
exit_groups=() exit_fault_host="" exit_nft_rule=""
on_exit() {
	trap '' INT TERM HUP
	local g
	# A job interrupted before its setsid is not a group yet: then the process itself.
	for g in "${exit_groups[@]}"; do kill -- "-$g" 2>/dev/null || kill "$g" 2>/dev/null || true; done
	[[ -z $exit_fault_host ]] || heal "$exit_fault_host" || true
	[[ -z $exit_nft_rule ]] || in_ns mw nft delete rule inet netlab input handle "$exit_nft_rule" || true
	tail_restore_jitter
	if [[ -n $exit_proxy_pid ]]; then
		stop_pids pid_is_ours "$exit_proxy_pid"
		rm -f -- "$state/mw/shard-proxy.pid"
	fi
	((exit_down == 0)) || down
}
trap_exits() {
	trap on_exit EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	trap 'exit 129' HUP
}

# --- building the network ------------------------------------------------------------
nft_rules() { # HOST: the host's table; raw ports answer only to the host itself
	local h=$1 raw
	case $h in mw) raw=$mw_raw_port ;; shard*) raw=$pg_raw_port ;; *) raw="" ;; esac
	cat <<EOF
table inet netlab {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "lo" accept
		jump fault_in
		${raw:+tcp dport $raw reject with tcp reset}
	}
	chain output {
		type filter hook output priority filter; policy accept;
		oifname "lo" accept
		meta nfproto != ipv4 drop
		ip daddr != $subnet reject with icmp type admin-prohibited
		jump fault_out
		jump loss
	}
	chain fault_in {
	}
	chain fault_out {
	}
	chain loss {
	}
}
EOF
}

# set_loss HOST PPM: the host drops PPM parts per million of what it sends.
set_loss() {
	in_ns "$1" nft flush chain inet netlab loss
	(($2 == 0)) || in_ns "$1" nft add rule inet netlab loss numgen random mod 1000000 '<' "$2" drop
}

# set_rate HOST: the host's outgoing rate; the bucket holds 4 ms of it (at least 16 KB).
set_rate() {
	local bps burst
	bps=$(state_get rate_bps)
	burst=$((bps / 8 / 250))
	((burst >= 16384)) || burst=16384
	in_ns "$1" tc qdisc replace dev eth0 root tbf rate "$(state_get rate)" burst "$burst" latency 20ms
}

# disable_ipv6 HOST: no IPv6 in the host (its own /proc/sys, as sysctl would write it,
# without needing procps). A kernel without IPv6 has nothing to turn off.
disable_ipv6() {
	# shellcheck disable=SC2016 # expanded by the shell inside the namespace
	in_ns "$1" sh -c 'for c in all default; do f=/proc/sys/net/ipv6/conf/$c/disable_ipv6; [ ! -e "$f" ] || echo 1 >"$f"; done'
}

add_host() { # HOST ADDRESS
	local h=$1 addr=$2 n
	n=$(ns "$h")
	ip netns add "$n"
	disable_ipv6 "$h"
	in_ns "$h" ip link set lo up
	ip link add eth0 netns "$n" type veth peer name "$h" netns "$(ns sw)"
	ip -n "$(ns sw)" link set dev "$h" master br0 up
	ip -n "$n" addr add "$addr/24" dev eth0
	ip -n "$n" link set dev eth0 up
	nft_rules "$h" | in_ns "$h" nft -f -
	set_loss "$h" "$(state_get loss_ppm)"
	set_rate "$h"
}

build_bins() { # PROGRAM...: into the state directory, unless --bin-dir gave them
	local p missing=()
	if [[ -n $bin_dir ]]; then
		for p in "$@"; do [[ -x $bin_dir/$p ]] || missing+=("$p"); done
		((${#missing[@]} == 0)) || die "--bin-dir $bin_dir lacks ${missing[*]}"
		return 0
	fi
	command -v go >/dev/null || bad "go is not installed (or give --bin-dir with ${*})"
	for p in "$@"; do [[ -x $state/bin/$p ]] || missing+=("./cmd/$p"); done
	((${#missing[@]} == 0)) && return 0
	note "building ${missing[*]#./cmd/}"
	(cd "$root" && go build -o "$state/bin/" "${missing[@]}")
}
bin() { echo "${bin_dir:-$state/bin}/$1"; }

init_shard() { # I: a throwaway cluster listening on the host's address only
	local h="shard$1" addr
	addr=$(shard_addr "$1")
	mkdir -p "$state/$h"
	chown postgres: "$state/$h"
	(cd "$state/$h" && runuser -u postgres -- "$pg_bin/initdb" -D "$state/$h/data" -U postgres -A trust -E UTF8 \
		--locale=C --no-sync --no-instructions >"$state/$h/initdb.log" 2>&1) || { cat "$state/$h/initdb.log" >&2; return 1; }
	cat >>"$state/$h/data/postgresql.conf" <<EOF
# netlab: this host's address only; the shaped path is the delay line on port $pg_port
listen_addresses = '$addr'
port = $pg_raw_port
unix_socket_directories = ''
max_connections = 300
max_prepared_transactions = 20
shared_buffers = 32MB
fsync = off
full_page_writes = off
EOF
	echo "host all all $subnet trust" >>"$state/$h/data/pg_hba.conf"
}

start_shard() {
	local h="shard$1"
	(cd "$state/$h" && pg_as "$h" "$pg_bin/pg_ctl" -D "$state/$h/data" -l "$state/$h/postgres.log" -w -t 60 start \
		>"$state/$h/pg_ctl.log" 2>&1 </dev/null 3>&- 9>&-) || { cat "$state/$h/pg_ctl.log" "$state/$h/postgres.log" >&2; return 1; }
}

# start_delayline HOST LISTEN UPSTREAM: the host's delay line, with one proxy.
start_delayline() {
	local h=$1 name
	name=$(proxy_name "$h")
	printf '[{"name":"%s","listen":"%s","upstream":"%s"}]\n' "$name" "$2" "$3" >"$state/$h/proxies.json"
	# Started directly (not through a function, which would fork a subshell) so that
	# $! is the delay line itself: setsid and ip netns exec replace themselves with it.
	# One thread (--procs 1): under pgbench -S at the zone preset it cost 0.77x the CPU
	# per transaction of Go's default two, and the proxy made 1.1-1.2x the throughput.
	ip netns exec "$(ns "$h")" setsid "$(bin delayline)" --procs 1 --api "$api" --proxies "$state/$h/proxies.json" \
		>"$state/$h/delayline.log" 2>&1 </dev/null 3>&- 9>&- &
	echo $! >"$state/$h/delayline.pid"
}

# api_curl HOST CURL_ARG...: curl to the delay line's API inside HOST, never through a
# proxy that http_proxy or ALL_PROXY may name (curl would send even 127.0.0.1 there).
api_curl() { local h=$1; shift; in_ns "$h" curl --noproxy '*' -s "$@"; }

wait_delayline() {
	local h=$1
	for _ in $(seq 100); do
		api_curl "$h" -f -o /dev/null "http://$api/version" && return 0
		alive "$(cat "$state/$h/delayline.pid")" || break
		sleep 0.05
	done
	cat "$state/$h/delayline.log" >&2
	die "the delay line on $h did not start"
}

proxy_name() { [[ $1 == mw ]] && echo proxy || echo pg; }

# toxic HOST NAME STREAM DELAY_US JITTER_US: sets a delay toxic, replacing the one of
# that name (Toxiproxy's update in place races with the connections that read it).
toxic() {
	local h=$1 name=$2 stream=$3 body url
	url="http://$api/proxies/$(proxy_name "$h")/toxics"
	body=$(printf '{"name":"%s","type":"delay","stream":"%s","attributes":{"delay_us":%d,"jitter_us":%d}}' "$name" "$stream" "$4" "$5")
	remove_toxic "$h" "$name"
	api_curl "$h" -f -o /dev/null -X POST "$url" -d "$body" || die "could not set the delay toxic $name on $h"
}
remove_toxic() { api_curl "$1" -o /dev/null -X DELETE "http://$api/proxies/$(proxy_name "$1")/toxics/$2" || true; }

# set_delay DELAY_US: every delay line holds each direction DELAY_US ± the jitter.
set_delay() {
	local h
	for h in $(server_hosts); do
		toxic "$h" delay_up upstream "$1" "$(state_get jitter_us)"
		toxic "$h" delay_down downstream "$1" "$(state_get jitter_us)"
	done
	state_set delay_us "$1"
}

# --- measuring -----------------------------------------------------------------------
shard_dsn() { echo "postgres://postgres@$(shard_addr "$1"):$2/postgres?sslmode=disable&connect_timeout=5"; }

# sql_probe FROM DSN N: netprobe's line for N round trips from host FROM.
sql_probe() {
	local timeout
	timeout=$(awk -v n="$3" -v r="$(state_get delay_us)" 'BEGIN { printf "%ds\n", 10 + n * (2 * r + 5000) / 1000000 }')
	in_ns "$1" "$(bin netprobe)" sql --count "$3" --timeout "$timeout" "$2"
}
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<<"$2"; }

# probe_count: SQL samples per link, about a second's worth, 30 to 200.
probe_count() {
	if [[ -n $probes ]]; then echo "$probes"; return; fi
	local target
	target=$(state_get rtt_us)
	[[ -n $target ]] || target=$((2 * $(state_get delay_us) + 100))
	awk -v t="$target" 'BEGIN { n = int(1000000 / (t > 1 ? t : 1)); print (n < 30 ? 30 : (n > 200 ? 200 : n)) }'
}

# measure_links OUT: SQL round trips from mw to every shard through the shaped path,
# one line per link into OUT.
measure_links() {
	local out=$1 n i line
	n=$(probe_count)
	: >"$out"
	for ((i = 0; i < $(state_get shards); i++)); do
		line=$(sql_probe mw "$(shard_dsn "$i" $pg_port)" "$n") || die "cannot reach shard$i from mw through the shaped path"
		echo "mw->shard$i $line" >>"$out"
	done
}
# median_of_links FILE: the median of the links' medians, in ms.
median_of_links() {
	sed -n 's/.* median_ms=\([^ ]*\).*/\1/p' "$1" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
# off_links FILE: the links whose median is off the target by more than tolerance_us.
off_links() {
	local target
	target=$(state_get rtt_us)
	[[ -n $target ]] || return 0
	awk -v t="$target" '{
		m = $0; sub(/.* median_ms=/, "", m); sub(/ .*/, "", m)
		d = m * 1000 - t; if (d < 0) d = -d
		if (d > (t / 4 > 150 ? t / 4 : 150)) printf "%s %s ms; ", $1, m
	}' "$1"
}
tolerance_text="25% or 0.15 ms, whichever is larger"

# calibrate: sets the delay that makes the median SQL round trip from mw to the shards
# the target: first the path without delay, then two corrections, each from a
# measurement (a delay line that holds chunks costs a wakeup more than one that passes
# them on, so the first step overshoots).
calibrate() {
	local target m d tmp
	target=$(state_get rtt_us)
	tmp="$state/calibrate.txt"
	set_delay 0
	measure_links "$tmp"
	m=$(median_of_links "$tmp")
	state_set path_rtt_ms "$m"
	d=$(awk -v t="$target" -v m="$m" 'BEGIN { d = (t - m * 1000) / 2; printf "%d\n", (d > 0 ? d : 0) }')
	if ((d == 0)); then
		note "the path's own round trip ($m ms, mostly the delay line) is at or above the target $(us_ms "$target") ms: no delay added"
		return 0
	fi
	for _ in 1 2; do
		set_delay "$d"
		measure_links "$tmp"
		m=$(median_of_links "$tmp")
		d=$(awk -v t="$target" -v m="$m" -v d="$d" 'BEGIN { d += (t - m * 1000) / 2; printf "%d\n", (d > 0 ? d : 0) }')
	done
	set_delay "$d"
}

# verify OUT: measures every shard link into OUT and the state, and fails when a median
# is off the target by more than the tolerance (and verification is on). A busy machine
# has moments: up to three measurements are made before it gives up.
verify() {
	local out=$1 target off="" attempt
	target=$(state_get rtt_us)
	for attempt in 1 2 3; do
		measure_links "$out"
		off=$(off_links "$out")
		[[ -n $off ]] || break
		((attempt == 3)) || { note "off the target $(us_ms "$target") ms: ${off%; }; measuring again"; sleep 1; }
	done
	cp "$out" "$state/rtt.txt"
	state_set verified "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	sed 's/^/netlab: /' "$out" >&2
	if [[ -n $off ]]; then
		local msg
		msg="round trips off the target $(us_ms "$target") ms ($tolerance_text) in 3 measurements: ${off%; }"
		if ((verify)); then
			state_set rtt_check "failed: $msg"
			echo "netlab.sh: $msg; the machine may be too busy to model this network (--no-verify records without failing)" >&2
			return 1
		fi
		state_set rtt_check "off, not enforced (--no-verify): $msg"
		note "$msg (not enforced: --no-verify)"
		return 0
	fi
	state_set rtt_check "$([[ -n $target ]] && echo "ok, within $tolerance_text of $(us_ms "$target") ms" || echo "no target (--delay)")"
}

# shaping_summary: one line for run.txt and status.
shaping_summary() {
	printf 'preset=%s rtt_target_ms=%s delay_us=%s jitter_us=%s loss_pct=%s rate=%s\n' "$(state_get preset)" \
		"$([[ -n $(state_get rtt_us) ]] && us_ms "$(state_get rtt_us)" || echo none)" "$(state_get delay_us)" \
		"$(state_get jitter_us)" "$(state_get loss)" "$(state_get rate)"
}

# --- up --------------------------------------------------------------------------------
do_up() {
	local i
	resolve_shaping
	need_root_and_tools ping
	for p in initdb pg_ctl postgres; do [[ -x $pg_bin/$p ]] || bad "$pg_bin/$p is missing: install postgresql-15 or set SHARDLAB_PG_BINDIR"; done
	id postgres >/dev/null 2>&1 || bad "no 'postgres' OS user to run the clusters as"
	lock
	if lab_is_up; then
		die "lab $lab is already up ($(state_get shards) shards, $(state_get preset)); netlab.sh down first, or --lab OTHER"
	fi
	if [[ -e $state ]] && ! owns_state; then
		die "$state is in the way: not a state directory up made for lab $lab (no lab.env naming it); give another --state-dir or --lab"
	fi
	if [[ -e $state || -n $(lab_namespaces) ]]; then
		note "lab $lab: cleaning up what an earlier run left behind"
		teardown
	fi
	exit_down=1
	trap_exits
	# The state directory appears with its lab.env, which marks it as the lab's (the
	# only directory teardown removes): made aside, then renamed into place.
	local tmp
	tmp=$(mktemp -d "$state_root/.$lab.XXXXXX")
	chmod 711 "$tmp"
	cat >"$tmp/lab.env" <<EOF
lab=$lab
shards=$shards
preset=$preset_name
rtt_us=$rtt_us
delay_us=${delay_us:-0}
jitter_us=$jitter_us
loss=$loss
loss_ppm=$loss_ppm
rate=$rate
rate_bps=$rate_bps
bin_dir=$bin_dir
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
	mv -T -- "$tmp" "$state"
	build_bins netprobe delayline
	note "lab $lab: client, mw and $shards shard hosts on $subnet ($(shaping_summary))"
	ip netns add "$(ns sw)"
	disable_ipv6 sw
	in_ns sw ip link set lo up
	ip -n "$(ns sw)" link add br0 type bridge
	ip -n "$(ns sw)" link set dev br0 up
	mkdir -p "$state/client" "$state/mw"
	add_host client "$client_addr"
	add_host mw "$mw_addr"
	for ((i = 0; i < shards; i++)); do add_host "shard$i" "$(shard_addr "$i")"; done
	local pids=()
	for ((i = 0; i < shards; i++)); do init_shard "$i" & pids+=($!); done
	for i in "${pids[@]}"; do wait "$i" || die "initdb failed"; done
	for ((i = 0; i < shards; i++)); do start_shard "$i"; done
	start_delayline mw "$mw_addr:$mw_port" "$mw_addr:$mw_raw_port"
	for ((i = 0; i < shards; i++)); do
		start_delayline "shard$i" "$(shard_addr "$i"):$pg_port" "$(shard_addr "$i"):$pg_raw_port"
	done
	for h in $(server_hosts); do wait_delayline "$h"; done
	if [[ -n $rtt_us ]]; then calibrate; else set_delay "$delay_us"; fi
	if ! verify "$state/verify.txt"; then
		# The calibration's moment may have been unlike the machine's now (one link
		# faster or slower under a busy machine's load): once more, then it holds.
		[[ -n $rtt_us ]] || exit 1
		note "calibrating again"
		calibrate
		verify "$state/verify.txt" || exit 1
	fi
	state_set ready 1
	# A run that brought the network up takes it down when it ends; up leaves it.
	[[ $command == run ]] || exit_down=0
	note "lab $lab is up: $(shaping_summary); scripts/netlab.sh status shows it, scripts/netlab.sh down ends it"
}

# --- status ----------------------------------------------------------------------------
do_status() {
	if ! lab_is_up; then
		if [[ -d $state || -n $(lab_namespaces) ]]; then
			echo "lab $lab is not (completely) up: left from a run that did not finish; scripts/netlab.sh down cleans it up"
			return 1
		fi
		echo "lab $lab is down"
		return 0
	fi
	echo "lab $lab: $(shaping_summary)"
	echo "state: $state"
	local h pid services faults
	printf '%-8s %-13s %-30s %s\n' host address namespace services
	for h in $(all_hosts); do
		services=""
		case $h in
		client) services="-" ;;
		mw)
			pid=$(cat "$state/mw/delayline.pid" 2>/dev/null)
			services="delay line :$mw_port -> :$mw_raw_port ($(alive "$pid" && echo running || echo DOWN))"
			[[ -f $state/mw/shard-proxy.pid ]] && alive "$(cat "$state/mw/shard-proxy.pid")" && services+=", shard-proxy :$mw_raw_port"
			;;
		shard*)
			pid=$(cat "$state/$h/delayline.pid" 2>/dev/null)
			services="delay line :$pg_port ($(alive "$pid" && echo running || echo DOWN))"
			services+=", postgres :$pg_raw_port ($(pg_as "$h" "$pg_bin/pg_ctl" -D "$state/$h/data" status >/dev/null 2>&1 && echo running || echo DOWN))"
			;;
		esac
		faults=$(paste -sd, "$state/$h/faults" 2>/dev/null || true)
		printf '%-8s %-13s %-30s %s%s\n' "$h" "$(host_addr "$h")" "$(ns "$h")" "$services" "${faults:+; FAULTS: $faults}"
	done
	echo "round trips measured $(state_get verified) ($(state_get rtt_check)):"
	sed 's/^/  /' "$state/rtt.txt"
}

# --- faults ----------------------------------------------------------------------------
do_fault() {
	((${#positional[@]} >= 2)) || bad "fault takes a kind and a host: partition|oneway|slow|loss|heal HOST"
	local kind=${positional[0]} h=${positional[1]} arg=${positional[2]:-}
	((${#positional[@]} <= 3)) || bad "fault $kind: too many arguments"
	[[ $kind =~ ^(partition|oneway|slow|loss|heal)$ ]] || bad "unknown fault '$kind': partition, oneway, slow, loss or heal"
	need_root_and_tools
	lab_is_up || die "lab $lab is not up (scripts/netlab.sh up)"
	if [[ $kind == heal && $h == all ]]; then
		local x
		for x in $(all_hosts); do heal "$x"; done
		note "every host healed"
		return 0
	fi
	check_host "$h"
	apply_fault "$kind" "$h" "$arg"
	note "$h: $kind${arg:+ $arg}"
}

# apply_fault KIND HOST [ARG]: the fault, on a lab that is up (fault, and run faults).
apply_fault() {
	local kind=$1 h=$2 arg=${3:-}
	case $kind in
	partition)
		[[ -z $arg ]] || bad "fault partition takes only a host"
		in_ns "$h" nft add rule inet netlab fault_in iifname eth0 drop
		in_ns "$h" nft add rule inet netlab fault_out oifname eth0 drop
		echo "partition" >>"$state/$h/faults"
		;;
	oneway)
		case ${arg:-out} in
		out) in_ns "$h" nft add rule inet netlab fault_out oifname eth0 drop ;;
		in) in_ns "$h" nft add rule inet netlab fault_in iifname eth0 drop ;;
		*) bad "fault oneway HOST takes out (what HOST sends is dropped) or in, got '$arg'" ;;
		esac
		echo "oneway-${arg:-out}" >>"$state/$h/faults"
		;;
	slow)
		[[ $h != client ]] || bad "the client host has no delay line (it serves nothing): slow mw or a shard host"
		local us
		us=$(duration_us "${arg:-50ms}") || bad "fault slow HOST takes a duration such as 50ms, got '$arg'"
		toxic "$h" slow downstream "$us" 0
		echo "slow+$(us_ms "$us")ms" >>"$state/$h/faults"
		;;
	loss)
		[[ -n $arg ]] || bad "fault loss HOST takes a percentage"
		local ppm
		ppm=$(loss_ppm "$arg") || bad "fault loss takes a percentage from 0 to 100, got '$arg'"
		set_loss "$h" "$ppm"
		echo "loss=${arg%\%}%" >>"$state/$h/faults"
		;;
	heal)
		[[ -z $arg ]] || bad "fault heal takes only a host (or all)"
		heal "$h"
		;;
	*) bad "unknown fault '$kind': partition, oneway, slow, loss or heal" ;;
	esac
}

heal() {
	local h=$1
	in_ns "$h" nft flush chain inet netlab fault_in
	in_ns "$h" nft flush chain inet netlab fault_out
	set_loss "$h" "$(state_get loss_ppm)"
	[[ $h == client ]] || remove_toxic "$h" slow
	rm -f "$state/$h/faults"
}

# --- run -------------------------------------------------------------------------------
# start_run PREFIX: claims the run directory and writes the head of run.txt.
start_run() {
	claim_run_dir "$runs_dir" "$(new_run_id "$1")" || exit 1
	mkdir -p "$run_dir/logs"
	run_info_start "$run_dir/run.txt" "$cmdline" "$root"
	{
		echo "lab: $lab, $(state_get shards) shard hosts, $subnet"
		echo "shaping: $(shaping_summary)"
		[[ -n $(state_get path_rtt_ms) ]] && echo "path_rtt_without_delay_ms: $(state_get path_rtt_ms)"
		echo "delay_line: lab/delayline (Toxiproxy $(go_module_version github.com/Shopify/toxiproxy/v2) with a microsecond delay toxic), one per server host"
	} >>"$run_dir/run.txt"
	note "run $run_id: writing to $(show_path "$run_dir")"
}
go_module_version() { awk -v m="$1" '$1 == m { print $2; exit }' "$root/go.mod"; }

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
delayline_ticks() {
	local h t=0
	for h in $(server_hosts); do t=$((t + $(cpu_ticks "$(cat "$state/$h/delayline.pid")"))); done
	echo "$t"
}

# icmp_line FROM TO N: ping's samples summarized like netprobe's line.
icmp_line() {
	local out
	out=$(in_ns "$1" ping -n -c "$3" -i 0.01 -W 1 "$2" 2>&1) || true
	awk -v sent="$3" '
		/ time=/ { for (i = 1; i <= NF; i++) if ($i ~ /^time=/) { sub("time=", "", $i); v[++n] = $i + 0 } }
		END {
			for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
			loss = (sent - n) * 100 / sent
			if (n == 0) { printf "n=0 loss_pct=%.1f\n", loss; exit }
			s = 0; for (i = 1; i <= n; i++) s += v[i]
			p = int(0.99 * n + 0.999999); med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
			printf "n=%d loss_pct=%.1f min_ms=%.3f median_ms=%.3f p99_ms=%.3f max_ms=%.3f mean_ms=%.3f\n", n, loss, v[1], med, v[p], v[n], s / n
		}' <<<"$out"
}

csv_row() { # LINK PROBE LINE
	local f out="$1,$2"
	for f in n loss_pct min_ms median_ms p99_ms max_ms mean_ms; do out+=",$(field "$f" "$3")"; done
	echo "$out"
}

run_ping() {
	start_run netlab-ping-
	local csv="$run_dir/rtt.csv" i line
	echo "link,probe,n,loss_pct,min_ms,median_ms,p99_ms,max_ms,mean_ms" >"$csv"
	line=$(icmp_line client "$mw_addr" "$count")
	csv_row client-mw icmp "$line" >>"$csv"
	for ((i = 0; i < $(state_get shards); i++)); do
		line=$(icmp_line mw "$(shard_addr "$i")" "$count")
		csv_row "mw-shard$i" icmp "$line" >>"$csv"
		line=$(sql_probe mw "$(shard_dsn "$i" $pg_port)" "$count") || die "cannot reach shard$i from mw through the shaped path"
		csv_row "mw-shard$i" sql-shaped "$line" >>"$csv"
		line=$(sql_probe "shard$i" "$(shard_dsn "$i" $pg_raw_port)" "$count") || die "cannot reach PostgreSQL on shard$i from its own host"
		csv_row "shard$i-local" sql-local "$line" >>"$csv"
	done
	run_info_finish "$run_dir/run.txt"
	{
		echo "measured (median/p99 ms; icmp: the kernel's path, without the delay line):"
		awk -F, 'NR > 1 { printf "  %s %s: median %s p99 %s (n=%s%s)\n", $1, $2, $6, $7, $3, ($4 == "" ? "" : ", loss " $4 "%") }' "$csv"
	} | tee -a "$run_dir/run.txt"
	echo "results: $(show_path "$run_dir")" >&2
}

# start_proxy LOG ARG...: shard-proxy on mw, behind mw's delay line, with ARGs; the one
# before (of this run, or left by a run that was killed) is stopped first. on_exit stops
# it however the run ends.
start_proxy() {
	local log=$1 proxy_pid
	shift
	stop_proxy
	rm -f -- "$state/mw/proxy.addr"
	ip netns exec "$(ns mw)" setsid "$(bin shard-proxy)" --listen "$mw_addr:$mw_raw_port" --addr-file "$state/mw/proxy.addr" \
		--log-level warn --stats-interval 0 "$@" >"$log" 2>&1 </dev/null 3>&- 9>&- &
	proxy_pid=$!
	exit_proxy_pid=$proxy_pid
	echo "$proxy_pid" >"$state/mw/shard-proxy.pid"
	for _ in $(seq 100); do
		[[ -s $state/mw/proxy.addr ]] && return 0
		alive "$proxy_pid" || { cat "$log" >&2; die "shard-proxy did not start"; }
		sleep 0.1
	done
	die "shard-proxy did not start within 10 s"
}
# stop_proxy: stops the proxy start_proxy started, or one a killed run left behind (not
# one of a run going on: run holds the lock).
stop_proxy() {
	if [[ -n $exit_proxy_pid ]]; then
		stop_pids pid_is_ours "$exit_proxy_pid"
	elif [[ -f $state/mw/shard-proxy.pid ]]; then
		stop_pids pid_is_ours "$(cat "$state/mw/shard-proxy.pid")"
	fi
	rm -f -- "$state/mw/shard-proxy.pid"
	exit_proxy_pid=""
}

run_pgbench() {
	build_bins shard-proxy netprobe delayline
	local i n shards_n args=()
	shards_n=$(state_get shards)
	for ((i = 0; i < shards_n; i++)); do
		in_ns "shard$i" psql "$(shard_dsn "$i" $pg_raw_port)" -X -q -At -c "SELECT 1 FROM pg_database WHERE datname = 'app'" | grep -q 1 ||
			in_ns "shard$i" psql "$(shard_dsn "$i" $pg_raw_port)" -X -q -c "CREATE DATABASE app" ||
			die "could not create the database app on shard$i"
		args+=(--shard "postgres://postgres@$(shard_addr "$i"):$pg_port/app?sslmode=disable")
	done
	start_run netlab-pgbench-
	{
		echo "workload: pgbench -S -M $mode, $clients clients, ${time_s} s, scale $scale, through shard-proxy on mw (pool size $pool_size${proxy_args[*]:+, ${proxy_args[*]}})"
		echo "pgbench: $(pgbench --version)"
	} >>"$run_dir/run.txt"
	start_proxy "$run_dir/logs/shard-proxy.log" --database app "${args[@]}" \
		--sharded pgbench_accounts=aid --sharded pgbench_history=aid --broadcast pgbench_branches --broadcast pgbench_tellers \
		--pool-size "$pool_size" "${proxy_args[@]}"
	local pgb=(ip netns exec "$(ns client)" pgbench -h "$mw_addr" -p "$mw_port" -U postgres)
	note "pgbench -i --scale $scale from client through mw"
	"${pgb[@]}" -i -q --scale "$scale" app 9>&- >"$run_dir/logs/pgbench-init.txt" 2>&1 || { cat "$run_dir/logs/pgbench-init.txt" >&2; die "pgbench -i failed"; }

	verify "$run_dir/rtt.txt" || die "not measured: the round trips are off the preset's (see $(show_path "$run_dir")/rtt.txt)"
	local line
	line=$(sql_probe client "postgres://postgres@$mw_addr:$mw_port/app?sslmode=disable&connect_timeout=5" "$(probe_count)") ||
		die "cannot reach the proxy from the client"
	echo "client->mw->shard(proxy) $line" >>"$run_dir/rtt.txt"
	{
		echo "rtt_check: $(state_get rtt_check)"
		echo "rtt (SQL SELECT 1 round trips through the shaped path, netprobe):"
		sed 's/^/  /' "$run_dir/rtt.txt"
	} >>"$run_dir/run.txt"

	local hz c0 d0 c1 d1 out="$run_dir/logs/pgbench-S.txt" status=ok
	hz=$(getconf CLK_TCK)
	note "pgbench -S -M $mode -c $clients -T $time_s from client through the proxy"
	c0=$(cpu_ticks "$exit_proxy_pid") d0=$(delayline_ticks)
	"${pgb[@]}" -S -M "$mode" -c "$clients" -j "$(((clients + 1) / 2))" -T "$time_s" -n app 9>&- >"$out" 2>&1 || status=failed
	c1=$(cpu_ticks "$exit_proxy_pid") d1=$(delayline_ticks)
	n=$(grep -oP 'number of transactions actually processed: \K[0-9]+' "$out" || echo 0)
	local tps lat failed
	tps=$(grep -oP 'tps = \K[0-9.]+' "$out" | tail -n 1 || echo 0)
	lat=$(grep -oP 'latency average = \K[0-9.]+' "$out" || echo nan)
	failed=$(grep -oP 'number of failed transactions: \K[0-9]+' "$out" || echo 0)
	per_tx() { awk -v c="$1" -v n="$n" -v hz="$hz" 'BEGIN { if (n > 0) printf "%.1f", c * 1e6 / hz / n; else print "nan" }'; }
	local proxy_cpu dl_cpu
	proxy_cpu=$(per_tx $((c1 - c0))) dl_cpu=$(per_tx $((d1 - d0)))
	run_info_finish "$run_dir/run.txt"
	echo "preset,shards,rtt_target_ms,delay_us,jitter_us,loss_pct,rate,clients,mode,time_s,transactions,tps,latency_avg_ms,failed,proxy_cpu_us_per_tx,delayline_cpu_us_per_tx,status" >"$run_dir/results.csv"
	echo "$(state_get preset),$shards_n,$([[ -n $(state_get rtt_us) ]] && us_ms "$(state_get rtt_us)"),$(state_get delay_us),$(state_get jitter_us),$(state_get loss),$(state_get rate),$clients,$mode,$time_s,$n,$tps,$lat,$failed,$proxy_cpu,$dl_cpu,$status" >>"$run_dir/results.csv"
	local summary
	summary="pgbench -S -M $mode, $clients clients over $shards_n shards ($(state_get preset)): $tps tps, latency $lat ms, $failed failed; CPU per transaction: proxy $proxy_cpu µs, delay lines $dl_cpu µs ($status)"
	echo "result: $summary" >>"$run_dir/run.txt"
	echo "$summary"
	echo "results: $(show_path "$run_dir")" >&2
	[[ $status == ok ]] || { cat "$out" >&2; exit 1; }
}

# --- the tail experiment ------------------------------------------------------------
tail_query_point='SELECT v FROM tail_items WHERE id = $1'
tail_query_cross='SELECT id, v FROM tail_items ORDER BY v LIMIT 10'

# tail_load K: the database tailK on shard hosts 0..K-1, made anew, with tail_items
# sharded over them by id through a proxy over those K (started and left running).
tail_load() {
	local k=$1 i
	for ((i = 0; i < k; i++)); do
		in_ns "shard$i" env PGOPTIONS="-c client_min_messages=warning" psql "$(shard_dsn "$i" $pg_raw_port)" -X -q -v ON_ERROR_STOP=1 \
			-c "DROP DATABASE IF EXISTS tail$k WITH (FORCE)" -c "CREATE DATABASE tail$k" >/dev/null ||
			die "could not create the database tail$k on shard$i"
	done
	tail_proxy "$k"
	local dsn="postgres://postgres@$mw_addr:$mw_port/tail?sslmode=disable&connect_timeout=5"
	in_ns client psql "$dsn" -X -q -v ON_ERROR_STOP=1 \
		-c "CREATE TABLE tail_items (id bigint PRIMARY KEY, v bigint NOT NULL, pad text NOT NULL)" \
		-c "CREATE INDEX tail_items_v ON tail_items (v)" >/dev/null || die "could not create tail_items through the proxy over $k shards"
	# v is a permutation of the ids, so ORDER BY v LIMIT 10 draws its rows from every shard.
	awk -v n="$tail_rows" 'BEGIN { for (i = 1; i <= n; i++) printf "%d,%d,row %d\n", i, (i * 7919) % 1000003, i }' |
		in_ns client psql "$dsn" -X -q -v ON_ERROR_STOP=1 -c "\\copy tail_items FROM STDIN (FORMAT csv)" >/dev/null ||
		die "could not load tail_items through the proxy over $k shards"
	for ((i = 0; i < k; i++)); do
		in_ns "shard$i" psql "postgres://postgres@$(shard_addr "$i"):$pg_raw_port/tail$k?sslmode=disable" -X -q -c "VACUUM ANALYZE tail_items" >/dev/null
	done
}

# tail_proxy K: shard-proxy on mw over shard hosts 0..K-1 (database tailK), serving the
# database tail; the one before is stopped.
tail_proxy() {
	local k=$1 i args=()
	for ((i = 0; i < k; i++)); do
		args+=(--shard "postgres://postgres@$(shard_addr "$i"):$pg_port/tail$k?sslmode=disable")
	done
	start_proxy "$run_dir/logs/shard-proxy-$k.log" --database tail "${args[@]}" --sharded tail_items=id --pool-size 4
}

# tail_latency FROM NAME DSN QUERY [KEY_MAX]: a paced latency run into samples/NAME.
tail_latency() {
	local from=$1 name=$2 dsn=$3 query=$4 key_max=${5:-0}
	in_ns "$from" "$(bin netprobe)" latency --query "$query" --key-max "$key_max" --count "$count" \
		--rate "$qps" --seed "$trial" --out "$run_dir/samples/$name" "$dsn" >/dev/null ||
		die "the latency run $name failed"
}

run_tail() {
	build_bins shard-proxy netprobe delayline
	local lab_shards k i counts=() trial
	lab_shards=$(state_get shards)
	IFS=, read -ra counts <<<"$shard_counts"
	for k in "${counts[@]}"; do
		((k <= lab_shards)) || die "--shard-counts $shard_counts needs $k shard hosts, lab $lab has $lab_shards: netlab.sh down, then run tail (it brings up as many as it needs)"
	done
	local jh=${jitter_host#shard}
	((jh < counts[0])) || note "$jitter_host is not among the first ${counts[0]} shards: the smallest shard counts run without it"
	local extra_us=${extra_jitter_us:-$(state_get delay_us)}
	if [[ " ${run_opts[*]} " != *" --qps "* ]]; then
		# One statement in flight takes a few round trips (client to mw, mw to the
		# shards): a pace of 100 / RTT(ms) a second keeps the connection busy about a
		# quarter of the time, so answers rarely queue behind each other.
		local rtt
		rtt=$(state_get rtt_us)
		[[ -n $rtt ]] || rtt=$((2 * $(state_get delay_us) + 100))
		qps=$(awk -v r="$rtt" 'BEGIN { q = int(100000 / r); print (q > 200 ? 200 : (q < 1 ? 1 : q)) }')
	fi
	start_run netlab-tail-
	mkdir -p "$run_dir/samples"
	{
		echo "workload: through shard-proxy on mw from the client, per shard count and trial: '$tail_query_point' (\$1 uniform over $tail_rows ids) and '$tail_query_cross', $count each at $qps a second on one connection (open loop, latency from when each was due); then the cross-shard query's per-shard statement sent by mw straight to each shard host, all at once"
		echo "tail_items: $tail_rows rows sharded by id over each shard count's hosts; shard counts ${counts[*]}, $trials interleaved trials"
		echo "extra jitter: $jitter_host's delay line holds each chunk $(us_ms "$(state_get delay_us)") ms ± $(us_ms "$extra_us") ms in each direction (the others ± $(us_ms "$(state_get jitter_us)") ms)"
	} >>"$run_dir/run.txt"
	for k in "${counts[@]}"; do
		note "loading tail_items over $k shard hosts"
		tail_load "$k"
	done
	stop_proxy
	verify "$run_dir/rtt.txt" || die "not measured: the round trips are off the preset's (see $(show_path "$run_dir")/rtt.txt)"
	{
		echo "rtt_check: $(state_get rtt_check)"
		echo "rtt (SQL SELECT 1 round trips through the shaped path, netprobe, before the extra jitter):"
		sed 's/^/  /' "$run_dir/rtt.txt"
	} >>"$run_dir/run.txt"
	tail_jitter_set=1 # before the first toxic: a failure of the second must undo the first
	toxic "$jitter_host" delay_up upstream "$(state_get delay_us)" "$extra_us"
	toxic "$jitter_host" delay_down downstream "$(state_get delay_us)" "$extra_us"
	local d0 d1 sends=0 proxy_dsn="postgres://postgres@$mw_addr:$mw_port/tail?sslmode=disable&connect_timeout=5"
	d0=$(delayline_ticks)
	for ((trial = 1; trial <= trials; trial++)); do
		for k in $(printf '%s\n' "${counts[@]}" | shuf); do
			note "trial $trial/$trials: $k shard hosts"
			tail_proxy "$k"
			tail_latency client "k$k-point-t$trial" "$proxy_dsn" "$tail_query_point" "$tail_rows"
			tail_latency client "k$k-cross-t$trial" "$proxy_dsn" "$tail_query_cross"
			stop_proxy
			exit_groups=()
			for ((i = 0; i < k; i++)); do
				# A process group of its own (setsid), without the lock's descriptor: on_exit
				# can stop it, and it cannot hold the lab's lock past the script.
				setsid ip netns exec "$(ns mw)" "$(bin netprobe)" latency --query "$tail_query_cross" --count "$count" --rate "$qps" --seed "$trial" \
					--out "$run_dir/samples/k$k-shard$i-t$trial" "postgres://postgres@$(shard_addr "$i"):$pg_port/tail$k?sslmode=disable&connect_timeout=5" \
					>/dev/null 9>&- &
				exit_groups+=($!)
			done
			for i in "${exit_groups[@]}"; do wait "$i" || die "a direct latency run from mw over $k shards failed"; done
			exit_groups=()
			sends=$((sends + (2 + k) * count))
		done
	done
	d1=$(delayline_ticks)
	tail_restore_jitter
	run_info_finish "$run_dir/run.txt"

	local csv="$run_dir/results.csv" q line model offset p99s
	echo "preset,rtt_target_ms,delay_us,jitter_us,jitter_host,extra_jitter_us,shards,query,n,p50_ms,p99_ms,p999_ms,max_ms,p99_trial_min_ms,p99_trial_max_ms,model_p50_ms,model_p99_ms,model_p999_ms" >"$csv"
	local s="$run_dir/samples" head
	head="$(state_get preset),$([[ -n $(state_get rtt_us) ]] && us_ms "$(state_get rtt_us)"),$(state_get delay_us),$(state_get jitter_us),$jitter_host,$extra_us"
	for k in "${counts[@]}"; do
		# One file per shard host, its trials pooled: the model's servers.
		for ((i = 0; i < k; i++)); do cat "$s"/k"$k"-shard"$i"-t*[0-9] >"$s/k$k-shard$i-all"; done
		# The model's offset: what a point select through the proxy costs beyond one
		# shard's own answer (the client's hop and the proxy), from the medians.
		local point_p50 direct_p50
		point_p50=$(field p50_ms "$(in_ns mw "$(bin netprobe)" quantiles "$s"/k"$k"-point-t*[0-9])")
		direct_p50=$(field p50_ms "$(in_ns mw "$(bin netprobe)" quantiles "$s"/k"$k"-shard*-all)")
		[[ -n $point_p50 && -n $direct_p50 ]] || die "no samples to compute the model's offset over $k shards from"
		offset=$(awk -v a="$point_p50" -v b="$direct_p50" 'BEGIN { printf "%dus\n", (a - b) * 1000 }')
		model=$("$(bin netprobe)" slowest --offset "$offset" "$s"/k"$k"-shard*-all)
		for q in point cross; do
			line=$("$(bin netprobe)" quantiles "$s"/k"$k"-"$q"-t*[0-9])
			p99s=$(for ((trial = 1; trial <= trials; trial++)); do field p99_ms "$("$(bin netprobe)" quantiles "$s/k$k-$q-t$trial")"; done | sort -n)
			local mp50="" mp99="" mp999=""
			[[ $q == cross ]] && mp50=$(field p50_ms "$model") mp99=$(field p99_ms "$model") mp999=$(field p999_ms "$model")
			echo "$head,$k,$q,$(field n "$line"),$(field p50_ms "$line"),$(field p99_ms "$line"),$(field p999_ms "$line"),$(field max_ms "$line"),$(head -n1 <<<"$p99s"),$(tail -n1 <<<"$p99s"),$mp50,$mp99,$mp999" >>"$csv"
		done
	done
	local dl_cpu
	dl_cpu=$(awk -v c="$((d1 - d0))" -v n="$sends" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", (n > 0 ? c * 1e6 / hz / n : 0) }')
	{
		echo "delay lines' CPU: $dl_cpu µs per statement sent ($sends statements)"
		echo "result (ms; model: the slowest of the shards' own answers, plus the point select's cost beyond one shard):"
		awk -F, 'NR > 1 { printf "  %d shards %-5s p50 %s p99 %s p99.9 %s (trials p99 %s-%s)%s\n", $7, $8, $10, $11, $12, $14, $15, ($16 == "" ? "" : sprintf("; model p50 %s p99 %s p99.9 %s", $16, $17, $18)) }' "$csv"
	} | tee -a "$run_dir/run.txt"
	echo "results: $(show_path "$run_dir")" >&2
}

tail_jitter_set=0
tail_restore_jitter() {
	((tail_jitter_set)) || return 0
	tail_jitter_set=0
	# In a subshell: toxic dies on failure, and this runs on the way out.
	(toxic "$jitter_host" delay_up upstream "$(state_get delay_us)" "$(state_get jitter_us)" &&
		toxic "$jitter_host" delay_down downstream "$(state_get delay_us)" "$(state_get jitter_us)") ||
		note "could not take the extra jitter off $jitter_host's delay line: netlab.sh down clears it"
}

# --- faults, measured ------------------------------------------------------------------
# fault_spec KIND: how run faults applies a fault kind: "NFT-KIND ARG".
fault_spec() {
	case $1 in
	partition) echo "partition" ;;
	oneway) echo "oneway out" ;;
	oneway-in) echo "oneway in" ;;
	slow) echo "slow 200ms" ;;
	loss) echo "loss 5" ;;
	*) return 1 ;;
	esac
}
now_us() { date +%s%6N; }

# run_faults: traffic through shard-proxy over the shard hosts while one of them fails
# in turn in each way, and what it did (see usage).
run_faults() {
	build_bins shard-proxy faultload
	local n i shards_n args=() dsn kind spec
	shards_n=$(state_get shards)
	((${faulty_host#shard} < shards_n)) || die "--faulty $faulty_host: lab $lab has $shards_n shard hosts"
	for ((i = 0; i < shards_n; i++)); do
		in_ns "shard$i" env PGOPTIONS="-c client_min_messages=warning" psql "$(shard_dsn "$i" $pg_raw_port)" -X -q -v ON_ERROR_STOP=1 \
			-c "DROP DATABASE IF EXISTS faults WITH (FORCE)" -c "CREATE DATABASE faults" >/dev/null ||
			die "could not create the database faults on shard$i"
		args+=(--shard "postgres://postgres@$(shard_addr "$i"):$pg_port/faults?sslmode=disable")
	done
	((two_phase)) && args+=(--two-phase)
	start_run netlab-faults-
	local total=$((fault_warm + ${#fault_kinds[@]} * (fault_hold + fault_settle) + 5))
	{
		echo "workload: faultload run, $fault_workers workers (each on one shard's keys) through shard-proxy on mw over $shards_n shard hosts$( ((two_phase)) && echo ", --two-phase, half the writes two-key transactions"): reads of fault_items and inserts into fault_acks, a statement every 10 ms per worker, each given up after $fault_bound"
		echo "faults: on $faulty_host (data source ds_${faulty_host#shard}), in turn: ${fault_kinds[*]}; each held ${fault_hold} s, then healed and watched ${fault_settle} s; ${fault_warm} s of traffic before the first"
		echo "proxy: ${proxy_args[*]:-its defaults}"
	} >>"$run_dir/run.txt"
	start_proxy "$run_dir/logs/shard-proxy.log" --database faults "${args[@]}" --sharded fault_items=id --sharded fault_acks=id \
		--pool-size "$pool_size" "${proxy_args[@]}"
	dsn="postgres://postgres@$mw_addr:$mw_port/faults?sslmode=disable&connect_timeout=5"
	"$(bin faultload)" schema | in_ns client psql "$dsn" -X -q -v ON_ERROR_STOP=1 >/dev/null ||
		die "could not create the tables through the proxy"
	awk -v n="$fault_keys" 'BEGIN { for (i = 1; i <= n; i++) print i }' |
		in_ns client psql "$dsn" -X -q -v ON_ERROR_STOP=1 -c "\\copy fault_items (id) FROM STDIN" >/dev/null || die "could not load fault_items"
	: >"$run_dir/shard-map.csv"
	for ((i = 0; i < shards_n; i++)); do
		in_ns "shard$i" psql "postgres://postgres@$(shard_addr "$i"):$pg_raw_port/faults?sslmode=disable" -X -q -At -F, \
			-c "SELECT id, $i FROM fault_items" >>"$run_dir/shard-map.csv"
	done
	n=$(wc -l <"$run_dir/shard-map.csv")
	((n == fault_keys)) || die "the shards hold $n of fault_items' $fault_keys rows"
	verify "$run_dir/rtt.txt" || die "not measured: the round trips are off the preset's (see $(show_path "$run_dir")/rtt.txt)"
	echo "rtt_check: $(state_get rtt_check)" >>"$run_dir/run.txt"

	note "traffic for $total s; faults on $faulty_host: ${fault_kinds[*]}"
	local pairs=()
	((two_phase)) && pairs=(--pairs)
	setsid ip netns exec "$(ns client)" "$(bin faultload)" run --workers "$fault_workers" --keys "$fault_keys" --shard-map "$run_dir/shard-map.csv" \
		--bound "$fault_bound" --duration "${total}s" "${pairs[@]}" --events "$run_dir/events.csv" "$dsn" >"$run_dir/logs/faultload.txt" 2>&1 9>&- &
	local load_pid=$!
	exit_groups=("$load_pid")
	sleep "$fault_warm"
	: >"$run_dir/windows.csv"
	local begin healed
	local spec_kind spec_arg
	for kind in "${fault_kinds[@]}"; do
		spec=$(fault_spec "$kind")
		read -r spec_kind spec_arg <<<"$spec"
		begin=$(now_us)
		exit_fault_host=$faulty_host
		apply_fault "$spec_kind" "$faulty_host" "${spec_arg:-}"
		note "$faulty_host: $kind for $fault_hold s"
		sleep "$fault_hold"
		heal "$faulty_host"
		exit_fault_host=""
		healed=$(now_us)
		echo "$kind,${faulty_host#shard},$begin,$healed" >>"$run_dir/windows.csv"
		note "$faulty_host healed; watching $fault_settle s"
		sleep "$fault_settle"
	done
	wait "$load_pid" || { cat "$run_dir/logs/faultload.txt" >&2; die "the traffic failed"; }
	exit_groups=()

	# What is left once healed: transactions in doubt on the shards, the pools.
	local in_doubt=0 d
	for ((i = 0; i < shards_n; i++)); do
		d=$(in_ns "shard$i" psql "postgres://postgres@$(shard_addr "$i"):$pg_raw_port/faults?sslmode=disable" -X -q -At -c "SELECT count(*) FROM pg_prepared_xacts") || d=unknown
		[[ $d == 0 ]] || in_doubt=$((in_doubt + ${d/unknown/1}))
	done
	in_ns client psql "postgres://postgres@$mw_addr:$mw_port/shardlab?sslmode=disable&connect_timeout=5" -X -c "SHOW POOLS" >"$run_dir/pools.txt" 2>&1 || true
	in_ns client psql "$dsn" -X -q -At -c "\\copy (SELECT id, worker, seq FROM fault_acks) TO STDOUT (FORMAT csv)" >"$run_dir/found.csv" ||
		die "could not read fault_acks back through the proxy"
	client_vanish

	local status=ok line
	line=$("$(bin faultload)" analyze --events "$run_dir/events.csv" --windows "$run_dir/windows.csv" --shard-map "$run_dir/shard-map.csv" \
		--found "$run_dir/found.csv" --out "$run_dir/results.csv") || status=failed
	run_info_finish "$run_dir/run.txt"
	{
		echo "statements: $(cat "$run_dir/logs/faultload.txt")"
		echo "writes: $line"
		echo "in doubt after healing (pg_prepared_xacts, every shard): $in_doubt"
		echo "client vanished in a transaction holding a row lock: $vanish_result"
		echo "result (per fault on ds_${faulty_host#shard}; ms):"
		awk -F, 'function v(x) { return x == "" ? "-" : x }
			NR > 1 { printf "  %-9s others p99 %s -> %s (%s errors of %s); faulty: %s of %s failed, detect %s, longest failure %s, recover %s, after recovery %s errors of %s, hangs %s, %s errors naming the shard\n", $1, $6, $10, $8, $7, $12, $11, v($14), v($15), v($16), $18, $17, $19, $20 }' "$run_dir/results.csv"
	} | tee -a "$run_dir/run.txt"
	echo "results: $(show_path "$run_dir")" >&2
	((in_doubt == 0)) || status=failed
	[[ $status == ok ]] || die "faults: $line; in doubt $in_doubt"
}

# client_vanish: a client in a transaction that holds a row lock, whose host then
# vanishes (partitioned, no reset); sets vanish_result to how long until the row's lock
# was released (the proxy found the client gone and rolled its transaction back), as
# seen by a statement on the row's shard host that waits for it. The client connects
# straight to the proxy's own port, which mw opens to it for this: through mw's delay
# line it would be the delay line's keepalive, not the proxy's, that found the client
# gone. What it starts and changes is recorded for on_exit, so an interrupted run
# leaves none of it.
vanish_result=""
client_vanish() {
	local dsn="postgres://postgres@$mw_addr:$mw_raw_port/faults?sslmode=disable&connect_timeout=5" shard_i t0 t1 client_pid
	shard_i=$(awk -F, '$1 == 1 { print $2 }' "$run_dir/shard-map.csv")
	# --echo --handle prints the rule inserted, with its handle: this one, not another.
	exit_nft_rule=$(in_ns mw nft --echo --handle insert rule inet netlab input ip saddr "$client_addr" tcp dport "$mw_raw_port" accept |
		sed -n 's/.*# handle \([0-9]*\)$/\1/p')
	[[ $exit_nft_rule =~ ^[0-9]+$ ]] || die "could not open mw's proxy port to the client (nft gave no handle)"
	setsid ip netns exec "$(ns client)" bash -c '{ echo "BEGIN;"; echo "UPDATE fault_items SET n = n + 1 WHERE id = 1;"; echo "SELECT '"'locked'"';"; sleep 3600; } | psql "$1" -X -q -At' \
		_ "$dsn" >"$run_dir/logs/vanish-client.txt" 2>&1 </dev/null 9>&- &
	client_pid=$!
	exit_groups=("$client_pid")
	for _ in $(seq 100); do
		grep -q locked "$run_dir/logs/vanish-client.txt" && break
		sleep 0.1
	done
	if grep -q locked "$run_dir/logs/vanish-client.txt"; then
		exit_fault_host=client
		apply_fault partition client
		t0=$(now_us)
		local out released=0
		out=$(in_ns "shard$shard_i" psql "postgres://postgres@$(shard_addr "$shard_i"):$pg_raw_port/faults?sslmode=disable" -X -q -At \
			-c "SET lock_timeout = '${vanish_bound}s'" -c "UPDATE fault_items SET n = n WHERE id = 1" 2>&1) && released=1
		t1=$(now_us)
		heal client
		exit_fault_host=""
		if ((released)); then
			vanish_result=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "released after %.1f s", (b - a) / 1e6 }')
		else
			vanish_result="NOT released within ${vanish_bound} s (${out//$'\n'/ })"
		fi
	else
		vanish_result="not measured: the client's transaction did not start ($(tr '\n' ' ' <"$run_dir/logs/vanish-client.txt"))"
	fi
	kill -- "-$client_pid" 2>/dev/null || true
	wait "$client_pid" 2>/dev/null || true
	exit_groups=()
	[[ -z $exit_nft_rule ]] || in_ns mw nft delete rule inet netlab input handle "$exit_nft_rule"
	exit_nft_rule=""
}

# run_scenarios: the lab's scenarios (scripts/run_all_scenarios.sh) with the demo-server
# and loadgen on mw and the shards on the shard hosts, one each, across the shaped links.
run_scenarios() {
	local i args=()
	for ((i = 0; i < $(state_get shards); i++)); do args+=(--dsn "$(shard_dsn "$i" $pg_port)"); done
	start_run netlab-scenarios-
	verify "$run_dir/rtt.txt" || die "not measured: the round trips are off the preset's (see $(show_path "$run_dir")/rtt.txt)"
	{
		echo "workload: scripts/run_all_scenarios.sh --backend postgres ${scenario_args[*]} on mw (demo-server and loadgen), shard i of a configuration on shard host i"
		echo "rtt_check: $(state_get rtt_check)"
		echo "rtt (SQL SELECT 1 round trips through the shaped path, netprobe):"
		sed 's/^/  /' "$run_dir/rtt.txt"
	} >>"$run_dir/run.txt"
	local d0 d1 status=ok
	d0=$(delayline_ticks)
	note "the scenarios on mw over $(state_get shards) shard hosts"
	in_ns mw "$root/scripts/run_all_scenarios.sh" --backend postgres "${args[@]}" --runs-dir "$run_dir/scenarios" "${scenario_args[@]}" \
		>"$run_dir/logs/scenarios.txt" 2>&1 </dev/null 9>&- || status=failed
	d1=$(delayline_ticks)
	run_info_finish "$run_dir/run.txt"
	echo "delay lines' CPU: $(awk -v c="$((d1 - d0))" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", c / hz }') s over the run" >>"$run_dir/run.txt"
	local report=""
	[[ ! -d $run_dir/scenarios ]] || report=$(find "$run_dir/scenarios" -name report.md | head -n 1)
	echo "result: $status; the scenarios' report is ${report:+$(show_path "$report")}" | tee -a "$run_dir/run.txt"
	echo "results: $(show_path "$run_dir")" >&2
	[[ $status == ok ]] || { tail -n 20 "$run_dir/logs/scenarios.txt" >&2; exit 1; }
}

# run_routerbench: seed 004's experiment with the database/sql driver on mw and its two
# databases on two shard hosts, across the shaped links.
run_routerbench() {
	build_bins routerbench
	# Seed 004's comparison is the limit experiment (one database against two on two
	# servers); routerbench's own default, overhead, uses one.
	[[ " ${routerbench_args[*]} " == *" --experiment"* || " ${routerbench_args[*]} " == *" -experiment"* ]] ||
		routerbench_args=(--experiment=limit "${routerbench_args[@]}")
	(($(state_get shards) >= 2)) || die "run routerbench needs 2 shard hosts, lab $lab has $(state_get shards): netlab.sh down, then run routerbench"
	start_run netlab-routerbench-
	verify "$run_dir/rtt.txt" || die "not measured: the round trips are off the preset's (see $(show_path "$run_dir")/rtt.txt)"
	{
		echo "workload: routerbench ${routerbench_args[*]:-(its defaults)} on mw, its databases on shard0 and shard1 through the shaped path"
		echo "rtt_check: $(state_get rtt_check)"
		echo "rtt (SQL SELECT 1 round trips through the shaped path, netprobe):"
		sed 's/^/  /' "$run_dir/rtt.txt"
	} >>"$run_dir/run.txt"
	local d0 d1 status=ok
	d0=$(delayline_ticks)
	note "routerbench on mw over shard0 and shard1"
	in_ns mw "$(bin routerbench)" --dsn "$(shard_dsn 0 $pg_port)" --dsn "$(shard_dsn 1 $pg_port)" \
		--out "$run_dir/routerbench" "${routerbench_args[@]}" >"$run_dir/logs/routerbench.txt" 2>&1 </dev/null || status=failed
	d1=$(delayline_ticks)
	run_info_finish "$run_dir/run.txt"
	echo "delay lines' CPU: $(awk -v c="$((d1 - d0))" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", c / hz }') s over the run" >>"$run_dir/run.txt"
	echo "result: $status; routerbench's report is $(show_path "$run_dir")/routerbench/report.md" | tee -a "$run_dir/run.txt"
	echo "results: $(show_path "$run_dir")" >&2
	[[ $status == ok ]] || { tail -n 20 "$run_dir/logs/routerbench.txt" >&2; exit 1; }
}

# sweep_opt NAME DEFAULT: the value the sweep's arguments give flag --NAME (the last
# one, as Go's flag package takes it), or DEFAULT.
sweep_opt() {
	local v=$2 i
	for ((i = 0; i < ${#sweep_args[@]}; i++)); do
		case ${sweep_args[i]} in
		--"$1"=* | -"$1"=*) v=${sweep_args[i]#*=} ;;
		--"$1" | -"$1") v=${sweep_args[i + 1]:-} ;;
		esac
	done
	echo "$v"
}

# run_sweep: seed 001's proxy sweep with its client, middleware and database on three
# hosts: proxysweep on mw, its clients in the client's namespace, shard0's server.
run_sweep() {
	build_bins proxysweep shard-proxy
	start_run netlab-sweep-
	verify "$run_dir/rtt.txt" || die "not measured: the round trips are off the preset's (see $(show_path "$run_dir")/rtt.txt)"
	local args=(--workloads "oltp_point_select,oltp_read_write" --threads "8,32" --tables 4 --table-size 25000 --time 10s
		--warmup 2s --trials 3 --pgbench-clients 8 --pgbench-modes extended --pgbench-scale 1 --pool-size 20 --shards 4
		"${sweep_args[@]}")
	{
		echo "workload: proxysweep run --out $(show_path "$run_dir/sweep") --proxy $(bin shard-proxy) --server $(shard_addr 0):$pg_port --listen $mw_addr:$mw_raw_port --reach $mw_addr:$mw_port --client-netns $(ns client)$(quote_args "${args[@]}") on mw, sysbench and pgbench on the client, PostgreSQL on shard0 (the sweep's schema shards in one database there)"
		echo "rtt_check: $(state_get rtt_check)"
		echo "rtt (SQL SELECT 1 round trips through the shaped path, netprobe):"
		sed 's/^/  /' "$run_dir/rtt.txt"
		echo "sysbench: $(sysbench --version)"
		echo "pgbench: $(pgbench --version)"
		echo "pgbouncer: $(pgbouncer --version | head -n 1)"
	} >>"$run_dir/run.txt"
	local d0 d1 status=0
	d0=$(delayline_ticks)
	note "the proxy sweep: client -> mw -> shard0 (logs/sweep.txt shows its progress)"
	# Its scratch directory (pgbouncer's files) in the lab's state, which the postgres
	# user pgbouncer runs as may pass through.
	TMPDIR="$state/mw" in_ns mw "$(bin proxysweep)" run --out "$run_dir/sweep" --proxy "$(bin shard-proxy)" --server "$(shard_addr 0):$pg_port" \
		--listen "$mw_addr:$mw_raw_port" --reach "$mw_addr:$mw_port" --client-netns "$(ns client)" "${args[@]}" \
		>"$run_dir/logs/sweep.txt" 2>&1 </dev/null 9>&- || status=$?
	d1=$(delayline_ticks)
	# proxysweep says 2 for a refused flag, before it writes anything; a Go panic says 2
	# too, but after the sweep started its results: keep those.
	if ((status == 2)) && [[ ! -e $run_dir/sweep/results.csv ]]; then
		cat "$run_dir/logs/sweep.txt" >&2
		discard_run_dir # nothing ran: nothing to keep
		bad "proxysweep refused its arguments (see above)"
	fi
	run_info_finish "$run_dir/run.txt"
	echo "delay lines' CPU: $(awk -v c="$((d1 - d0))" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", c / hz }') s over the run" >>"$run_dir/run.txt"
	if ((status == 0)); then
		"$(bin proxysweep)" report --dir "$run_dir/sweep" --pool-size "$(sweep_opt pool-size 20)" \
			--shards "$(sweep_opt shards 4)" --proxy-procs "$(sweep_opt proxy-procs 1)" \
			--where "the PostgreSQL cluster of host shard0, across the lab's network from mw (the proxy, pgbouncer, the relay) and the client (sysbench, pgbench), $(shaping_summary)" || status=1
	fi
	echo "result: $( ((status == 0)) && echo ok || echo failed); the sweep's report is $(show_path "$run_dir")/sweep/report.md" | tee -a "$run_dir/run.txt"
	echo "results: $(show_path "$run_dir")" >&2
	((status == 0)) || { tail -n 20 "$run_dir/logs/sweep.txt" >&2; exit 1; }
}

do_run() {
	((${#positional[@]} == 1)) || bad "run takes one experiment: ping, pgbench, tail, routerbench, sweep, scenarios or faults"
	local experiment=${positional[0]}
	[[ $experiment =~ ^(ping|pgbench|tail|routerbench|sweep|scenarios|faults)$ ]] || bad "unknown experiment '$experiment': ping, pgbench, tail, routerbench, sweep, scenarios or faults"
	local o want
	for o in "${run_opts[@]}"; do
		case $o in
		--count) want="ping tail" ;;
		--qps | --trials | --shard-counts | --jitter-host | --extra-jitter | --rows) want="tail" ;;
		--routerbench-arg) want=routerbench ;;
		--scenario-arg) want=scenarios ;;
		--sweep-arg) want=sweep ;;
		--faults | --hold | --settle | --faulty | --workers | --bound | --vanish-bound | --two-phase) want=faults ;;
		--pool-size | --proxy-arg) want="pgbench faults" ;;
		*) want=pgbench ;;
		esac
		[[ " $want " == *" $experiment "* ]] || bad "$o is for run ${want// / or run }"
	done
	case $experiment in
	ping) posint --count "$count" ;;
	pgbench)
		posint --clients "$clients"
		posint --time "$time_s"
		posint --scale "$scale"
		posint --pool-size "$pool_size"
		[[ $mode =~ ^(simple|extended|prepared)$ ]] || bad "--mode takes simple, extended or prepared, got '$mode'"
		command -v pgbench >/dev/null || bad "pgbench is not installed (postgresql-client / postgresql-15)"
		;;
	routerbench) [[ -n $shards ]] || shards=2 ;;
	sweep)
		local prog
		for prog in sysbench pgbench pgbouncer runuser; do
			command -v "$prog" >/dev/null || bad "run sweep needs $prog, which is not installed"
		done
		[[ -n $shards ]] || shards=1
		;;
	scenarios) [[ -n $shards ]] || shards=5 ;; # scripts/scenarios.conf goes up to 5 shards
	faults)
		local f
		((${#fault_kinds[@]})) || bad "--faults takes fault kinds separated by commas"
		for f in "${fault_kinds[@]}"; do fault_spec "$f" >/dev/null || bad "--faults: unknown fault '$f': partition, oneway, oneway-in, slow or loss"; done
		posint --hold "$fault_hold"
		posint --settle "$fault_settle"
		posint --workers "$fault_workers"
		posint --pool-size "$pool_size"
		posint --vanish-bound "$vanish_bound"
		[[ $fault_bound =~ ^[1-9][0-9]*s$ ]] || bad "--bound takes whole seconds such as 60s, got '$fault_bound'"
		[[ $faulty_host =~ ^shard[0-9]+$ ]] || bad "--faulty takes a shard host (shard0, shard1 ...), got '$faulty_host'"
		[[ -n $shards ]] || shards=4
		;;
	tail)
		[[ " ${run_opts[*]} " == *" --count "* ]] || count=1000
		posint --count "$count"
		posint --trials "$trials"
		posint --rows "$tail_rows"
		[[ $qps =~ ^[1-9][0-9]*$ ]] || bad "--qps takes a positive whole number of statements a second, got '$qps'"
		[[ $shard_counts =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || bad "--shard-counts takes shard counts separated by commas, such as 1,2,4,8, got '$shard_counts'"
		local k most=0
		for k in ${shard_counts//,/ }; do ((k <= max_shards)) || bad "--shard-counts: at most $max_shards shard hosts, got $k"; most=$((k > most ? k : most)); done
		[[ $jitter_host =~ ^shard[0-9]+$ ]] || bad "--jitter-host takes a shard host (shard0, shard1 ...), got '$jitter_host'"
		((${jitter_host#shard} < most)) || bad "--jitter-host $jitter_host is not among the $most shard hosts the run uses"
		if [[ -n $extra_jitter ]]; then
			extra_jitter_us=$(duration_us "$extra_jitter") || bad "--extra-jitter takes a duration such as 500us or 2ms, got '$extra_jitter'"
		fi
		# Brought up by this run: as many shard hosts as the largest count needs.
		[[ -n $shards ]] || shards=$most
		command -v shuf >/dev/null || bad "shuf is not installed (coreutils)"
		;;
	esac
	command -v psql >/dev/null || bad "psql is not installed (postgresql-client)"
	need_root_and_tools ping
	# One run at a time on a network (two would share mw's proxy port and its pid
	# file), and no up or down during one.
	lock
	trap_exits
	if lab_is_up; then
		((${#up_opts[@]} == 0)) || bad "lab $lab is up already ($(state_get shards) shards, $(state_get preset)); ${up_opts[0]} is for a network run brings up: netlab.sh down first"
	else
		note "lab $lab is down: bringing it up for this run, and down again at the end"
		do_up
	fi
	run_info_sample
	case $experiment in
	ping) run_ping ;;
	pgbench) run_pgbench ;;
	tail) run_tail ;;
	routerbench) run_routerbench ;;
	sweep) run_sweep ;;
	scenarios) run_scenarios ;;
	faults) run_faults ;;
	esac
}

do_exec() {
	((${#positional[@]} == 1)) || bad "exec takes one host, then -- and the command: exec HOST -- COMMAND..."
	((${#exec_cmd[@]})) || bad "exec ${positional[0]}: give the command after --"
	need_root_and_tools
	lab_is_up || die "lab $lab is not up (scripts/netlab.sh up)"
	check_host "${positional[0]}"
	exec ip netns exec "$(ns "${positional[0]}")" "${exec_cmd[@]}"
}

# Commands on a network that is up take its programs from where up took them.
[[ $command == up || -n $bin_dir ]] || bin_dir=$(state_get bin_dir || true)

case $command in
up)
	((${#positional[@]} == 0)) || bad "up takes no arguments, got '${positional[0]}'"
	do_up
	;;
down)
	((${#positional[@]} == 0)) || bad "down takes no arguments, got '${positional[0]}'"
	need_root_and_tools
	lock
	down
	;;
status)
	((${#positional[@]} == 0)) || bad "status takes no arguments, got '${positional[0]}'"
	do_status
	;;
fault) do_fault ;;
run) do_run ;;
exec) do_exec ;;
esac
