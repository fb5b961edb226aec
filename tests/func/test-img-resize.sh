#!/bin/bash
# `ioplane img resize`: qcow2 grows (absolute and +SIZE, across L1 growth and with small
# clusters), data and a backing file stay as they were, the new part reads as zeroes, the
# image stays clean for qemu-img check and can be written past the old end; shrinking a
# qcow2 image, or an image with internal snapshots, is refused with one line; raw images
# grow and, with --shrink, shrink; shrinking without --shrink is refused like qemu-img.
. "$(dirname "$0")/img-lib.sh"

size_of() { qinfo "$1" virtual-size; }

for opts in cluster_size=64k cluster_size=512 compat=0.10,cluster_size=4k extended_l2=on \
	refcount_bits=1,cluster_size=4k preallocation=metadata,cluster_size=16k; do
	echo "== -o $opts"
	rm -f g.qcow2 g.raw
	img create -q -f qcow2 -o "$opts" g.qcow2 3M
	qemu-io -c 'write -P 0x21 0 1M' -c 'write -P 0x22 2M 1M' g.qcow2 >/dev/null
	img resize g.qcow2 +5M
	expect_line "$OUT" "Image resized."
	[ "$(size_of g.qcow2)" = $((8 << 20)) ] || fail "$opts: size after +5M"
	img resize g.qcow2 300M
	[ "$(size_of g.qcow2)" = $((300 << 20)) ] || fail "$opts: size after 300M"
	qcheck g.qcow2
	qemu-io -c 'read -P 0x21 0 1M' -c 'read -P 0x22 2M 1M' -c 'read -P 0 3M 297M' \
		-c 'write -P 0x23 299M 1M' -c 'read -P 0x23 299M 1M' g.qcow2 >qio.out
	! grep -qE 'fail|error' qio.out || fail "$opts: data wrong after resize"
	qcheck g.qcow2
	same_as_qemu g.qcow2
	img_status 1 resize g.qcow2 -- -1M
	expect_grep "$ERR" "shrink"
	img_status 1 resize --shrink g.qcow2 -- -1M
	[ "$(size_of g.qcow2)" = $((300 << 20)) ] || fail "$opts: a refused shrink changed the size"
	[ "$(wc -l <"$ERR")" = 1 ] || fail "not one error line: $(cat "$ERR")"
done

# Overlay: grows; the backing file is untouched and still shows through.
qemu-img create -q -f qcow2 base.qcow2 2M
qemu-io -c 'write -P 0x31 0 2M' base.qcow2 >/dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 ov.qcow2
img resize ov.qcow2 4M
qcheck ov.qcow2
qemu-io -c 'read -P 0x31 0 2M' -c 'read -P 0 2M 2M' ov.qcow2 | grep -qE 'fail|error' &&
	fail "overlay content after resize"
[ "$(size_of base.qcow2)" = $((2 << 20)) ] || fail "the backing file was resized"

# Internal snapshots: refused (like qemu-img), image unchanged.
qemu-img create -q -f qcow2 s.qcow2 1M
qemu-img snapshot -c s1 s.qcow2
img_status 1 resize s.qcow2 2M
expect_grep "$ERR" "snapshot"
[ "$(size_of s.qcow2)" = $((1 << 20)) ] || fail "snapshot image resized"
qcheck s.qcow2

# raw: grow, shrink with --shrink, sizes with suffixes and signs.
truncate -s 1M r.raw
printf 'abc' | dd of=r.raw bs=1 seek=1000 conv=notrunc status=none
img resize r.raw +1.5M
[ "$(stat -c %s r.raw)" = $((2560 << 10)) ] || fail "raw +1.5M"
img resize -f raw r.raw 4M
[ "$(stat -c %s r.raw)" = $((4 << 20)) ] || fail "raw 4M"
img_status 1 resize r.raw 2M
expect_line "$ERR" "ioplane img: Use the --shrink option to perform a shrink operation."
img resize --shrink r.raw -3M
[ "$(stat -c %s r.raw)" = $((1 << 20)) ] || fail "raw --shrink -3M"
[ "$(dd if=r.raw bs=1 skip=1000 count=3 status=none)" = abc ] || fail "raw data lost"
img resize -q r.raw 2M
[ ! -s "$OUT" ] || fail "-q printed something"

# Bad command lines.
img_status 1 resize r.raw
img_status 1 resize r.raw 1Q
img_status 1 resize r.raw -- -5M
img_status 1 resize missing.raw 1M
img_status 1 resize -f qcow2 r.raw 8M
echo "resize: all cases passed"
