#!/bin/bash
# `ioplane img compare` next to `qemu-img compare`: the same verdict, message and exit
# status for identical images (raw/qcow2, across formats and backing chains), a content
# difference (at the 512-byte block qemu-img names), a size difference with a zero or
# non-zero tail, strict mode (-s), errors; -p progress; -q silence.
. "$(dirname "$0")/img-lib.sh"

# both STATUS ARGS...: ioplane and qemu-img agree on stdout and exit status (STATUS).
both() {
	local want=$1 rc=0
	shift
	img_status "$want" compare "$@"
	qemu-img compare "$@" >q.out 2>/dev/null || rc=$?
	[ "$rc" = "$want" ] || fail "qemu-img compare $*: exit $rc, test expects $want"
	diff -u q.out "$OUT" || fail "compare $*: output differs from qemu-img's"
}

pattern_raw a.raw $((8 << 20)) 21
qemu-img convert -q -f raw -O qcow2 -o cluster_size=4k a.raw a.qcow2
cp a.raw b.raw
both 0 a.raw b.raw
expect_line "$OUT" "Images are identical."
both 0 a.raw a.qcow2
both 0 -f raw -F qcow2 a.raw a.qcow2

# One byte changed: the mismatch is reported at its 512-byte block.
printf '\xff' | dd of=b.raw bs=1 seek=3000001 conv=notrunc status=none
both 1 a.raw b.raw
expect_line "$OUT" "Content mismatch at offset 2999808!"
qemu-io -f qcow2 -c 'write -P 0x5c 5M 4k' a.qcow2 >/dev/null
both 1 a.raw a.qcow2
both 1 a.qcow2 a.raw

# Backing chains: an overlay is identical to its base until written.
qemu-img create -q -f qcow2 -b a.qcow2 -F qcow2 ov.qcow2
both 0 a.qcow2 ov.qcow2
qemu-io -c 'write -z 0 4k' ov.qcow2 >/dev/null
both 1 a.qcow2 ov.qcow2

# Sizes: a zero tail is fine (not with -s); a non-zero tail is a mismatch.
cp a.raw c.raw
truncate -s 12M c.raw
both 0 a.raw c.raw
expect_line "$OUT" "Warning: Image size mismatch!"
both 0 c.raw a.raw
both 1 -s a.raw c.raw
expect_line "$OUT" "Strict mode: Image size mismatch!"
printf 'x' | dd of=c.raw bs=1 seek=$((10 << 20)) conv=notrunc status=none
both 1 a.raw c.raw
expect_line "$OUT" "Content mismatch at offset $((10 << 20))!"
both 1 c.raw a.raw

# Strict mode also compares allocation: a zero cluster is not a hole.
qemu-img create -q -f qcow2 e1.qcow2 1M
qemu-img create -q -f qcow2 e2.qcow2 1M
qemu-io -c 'write -z 0 64k' e2.qcow2 >/dev/null
both 0 e1.qcow2 e2.qcow2
img_status 1 compare -s e1.qcow2 e2.qcow2
expect_grep "$OUT" "^Strict mode: Offset 0 block status mismatch!"

# -q: only the exit status; -p: progress on stdout.
img_status 1 compare -q a.raw b.raw
[ ! -s "$OUT" ] || fail "-q printed: $(cat "$OUT")"
img_status 1 compare -p a.raw a.qcow2
grep -q $'    (0.00/100%)\r' "$OUT" || fail "no progress line"

# Errors: an image that does not open is exit 2, a bad command line 1 (as qemu-img);
# one line.
img_status 2 compare a.raw missing.raw
[ "$(wc -l <"$ERR")" = 1 ] || fail "not one error line: $(cat "$ERR")"
img_status 2 compare -f qcow2 a.raw a.qcow2
img_status 1 compare a.raw
echo "compare: agrees with qemu-img"
