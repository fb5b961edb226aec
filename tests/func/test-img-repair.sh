#!/bin/bash
# Repair of qcow2 images marked corrupt (incompatible feature bit 1) or dirty (bit 0, lazy
# refcounts after a crash), next to qemu-img: `ioplane img check` without -r reads such an
# image read-only and reports what qemu-img check reports; `check -r leaks|all` opens it
# for repair, fixes leaks and refcount errors, clears the bits only when the image then
# checks clean, and exits as qemu-img check -r does on a copy; the guest data reads back
# the same as a copy made before the damage. A dirty image opened read-write (serve) is
# repaired at open. `ioplane serve` refuses a writable open of a corrupt image, and the
# repair=on open option that img check uses.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/img-lib.sh"

nbd_need_ioplane
[ -z "$NBD_TEST_PEER" ] || skip "NBD_TEST_PEER: this test is about ioplane's qcow2 driver"

DIRTY=1
CORRUPT=2
sock=$T/nbd.sock

# bits IMAGE: the dirty and corrupt bits of the header (incompatible features & 3).
bits() {
	python3 -c '
import struct, sys
with open(sys.argv[1], "rb") as f:
    f.seek(72)
    print(struct.unpack(">Q", f.read(8))[0] & 3)' "$1"
}

# set_bits IMAGE BITS: set incompatible feature bits, as QEMU does when it finds corruption.
set_bits() {
	python3 - "$1" "$2" <<'PY'
import struct, sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(72)
    inc = struct.unpack('>Q', f.read(8))[0] | int(sys.argv[2])
    f.seek(72)
    f.write(struct.pack('>Q', inc))
PY
}

