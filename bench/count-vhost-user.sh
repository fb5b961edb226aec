#!/bin/bash
# Counts behind the "scsi" and "packed" rows of compare-vhost-user.sh, which hold on a
# loaded machine where times do not: ioplane's vhost-user-blk split ring, packed ring
# (client --packed) and vhost-user-scsi (client --scsi), null node, 4 KiB random reads,
# depth 64, one queue, one iothread, the same `ioplane bench --vhost-user` front-end.
#   instructions per request (valgrind --tool=callgrind, the marginal count between
#     -c N and -c 2N so that start-up cancels out) of the whole server (epoll loop
#     backend: valgrind does not wait in io_uring) and of the front-end (its polling
#     included, for a polling guest); with a polling
#     guest the server spins while the front-end turns a round around, so its CPU per
#     I/O follows the sum of both;
#   per 1000 requests: loop rounds, sleeps, busy-poll hits (the server's SIGUSR1
#     statistics) and, when bpftrace can attach to the vu_kick/vu_call USDT probes,
#     kicks and calls.
# Prints one row per ring kind and guest kind with the ratios to split.
#
#   bench/count-vhost-user.sh [--count N] [--guests "poll irq"] [--guest-poll-ns NS]
#
# A benchmark, not a test: exit 0 (2 on bad usage, 1 when a server or client fails).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
count=20000
guests="poll irq"
guest_poll_ns=200000

while [ $# -gt 0 ]; do
	case "$1" in
	--count) count=${2:?}; shift ;;
	--guests) guests=${2:?}; shift ;;
	--guest-poll-ns) guest_poll_ns=${2:?}; shift ;;
	*) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
	esac
	shift
