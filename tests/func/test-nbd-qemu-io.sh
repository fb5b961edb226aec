#!/bin/bash
# qemu-io against an NBD export: write/read with patterns, discard, write-zeroes (with and
# without unmap), FUA writes, flush, async writes; read-back checks through NBD, through a
# second connection and, after the daemon exits, directly from the image file. Runs once
# per I/O engine (io_uring, native, threads), with and without O_DIRECT, on both loop
# backends; then the null driver.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need qemu-io qemu-img

img=$NBD_TMP/disk.img
sock=$NBD_TMP/nbd.sock

# file_suite IMAGE-OPTIONS: the whole file test with these --image options.
file_suite() {
	echo "== $IOPLANE_LOOP_BACKEND loop, $1"
	rm -f "$img"
	truncate -s 64M "$img"
	nbd_serve --image d0,file="$img",discard=unmap,"$1" \
		--nbd unix="$sock",image=d0,writable=on
	uri=$(nbd_uri d0 "$sock")

	# Patterns at aligned and unaligned places, read back in one connection.
	nbd_qemu_io "$uri" \
		'write -P 0xa5 0 1M' \
		'write -P 0x5a 1M 64k' \
		'write -P 0x11 3000 5000' \
		'write -f -P 0x22 8M 128k' \
		'flush' \
		'read -P 0xa5 0 3000' \
		'read -P 0x11 3000 5000' \
		'read -P 0xa5 8000 1040576' \
		'read -P 0x5a 1M 64k' \
		'read -P 0 1088k 64k' \
		'read -P 0x22 8M 128k'

	# A pattern check must be able to fail (guards against a no-op client or server).
	out=$(qemu-io -f raw "$uri" -c 'read -P 0x77 0 4k' 2>&1) || true
	grep -q 'Pattern verification failed' <<<"$out" || fail "wrong pattern not detected: $out"

	# Second connection sees the data; write-zeroes and discard read back as zeroes.
	nbd_qemu_io "$uri" \
		'read -P 0xa5 0 3000' \
		'write -z 64k 64k' \
		'write -z -u 128k 128k' \
		'discard 512k 256k' \
		'read -P 0xa5 0 3000' \
		'read -P 0 64k 192k' \
		'read -P 0xa5 256k 256k' \
		'read -P 0 512k 256k' \
		'read -P 0xa5 768k 256k'

	# Many writes in flight on one connection (aio_write), then one large read.
	cmds=()
	for i in $(seq 0 31); do
		cmds+=("aio_write -P $((i + 1)) $((16 + i))M 256k")
	done
	cmds+=(aio_flush)
	for i in $(seq 0 31); do
		cmds+=("read -P $((i + 1)) $((16 + i))M 256k")
	done
	nbd_qemu_io "$uri" "${cmds[@]}" >/dev/null

	# Past the end is refused and changes nothing.
	nbd_qemu_io_fails "$uri" 'write -P 0x33 64M 4k' >/dev/null
	nbd_qemu_io_fails "$uri" 'read 63M 2M' >/dev/null

	# The info the client got matches the image.
	size=$(qemu-img info --output=json -f raw "$uri" | python3 -c \
		'import json,sys; print(json.load(sys.stdin)["virtual-size"])')
	[ "$size" = 67108864 ] || fail "virtual size $size, expected 64 MiB"

	nbd_stop

	# What the clients were told is written is in the file.
	nbd_file_check "$img" \
		'read -P 0xa5 0 3000' \
		'read -P 0x11 3000 5000' \
		'read -P 0 64k 192k' \
		'read -P 0xa5 256k 256k' \
		'read -P 0 512k 256k' \
		'read -P 0x5a 1M 64k' \
		'read -P 0x22 8M 128k' \
		'read -P 1 16M 256k' \
		'read -P 32 47M 256k' \
		'read -P 0 63M 1M'
	[ "$(stat -c %s "$img")" = 67108864 ] || fail "image size changed"
}

export IOPLANE_LOOP_BACKEND
for combo in "uring aio=io_uring,cache=writeback" "epoll aio=native,cache=none" \
	"uring aio=threads,cache=none" "epoll aio=io_uring,cache=none"; do
	IOPLANE_LOOP_BACKEND=${combo%% *}
	file_suite "${combo#* }"
done
unset IOPLANE_LOOP_BACKEND

# The null driver with read-zeroes reads zeroes and has the requested size.
nbd_serve --image n0,driver=null,size=1G,read-zeroes=on \
	--nbd unix="$sock",image=n0,writable=on
uri=$(nbd_uri n0 "$sock")
nbd_qemu_io "$uri" 'read -P 0 0 1M' 'read -P 0 1023M 1M' 'write -P 1 0 4k' \
	'read -P 0 1020M 4k' >/dev/null
size=$(qemu-img info --output=json -f raw "$uri" | python3 -c \
	'import json,sys; print(json.load(sys.stdin)["virtual-size"])')
[ "$size" = 1073741824 ] || fail "null virtual size $size, expected 1 GiB"
nbd_stop
echo PASS
