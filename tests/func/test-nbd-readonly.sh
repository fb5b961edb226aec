#!/bin/bash
# Read-only exports refuse writes and keep the data: an export without writable=on, and
# an image opened with read-only=on. Writes, write-zeroes and discards through qemu-io must
# fail, reads must return the original data, and the file must be unchanged afterwards.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need qemu-io nbdinfo sha256sum

img=$NBD_TMP/disk.img
sock=$NBD_TMP/nbd.sock
truncate -s 16M "$img"
qemu-io -f raw "$img" -c 'write -P 0x3c 0 16M' >/dev/null
sum=$(sha256sum <"$img")

# refuse URI: every kind of modification fails and the data reads back unchanged.
refuse() {
	local uri=$1
	nbd_qemu_io_fails "$uri" 'write -P 0x99 0 64k' >/dev/null
	nbd_qemu_io_fails "$uri" 'write -P 0x99 1M 512' >/dev/null
	nbd_qemu_io_fails "$uri" 'write -z 2M 1M' >/dev/null
	nbd_qemu_io_fails "$uri" 'discard 4M 1M' >/dev/null
	nbd_qemu_io_fails "$uri" 'aio_write -P 0x98 8M 4k' >/dev/null
	# A read-only open still reads, and sees the original pattern everywhere.
	out=$(qemu-io -r -f raw "$uri" -c 'read -P 0x3c 0 16M' 2>&1) ||
		fail "read-only read of $uri: $out"
	nbdinfo --is read-only "$uri" || fail "$uri does not say it is read-only"
}

# 1. Export without writable=on on a read-write image.
nbd_serve --image d0,file="$img" --nbd unix="$sock",image=d0
refuse "$(nbd_uri d0 "$sock")"
nbd_stop
[ "$(sha256sum <"$img")" = "$sum" ] || fail "image changed through a read-only export"

# 2. Image opened read-only; the export is not writable either.
nbd_serve --image d0,file="$img",read-only=on --nbd unix="$sock",image=d0
refuse "$(nbd_uri d0 "$sock")"
nbd_stop
[ "$(sha256sum <"$img")" = "$sum" ] || fail "image changed through a read-only image"

# 3. A read-only file on disk served read-only (the daemon must not need write access).
chmod 0444 "$img"
if [ "$(id -u)" -ne 0 ]; then
	nbd_serve --image d0,file="$img",read-only=on --nbd unix="$sock",image=d0
	refuse "$(nbd_uri d0 "$sock")"
	nbd_stop
fi
chmod 0644 "$img"

# 4. writable=on on a read-only image: either refused at start-up, or still read-only.
rc=0
timeout 10 "$IOPLANE" serve --image d0,file="$img",read-only=on \
	--nbd unix="$NBD_TMP/x.sock",image=d0,writable=on >"$NBD_TMP/x.log" 2>&1 &
xpid=$!
for ((i = 0; i < 100; i++)); do
	kill -0 $xpid 2>/dev/null || break
	nbd_unix_listening "$NBD_TMP/x.sock" && break
	sleep 0.05
done
if nbd_unix_listening "$NBD_TMP/x.sock"; then
	nbd_qemu_io_fails "$(nbd_uri d0 "$NBD_TMP/x.sock")" 'write -P 0x99 0 64k' >/dev/null
	kill -TERM $xpid
fi
wait $xpid || rc=$?
[ $rc -ne 124 ] || fail "writable=on on a read-only image: daemon hung"
[ "$(sha256sum <"$img")" = "$sum" ] || fail "image changed through writable=on,read-only=on"
echo PASS
