#!/bin/bash
# NBD servers side by side: ioplane vs qemu-storage-daemon vs nbdkit, null and raw-file
# backends, driven by fio's nbd engine on a unix socket (4 KiB random reads, one
# connection, queue depth 1 and 64). Per server it measures IOPS, server CPU time per I/O
# (utime+stime of the whole server process from /proc/PID/stat, before/after the run,
# divided by the I/Os fio completed) and, in a separate fixed-count run at depth 64 under
# `strace -c -f -p PID`, server system calls per I/O. Runs alternate between servers;
# each number is the median of --reps runs. Prints a table, then ioplane/qsd ratios
# against ioplane's targets (CPU <= 0.5x qsd, syscalls/IO <= 1.0, IOPS >= qsd).
# Next to the server's CPU per I/O, the client's: fio's own usr_cpu + sys_cpu (the
# getrusage of its job process over the I/O phase, connection set-up excluded) times
# job_runtime, divided by the I/Os; and each side's CPU utilisation, CPU seconds / fio's
# job_runtime seconds (1.00 = one CPU busy all the time; the server's CPU window also holds
# fio's start and connection, a few ms of a 10 s run). fio's nbd engine is one thread per
# job, so a client utilisation near 1.00 means the client, not the server, sets the pace.
# --jobs N runs N fio jobs (numjobs=N, one connection each) against the same server;
# I/Os, IOPS and CPU are summed over the jobs (a client utilisation up to N).
#
#   bench/compare-nbd.sh [--runtime S] [--reps N] [--servers "ioplane qsd nbdkit"]
#                        [--backends "null file"] [--depths "1 64"] [--strace-ios N]
#                        [--file PATH] [--direct] [--qsd-iothread] [--quick] [--strict]
#                        [--ioplane-args "SERVE OPTIONS"] [--tls] [--taskset S:C]
#                        [--jobs N]
#
# Each timed run also counts the machine's inter-processor interrupts (RES + CAL lines of
# /proc/interrupts, all CPUs) per I/O: on a virtual machine a cross-CPU wake-up is one, and
# at depth 1 they say where the scheduler put client and server (about 2 per I/O: on
# different CPUs, each request and each reply wakes the other side there; about 0: on one
# CPU). The summary then compares ioplane with nbdkit at depth 1 (IOPS >= 1.15x, CPU per
# I/O <= 1.0x). --taskset S:C runs every server under taskset -c S and fio under
# taskset -c C (e.g. 1:0 apart, 0:0 together), to measure one placement on purpose.
#
# --tls: NBD over TLS instead, on TCP loopback with one x509 certificate (made with
# certtool) for every server (nbdkit --tls=require --tls-certificates=DIR), two rows:
# 4 KiB random reads at depth 64 and 1 MiB sequential reads at depth 8. Servers default to
# "ioplane ioplane-plain qsd nbdkit", where ioplane-plain is ioplane without TLS on the
# same TCP socket kind (the cost of TLS itself). Ratios: ioplane/qsd CPU per I/O
# (target <= 0.6), 1 MiB throughput (target >= 1.3), ioplane TLS/plain CPU per I/O; the
# record layer each ioplane connection used (GnuTLS or kTLS) from its log. No strace run.
# Then, for the 1 MiB row, each server's and client's utilisation and the client's
# ceiling: the MiB/s fio would read with each job at one full CPU (1 / client CPU per
# MiB, measured against that server), and that ceiling over qsd's measured MiB/s, the
# best 1 MiB throughput ratio a server could reach against this client; and the
# machine's ceiling, all CPUs (nproc) busy with this server and client only: nproc /
# (server + client CPU per MiB). Each figure is a median on its own (of --reps runs).
# fio's nbd engine refuses a certificate directory in its URI (libnbd's local file
# access), so fio does not verify the server (tls-verify-peer=false) and the servers do
# not ask for a client certificate: the handshake is shorter, the record layer the same.
#
# --ioplane-args adds options to ioplane's serve command line, e.g. "--poll-max-ns 0"
# to see what adaptive polling costs and brings.
# Fairness: one connection, served by one I/O thread where the server has a choice
# (ioplane --iothreads 1; nbdkit keeps its default thread pool, which it needs to run
# requests in parallel). qsd serves from its main loop: an iothread would be fairer, but
# qemu-storage-daemon 7.2 aborts when a client of an NBD export bound to an iothread
# disconnects ("nbd_blockdev_client_closed: Assertion `qemu_in_main_thread() &&
# nbd_server' failed"), so --qsd-iothread is off by default. The file backend reads a 1 GiB
# fully allocated file through the page cache (cache=writeback / cache.direct=off,
# io_uring for ioplane and qsd) so that the server's own cost is what is measured;
# --direct uses O_DIRECT for ioplane and qsd instead (nbdkit's file plugin stays
# buffered). qsd's file node is the bare protocol driver (no raw format layer on top),
# which is its cheapest configuration. The null backends do not fill read buffers
# (read-zeroes off) except nbdkit's null plugin, which always does.
# A benchmark, not a test: exit 0 whether targets are met or not (--strict: exit 1 if
# one is missed); exit 2 on bad usage, 1 when a server or client fails.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
runtime=10
reps=3
servers="ioplane qsd nbdkit"
backends="null file"
depths="1 64"
strace_ios=20000
file=
direct=0
strict=0
ioplane_args=()
qsd_iot=()
qsd_exp=
tls=0
taskset_srv=()
taskset_fio=()
servers_given=0
jobs=1
rw=randread
bs=4k

