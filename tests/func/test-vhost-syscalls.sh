#!/bin/bash
# System calls the daemon makes per vhost-user-blk request (strace -c -f on every thread),
# with an interrupt-driven driver (`ioplane bench --vhost-user --poll-max-ns 0`, whose
# call and kick eventfds are O_NONBLOCK as QEMU's are) reading 4 KiB from a null export,
# one request at a time:
#   - on a loop that waits in an io_uring with DEFER_TASKRUN, the kick arrives as a read
#     completion of the io_uring_enter that waits and the interrupt goes out in the next
#     one without a completion of its own: one call per request (asserted <= 1.2), and no
#     read, preadv2 or write calls;
#   - on a kernel without those features (IOPLANE_RING_PLAIN=1) and under the epoll loop:
#     a readiness event, the kick read and the interrupt, at most 3.3 calls per request.
# In each mode a second export on a raw file takes writes and reads with --verify.
# Counts, not times: the bounds hold on a slow machine too.
. "$(dirname "${BASH_SOURCE[0]}")/vhost-lib.sh"

need strace python3
sock=$FUNC_TMP/vhost.sock
sock2=$FUNC_TMP/vhost2.sock
truncate -s 64M "$FUNC_TMP/disk.raw"
n=4000
ring_kernel=0
IFS=.- read -r kmaj kmin _ <<<"$(uname -r)"
[ "$kmaj" -gt 6 ] || { [ "$kmaj" -eq 6 ] && [ "$kmin" -ge 1 ]; } && ring_kernel=1

# calls MODE: prints "calls/request rw-calls" for n requests of one server in MODE.
calls() {
	local total rw
	vhost_serve "$sock" --iothreads 1 --image d,driver=null,size=64M \
		--image f,file="$FUNC_TMP/disk.raw",format=raw \
		--vhost-user-blk unix="$sock",image=d,num-queues=1 \
		--vhost-user-blk unix="$sock2",image=f,num-queues=1,writable=on
	vhost_wait_socket "$VHOST_PID" "$sock2"
	strace_start "$VHOST_PID" "$FUNC_TMP/strace.out"
	vhost_bench --vhost-user "$sock" --num-queues 1 -d 1 -c "$n" -s 4096 -q \
		--poll-max-ns 0 >/dev/null || fail "$1: bench failed"
	strace_stop
	for w in -w ""; do
		# shellcheck disable=SC2086
		vhost_bench --vhost-user "$sock2" --num-queues 1 -d 1 -c 500 -s 4096 $w --verify \
			--pattern 7 -q --poll-max-ns 0 >/dev/null || fail "$1: bench $w --verify failed"
	done
	vhost_stop "$VHOST_PID"
	read -r total rw <<<"$(strace_calls "$FUNC_TMP/strace.out" read preadv2 write pwritev2 readv writev)"
	awk -v t="$total" -v n="$n" -v rw="$rw" 'BEGIN { printf "%.3f %d\n", t / n, rw }'
}

for mode in ring plain epoll; do
	case $mode in
	plain) export IOPLANE_RING_PLAIN=1 ;;
	epoll) export IOPLANE_LOOP_BACKEND=epoll ;;
	esac
	# Not in $(...): a server started in a subshell would escape the cleanup.
	calls $mode >"$FUNC_TMP/calls.out"
	read -r per rw <"$FUNC_TMP/calls.out"
	unset IOPLANE_RING_PLAIN IOPLANE_LOOP_BACKEND
	echo "$mode: $per calls per request, $rw read/write calls for $n requests"
	if [ $mode = ring ] && [ $ring_kernel = 1 ]; then
		awk -v p="$per" 'BEGIN { exit !(p <= 1.2) }' ||
			fail "ring: $per system calls per request (at most 1.2 expected)"
		[ "$rw" -lt $((n / 100)) ] ||
			fail "ring: $rw read/write calls for $n requests (kicks and interrupts belong in the ring)"
	else
		awk -v p="$per" 'BEGIN { exit !(p <= 3.3) }' ||
			fail "$mode: $per system calls per request (at most 3.3 expected)"
	fi
done
echo PASS
