#!/bin/bash
# `ioplane img bitmap` next to `qemu-img bitmap`: the same sequence of --add (with -g),
# --remove, --clear, --enable, --disable, --merge (in the image and from another with
# -b/-F) on two copies of an image gives the same output, messages and exit status at
# every step, and the same bitmaps in qemu-img info (names, flags, granularities); the
# bitmap data ioplane wrote is what QEMU reads (qemu-img bitmap --merge takes it into
# another image, whose dirty map qemu-storage-daemon exports), and qemu-img check
# accepts the image; img resize keeps the bitmaps loadable by QEMU.
. "$(dirname "$0")/img-lib.sh"

for t in q i; do
	qemu-img create -q -f qcow2 $t.qcow2 16M
done
qemu-img create -q -f qcow2 src.qcow2 16M
qemu-img bitmap --add src.qcow2 s0
qemu-io -f qcow2 -c 'write 1M 64k' -c 'write 9M 128k' src.qcow2 >/dev/null

steps=(
	"--add|b1" "--add|b1" "--add -g 4096|b2" "--add -g 1000|b3" "--add -g 64k --disable|b4"
	"--enable|b4" "--disable|b1" "--merge b2|b1" "--merge nope|b1" "--clear|b2"
	"--remove|b2" "--remove|b2" "|b1" "-g 4096 --remove|b1" "-F qcow2 --add|x"
	"--add -b src.qcow2|x" "--merge s0 -b src.qcow2 -F qcow2|b4" "--merge s0 -b src.qcow2|b1"
	"--add --remove|tmp"
)
for c in "${steps[@]}"; do
	args=${c%|*}
	name=${c#*|}
	rc=0
	# shellcheck disable=SC2086
	qemu-img bitmap $args q.qcow2 "$name" >q.out 2>&1 || rc=$?
	sed -i 's/^qemu-img: //' q.out
	echo "exit $rc" >>q.out
	rc=0
	# shellcheck disable=SC2086
	"$IOPLANE" img bitmap $args i.qcow2 "$name" >i.out 2>&1 || rc=$?
	sed -i "s/^ioplane img: //" i.out
	echo "exit $rc" >>i.out
	diff -u q.out i.out || fail "bitmap $c: qemu-img (-) and ioplane (+) differ"
done
for t in q i; do
	qemu-img info "$t.qcow2" | sed -n '/bitmaps:/,/refcount bits/p' >"$t.info"
done
diff -u q.info i.info || fail "the bitmaps differ in qemu-img info"
grep -q "name: b4" i.info || fail "no bitmap b4 in: $(cat i.info)"
qcheck i.qcow2

# The bits: what ioplane merged into b4 (and saved), qemu-img merges into a bitmap of
# another image, and QEMU exports that one as dirty.
need qemu-storage-daemon nbdinfo
qemu-img create -q -f qcow2 m.qcow2 16M
qemu-img bitmap --add m.qcow2 m
qemu-img bitmap --merge b4 -b i.qcow2 -F qcow2 m.qcow2 m
qemu-img bitmap --disable m.qcow2 m
qemu-storage-daemon --blockdev driver=file,filename=m.qcow2,node-name=f,read-only=on \
	--blockdev driver=qcow2,file=f,node-name=q,read-only=on \
	--nbd-server "addr.type=unix,addr.path=$T/qsd.sock" \
	--export type=nbd,id=e,node-name=q,name=d,bitmaps.0=m </dev/null >qsd.log 2>&1 &
pid=$!
at_exit "kill $pid 2>/dev/null"
for ((n = 0; n < 200; n++)); do
	[ -S "$T/qsd.sock" ] && break
	sleep 0.05
done
nbdinfo --map=qemu:dirty-bitmap:m "nbd+unix:///d?socket=$T/qsd.sock" >map.out ||
	fail "nbdinfo: $(cat qsd.log)"
kill $pid
cat >map.want <<'EOF'
         0     1048576    0  clean
   1048576       65536    1  dirty
   1114112     8323072    0  clean
   9437184      131072    1  dirty
   9568256     7208960    0  clean
EOF
diff -u map.want map.out || fail "the dirty map of b4, merged by qemu-img, as QEMU reads it"

# img resize grows the bitmaps with the disk: QEMU loads them (a bitmap too small for
# the disk breaks its constraints) and marks a write past the old end.
cp src.qcow2 r.qcow2
img resize r.qcow2 48M
qemu-io -f qcow2 -c 'write 40M 64k' r.qcow2 >/dev/null || fail "qemu-io cannot open the resized image"
qcheck r.qcow2
qemu-img info --output=json r.qcow2 | grep -q '"name": "s0"' || fail "bitmap s0 lost by resize"
qemu-img info r.qcow2 | grep -q in-use && fail "a bitmap left in use after resize"
echo "img bitmap: ${#steps[@]} steps as qemu-img; the merged bits read back by QEMU"
