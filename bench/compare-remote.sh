#!/bin/bash
# The remote protocol drivers side by side with QEMU's, in one invocation:
#   1  RBD: `ioplane bench` vs `qemu-img bench` (QEMU's rbd driver) on one image of a
#      single-node test cluster, 4 KiB reads and writes at depth 32, cache=none (librbd's
#      cache off in both): IOPS and client CPU per I/O (user+system time of the client
#      process / requests), and a perf profile of ioplane's client split by library
#      (librbd, librados and the Ceph common code vs ioplane, libc, the kernel).
#      qemu-img bench has no random mode: both step 4 MiB + 4 KiB per request (-S), so
#      that consecutive requests hit different objects as random ones would.
#   2  The same image exported over vhost-user-blk by ioplane serve and by
#      qemu-storage-daemon (one iothread each), the client `ioplane bench --vhost-user`,
#      4 KiB random reads and writes at depth 32: IOPS and server CPU per I/O.
#   3  NBD client: an nbdkit memory disk re-exported over NBD by ioplane (--iothreads 1,
#      driver=nbd) and by qemu-storage-daemon (--blockdev driver=nbd, its main loop: an NBD
#      export with iothread= trips an assertion in qsd 7.2 when a client leaves), fio's nbd
#      engine, 4 KiB random reads at depth 64: IOPS and the re-exporter's CPU
#      per I/O (from /proc/PID/task/*/schedstat).
# Targets (ioplane / peer): 1 IOPS >= 1.0, CPU/IO <= 0.8; 2 IOPS >= 1.0, CPU/IO <= 0.8;
# 3 CPU/IO <= 0.5. Rows 1 and 3 also print the libraries' floors: bare clients of librbd
# and libnbd (bench/floor/*.c, built with cc into the temporary directory) beside the
# peer, and for row 3 the floor plus ioplane's NBD server alone. Each figure is the median of --reps runs alternating between the two.
#
#   bench/compare-remote.sh [--rows "1 2 3"] [--reps N] [--count N] [--quick]
#
# Starts its own Ceph cluster (tests/func/lib-ceph.sh) under a temporary directory and
# stops it at exit. A benchmark, not a test: it installs nothing, skips a row (saying
# why) when a tool is missing, and exits 0 whether the targets are met or not.
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
rows="1 2 3"
reps=3
count=20000

while [ $# -gt 0 ]; do
	case "$1" in
	--rows) rows=$2; shift ;;
	--reps) reps=$2; shift ;;
	--count) count=$2; shift ;;
	--quick) reps=1 count=5000 ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "compare-remote.sh: unknown argument '$1'" >&2; exit 2 ;;
	esac
	shift || exit 2
done

