#!/bin/bash
# nbdcopy in and out of ioplane with several connections (--connections=4, which needs
# CAN_MULTI_CONN to be used): a random file with holes copied into an export and back out,
# compared byte for byte with cmp; also export-to-export and a sparse copy (--allocated).
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need nbdcopy qemu-io

src=$NBD_TMP/src.img
dst=$NBD_TMP/dst.img
dst2=$NBD_TMP/dst2.img
sock=$NBD_TMP/nbd.sock

# 48 MiB: random data with holes and zero runs in between.
truncate -s 48M "$src"
for i in 0 5 9 17 30 47; do
	head -c $((1 << 20)) /dev/urandom |
		dd of="$src" bs=1M seek=$i conv=notrunc status=none
done
head -c 12345 /dev/urandom | dd of="$src" bs=1 seek=$((20 << 20)) conv=notrunc status=none
truncate -s 48M "$dst" "$dst2"
# Stale data that the copy must overwrite (zeroes of the source are real zeroes).
qemu-io -f raw "$dst" -c 'write -P 0xee 0 48M' >/dev/null

nbd_serve --image d,file="$dst" --image e,file="$dst2" \
	--nbd unix="$sock",image=d,writable=on --nbd unix="$sock",image=e,writable=on
uri=$(nbd_uri d "$sock")
uri2=$(nbd_uri e "$sock")

# In: local file -> export, 4 connections, flushed.
# nbdcopy falls back to one connection unless the server advertises CAN_MULTI_CONN.
out=$(nbdcopy --connections=4 --threads=4 --requests=16 --flush -v "$src" "$uri" 2>&1) ||
	fail "nbdcopy in: $(grep -v 'libnbd: debug' <<<"$out")"
grep 'nbdcopy: connections=' <<<"$out"
grep -q 'nbdcopy: connections=4 ' <<<"$out" || fail "nbdcopy did not use 4 connections"

# Out: export -> local file, 4 connections; then export -> export.
nbdcopy --connections=4 --threads=4 "$uri" "$NBD_TMP/out.img"
cmp "$src" "$NBD_TMP/out.img" || fail "nbdcopy out differs from the source"
nbdcopy --connections=4 --threads=4 --flush "$uri" "$uri2"
nbdcopy -C 2 "$uri2" "$NBD_TMP/out2.img"
cmp "$src" "$NBD_TMP/out2.img" || fail "export-to-export copy differs"

# Sparse copy out: only allocated data is written; holes must still read as zero.
nbdcopy --connections=4 --threads=4 --allocated "$uri" "$NBD_TMP/out3.img"
cmp "$src" "$NBD_TMP/out3.img" || fail "--allocated copy differs"

nbd_stop
cmp "$src" "$dst" || fail "image file differs from the source after the daemon exited"
cmp "$src" "$dst2" || fail "second image differs from the source after the daemon exited"
echo PASS
