#!/bin/bash
# vhost-user-blk back-ends side by side: ioplane vs qemu-storage-daemon, the same client
# (`ioplane bench --vhost-user`, a real vhost-user front-end with memfd guest memory) for
# both, in one invocation. Null and raw-file backends, 4 KiB random reads, depth 1 and 64,
# 1 and 2 queues. Per server it measures IOPS, server CPU time per I/O (utime+stime of the
# whole server process from /proc/PID/stat before/after a run, divided by the requests)
# and, in a separate run at depth 64 under `strace -c -f -p PID`, server system calls per
# I/O. Then the time from connect() until every queue has answered a request, for 1, 16,
# 64 and 256 queues (both servers export 256). Runs alternate between servers; each
# number is the median of --reps runs. Prints tables and the ioplane/qsd ratios against
# ioplane's targets: CPU/IO <= 0.5x qsd, IOPS at depth 64 >= 1.5x, syscalls/IO at depth
# 64 <= 0.2, 256 queues ready in <= 20 ms and setup time linear in the queue count.
#
# Then ioplane against itself (qsd has neither), null backend, depth 64, one queue, the
# same client: row "scsi": server CPU per I/O of a vhost-user-scsi export (client
# --scsi: READ 16 on LUN 0) over that of a vhost-user-blk export, target <= 1.2; row
# "packed": packed virtqueues (client --packed) over split ones on vhost-user-blk,
# target <= 1.0 (these two rows: --own-reps runs of each, default 2 * --reps + 1, taking
# turns in one server process; the ratio is the median of the turns' ratios); row
# "scsi-setup": the setup time of a vhost-user-scsi export for --setup-queues request queues (256 means 254: the control and event queues make the
# 256 virtqueues vhost-user allows), target linear and <= 20 ms at the largest.
#
#   bench/compare-vhost-user.sh [--count N] [--reps N] [--own-reps N] [--backends "null file"]
#        [--depths "1 64"] [--queues "1 2"] [--setup-queues "1 16 64 256"]
#        [--guests "irq poll"] [--guest-poll-ns NS]
#        [--iothreads N] [--strace-count N] [--file PATH] [--quick] [--strict]
#        [--ioplane-args "SERVE OPTIONS"] [--rows "qsd scsi packed scsi-setup"]
#
# Every row runs with two kinds of guest, the same for both servers:
#   irq   sleeps until the back-end signals the call eventfd, as a guest driver that
#         waits for interrupts (the client's default);
#   poll  watches its used rings for up to --guest-poll-ns (default 200000) before it
#         sleeps (client --poll-max-ns), as a guest with polled virtio-blk queues or a
#         polling user-space initiator. While it polls it asks for no calls.
# With an irq guest a polling server spends the guest's wake-up time spinning, and
# that counts as its CPU; a poll guest shows the server's own cost per request.
# With the file backend, when fio is installed, it also measures what the kernel spends
# on one 4 KiB page-cache read into a buffer (fio psync, one job: system CPU time per
# read): every server that reads through the page cache pays at least that per request,
# and the targets list it as a fraction of qsd's CPU/IO. With depth 1 and the irq guest
# it also runs bench/floor/eventfd-floor.c (built with cc): a back-end that only wakes on
# the kick eventfd and writes the call eventfd, no ring and no request, whose CPU per
# round trip every back-end pays per request there; the targets list it likewise.
#
# --ioplane-args adds options to ioplane's serve command line, e.g. "--poll-max-ns 0"
# to see what adaptive polling costs and brings (qsd does not poll virtqueues).
# Fairness: each server runs its queues in one I/O thread by default (ioplane
# --iothreads 1; qsd's export on one iothread object); --iothreads N gives ioplane more.
# The null backends do not fill read buffers (read-zeroes off). The file backend reads a
# 1 GiB fully allocated file through the page cache with io_uring in both servers.
# A benchmark, not a test: exit 0 whether the targets are met or not (--strict: exit 1
# when one is missed); 2 on bad usage; 1 when a server or the client fails.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
count=200000
reps=3
own_reps=
backends="null file"
depths="1 64"
queues="1 2"
setup_queues="1 16 64 256"
guests="irq poll"
guest_poll_ns=200000
iothreads=1
strace_count=50000
file=
strict=0
ioplane_args=()
rows="qsd scsi packed scsi-setup"
client_extra=()