usage() {
	sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case "$1" in
	--runtime) runtime=${2:?}; shift ;;
	--reps) reps=${2:?}; shift ;;
	--servers) servers=${2:?}; servers_given=1; shift ;;
	--backends) backends=${2:?}; shift ;;
	--depths) depths=${2:?}; shift ;;
	--strace-ios) strace_ios=${2:?}; shift ;;
	--file) file=${2:?}; shift ;;
	--direct) direct=1 ;;
	--qsd-iothread) qsd_iot=(--object iothread,id=iot0); qsd_exp=,iothread=iot0 ;;
	--quick) runtime=3; reps=1; strace_ios=5000 ;;
	--strict) strict=1 ;;
	--ioplane-args) read -r -a ioplane_args <<<"${2?}"; shift ;;
	--tls) tls=1 ;;
	--jobs) jobs=${2:?}; shift ;;
	--taskset)
		[[ "${2:-}" =~ ^[0-9,-]+:[0-9,-]+$ ]] || usage
		taskset_srv=(taskset -c "${2%%:*}") taskset_fio=(taskset -c "${2##*:}")
		shift ;;
	-h | --help) usage ;;
	*) echo "compare-nbd.sh: unknown argument $1" >&2; usage ;;
	esac
	shift
done
[[ "$runtime" =~ ^[0-9]+$ && "$reps" =~ ^[0-9]+$ && "$strace_ios" =~ ^[0-9]+$ ]] || usage
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || usage

need() {
	command -v "$1" >/dev/null || { echo "compare-nbd.sh: $1 is not installed" >&2; exit 1; }
}
need fio
need python3
[ ${#taskset_srv[@]} = 0 ] || need taskset
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "fio lacks the nbd engine" >&2; exit 1; }
if [ $tls = 1 ]; then
	[ $servers_given = 1 ] || servers="ioplane ioplane-plain qsd nbdkit"
	need certtool
fi
for s in $servers; do
	case $s in
	ioplane | ioplane-plain) [ -x "$IOPLANE" ] || { echo "no $IOPLANE (build first)" >&2; exit 1; } ;;
	qsd) need qemu-storage-daemon ;;
	nbdkit) need nbdkit ;;
	*) echo "unknown server $s" >&2; usage ;;
	esac
done
have_strace=1
command -v strace >/dev/null || have_strace=0
[ $tls = 0 ] || have_strace=0

tmp=$(mktemp -d /tmp/compare-nbd.XXXXXX)
sock=$tmp/nbd.sock
results=$tmp/results
spid=

