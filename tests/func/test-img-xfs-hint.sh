#!/bin/bash
# The XFS extent size hint that `ioplane img create` gives a new image (1 MiB, as
# qemu-img does): on an XFS file system made on a loop device, raw and qcow2 images get it,
# `-o extent_size_hint=SIZE` (raw) sets another size or none (0), a bad value is refused
# with one line, the image works (qemu-io writes and reads a pattern), and on a file system
# that is not XFS creation goes on without a hint. Needs root, losetup and xfsprogs.
. "$(dirname "$0")/img-lib.sh"

[ "$(id -u)" = 0 ] || skip "needs root for a loop device"
need losetup mkfs.xfs xfs_io mount umount

dd if=/dev/zero of="$T/xfs.img" bs=1M count=0 seek=320 status=none
loopdev=$(losetup --find --show "$T/xfs.img" 2>"$T/losetup.log") ||
	skip "losetup failed: $(head -n 1 "$T/losetup.log")"
at_exit "losetup -d $loopdev"
mkfs.xfs -q -f "$loopdev" >"$T/mkfs.log" 2>&1 || { cat "$T/mkfs.log" >&2; fail "mkfs.xfs"; }
mkdir "$T/mnt"
mount "$loopdev" "$T/mnt" 2>"$T/mount.log" || skip "cannot mount XFS: $(head -n 1 "$T/mount.log")"
at_exit "umount $T/mnt || umount -l $T/mnt"
M=$T/mnt

# extsize FILE: the extent size hint XFS keeps for FILE, in bytes.
extsize() {
	xfs_io -c extsize "$1" | sed -n 's/^\[\([0-9]*\)\].*/\1/p'
}

want_hint() {
	local got
	got=$(extsize "$1")
	[ "$got" = "$2" ] || fail "$1: extent size hint is '$got', want $2"
}

echo "== defaults: 1 MiB, like qemu-img"
img create -q -f raw "$M/a.raw" 64M
want_hint "$M/a.raw" 1048576
qemu-img create -q -f raw "$M/q.raw" 64M
want_hint "$M/q.raw" "$(extsize "$M/a.raw")"
img create -q -f qcow2 "$M/a.qcow2" 64M
want_hint "$M/a.qcow2" 1048576
qcheck "$M/a.qcow2"

echo "== extent_size_hint= for raw"
img create -q -f raw -o extent_size_hint=256k "$M/b.raw" 64M
want_hint "$M/b.raw" 262144
img create -q -f raw -o extent_size_hint=0 "$M/c.raw" 64M
want_hint "$M/c.raw" 0
img_status 1 create -q -f raw -o extent_size_hint=4G "$M/d.raw" 64M
expect_grep "$ERR" "Extent size hint is too large"
img_status 1 create -q -f raw -o extent_size_hint=big "$M/d.raw" 64M
expect_grep "$ERR" "Parameter 'extent_size_hint' expects a non-negative number"

echo "== the images work"
for f in "$M/a.raw" "$M/b.raw"; do
	out=$(qemu-io -f raw -c 'write -P 0x3c 1M 64k' -c 'write -P 0x3d 40M 4k' \
		-c 'read -P 0x3c 1M 64k' -c 'read -P 0x3d 40M 4k' -c 'read -P 0 2M 4k' "$f" 2>&1)
	if grep -qiE 'fail|error|mismatch' <<<"$out"; then
		echo "$out" >&2
		fail "qemu-io on $f"
	fi
done
out=$(qemu-io -f qcow2 -c 'write -P 0x3e 0 128k' -c 'read -P 0x3e 0 128k' "$M/a.qcow2" 2>&1)
grep -qiE 'fail|error|mismatch' <<<"$out" && { echo "$out" >&2; fail "qemu-io on a.qcow2"; }
qcheck "$M/a.qcow2"

echo "== not XFS: no hint, no error"
img create -q -f raw -o extent_size_hint=1M "$T/e.raw" 8M
[ "$(stat -c %s "$T/e.raw")" = 8388608 ] || fail "raw image off XFS"

echo "PASS"