tmp=$(mktemp -d /tmp/compare-remote.XXXXXX)
FUNC_TMP=$tmp
hooks=()
spid=
at_exit() { hooks+=("$1"); }
fail() { echo "compare-remote: $*" >&2; exit 1; }
skip() { echo "compare-remote: $*" >&2; exit 0; }
need() { for c in "$@"; do command -v "$c" >/dev/null || skip "$c is not installed"; done; }
cleanup() {
	[ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
	for h in "${hooks[@]}"; do eval "$h"; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
have() { command -v "$1" >/dev/null 2>&1; }

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print('%.2f' % (a / b if b else 0))" "$1" "$2"; }
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }
# verdict VALUE OP TARGET: "ok" or "NOT MET".
verdict() { python3 -c "import sys; v, t = float(sys.argv[1]), float(sys.argv[3]); print('ok' if (v >= t if sys.argv[2] == '>=' else v <= t) else 'NOT MET')" "$@"; }
row() { printf '%-34s %10s %10s %6s  %s %s  %s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$(verdict "$4" "$5" "$6")"; }
header() { printf '\n%s\n%-34s %10s %10s %6s  %s\n' "$1" metric ioplane peer ratio target; }

# client_run CMD...: run a benchmark client; prints "IOPS CPU_US_PER_IO" (CPU: its
# user+system time; IOPS from "Run completed in S seconds").
client_run() {
	python3 - "$count" "$@" <<'PY'
import re, resource, subprocess, sys
n = int(sys.argv[1])
p = subprocess.run(sys.argv[2:], capture_output=True, text=True, timeout=600)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
m = re.search(r"Run completed in ([0-9.]+) seconds", p.stdout)
if p.returncode or not m:
    sys.exit("client failed: %s\n%s%s" % (" ".join(sys.argv[2:]), p.stdout, p.stderr))
print("%.0f %.2f" % (n / float(m.group(1)), (r.ru_utime + r.ru_stime) * 1e6 / n))
PY
}

# measure KEY CMD...: run CMD reps times; IOPS[KEY] and CPU[KEY] get the medians.
declare -A IOPS CPU
measure_add() { echo "$2" >>"$tmp/$1.iops"; echo "$3" >>"$tmp/$1.cpu"; }
measure_end() {
	IOPS[$1]=$(median <"$tmp/$1.iops")
	CPU[$1]=$(median <"$tmp/$1.cpu")
}

ceph_up=0
ceph_setup() {
	[ $ceph_up = 1 ] && return 0
	# shellcheck source=../tests/func/lib-ceph.sh
	. "$src/tests/func/lib-ceph.sh"
	ceph_need
	ceph_start
	timeout 120 rbd create --size 1G rbd/bench || fail "rbd create"
	# Data everywhere, so that reads reach real objects.
	timeout 300 rbd bench --io-type write --io-size 4M --io-total 1G --io-pattern seq \
		rbd/bench >/dev/null || fail "rbd bench (fill)"
	ceph_up=1
}

# summary ROW PEER WHOSE: the read and write rows of ROW (targets IOPS >= 1.0, CPU <= 0.8).
summary() {
	local w a b name
	for w in r w; do
		a=$1${w}ioplane b=$1${w}$2 name=reads
		[ $w = w ] && name=writes
		measure_end "$a"
		measure_end "$b"
		row "$name: IOPS" "${IOPS[$a]}" "${IOPS[$b]}" "$(ratio "${IOPS[$a]}" "${IOPS[$b]}")" \
			">=" 1.0
		row "$name: $3 CPU us/IO" "${CPU[$a]}" "${CPU[$b]}" "$(ratio "${CPU[$a]}" "${CPU[$b]}")" \
			"<=" 0.8
	done
}

# floor_build NAME LIBS...: compile bench/floor/NAME.c into $tmp (a bare client of the
# library, to show the least CPU per request anything built on it can spend); 1 if no cc.
floor_build() {
	local name=$1
	shift
	[ -x "$tmp/$name" ] && return 0
	have cc || return 1
	cc -O2 -o "$tmp/$name" "$src/bench/floor/$name.c" "$@" 2>"$tmp/$name.cc.log"
}

# floor_row KEY LABEL PEER_KEY [NOTE]: the medians of KEY (a floor's runs) beside the
# peer's CPU per I/O: what share of the peer's cost that part alone takes.
floor_row() {
	measure_end "$1"
	printf '%-34s %10s %10s %6s  %s\n' "$2" "${CPU[$1]}" "${CPU[$3]}" \
		"$(ratio "${CPU[$1]}" "${CPU[$3]}")" "${4:-(the library alone)}"
}

step=$((4194304 + 4096))
row1() {
	local rep w key out
	have qemu-img && qemu-img --help | grep -qw rbd || { echo "row 1: no qemu-img rbd"; return; }
	ceph_setup
	for rep in $(seq "$reps"); do
		for w in r w; do
			local wf=()
			[ $w = w ] && wf=(-w)
			for tool in ioplane qemu; do
				if [ $tool = ioplane ]; then
					out=$(client_run "$IOPLANE" bench -f raw -t none -c "$count" -d 32 \
						-s 4096 -S $step "${wf[@]}" rbd:rbd/bench) || fail "$out"
				else
					out=$(client_run qemu-img bench -f raw -t none -c "$count" -d 32 \
						-s 4096 -S $step "${wf[@]}" rbd:rbd/bench) || fail "$out"
				fi
				measure_add "r1$w$tool" $out
			done
		done
	done
	header "1  RBD, qemu-img bench vs ioplane bench, 4 KiB, depth 32, cache=none"
	summary r1 qemu client
	row1_floor
	if have perf; then
		echo "ioplane bench (reads), client CPU by library (perf, share of samples):"
		timeout 300 perf record -q -o "$tmp/perf.data" -- "$IOPLANE" bench -f raw -t none \
			-c "$count" -d 32 -s 4096 -S $step rbd:rbd/bench >/dev/null 2>&1
		timeout 120 perf report -q -i "$tmp/perf.data" --sort dso --stdio 2>/dev/null |
			awk 'NF >= 2 && $1 ~ /%$/ {printf "  %7s  %s\n", $1, $2}' | head -12
	fi
}

# Row 1's floor: bench/floor/rbd-floor.c, librbd with nothing around it, CPU per I/O
# beside qemu-img bench's: mode 0 wakes the submitting thread once per completion (an
# event loop's minimum), mode 1 submits from librbd's callback thread (no wake-up).
row1_floor() {
	local rep w m out
	floor_build rbd-floor -lrbd -lrados -lpthread ||
		{ echo "row 1 floor: cannot build bench/floor/rbd-floor.c (cc, librbd-dev)"; return; }
	for rep in $(seq "$reps"); do
		for w in 0 1; do
			for m in 0 1; do
				out=$(timeout 300 "$tmp/rbd-floor" rbd bench "$count" 32 $step $m $w) ||
					{ echo "row 1 floor: rbd-floor failed"; return; }
				measure_add "f1$w$m" $out
			done
		done
	done
	echo "librbd alone (bench/floor/rbd-floor.c), client CPU us/IO beside qemu-img bench's:"
	floor_row f100 "  reads, one wake-up per completion" r1rqemu
	floor_row f101 "  reads, no wake-up" r1rqemu
	floor_row f110 "  writes, one wake-up per completion" r1wqemu
	floor_row f111 "  writes, no wake-up" r1wqemu
}

start_server() {
	local sock=$1
	shift
	rm -f "$sock"
	"$@" >"$tmp/server.log" 2>&1 &
	spid=$!
	for ((i = 0; i < 300; i++)); do
		[ -S "$sock" ] && return 0
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.1
	done
	cat "$tmp/server.log" >&2
	fail "server did not start: $*"
}

stop_server() {
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	spid=
}

# server_run KEY CMD...: a client run against the server $spid; records IOPS and the
# server's CPU per I/O.
server_run() {
	local key=$1 c0 c1 out iops
	shift
	c0=$(cpu_ns "$spid")
	out=$("$@" 2>&1) || { tail -20 "$tmp/server.log" >&2; fail "client failed: $*: $(tail -3 <<<"$out")"; }
	c1=$(cpu_ns "$spid")
	iops=$(sed -n 's/^IOPS: \([0-9]*\),.*/\1/p' <<<"$out")
	[ -n "$iops" ] || iops=$(python3 -c 'import json, sys
t = sys.argv[1]
print("%.0f" % json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"])' "$out")
	measure_add "$key" "$iops" "$(python3 -c "print('%.2f' % (($c1 - $c0) / 1000.0 / $count))")"
}

row2() {
	local sock=$tmp/vu.sock rep srv w
	have qemu-storage-daemon || { echo "row 2: no qemu-storage-daemon"; return; }
	ceph_setup
	for rep in $(seq "$reps"); do
		for srv in ioplane qsd; do
			if [ $srv = ioplane ]; then
				start_server "$sock" "$IOPLANE" serve --iothreads 1 \
					--image r,file=rbd:rbd/bench,format=raw,cache=none \
					--vhost-user-blk unix="$sock",image=r,writable=on
			else
				start_server "$sock" qemu-storage-daemon --object iothread,id=io0 \
					--blockdev driver=rbd,node-name=r,pool=rbd,image=bench,conf="$CEPH_CONF",cache.direct=on \
					--export type=vhost-user-blk,id=e,node-name=r,iothread=io0,addr.type=unix,addr.path="$sock",writable=on
			fi
			for w in r w; do
				local wf=()
				[ $w = w ] && wf=(-w)
				server_run "r2$w$srv" timeout 300 "$IOPLANE" bench --vhost-user "$sock" \
					-c "$count" -d 32 -s 4096 --random "${wf[@]}"
			done
			stop_server
		done
	done
	header "2  RBD over vhost-user-blk, ioplane serve vs qemu-storage-daemon, depth 32"
	summary r2 qsd server
}

row3() {
	local bsock=$tmp/back.sock fsock=$tmp/front.sock rep srv npid
	have nbdkit && have fio && have qemu-storage-daemon ||
		{ echo "row 3: needs nbdkit, fio and qemu-storage-daemon"; return; }
	fio --enghelp 2>/dev/null | grep -qw nbd || { echo "row 3: fio has no nbd engine"; return; }
	rm -f "$bsock"
	nbdkit -f -U "$bsock" memory 1G >"$tmp/nbdkit.log" 2>&1 &
	npid=$!
	at_exit "kill $npid 2>/dev/null"
	for ((i = 0; i < 100; i++)); do [ -S "$bsock" ] && break; sleep 0.1; done
	for rep in $(seq "$reps"); do
		for srv in ioplane qsd; do
			if [ $srv = ioplane ]; then
				start_server "$fsock" "$IOPLANE" serve --iothreads 1 \
					--image r,driver=nbd,server.type=unix,server.path="$bsock" \
					--nbd unix="$fsock",image=r,writable=on
			else
				start_server "$fsock" qemu-storage-daemon \
					--blockdev driver=nbd,node-name=r,server.type=unix,server.path="$bsock" \
					--nbd-server addr.type=unix,addr.path="$fsock" \
					--export type=nbd,id=e,node-name=r,name=r,writable=on
			fi
			server_run "r3$srv" timeout 300 fio --name=r --ioengine=nbd \
				--uri="nbd+unix:///r?socket=$fsock" --rw=randread --bs=4k --iodepth=64 \
				--size=1G --io_size=$((count * 4096)) --output-format=json
			stop_server
		done
	done
	header "3  NBD client re-export of nbdkit memory, ioplane vs qsd, fio depth 64"
	measure_end r3ioplane
	measure_end r3qsd
	row "reads: IOPS" "${IOPS[r3ioplane]}" "${IOPS[r3qsd]}" \
		"$(ratio "${IOPS[r3ioplane]}" "${IOPS[r3qsd]}")" ">=" 0
	row "reads: re-exporter CPU us/IO" "${CPU[r3ioplane]}" "${CPU[r3qsd]}" \
		"$(ratio "${CPU[r3ioplane]}" "${CPU[r3qsd]}")" "<=" 0.5
	row3_floor "$bsock" "$fsock"
}

# Row 3's floor: what a re-exporter built on libnbd costs at least, as two parts measured
# apart: a bare libnbd client (bench/floor/nbd-floor.c) reading the same nbdkit disk at
# depth 64, and ioplane's NBD server alone (a null node) under the same fio job. Their
# sum beside qsd's re-export is the best ratio such a re-exporter could reach.
row3_floor() {
	local bsock=$1 fsock=$2 rep out
	floor_build nbd-floor -lnbd ||
		{ echo "row 3 floor: cannot build bench/floor/nbd-floor.c (cc, libnbd-dev)"; return; }
	for rep in $(seq "$reps"); do
		out=$(timeout 300 "$tmp/nbd-floor" "$bsock" "$count" 64) ||
			{ echo "row 3 floor: nbd-floor failed"; return; }
		measure_add f3client $out
		start_server "$fsock" "$IOPLANE" serve --iothreads 1 --image r,driver=null,size=1G \
			--nbd unix="$fsock",image=r
		server_run f3server timeout 300 fio --name=r --ioengine=nbd \
			--uri="nbd+unix:///r?socket=$fsock" --rw=randread --bs=4k --iodepth=64 \
			--size=1G --io_size=$((count * 4096)) --output-format=json
		stop_server
	done
	echo "the parts of a libnbd re-exporter, CPU us/IO beside qsd's re-export:"
	floor_row f3client "  libnbd client alone (nbd-floor)" r3qsd
	floor_row f3server "  ioplane NBD server alone (null)" r3qsd "(no client part)"
	CPU[f3sum]=$(python3 -c "print('%.2f' % (${CPU[f3client]} + ${CPU[f3server]}))")
	printf '%-34s %10s %10s %6s  %s\n' "  the two together" "${CPU[f3sum]}" "${CPU[r3qsd]}" \
		"$(ratio "${CPU[f3sum]}" "${CPU[r3qsd]}")" "(the best a libnbd re-exporter reaches)"
}

[ -x "$IOPLANE" ] || fail "no ioplane at $IOPLANE"
echo "compare-remote: $count requests per run, median of $reps; $(nproc) CPUs"
for r in $rows; do
	case $r in
	1) row1 ;;
	2) row2 ;;
	3) row3 ;;
	*) echo "compare-remote.sh: no row $r" >&2; exit 2 ;;
	esac
done