cleanup() {
	[ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

if [[ " $backends " == *" file "* ]] && [ -z "$file" ]; then
	file=$tmp/disk.img
	echo "creating a 1 GiB file $file" >&2
	dd if=/dev/zero of="$file" bs=1M count=1024 status=none conv=fsync
fi

# make_pki DIR: a CA, a server certificate for 127.0.0.1 and a client certificate, in the
# file names QEMU, nbdkit and libnbd all read.
make_pki() {
	local d=$1 k
	mkdir -p "$d"
	printf '%s\n' 'cn = "bench CA"' ca cert_signing_key 'expiration_days = 2' >"$d/ca.info"
	printf '%s\n' 'cn = "localhost"' 'ip_address = "127.0.0.1"' tls_www_server \
		encryption_key signing_key 'expiration_days = 2' >"$d/server.info"
	printf '%s\n' 'cn = "bench client"' tls_www_client encryption_key signing_key \
		'expiration_days = 2' >"$d/client.info"
	for k in ca server client; do
		certtool --generate-privkey --outfile "$d/$k-key.pem" >/dev/null 2>&1
	done
	certtool --generate-self-signed --load-privkey "$d/ca-key.pem" --template "$d/ca.info" \
		--outfile "$d/ca-cert.pem" >/dev/null 2>&1
	for k in server client; do
		certtool --generate-certificate --load-privkey "$d/$k-key.pem" \
			--load-ca-certificate "$d/ca-cert.pem" --load-ca-privkey "$d/ca-key.pem" \
			--template "$d/$k.info" --outfile "$d/$k-cert.pem" >/dev/null 2>&1
	done
}

# tls_server_cmd SERVER BACKEND: the TCP (TLS) command line (array srv).
tls_server_cmd() {
	local node t=(--object "tls-creds-x509,id=t0,dir=$pki,endpoint=server,verify-peer=off")
	local addr=addr.type=inet,addr.host=127.0.0.1,addr.port=$port
	if [ "$2" = null ]; then
		node=driver=null-co,node-name=n0,size=1073741824
	else
		node="driver=file,node-name=n0,filename=$file,aio=io_uring,cache.direct=off"
	fi
	case "$1" in
	ioplane) srv=("$IOPLANE" serve --iothreads 1 "${ioplane_args[@]}" "${t[@]}") ;;
	ioplane-plain) srv=("$IOPLANE" serve --iothreads 1 "${ioplane_args[@]}"); t=() ;;
	qsd) srv=(qemu-storage-daemon "${qsd_iot[@]}" "${t[@]}") ;;
	nbdkit)
		srv=(nbdkit -f -i 127.0.0.1 -p "$port" --tls=require "--tls-certificates=$pki")
		if [ "$2" = null ]; then srv+=(null 1G); else srv+=(file "$file"); fi
		return ;;
	esac
	srv+=(--blockdev "$node" --nbd-server "$addr${t:+,tls-creds=t0}"
		--export "type=nbd,id=e0,node-name=n0,name=e0$qsd_exp")
}

# server_cmd SERVER BACKEND: the command line (array srv).
server_cmd() {
	if [ $tls = 1 ]; then
		tls_server_cmd "$@"
		return
	fi
	local cache=writeback qcache=off
	[ $direct = 1 ] && cache=none qcache=on
	case "$1/$2" in
	ioplane/null) srv=("$IOPLANE" serve --iothreads 1 "${ioplane_args[@]}" --image e0,driver=null,size=1G
		--nbd "unix=$sock,image=e0") ;;
	ioplane/file) srv=("$IOPLANE" serve --iothreads 1 "${ioplane_args[@]}"
		--image "e0,file=$file,format=raw,cache=$cache,aio=io_uring"
		--nbd "unix=$sock,image=e0") ;;
	qsd/null) srv=(qemu-storage-daemon "${qsd_iot[@]}"
		--blockdev driver=null-co,node-name=n0,size=1073741824
		--nbd-server "addr.type=unix,addr.path=$sock"
		--export "type=nbd,id=e0,node-name=n0,name=e0$qsd_exp") ;;
	qsd/file) srv=(qemu-storage-daemon "${qsd_iot[@]}"
		--blockdev "driver=file,node-name=n0,filename=$file,aio=io_uring,cache.direct=$qcache"
		--nbd-server "addr.type=unix,addr.path=$sock"
		--export "type=nbd,id=e0,node-name=n0,name=e0$qsd_exp") ;;
	nbdkit/null) srv=(nbdkit -f -U "$sock" null 1G) ;;
	nbdkit/file) srv=(nbdkit -f -U "$sock" file "$file") ;;
	esac
}

