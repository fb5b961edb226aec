#!/bin/bash
# `ioplane img snapshot -l` lists what `qemu-img snapshot -c` made, byte for byte as
# `qemu-img snapshot -l` does (none, one, several with odd names, after writes and a
# deletion; -U while another process holds the image), and prints nothing for an image
# without snapshots or a raw one; mixing actions gets qemu-img's message; -c, -a and -d,
# which ioplane does not do yet, are refused with one line and leave the image as it was.
. "$(dirname "$0")/img-lib.sh"

# same_list ARGS... FILE: both tools print the same list (and both succeed).
same_list() {
	local want file=${*: -1}
	want=$(qemu-img snapshot "${@:1:$#-1}" -l "$file") || fail "qemu-img snapshot -l $*"
	img snapshot "${@:1:$#-1}" -l "$file"
	[ "$(cat "$OUT")" = "$want" ] || { diff <(echo "$want") "$OUT" >&2; fail "list of $*"; }
}

qemu-img create -q -f qcow2 s.qcow2 16M
same_list s.qcow2
[ ! -s "$OUT" ] || fail "a list for an image without snapshots"
qemu-io -c 'write -P 0x11 0 1M' s.qcow2 >/dev/null
qemu-img snapshot -c first s.qcow2
same_list s.qcow2
expect_grep "$OUT" '^1 +first +0 B '
qemu-io -c 'write -P 0x22 0 1M' s.qcow2 >/dev/null
qemu-img snapshot -c 'with spaces and a very long name indeed' s.qcow2
qemu-img snapshot -c third s.qcow2
qemu-img snapshot -d first s.qcow2
same_list s.qcow2
[ "$(grep -c '^[0-9]' "$OUT")" = 2 ] || fail "two snapshots after the deletion"
same_list -q s.qcow2

# Held by another process: -U, as qemu-img.
timeout 60 qemu-io -c 'sleep 60000' s.qcow2 >qemu-io.log 2>&1 &
holder=$!
image_locked s.qcow2 30 || { cat qemu-io.log >&2; fail "qemu-io did not lock the image within 30 s"; }
img_status 1 snapshot -l s.qcow2
same_list -U s.qcow2
kill "$holder"
wait "$holder" 2>/dev/null || true
wait_unlocked s.qcow2

truncate -s 1M r.raw
same_list r.raw
[ ! -s "$OUT" ] || fail "a list for a raw image"

before=$(qemu-img snapshot -l s.qcow2)
img_status 1 snapshot -l -c x s.qcow2
expect_line "$ERR" "ioplane img: Cannot mix '-l', '-a', '-c', '-d'"
for a in -c -a -d; do
	img_status 1 snapshot $a third s.qcow2
	expect_grep "$ERR" "not supported by ioplane yet"
done
[ "$(qemu-img snapshot -l s.qcow2)" = "$before" ] || fail "a refused action changed the image"
qcheck s.qcow2
echo PASS