usage() {
	sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case "$1" in
	--count) count=${2:?}; shift ;;
	--reps) reps=${2:?}; shift ;;
	--own-reps) own_reps=${2:?}; shift ;;
	--backends) backends=${2:?}; shift ;;
	--depths) depths=${2:?}; shift ;;
	--queues) queues=${2:?}; shift ;;
	--setup-queues) setup_queues=${2:?}; shift ;;
	--guests) guests=${2:?}; shift ;;
	--guest-poll-ns) guest_poll_ns=${2:?}; shift ;;
	--iothreads) iothreads=${2:?}; shift ;;
	--strace-count) strace_count=${2:?}; shift ;;
	--file) file=${2:?}; shift ;;
	--quick) count=50000; reps=1; strace_count=20000 ;;
	--strict) strict=1 ;;
	--ioplane-args) read -r -a ioplane_args <<<"${2?}"; shift ;;
	--rows) rows=${2:?}; shift ;;
	-h | --help) usage ;;
	*) echo "unknown option $1" >&2; usage ;;
	esac
	shift
done

own_reps=${own_reps:-$((2 * reps + 1))}
has_row() { [[ " $rows " == *" $1 "* ]]; }
need="python3"
has_row qsd && need="qemu-storage-daemon strace python3"
for c in $need; do
	command -v "$c" >/dev/null || { echo "compare-vhost-user: $c is not installed" >&2; exit 1; }
done
[ -x "$IOPLANE" ] || { echo "compare-vhost-user: no $IOPLANE (set IOPLANE)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/compare-vhost.XXXXXX)
spid=
cleanup() {
	[ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
sock=$tmp/vhost.sock

if has_row qsd && [[ " $backends " == *" file "* ]] && [ -z "$file" ]; then
	file=$tmp/disk.raw
	dd if=/dev/urandom of="$file" bs=1M count=1024 status=none
fi

# start SERVER BACKEND NQ: start a server exporting NQ queues at $sock; sets spid.
start() {
	local srv=$1 be=$2 nq=$3 i
	rm -f "$sock" "$tmp/vhost.sock" "$tmp/vhost-scsi.sock"
	if [ "$srv" = ioplane-own ]; then # rows scsi and packed: both exports, one process
		"$IOPLANE" serve --iothreads "$iothreads" "${ioplane_args[@]}" \
			--blockdev driver=null-co,node-name=d,size=1073741824 \
			--export "type=vhost-user-blk,id=e0,node-name=d,num-queues=$nq,addr.type=unix,addr.path=$tmp/vhost.sock" \
			--export "type=vhost-user-scsi,id=e1,node-name=d,num-queues=$nq,addr.type=unix,addr.path=$tmp/vhost-scsi.sock" \
			>"$tmp/server.log" 2>&1 &
	elif [ "$srv" = ioplane-blk ] || [ "$srv" = ioplane-scsi ]; then # rows 2-4: null only
		[ "$srv" = ioplane-scsi ] && [ "$nq" -gt 254 ] && nq=254
		"$IOPLANE" serve --iothreads "$iothreads" "${ioplane_args[@]}" \
			--blockdev driver=null-co,node-name=d,size=1073741824 \
			--export "type=vhost-user-${srv#ioplane-},id=e0,node-name=d,num-queues=$nq,addr.type=unix,addr.path=$sock" \
			>"$tmp/server.log" 2>&1 &
	elif [ "$srv" = ioplane ]; then
		local img="d,driver=null,size=1G"
		[ "$be" = file ] && img="d,file=$file,format=raw,cache=writeback,aio=io_uring"
		"$IOPLANE" serve --iothreads "$iothreads" "${ioplane_args[@]}" --image "$img" \
			--vhost-user-blk unix="$sock",image=d,num-queues="$nq" >"$tmp/server.log" 2>&1 &
	else
		local bd="driver=null-co,node-name=d,size=1073741824"
		[ "$be" = file ] && bd="driver=file,node-name=d,filename=$file,aio=io_uring,cache.direct=off"
		qemu-storage-daemon --object iothread,id=iot0 --blockdev "$bd" \
			--export type=vhost-user-blk,id=e0,node-name=d,iothread=iot0,addr.type=unix,addr.path="$sock",num-queues="$nq" \
			>"$tmp/server.log" 2>&1 &
	fi
	spid=$!
	for ((i = 0; i < 300; i++)); do
		if [ "$srv" = ioplane-own ]; then
			[ -S "$tmp/vhost.sock" ] && [ -S "$tmp/vhost-scsi.sock" ] && return 0
		else
			[ -S "$sock" ] && return 0
		fi
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.1
	done
	cat "$tmp/server.log" >&2
	echo "compare-vhost-user: $srv did not start" >&2
	exit 1
}

stop() {
	kill "$spid" 2>/dev/null || true
	wait "$spid" 2>/dev/null || true
	spid=
}

# CPU time of every thread of PID in ns (schedstat: finer than /proc/PID/stat's ticks).
cpu_ns() {
	cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'
}

client() {
	timeout -k 5 300 "$IOPLANE" bench --vhost-user "$sock" ${client_extra[@]+"${client_extra[@]}"} "$@" && return 0
	echo "compare-vhost-user: client failed against $(ps -o comm= -p "$spid"): $*" >&2
	tail -n 20 "$tmp/server.log" >&2
	return 1
}

# guest_args G: the client options for guest kind G.
guest_args() {
	case $1 in
	irq) echo "--poll-max-ns 0" ;;
	poll) echo "--poll-max-ns $guest_poll_ns" ;;
	*) echo "compare-vhost-user: unknown guest kind '$1' (irq, poll)" >&2; exit 2 ;;
	esac
}

