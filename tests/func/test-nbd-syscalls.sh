#!/bin/bash
# System calls the daemon makes per NBD request (strace -c -f on every thread), with fio's
# nbd engine reading 4 KiB from a null export over a unix socket:
#   - depth 1 on a loop that waits in an io_uring with DEFER_TASKRUN: the request arrives
#     as a receive completion of the io_uring_enter that waits, and the reply goes out as a
#     SENDMSG submitted by that same call, so one call per request (asserted <= 1.3, with
#     polling off: --poll-max-ns 0) and no recv or send calls at all (asserted with the
#     default polling too, which may poll for the next request: then the calls are the
#     submission, the one that runs the receive and sched_yield while it polls, not
#     socket calls);
#   - the same on a kernel without those features (IOPLANE_RING_PLAIN=1) and under the
#     epoll loop: a readiness event, recv and sendmsg (asserted <= 3.3, and > 2.5);
#   - depth 64: at most one call per request on the ring path (the default); on the
#     fallbacks (plain ring, epoll) at most 1.5, since how many requests share a round
#     there depends on how fast the server runs against the client (1.05 was seen under
#     ASan on a loaded machine, 0.4-0.7 in a normal build).
# Counts, not times: the bounds hold on a slow machine too.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need fio strace python3
fio --enghelp 2>/dev/null | grep -qw nbd || skip "this fio has no nbd engine"

sock=$NBD_TMP/nbd.sock
# DEFER_TASKRUN (Linux 6.1) is what the daemon probes for; older kernels take the plain path.
ring_kernel=0
IFS=.- read -r kmaj kmin _ <<<"$(uname -r)"
[ "$kmaj" -gt 6 ] || { [ "$kmaj" -eq 6 ] && [ "$kmin" -ge 1 ]; } && ring_kernel=1

# calls_per_io DEPTH IOS: run fio under strace -c -f -p NBD_PID; prints "calls/IO recvs
# sends".
calls_per_io() {
	local depth=$1 ios=$2 out total recv send
	strace_start "$NBD_PID" "$NBD_TMP/strace.out"
	out=$(cd "$NBD_TMP" && timeout 300 fio --name=sc --ioengine=nbd \
		--uri="$(nbd_uri e0 "$sock")" --rw=randread --bs=4k --size=256M \
		--iodepth="$depth" --number_ios="$ios" --randrepeat=0 --output-format=json) ||
		fail "fio: $out"
	strace_stop
	read -r total recv <<<"$(strace_calls "$NBD_TMP/strace.out" recvfrom recvmsg readv)"
	read -r _ send <<<"$(strace_calls "$NBD_TMP/strace.out" sendmsg sendto writev)"
	python3 - "$total" "$recv" "$out" "$send" <<'EOF'
import json, sys
s = sys.argv[3]
ios = json.loads(s[s.index("{"):])["jobs"][0]["read"]["total_ios"]
print("%.3f %s %s" % (int(sys.argv[1]) / max(ios, 1), sys.argv[2], sys.argv[4]))
EOF
}

# check MODE DEPTH MAX [MIN]: calls per I/O of the running daemon within bounds.
check() {
	local mode=$1 depth=$2 max=$3 min=${4:-0} r calls recvs sends
	r=$(calls_per_io "$depth" $((depth == 1 ? 3000 : 30000)))
	read -r calls recvs sends <<<"$r"
	echo "$mode, depth $depth: $calls system calls per request, $recvs recv and $sends send calls"
	python3 -c "import sys; sys.exit(not ($min < $calls <= $max))" ||
		fail "$mode, depth $depth: $calls system calls per request (want ($min, $max])"
	if [[ "$mode" = ring* ]] && [ "$depth" = 1 ] && [ "$recvs" -gt 20 ]; then
		fail "ring, depth 1: $recvs recv system calls: the socket input is not in the ring"
	fi
	if [[ "$mode" = ring* ]] && [ "$depth" = 1 ] && [ "$sends" -gt 20 ]; then
		fail "ring, depth 1: $sends send system calls: the replies are not in the ring"
	fi
}

for mode in ring ring-nopoll plain epoll; do
	poll=()
	case $mode in
	ring-nopoll) poll=(--poll-max-ns 0) ;;
	plain) export IOPLANE_RING_PLAIN=1 ;;
	epoll) export IOPLANE_LOOP_BACKEND=epoll ;;
	esac
	[ $mode = ring-nopoll ] && [ $ring_kernel = 0 ] && continue
	nbd_serve --iothreads 1 "${poll[@]}" --image e0,driver=null,size=256M \
		--nbd unix="$sock",image=e0
	unset IOPLANE_RING_PLAIN IOPLANE_LOOP_BACKEND
	if [ $mode = ring ] && [ $ring_kernel = 0 ]; then
		echo "kernel $(uname -r) has no DEFER_TASKRUN: the plain path twice"
		check plain 1 3.3 2.5
	elif [ $mode = ring ]; then
		check ring 1 1000 # polling: no socket calls (checked), the count is the poll's
	elif [ $mode = ring-nopoll ]; then
		check ring-nopoll 1 1.3
	else
		check $mode 1 3.3 2.5
	fi
	if [[ $mode = ring* ]] && [ $ring_kernel = 1 ]; then
		check $mode 64 1.0
	else
		check $mode 64 1.5
	fi
	nbd_stop
done
echo PASS