done
command -v valgrind >/dev/null || { echo "count-vhost-user: valgrind is not installed" >&2; exit 1; }
[ -x "$IOPLANE" ] || { echo "count-vhost-user: no $IOPLANE (set IOPLANE)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/count-vhost.XXXXXX)
spid=
cleanup() {
	[ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
sock=$tmp/vhost.sock

# start KIND [PREFIX...]: a server for ring kind KIND (split packed scsi); sets spid.
start() {
	local kind=$1 typ=blk i
	shift
	[ "$kind" = scsi ] && typ=scsi
	rm -f "$sock"
	IOPLANE_LOOP_BACKEND=epoll "$@" "$IOPLANE" serve --iothreads 1 \
		--blockdev driver=null-co,node-name=d,size=1073741824 \
		--export "type=vhost-user-$typ,id=e0,node-name=d,num-queues=1,addr.type=unix,addr.path=$sock" \
		>"$tmp/server.log" 2>&1 &
	spid=$!
	for ((i = 0; i < 600; i++)); do
		[ -S "$sock" ] && return 0
		sleep 0.1
	done
	cat "$tmp/server.log" >&2
	exit 1
}

stop() {
	kill "$spid" && wait "$spid" 2>/dev/null || true
	spid=
}

# client KIND GUEST N [PREFIX...]
client() {
	local kind=$1 g=$2 n=$3 extra=() gp=0
	shift 3
	[ "$kind" = packed ] && extra=(--packed)
	[ "$kind" = scsi ] && extra=(--scsi)
	[ "$g" = poll ] && gp=$guest_poll_ns
	timeout -k 5 600 "$@" "$IOPLANE" bench --vhost-user "$sock" "${extra[@]}" -d 64 -c "$n" \
		--random -s 4096 -q --poll-max-ns "$gp" >/dev/null 2>>"$tmp/client.log" ||
		{ tail -n 5 "$tmp/client.log" "$tmp/server.log" >&2; exit 1; }
}

# Total instructions of the callgrind outputs OUT*, thread 1 (main thread) left out
# for the server (SKIP1=1).
ir() {
	local f
	for f in "$1"*; do
		[ "${2:-0}" = 1 ] && [[ "$f" == *-01 ]] && continue
		sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$f" | head -n 1
	done | awk '{s += $1} END {print s + 0}'
}

# instr KIND GUEST: "server client" instructions per request.
instr() {
	local kind=$1 g=$2 n s1 s2 c1 c2
	for n in "$count" $((2 * count)); do
		start "$kind" valgrind --tool=callgrind --separate-threads=yes \
			--callgrind-out-file="$tmp/srv-$n"
		client "$kind" "$g" "$n"
		stop
		start "$kind"
		client "$kind" "$g" "$n" valgrind --tool=callgrind --callgrind-out-file="$tmp/cli-$n"
		stop
	done
	s1=$(ir "$tmp/srv-$count" 1) s2=$(ir "$tmp/srv-$((2 * count))" 1)
	c1=$(ir "$tmp/cli-$count") c2=$(ir "$tmp/cli-$((2 * count))")
	echo "$(((s2 - s1) / count)) $(((c2 - c1) / count))"
}

stats() { # "rounds sleeps hits" of the running server
	kill -USR1 "$spid"
	sleep 0.5
	grep 'stats: iothread' "$tmp/server.log" | tail -n 1 |
		sed -E 's/.*: ([0-9]+) rounds, ([0-9]+) sleeps, polling ([0-9]+) hits.*/\1 \2 \3/'
}

bt=0
if command -v bpftrace >/dev/null && timeout 30 bpftrace -l "usdt:$IOPLANE:ioplane:vu_call" 2>/dev/null |
	grep -q vu_call; then
	bt=1
fi

# events KIND GUEST: "rounds sleeps hits kicks calls" per 1000 requests.
events() {
	local kind=$1 g=$2 n=$((count * 10)) a b btp= k=n/a c=n/a
	start "$kind"
	client "$kind" "$g" 5000
	read -r -a a <<<"$(stats)"
	if [ $bt = 1 ]; then
		bpftrace -p "$spid" -e "usdt:$IOPLANE:ioplane:vu_kick { @k = count(); }
			usdt:$IOPLANE:ioplane:vu_call { @c = count(); }" >"$tmp/bt" 2>&1 &
		btp=$!
		sleep 5
	fi
	client "$kind" "$g" "$n"
	if [ -n "$btp" ]; then
		kill -INT "$btp"
		wait "$btp" || true
		k=$(sed -n 's/^@k: //p' "$tmp/bt")
		c=$(sed -n 's/^@c: //p' "$tmp/bt")
		k=$(python3 -c "print('%.1f' % (${k:-0} * 1000 / $n))")
		c=$(python3 -c "print('%.1f' % (${c:-0} * 1000 / $n))")
	fi
	read -r -a b <<<"$(stats)"
	stop
	python3 -c "print(' '.join('%.1f' % ((y - x) * 1000 / $n) for x, y in zip([${a[*]/%/,}], [${b[*]/%/,}])))" |
		tr -d '\n'
	echo " $k $c"
}

echo "ioplane against itself: null node, 4 KiB random reads, depth 64, one queue"
echo "instructions per request (callgrind, -c $count vs $((2 * count))); per 1000 requests" \
	"(-c $((count * 10))): rounds, sleeps, poll hits, kicks, calls"
[ $bt = 1 ] || echo "(bpftrace cannot attach to the USDT probes here: no kick and call counts)"
printf '%-7s %5s | %6s %6s %6s %6s | %6s %6s %6s %6s %6s\n' ring guest server client sum \
	"/split" rounds sleeps hits kicks calls
for g in $guests; do
	base=
	for kind in split packed scsi; do
		read -r s c <<<"$(instr "$kind" "$g")"
		[ -n "$base" ] || base=$((s + c))
		read -r r sl h k cl <<<"$(events "$kind" "$g")"
		printf '%-7s %5s | %6d %6d %6d %6.2f | %6s %6s %6s %6s %6s\n' "$kind" "$g" "$s" "$c" \
			$((s + c)) "$(python3 -c "print(($s + $c) / $base)")" "$r" "$sl" "$h" "$k" "$cl"
	done
done