for g in $guests; do guest_args "$g" >/dev/null || exit 2; done

# run D Q G: one measured run; prints "IOPS CPU_US_PER_IO". Deep queues get 8x the
# requests so that every run lasts long enough to measure.
# A server that dropped the connection is restarted and the run retried, as in
# setup_once below (the qemu-storage-daemon 7.2 race described there also hits
# measured runs now and then).
run() {
	local d=$1 q=$2 g=$3 c0 c1 out iops n=$count try
	[ "$d" -ge 16 ] && n=$((count * 8))
	for try in 1 2 3; do
		c0=$(cpu_ns "$spid")
		# shellcheck disable=SC2046 # guest_args is a word list
		if out=$(client --num-queues "$q" -d "$d" -c "$n" --random -s 4096 $(guest_args "$g")); then
			break
		fi
		[ "$try" = 3 ] && { echo "compare-vhost-user: client failed" >&2; exit 1; }
		echo "compare-vhost-user: $srv dropped the connection; restarting it" >&2
		stop
		start "$srv" "$be" "$maxq"
	done
	c1=$(cpu_ns "$spid")
	iops=$(sed -n 's/^IOPS: \([0-9]*\),.*/\1/p' <<<"$out")
	echo "$iops $(python3 -c "print(($c1 - $c0) / 1000.0 / $n)")"
}

# syscalls D Q G: server system calls per request under strace -c.
syscalls() {
	local d=$1 q=$2 g=$3 st calls
	strace -c -f -p "$spid" -o "$tmp/strace.out" 2>/dev/null &
	st=$!
	sleep 1
	# shellcheck disable=SC2046
	client --num-queues "$q" -d "$d" -c "$strace_count" --random -s 4096 -q \
		$(guest_args "$g") >/dev/null
	kill -INT "$st"
	wait "$st" 2>/dev/null || true
	calls=$(awk '$NF == "total" {print ($4 ~ /^[0-9]+$/) ? $4 : $3}' "$tmp/strace.out")
	python3 -c "print(${calls:-0} / $strace_count)"
}

median() {
	sort -g | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : 0}'
}

declare -A IOPS CPU SYS SETUP OWN OWNR
maxq=0
for q in $queues; do [ "$q" -gt "$maxq" ] && maxq=$q; done
missed=0

ratio() {
	python3 -c "a, b = float('$1' or 0), float('$2' or 0); print('%.2f' % (a / b) if b else 'n/a')"
}

check() { # VALUE OP LIMIT
	if python3 -c "import sys; sys.exit(0 if float('$1') $2 float('$3') else 1)" 2>/dev/null; then
		echo "ok"
	else
		missed=1
		echo "MISSED"
	fi
}

# One setup measurement; a server that dropped the connection is restarted and the
# measurement retried (qemu-storage-daemon 7.2 sometimes panics in libvhost-user with
# "Error writing eventfd: Bad file descriptor" when a front-end stops its rings right
# after the last completion: the notification races with GET_VRING_BASE).
setup_once() {
	local srv=$1 q=$2 try out
	for try in 1 2 3; do
		if out=$(client --num-queues "$q" --setup-only 2>>"$tmp/setup.err"); then
			sed -n 's/.*ready in \([0-9.]*\) ms.*/\1/p' <<<"$out"
			return 0
		fi
		echo "compare-vhost-user: $srv dropped the connection; restarting it" >&2
		stop
		start "$srv" null 256
	done
	return 1
}