# set_rc IMAGE HOST VALUE: the 16-bit refcount of the cluster at host offset HOST.
set_rc() {
	python3 - "$1" "$2" "$3" <<'PY'
import struct, sys
path, host, val = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, 'r+b') as f:
    h = f.read(104)
    cbits = struct.unpack('>I', h[20:24])[0]
    assert struct.unpack('>I', h[96:100])[0] == 4, '16-bit refcounts only'
    rct = struct.unpack('>Q', h[48:56])[0]
    per = (1 << cbits) // 2
    cl = host >> cbits
    f.seek(rct + 8 * (cl // per))
    rb = struct.unpack('>Q', f.read(8))[0]
    f.seek(rb + 2 * (cl % per))
    f.write(struct.pack('>H', val))
PY
}

# host_of IMAGE GUEST: the host offset qemu-img map gives for a guest offset.
host_of() {
	qemu-img map --output=json "$1" | python3 -c '
import json, sys
off = int(sys.argv[1])
for e in json.load(sys.stdin):
    if e["start"] <= off < e["start"] + e["length"] and "offset" in e:
        print(e["offset"] + off - e["start"])
        break' "$2"
}

# want_bits IMAGE WANT: the header's dirty/corrupt bits are WANT.
want_bits() {
	local got
	got=$(bits "$1")
	[ "$got" = "$2" ] || fail "$1: dirty/corrupt bits $got, expected $2"
}

# check_like_qemu IMAGE: `img check` (no -r) prints what qemu-img check prints on stdout,
# exits the same, and leaves the image untouched.
check_like_qemu() {
	local f=$1 rc=0 sum
	sum=$(sha256sum <"$f")
	qemu-img check "$f" >q.out 2>/dev/null || rc=$?
	[ $rc -ne 0 ] || fail "qemu-img check $f finds nothing (test bug)"
	img_status $rc check "$f"
	diff -u q.out "$OUT" || fail "check $f: output differs from qemu-img's"
	[ "$(sha256sum <"$f")" = "$sum" ] || fail "check without -r changed $f"
}

# repair_like_qemu IMAGE MODE: `img check -r MODE` exits as qemu-img check -r MODE does
# on a copy, and leaves the dirty/corrupt bits as it does.
repair_like_qemu() {
	local f=$1 mode=$2 rc=0
	cp "$f" q.qcow2
	qemu-img check -r "$mode" q.qcow2 >/dev/null 2>&1 || rc=$?
	img_status $rc check -r "$mode" "$f"
	want_bits "$f" "$(bits q.qcow2)"
	rm -f q.qcow2
}

# The undamaged image: data, zero clusters, unallocated space; 4 KiB clusters.
qemu-img create -q -f qcow2 -o cluster_size=4k base.qcow2 1M
qemu-io -c 'write -P 0x11 0 64k' -c 'write -P 0x22 200k 12k' -c 'write -z 16k 8k' \
	base.qcow2 >/dev/null
cp base.qcow2 ref.qcow2
qcheck base.qcow2

echo "== leaked cluster, marked corrupt"
cp base.qcow2 leak.qcow2
truncate -s $(($(stat -c %s leak.qcow2) + 8192)) leak.qcow2
set_rc leak.qcow2 $(($(stat -c %s leak.qcow2) - 4096)) 1
set_bits leak.qcow2 $CORRUPT
check_like_qemu leak.qcow2
img_status 3 check --output=json leak.qcow2
expect_grep "$OUT" '"leaks": 1'
cp leak.qcow2 leak2.qcow2
repair_like_qemu leak.qcow2 leaks
expect_line "$OUT" "    1 leaked clusters"
expect_line "$OUT" "No errors were found on the image."
want_bits leak.qcow2 0
qcheck leak.qcow2
qsame ref.qcow2 leak.qcow2
img info leak.qcow2
expect_line "$OUT" "    corrupt: false"
repair_like_qemu leak2.qcow2 all
want_bits leak2.qcow2 0
qcheck leak2.qcow2
qsame ref.qcow2 leak2.qcow2

echo "== refcount too high (leak and a wrong COPIED flag), marked corrupt"
cp base.qcow2 hi.qcow2
set_rc hi.qcow2 "$(host_of base.qcow2 8192)" 2
set_bits hi.qcow2 $CORRUPT
check_like_qemu hi.qcow2
repair_like_qemu hi.qcow2 leaks
want_bits hi.qcow2 0
qcheck hi.qcow2
qsame ref.qcow2 hi.qcow2

echo "== lost refcount of a data cluster, marked corrupt"
cp base.qcow2 bad.qcow2
set_rc bad.qcow2 "$(host_of base.qcow2 4096)" 0
set_bits bad.qcow2 $CORRUPT
check_like_qemu bad.qcow2
cp bad.qcow2 bad2.qcow2
# -r leaks cannot fix it: as qemu-img, the check fails (exit 1: the refcount structures
# would have to be rebuilt) and the image stays marked corrupt.
img_status 1 check -r leaks bad.qcow2
expect_line "$ERR" "ERROR need to rebuild refcount structures"
want_bits bad.qcow2 $CORRUPT
run_status 1 "$IOPLANE" serve --image d,file=bad.qcow2,format=qcow2 \
	--nbd unix="$sock",image=d,writable=on
expect_grep "$ERR" "marked corrupt"
img check -r all bad.qcow2
expect_grep "$OUT" "^    [1-9][0-9]* corruptions$"
expect_line "$OUT" "No errors were found on the image."
want_bits bad.qcow2 0
qcheck bad.qcow2
qsame ref.qcow2 bad.qcow2
repair_like_qemu bad2.qcow2 all
qsame ref.qcow2 bad2.qcow2

echo "== corrupt bit alone"
cp base.qcow2 bit.qcow2
set_bits bit.qcow2 $CORRUPT
img check bit.qcow2 # read-only: nothing wrong to report
expect_line "$OUT" "No errors were found on the image."
want_bits bit.qcow2 $CORRUPT
repair_like_qemu bit.qcow2 leaks
expect_line "$OUT" "No errors were found on the image."
want_bits bit.qcow2 0
qsame ref.qcow2 bit.qcow2

echo "== serve refuses a writable corrupt image, serves it read-only"
cp base.qcow2 sc.qcow2
set_bits sc.qcow2 $CORRUPT
sum=$(sha256sum <sc.qcow2)
run_status 1 "$IOPLANE" serve --image d,file=sc.qcow2,format=qcow2 \
	--nbd unix="$sock",image=d,writable=on
expect_grep "$ERR" "--image d: qcow2: image is marked corrupt; it can only be opened read-only"
run_status 1 "$IOPLANE" serve --image d,file=sc.qcow2,format=qcow2,repair=on \
	--nbd unix="$sock",image=d,writable=on
expect_grep "$ERR" "repair=on is reserved for 'ioplane img check -r'"
nbd_serve --image d,file=sc.qcow2,format=qcow2,read-only=on --nbd unix="$sock",image=d
qemu-img compare -q -f qcow2 -F raw ref.qcow2 "$(nbd_uri d "$sock")" ||
	fail "read-only export of the corrupt image differs"
nbd_stop
[ "$(sha256sum <sc.qcow2)" = "$sum" ] || fail "serve changed the corrupt image"

echo "== dirty image (lazy refcounts, crashed)"
# make_dirty IMAGE: data written with lazy refcounts, then qemu-io aborts.
make_dirty() {
	qemu-img create -q -f qcow2 -o cluster_size=4k,lazy_refcounts=on "$1" 1M
	(ulimit -c 0; qemu-io -f qcow2 -c 'write -P 0x81 0 8k' -c 'write -P 0x82 100k 4k' \
		-c abort "$1" >/dev/null 2>&1) 2>/dev/null || true
	want_bits "$1" $DIRTY
}
make_dirty dirty.qcow2
qemu_raw dirty.qcow2 dirty.raw # what the guest wrote (qemu-img reads it read-only)
qemu-io -f raw -c 'read -P 0x81 0 8k' -c 'read -P 0x82 100k 4k' dirty.raw | grep -q '^read 4096' ||
	fail "the crashed writes are not in the image (test bug)"
check_like_qemu dirty.qcow2
cp dirty.qcow2 dirty2.qcow2
repair_like_qemu dirty.qcow2 all
expect_grep "$OUT" "^    [1-9][0-9]* corruptions$"
want_bits dirty.qcow2 0
qcheck dirty.qcow2
qemu-img compare -q -f raw -F qcow2 dirty.raw dirty.qcow2 || fail "data lost by the repair"
# -r leaks cannot fix refcounts that are 0: as qemu-img, the check fails (exit 1) and
# the dirty bit stays.
cp dirty2.qcow2 dirty2q.qcow2
img_status 1 check -r leaks dirty2.qcow2
expect_line "$ERR" "ERROR need to rebuild refcount structures"
want_bits dirty2.qcow2 $DIRTY
cmp dirty2.qcow2 dirty2q.qcow2 || fail "check -r leaks changed an image it could not repair"
rc=0; qemu-img check -r leaks dirty2q.qcow2 >/dev/null 2>&1 || rc=$?
[ $rc = 1 ] || fail "qemu-img check -r leaks exits $rc here, not 1 (test bug)"

echo "== dirty image opened read-write: repaired at open"
make_dirty dirty3.qcow2
cp dirty3.qcow2 dirty3q.qcow2
nbd_serve --image d,file=dirty3.qcow2,format=qcow2 --nbd unix="$sock",image=d,writable=on
expect_grep "$NBD_LOG" "not closed cleanly.*repairing refcounts"
want_bits dirty3.qcow2 0 # before any write: repaired and marked clean
qemu-img check -U dirty3.qcow2 >/dev/null 2>&1 || fail "dirty image not repaired at open"
nbd_qemu_io "$(nbd_uri d "$sock")" 'write -P 0x83 200k 12k' >/dev/null
nbd_stop
want_bits dirty3.qcow2 0
qcheck dirty3.qcow2
qemu-io -f qcow2 -c 'write -P 0x83 200k 12k' dirty3q.qcow2 >/dev/null 2>&1 # QEMU repairs too
qsame dirty3q.qcow2 dirty3.qcow2

echo "== persistent bitmaps: their clusters are in use, not leaks"
qemu-img create -q -f qcow2 -o cluster_size=4k bm.qcow2 1M
qemu-img bitmap --add bm.qcow2 b0
qemu-img bitmap --add -g 128k --disable bm.qcow2 b1
qemu-io -f qcow2 -c 'write -P 0x42 0 64k' -c 'write -P 0x43 512k 8k' bm.qcow2 >/dev/null
qcheck bm.qcow2
cp bm.qcow2 bm.before
img check bm.qcow2
expect_line "$OUT" "No errors were found on the image."
for r in leaks all; do
	img check -r "$r" bm.qcow2
	cmp -s bm.qcow2 bm.before || fail "check -r $r changed an image with bitmaps"
done
qcheck bm.qcow2
[ "$(qemu-img info --output=json bm.qcow2 | grep -c '"granularity"')" = 2 ] ||
	fail "the bitmaps are gone"

echo "== a backing file that does not open: no check, no repair (exit 1, as qemu-img)"
qemu-img create -q -f qcow2 gone.qcow2 1M
qemu-img create -q -f qcow2 -b gone.qcow2 -F qcow2 orphan.qcow2
rm gone.qcow2
cp orphan.qcow2 orphan.before
for r in "" "-r leaks" "-r all"; do
	rc=0
	qemu-img check $r orphan.qcow2 >/dev/null 2>&1 || rc=$?
	[ $rc = 1 ] || fail "qemu-img check $r: exit $rc, the test expects 1"
	# shellcheck disable=SC2086
	img_status 1 check $r orphan.qcow2
	expect_grep "$ERR" "^ioplane img: Could not open 'orphan\.qcow2': .*gone\.qcow2.*No such file"
	cmp -s orphan.qcow2 orphan.before || fail "check $r changed an image it did not check"
done
echo "repair: agrees with qemu-img"