listening() {
	if [ $tls = 1 ]; then
		awk -v h="$(printf ':%04X' "$port")" '$2 ~ h"$" && $4 == "0A" { f = 1 }
			END { exit !f }' /proc/net/tcp
		return
	fi
	awk -v p="$1" '$NF == p && $4 == "00010000" { f = 1 } END { exit !f }' /proc/net/unix
}

start_server() {
	local i
	rm -f "$sock"
	sname=$1
	port=$(python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
	uri="nbd+unix:///e0?socket=$sock"
	if [ $tls = 1 ]; then
		uri="nbds://127.0.0.1:$port/e0?tls-verify-peer=false"
		[ "$1" = ioplane-plain ] && uri="nbd://127.0.0.1:$port/e0"
	fi
	server_cmd "$1" "$2"
	"${taskset_srv[@]}" "${srv[@]}" </dev/null >"$tmp/server.log" 2>&1 &
	spid=$!
	for ((i = 0; i < 300; i++)); do
		listening "$sock" && return 0
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.05
	done
	echo "compare-nbd.sh: $1/$2 did not start: ${srv[*]}" >&2
	cat "$tmp/server.log" >&2
	exit 1
}

stop_server() {
	local i
	kill -TERM "$spid" 2>/dev/null || true
	for ((i = 0; i < 200; i++)); do
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$spid" 2>/dev/null || true
	wait "$spid" 2>/dev/null || true
	spid=
	# Which record layer ioplane's TLS connections used (its log says, per connection).
	if [ $tls = 1 ]; then
		{ grep -o 'record layer: .*' "$tmp/server.log" || true; } | sort | uniq -c |
			sed "s/^/  $sname: /" >&2
	fi
	return 0
}

# cpu_ticks PID: utime+stime of every thread of the process, in clock ticks.
cpu_ticks() {
	# Field 2 (comm) may hold spaces: count fields after the closing parenthesis.
	sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

# run_fio DEPTH EXTRA...: print "ios iops client_cpu_ms runtime_ms" of one fio run on the
# server's socket, summed over the --jobs jobs (runtime: the longest job's). The client's
# CPU is fio's usr_cpu + sys_cpu of each job (percent of its job_runtime).
run_fio() {
	local depth=$1 out
	shift
	out=$(cd "$tmp" && "${taskset_fio[@]}" fio --name=bench --ioengine=nbd \
		--uri="$uri" --rw="$rw" --bs="$bs" --size=1G \
		--iodepth="$depth" --numjobs="$jobs" --randrepeat=0 --output-format=json "$@") || {
		echo "compare-nbd.sh: fio failed: $out" >&2
		exit 1
	}
	python3 -c 'import json, sys
s = sys.argv[1]
jobs = json.loads(s[s.index("{"):])["jobs"]
for j in jobs:
    if j["error"]:
        sys.exit("fio error %d" % j["error"])
print(sum(j["read"]["total_ios"] for j in jobs), sum(j["read"]["iops"] for j in jobs),
      sum((j["usr_cpu"] + j["sys_cpu"]) * j["job_runtime"] / 100 for j in jobs),
      max(j["job_runtime"] for j in jobs))' "$out"
}

# ipis: rescheduling and function-call interrupts received so far, all CPUs.
ipis() {
	awk '$1 == "RES:" || $1 == "CAL:" { for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i }
		END { print n + 0 }' /proc/interrupts
}

# measure SERVER BACKEND DEPTH: one timed run; appends "cpu_us", "iops", "ipis" and the
# client's "cli_us" results, and the utilisations "srv_util", "cli_util" (CPU seconds per
# second of fio's I/O phase).
measure() {
	local t0 t1 i0 i1 ios iops hz cpu ipi cms rms ccpu su cu
	hz=$(getconf CLK_TCK)
	t0=$(cpu_ticks "$spid")
	i0=$(ipis)
	read -r ios iops cms rms < <(run_fio "$3" --time_based --runtime="$runtime")
	t1=$(cpu_ticks "$spid")
	i1=$(ipis)
	read -r cpu ccpu ipi su cu < <(python3 -c "n = max($ios, 1); r = max($rms, 1) / 1e3
s = ($t1 - $t0) / $hz
print(s * 1e6 / n, $cms * 1e3 / n, ($i1 - $i0) / n, s / r, $cms / 1e3 / r)")
	echo "$2 $1 $3 iops $iops" >>"$results"
	echo "$2 $1 $3 cpu_us $cpu" >>"$results"
	echo "$2 $1 $3 ipis $ipi" >>"$results"
	echo "$2 $1 $3 cli_us $ccpu" >>"$results"
	echo "$2 $1 $3 srv_util $su" >>"$results"
	echo "$2 $1 $3 cli_util $cu" >>"$results"
	printf '  %-8s %-5s depth %-3s %10.0f IOPS %8.2f us CPU/IO %6.2f IPIs/IO' "$1" "$2" \
		"$3" "$iops" "$cpu" "$ipi" >&2
	printf '  client %8.2f us CPU/IO; utilisation server %4.2f client %4.2f\n' "$ccpu" \
		"$su" "$cu" >&2
}

# count_syscalls SERVER BACKEND: fixed number of I/Os at depth 64 under strace -c -f.
count_syscalls() {
	local st ios iops calls i tasks
	strace -c -f -o "$tmp/strace.out" -p "$spid" 2>"$tmp/strace.err" &
	st=$!
	# Wait until every thread of the server is traced.
	for ((i = 0; i < 200; i++)); do
		tasks=$(grep -h '^TracerPid:' /proc/"$spid"/task/*/status 2>/dev/null |
			awk '$2 == 0 { n++ } END { print n + 0 }')
		[ "$tasks" = 0 ] && break
		sleep 0.05
	done
	read -r ios iops _ < <(run_fio 64 --number_ios="$strace_ios")
	kill -INT $st
	wait $st || true
	# The "total" line: % time, seconds, usecs/call, calls, [errors,] "total".
	calls=$(awk '$NF == "total" { print $4 }' "$tmp/strace.out")
	[ -n "$calls" ] || { echo "no strace summary" >&2; cat "$tmp/strace.err" >&2; exit 1; }
	echo "$2 $1 64 syscalls $(python3 -c "print($calls / max($ios, 1))")" >>"$results"
	printf '  %-8s %-5s depth 64  %10s calls  %8s I/Os under strace; most: %s\n' "$1" "$2" \
		"$calls" "$ios" "$(awk '$NF != "total" && $4 ~ /^[0-9]+$/ { print $4, $NF }' \
		"$tmp/strace.out" | sort -rn | head -n 3 | awk '{ printf "%s %s ", $2, $1 }')" >&2
}

pki=$tmp/pki
ktls=-
if [ $tls = 1 ]; then
	make_pki "$pki"
	# kTLS needs the kernel's tls ULP and a GnuTLS built with it (Debian 12's is not).
	if ! grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp 2>/dev/null; then
		ktls="no (the kernel offers no tls ULP)"
	else
		ktls="the kernel has the tls ULP; the record layer lines say whether GnuTLS used it"
	fi
fi
: >"$results"
echo "runtime ${runtime}s, $reps reps, depths $depths, $jobs fio job(s), servers: $servers" >&2
for ((rep = 0; rep < reps; rep++)); do
	# Rotate the server order every repetition so that no server always goes first.
	read -r -a order <<<"$servers"
	order=("${order[@]:rep % ${#order[@]}}" "${order[@]:0:rep % ${#order[@]}}")
	for b in $backends; do
		for s in "${order[@]}"; do
			echo "rep $((rep + 1))/$reps: $s $b" >&2
			start_server "$s" "$b"
			if [ $tls = 1 ]; then
				rw=randread bs=4k measure "$s" "$b" 64
				rw=read bs=1M measure "$s" "$b" 8
			fi
			for d in $depths; do
				[ $tls = 1 ] && break
				measure "$s" "$b" "$d"
			done
			[ $have_strace = 1 ] && count_syscalls "$s" "$b"
			stop_server
		done
	done
done

# Not exec: the EXIT trap removes $tmp (and the 1 GiB file made for the file backend).
if [ $tls = 1 ]; then
	python3 - "$results" "$strict" "$ktls" "$jobs" <<'EOF'
import collections, os, statistics, sys

# Depth 64: 4 KiB random reads; depth 8: 1 MiB sequential reads.
vals = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, s, d, metric, v = line.split()
    vals[(b, s, int(d), metric)].append(float(v))
med = {k: statistics.median(v) for k, v in vals.items()}
rows = {64: "4k randread d64", 8: "1M read d8"}
servers = [s for s in ("ioplane", "ioplane-plain", "qsd", "nbdkit")
           if any(k[1] == s for k in med)]
backends = sorted({k[0] for k in med}, key=["null", "file"].index)
get = lambda b, s, d, m: med.get((b, s, d, m))
jobs = int(sys.argv[4])
fmt = lambda v, f: "-" if v is None else f % v
label = lambda s: s + ("" if s == "ioplane-plain" else " (TLS)")
# "CPU us/IO" is the server's; "cli us/IO" fio's; "srv/cli util": CPU seconds per second
# of fio's run (1.00 = one CPU busy all the time).
print("%-5s %-16s %-16s %12s %10s %10s %10s %8s %8s" % (
    "bknd", "server", "workload", "IOPS", "MiB/s", "CPU us/IO", "cli us/IO", "srv util",
    "cli util"))
for b in backends:
    for s in servers:
        for d, name in rows.items():
            i, c = get(b, s, d, "iops"), get(b, s, d, "cpu_us")
            if i is None:
                continue
            print("%-5s %-16s %-16s %12.0f %10.1f %10.2f %10s %8s %8s" % (
                b, label(s), name, i, i * (4 if d == 64 else 1024) / 1024, c,
                fmt(get(b, s, d, "cli_us"), "%.2f"), fmt(get(b, s, d, "srv_util"), "%.2f"),
                fmt(get(b, s, d, "cli_util"), "%.2f")))
missed = 0
print("\nkTLS on this machine: %s" % sys.argv[3])
for b in backends:
    checks = []
    for d, name in rows.items():
        c_i, c_q = get(b, "ioplane", d, "cpu_us"), get(b, "qsd", d, "cpu_us")
        if c_i is not None and c_q:
            checks.append(("%s CPU/IO ioplane/qsd" % name, c_i / c_q, "<=", 0.6))
        c_p = get(b, "ioplane-plain", d, "cpu_us")
        if c_i is not None and c_p:
            checks.append(("%s CPU/IO TLS/plain" % name, c_i / c_p, None, None))
    i_i, i_q = get(b, "ioplane", 8, "iops"), get(b, "qsd", 8, "iops")
    if i_i is not None and i_q:
        checks.append(("1M read MiB/s ioplane/qsd", i_i / i_q, ">=", 1.3))
    c_i, c_q = get(b, "ioplane", 8, "cli_us"), get(b, "qsd", 8, "cli_us")
    if c_i is not None and c_q:
        checks.append(("1M read client CPU/IO ioplane/qsd", c_i / c_q, None, None))
    for name, v, op, target in checks:
        if op is None:
            print("  %-5s %-34s %6.2f" % (b, name, v))
            continue
        ok = v <= target if op == "<=" else v >= target
        missed += not ok
        print("  %-5s %-34s %6.2f  (target %s %.1f)  %s"
              % (b, name, v, op, target, "met" if ok else "MISSED"))

# Which side saturates a CPU on the 1 MiB row, and two ceilings at the CPU per MiB measured
# against that server: the client's (each fio job at one full CPU) and the machine's (every
# CPU busy with server and client only, other work on the machine aside).
ncpu = os.cpu_count()
print("\n1M read d8 (%d fio job%s): CPU utilisation (CPU s / fio's run s); ceilings in MiB/s:"
      " client %d / client CPU s per MiB, machine %d / (server + client CPU s per MiB)"
      % (jobs, "s" * (jobs > 1), jobs, ncpu))
for b in backends:
    q = get(b, "qsd", 8, "iops")
    for s in servers:
        i, c, sc = get(b, s, 8, "iops"), get(b, s, 8, "cli_us"), get(b, s, 8, "cpu_us")
        if i is None or not c:
            continue
        cap = jobs * 1e6 / c
        print("  %-5s %-16s %7.1f MiB/s  util server %4.2f client %4.2f  ceiling client %7.1f%s"
              "  machine %7.1f" % (b, label(s), i, get(b, s, 8, "srv_util"),
                                   get(b, s, 8, "cli_util"), cap,
                                   " = %.2fx qsd" % (cap / q) if q else "", ncpu * 1e6 / (c + sc)))
sys.exit(1 if missed and sys.argv[2] == "1" else 0)
EOF
	exit
fi

python3 - "$results" "$strict" <<'EOF'
import collections, statistics, sys

vals = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, s, d, metric, v = line.split()
    vals[(b, s, int(d), metric)].append(float(v))
med = {k: statistics.median(v) for k, v in vals.items()}
backends = sorted({k[0] for k in med}, key=["null", "file"].index)
servers = [s for s in ("ioplane", "qsd", "nbdkit") if any(k[1] == s for k in med)]
depths = sorted({k[2] for k in med})

def get(b, s, d, m):
    return med.get((b, s, d, m))

def fmt(v, f):
    return "-" if v is None else f % v

# "CPU us/IO" is the server's, "cli us/IO" fio's; "util s/c": server/client CPU seconds
# per second of fio's run.
print("%-5s %-8s %5s %12s %12s %12s %9s %10s %9s" % (
    "bknd", "server", "depth", "IOPS", "CPU us/IO", "syscalls/IO", "IPIs/IO", "cli us/IO",
    "util s/c"))
for b in backends:
    for s in servers:
        for d in depths:
            su, cu = get(b, s, d, "srv_util"), get(b, s, d, "cli_util")
            print("%-5s %-8s %5d %12s %12s %12s %9s %10s %9s" % (
                b, s, d, fmt(get(b, s, d, "iops"), "%.0f"),
                fmt(get(b, s, d, "cpu_us"), "%.2f"),
                fmt(get(b, s, d, "syscalls"), "%.2f"),
                fmt(get(b, s, d, "ipis"), "%.2f"),
                fmt(get(b, s, d, "cli_us"), "%.2f"),
                "-" if su is None else "%.2f/%.2f" % (su, cu)))

def ratio(b, peer, d, m):
    a, p = get(b, "ioplane", d, m), get(b, peer, d, m)
    return a / p if a is not None and p else None

# compare(TITLE, PEER, DEPTH, [(NAME, METRIC, OP, TARGET)]): ioplane/PEER ratios against
# targets ("syscalls" is ioplane's own count); returns the number missed.
def compare(title, peer, d, rows):
    if "ioplane" not in servers or peer not in servers or d not in depths:
        return 0
    n = 0
    print("\n%s (median of %d):" % (title, len(next(iter(vals.values())))))
    for b in backends:
        for name, m, op, target in rows:
            v = get(b, "ioplane", d, m) if m == "syscalls" else ratio(b, peer, d, m)
            if v is None:
                continue
            ok = v <= target if op == "<=" else v >= target
            n += not ok
            print("  %-5s %-22s %6.2f  (target %s %.2f)  %s"
                  % (b, name, v, op, target, "met" if ok else "MISSED"))
    return n

missed = compare("ioplane vs qemu-storage-daemon at depth 64", "qsd", 64, [
    ("CPU/IO ioplane/qsd", "cpu_us", "<=", 0.5), ("syscalls/IO ioplane", "syscalls", "<=", 1.0),
    ("IOPS ioplane/qsd", "iops", ">=", 1.0)])
missed += compare("ioplane vs nbdkit at depth 1", "nbdkit", 1, [
    ("IOPS ioplane/nbdkit", "iops", ">=", 1.15), ("CPU/IO ioplane/nbdkit", "cpu_us", "<=", 1.0)])
sys.exit(1 if missed and sys.argv[2] == "1" else 0)
EOF