if has_row qsd; then
for be in $backends; do
	for d in $depths; do
		for q in $queues; do
			for srv in ioplane qsd; do
				start "$srv" "$be" "$maxq"
				client --num-queues "$q" -d "$d" -c 5000 --random -q # warm-up
				for g in $guests; do
					: >"$tmp/iops"
					: >"$tmp/cpu"
					for ((r = 0; r < reps; r++)); do
						# not in a subshell: it may restart the server
						run "$d" "$q" "$g" >"$tmp/run.out"
						read -r i c <"$tmp/run.out"
						echo "$i" >>"$tmp/iops"
						echo "$c" >>"$tmp/cpu"
					done
					IOPS[$srv,$be,$d,$q,$g]=$(median <"$tmp/iops")
					CPU[$srv,$be,$d,$q,$g]=$(median <"$tmp/cpu")
					if [ "$d" -ge 64 ]; then
						SYS[$srv,$be,$d,$q,$g]=$(syscalls "$d" "$q" "$g")
					fi
				done
				stop
			done
		done
	done
done

# Kernel CPU time of one 4 KiB random read from the page cache (read(2) and copy).
floor=
if [[ " $backends " == *" file "* ]] && command -v fio >/dev/null; then
	cat "$file" >/dev/null # in the page cache, as the servers had it
	floor=$(fio --name=floor --filename="$file" --ioengine=psync --invalidate=0 --rw=randread \
		--bs=4k --size=1G --io_size=2G --norandommap --randrepeat=0 --output-format=json \
		2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
print("%.3f" % (j["sys_cpu"] / 100.0 * 1e6 / j["read"]["iops"]))' 2>/dev/null) || floor=
fi

for srv in ioplane qsd; do
	start "$srv" null 256
	for q in $setup_queues; do
		: >"$tmp/setup"
		for ((r = 0; r < reps + 2; r++)); do
			setup_once "$srv" "$q" >>"$tmp/setup"
		done
		SETUP[$srv,$q]=$(median <"$tmp/setup")
	done
	stop
done

echo
echo "4 KiB random reads, $count requests per run, median of $reps; ioplane --iothreads $iothreads"
printf '%-5s %5s %3s %5s | %10s %10s %6s | %9s %9s %6s | %8s %8s\n' backend depth q guest \
	"ioplane" "qsd" "IOPS x" "ioplane" "qsd" "CPU x" "sys/IO" "qsd"
printf '%-5s %5s %3s %5s | %10s %10s %6s | %9s %9s %6s | %8s %8s\n' "" "" "" "" IOPS IOPS "" \
	"us CPU/IO" "us CPU/IO" "" ioplane ""
for be in $backends; do
	for d in $depths; do
		for q in $queues; do
			for g in $guests; do
				k=$be,$d,$q,$g
				printf '%-5s %5s %3s %5s | %10s %10s %6s | %9.3f %9.3f %6s | %8s %8s\n' "$be" "$d" "$q" "$g" \
					"${IOPS[ioplane,$k]}" "${IOPS[qsd,$k]}" \
					"$(ratio "${IOPS[ioplane,$k]}" "${IOPS[qsd,$k]}")" \
					"${CPU[ioplane,$k]}" "${CPU[qsd,$k]}" \
					"$(ratio "${CPU[ioplane,$k]}" "${CPU[qsd,$k]}")" \
					"${SYS[ioplane,$k]:--}" "${SYS[qsd,$k]:--}"
			done
		done
	done
done
# A back-end that does nothing but wake on the kick and write the call
# (bench/floor/eventfd-floor.c, built with cc into $tmp): the least server CPU per
# request of a depth-1 irq row, median of --reps runs per mode.
efloor_uring= efloor_poll=
if [[ " $depths " == *" 1 "* ]] && [[ " $guests " == *" irq "* ]] && command -v cc >/dev/null &&
	cc -O2 -o "$tmp/eventfd-floor" "$src/bench/floor/eventfd-floor.c" -luring 2>"$tmp/floor.cc.log"; then
	: >"$tmp/ef-uring"
	: >"$tmp/ef-poll"
	for ((r = 0; r < reps; r++)); do
		for m in uring poll; do
			out=$(timeout 300 "$tmp/eventfd-floor" "$m" "$count") || { echo "eventfd-floor $m failed" >&2; continue; }
			echo "${out#* }" >>"$tmp/ef-$m"
		done
	done
	efloor_uring=$(median <"$tmp/ef-uring")
	efloor_poll=$(median <"$tmp/ef-poll")
fi

echo
echo "time from connect until every queue answered (ms, median of $((reps + 2)))"
printf '%6s | %9s %9s %6s\n' queues ioplane qsd ratio
for q in $setup_queues; do
	printf '%6s | %9s %9s %6s\n' "$q" "${SETUP[ioplane,$q]}" "${SETUP[qsd,$q]}" \
		"$(ratio "${SETUP[ioplane,$q]}" "${SETUP[qsd,$q]}")"
done
if [ -n "$floor" ]; then
	echo
	echo "kernel CPU per 4 KiB page-cache read (fio psync, system time per read): $floor us"
fi
if [ -n "$efloor_uring" ]; then
	echo
	echo "back-end that only takes the kick and writes the call, depth 1, sleeping both sides"
	echo "(bench/floor/eventfd-floor.c), CPU us per round trip: io_uring multishot poll" \
		"$efloor_uring, poll+read+write $efloor_poll"
fi
echo
echo "targets:"
for be in $backends; do
	for d in $depths; do
		for q in $queues; do
			for g in $guests; do
				k=$be,$d,$q,$g
				r=$(ratio "${CPU[ioplane,$k]}" "${CPU[qsd,$k]}")
				f=
				if [ "$be" = file ] && [ -n "$floor" ]; then
					f=" (the page-cache read alone: $(ratio "$floor" "${CPU[qsd,$k]}"))"
				fi
				if [ "$d" = 1 ] && [ "$g" = irq ] && [ -n "$efloor_uring" ]; then
					f="$f (the kick and call alone: $(ratio "$efloor_uring" "${CPU[qsd,$k]}"))"
				fi
				echo "  CPU/IO ioplane/qsd <= 0.5   $be d$d q$q $g: $r $(check "$r" '<=' 0.5)$f"
				if [ "$d" -ge 64 ]; then
					r=$(ratio "${IOPS[ioplane,$k]}" "${IOPS[qsd,$k]}")
					echo "  IOPS ioplane/qsd >= 1.5     $be d$d q$q $g: $r $(check "$r" '>=' 1.5)"
					s=${SYS[ioplane,$k]}
					echo "  syscalls/IO <= 0.2          $be d$d q$q $g: $s $(check "$s" '<=' 0.2)"
				fi
			done
		done
	done
done
last=${setup_queues##* }
first=${setup_queues%% *}
echo "  $last queues ready <= 20 ms: ${SETUP[ioplane,$last]} $(check "${SETUP[ioplane,$last]}" '<=' 20)"
per1=$(python3 -c "print('%.3f' % (float('${SETUP[ioplane,$first]}') / $first))")
perN=$(python3 -c "print('%.3f' % (float('${SETUP[ioplane,$last]}') / $last))")
echo "  linear: ms/queue at $first: $per1, at $last: $perN (per-queue cost must not grow)" \
	"$(check "$perN" '<=' "$(python3 -c "print(max(float('$per1'), 0.05) * 1.5)")")"
fi # qsd rows

# own_cpu NAME...: server CPU per I/O (us) at depth 64, one queue, for every guest kind,
# into OWN[NAME,guest] (median of own_reps runs), for each variant NAME: blk (split ring
# on vhost-user-blk), packed (client --packed on the same export) and scsi (client
# --scsi on a vhost-user-scsi export of the same null node); and for every variant but
# blk its ratio to blk in OWNR[NAME,guest]. One server process serves both exports, and
# the variants take turns within each rep, in an order that rotates from rep to rep; the
# ratio is the median of each rep's ratio to the blk run of the same rep. On a shared VM
# the machine's speed drifts over seconds, by more than the rows' margins: measuring one
# variant's reps after the other's, or dividing medians taken at different times, would
# put that drift into the ratio.
own_cpu() {
	local names=("$@") g r i n k c
	local blk_sock=$sock
	declare -A got
	srv=ioplane-own be=null maxq=1
	start ioplane-own null 1
	for n in "${names[@]}"; do
		own_variant "$n"
		client -d 64 -c 5000 --random -q # warm-up
	done
	for g in $guests; do
		for n in "${names[@]}"; do : >"$tmp/cpu-$n"; done
		for ((r = 0; r < own_reps; r++)); do
			for ((i = 0; i < ${#names[@]}; i++)); do
				k=$(((i + r) % ${#names[@]}))
				n=${names[$k]}
				own_variant "$n"
				run 64 1 "$g" >"$tmp/run.out"
				read -r _ c <"$tmp/run.out"
				echo "$c" >>"$tmp/cpu-$n"
				got[$n]=$c
			done
			for n in "${names[@]}"; do
				[ "$n" = blk ] && continue
				python3 -c "print(float('${got[$n]}') / float('${got[blk]}'))" >>"$tmp/ratio-$n-$g"
			done
		done
		for n in "${names[@]}"; do
			OWN[$n,$g]=$(median <"$tmp/cpu-$n")
			[ "$n" = blk ] || OWNR[$n,$g]=$(median <"$tmp/ratio-$n-$g")
		done
	done
	sock=$blk_sock
	stop
	client_extra=()
}

# own_variant NAME: point the client at variant NAME of own_cpu's server.
own_variant() {
	sock=$tmp/vhost.sock
	case $1 in
	blk) client_extra=() ;;
	packed) client_extra=(--packed) ;;
	scsi) client_extra=(--scsi); sock=$tmp/vhost-scsi.sock ;;
	esac
}

own_rows=
has_row scsi && own_rows="$own_rows scsi"
has_row packed && own_rows="$own_rows packed"
[ -n "$own_rows" ] && own_cpu blk $own_rows
if [ -n "$own_rows" ]; then
	echo
	echo "ioplane against itself: null backend, 4 KiB random reads, depth 64, one queue," \
		"$((count * 8)) requests per run, $own_reps runs each, taking turns (server us" \
		"CPU/IO: medians; ratio: the median of each turn's ratio to blk)"
	printf '%-7s %5s | %9s %9s %6s | %s\n' row guest blk "this" ratio target
	for row in $own_rows; do
		lim=1.2
		[ "$row" = packed ] && lim=1.0
		for g in $guests; do
			r=$(python3 -c "print('%.2f' % float('${OWNR[$row,$g]}'))")
			printf '%-7s %5s | %9.3f %9.3f %6s | <= %s %s\n' "$row" "$g" "${OWN[blk,$g]}" \
				"${OWN[$row,$g]}" "$r" "$lim" "$(check "$r" '<=' "$lim")"
		done
	done
fi

if has_row scsi-setup; then
	srv=ioplane-scsi
	client_extra=(--scsi)
	start ioplane-scsi null 256
	for q in $setup_queues; do
		n=$q
		[ "$n" -gt 254 ] && n=254
		: >"$tmp/setup"
		for ((r = 0; r < reps + 2; r++)); do
			setup_once ioplane-scsi "$n" >>"$tmp/setup"
		done
		SETUP[scsi,$q]=$(median <"$tmp/setup")
	done
	stop
	client_extra=()
	echo
	echo "vhost-user-scsi: time from connect until every request queue answered (ms, median of $((reps + 2)))"
	printf '%6s | %9s %9s\n' queues ms ms/queue
	for q in $setup_queues; do
		printf '%6s | %9s %9s\n' "$q" "${SETUP[scsi,$q]}" \
			"$(python3 -c "print('%.4f' % (float('${SETUP[scsi,$q]}') / $q))")"
	done
	last=${setup_queues##* }
	first=${setup_queues%% *}
	per1=$(python3 -c "print('%.3f' % (float('${SETUP[scsi,$first]}') / $first))")
	perN=$(python3 -c "print('%.3f' % (float('${SETUP[scsi,$last]}') / $last))")
	echo "  vhost-user-scsi $last queues ready <= 20 ms: ${SETUP[scsi,$last]}" \
		"$(check "${SETUP[scsi,$last]}" '<=' 20)"
	echo "  vhost-user-scsi linear: ms/queue at $first: $per1, at $last: $perN" \
		"$(check "$perN" '<=' "$(python3 -c "print(max(float('$per1'), 0.05) * 1.5)")")"
fi
[ $strict = 1 ] && [ $missed = 1 ] && exit 1
exit 0
