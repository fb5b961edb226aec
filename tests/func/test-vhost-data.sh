#!/bin/bash
# vhost-user-blk export, data path end to end: `ioplane bench --vhost-user` (a real
# vhost-user front-end) writes offset-derived data through 1, 2 and 4 queues, reads it
# back through the same export and checks it, then the image file and an NBD export of
# the same image must hold the same bytes. Also: random 64 KiB requests, a second export
# with logical-block-size=4096 in the same daemon, command-line errors, and a polling
# front-end (--poll-max-ns) that must not need calls while it polls.
. "$(dirname "${BASH_SOURCE[0]}")/vhost-lib.sh"
need python3 qemu-img strace

img=$FUNC_TMP/disk.img
img2=$FUNC_TMP/disk4k.img
sock=$FUNC_TMP/vhost.sock
sock2=$FUNC_TMP/vhost4k.sock
nsock=$FUNC_TMP/nbd.sock
truncate -s 32M "$img"
truncate -s 8M "$img2"

# Bad command lines are refused with exit 1 (as in qemu-storage-daemon) before anything listens.
for bad in "unix=$sock" "image=d" "unix=$sock,image=nope" "unix=$sock,image=d,num-queues=0" \
	"unix=$sock,image=d,num-queues=300" "unix=$sock,image=d,logical-block-size=1024" \
	"unix=$sock,image=d,bogus=1" "unix=$sock,image=d,serial=123456789012345678901"; do
	rc=0
	"$IOPLANE" serve --image d,file="$img" --vhost-user-blk "$bad" >/dev/null 2>&1 || rc=$?
	[ $rc -eq 1 ] || fail "--vhost-user-blk $bad: exit $rc, expected 1"
done

vhost_serve "$sock" --iothreads 2 --image d,file="$img" --image e,file="$img2" \
	--vhost-user-blk unix="$sock",image=d,num-queues=4,writable=on,serial=ioplane-test \
	--vhost-user-blk unix="$sock2",image=e,num-queues=2,writable=on,logical-block-size=4096 \
	--nbd unix="$nsock",image=d
pid=$VHOST_PID
vhost_wait_socket "$pid" "$nsock"

# Sequential writes wrap before the last block (bench's rule): check all but it.
blocks=$((32 * 1024 * 1024 / 4096 - 1))
for nq in 1 2 4; do
	pat=$((16 + nq))
	vhost_bench --vhost-user "$sock" --num-queues $nq -d $((nq * 8)) -c $blocks -w \
		--verify --pattern $pat -q
	vhost_bench --vhost-user "$sock" --num-queues $nq -d 5 -c $blocks --verify \
		--pattern $pat -q
done
vhost_check_file "$img" $pat $blocks 4096
echo "sequential write/read through 1, 2, 4 queues: ok"

# The check itself works: other data must be reported.
if vhost_bench --vhost-user "$sock" -c 64 --verify --pattern 99 -q 2>/dev/null; then
	fail "reading pattern 20 data as pattern 99 passed the check"
fi

# Random 64 KiB writes, then reads of the same offsets (same seed).
vhost_bench --vhost-user "$sock" --num-queues 3 -d 16 -s 64K -c 2000 --random --seed 7 -w \
	--verify --pattern 5 -q
vhost_bench --vhost-user "$sock" --num-queues 2 -d 7 -s 64K -c 2000 --random --seed 7 \
	--verify --pattern 5 -q
echo "random 64 KiB: ok"

# The same bytes through NBD.
qemu-img convert -f raw -O raw "nbd+unix:///d?socket=$nsock" "$FUNC_TMP/copy.raw"
cmp "$img" "$FUNC_TMP/copy.raw" || fail "NBD and the image file differ"
echo "NBD sees the same data: ok"

# 4096-byte logical blocks: 4 KiB requests work, 512-byte ones are refused.
vhost_bench --vhost-user "$sock2" --num-queues 2 -d 8 -c 2047 -w --verify --pattern 3 -q
vhost_bench --vhost-user "$sock2" --num-queues 1 -d 8 -c 2047 --verify --pattern 3 -q
if vhost_bench --vhost-user "$sock2" -s 512 -c 1 -q 2>/dev/null; then
	fail "a 512-byte read on a 4096-byte-block disk succeeded"
fi
vhost_check_file "$img2" 3 2047 4096
echo "logical-block-size=4096: ok"

# A polling front-end. With a short poll it often gives up, asks for a call and
# sleeps: no completion may be lost on the way. With a long one it never sleeps: far
# fewer epoll_wait calls than the 512 wake-ups that 4095 requests at depth 8 need.
vhost_bench --vhost-user "$sock" --num-queues 3 -d 24 -c 4095 -w --verify --pattern 5 \
	--poll-max-ns 1000 -q
# (LeakSanitizer cannot run under ptrace.)
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 \
	strace -f -c -e trace=epoll_wait -o "$FUNC_TMP/poll.strace" "$IOPLANE" bench \
	--vhost-user "$sock" --num-queues 1 -d 8 -c 4095 --verify --pattern 5 \
	--poll-max-ns 1000000000 -q
waits=$(awk '$NF == "epoll_wait" {print ($4 ~ /^[0-9]+$/) ? $4 : $3}' "$FUNC_TMP/poll.strace")
[ "${waits:-0}" -lt 100 ] || fail "a polling front-end slept $waits times"
vhost_check_file "$img" 5 4095 4096
echo "polling front-end: ok ($waits epoll_wait calls)"

# Setup only, all queues; then the daemon stops cleanly.
vhost_bench --vhost-user "$sock" --num-queues 4 --setup-only | grep -q "4 queue(s)" ||
	fail "--setup-only did not report 4 queues"
vhost_stop "$pid"
[ ! -e "$sock" ] || fail "socket $sock left behind"
echo "PASS"
