#!/bin/bash
# Guest data never lands on qcow2 metadata. Images from _qcow2craft.py (group overlap)
# have an L2 entry whose data cluster is an L2 table, a refcount block (also as a zero
# cluster that kept its host cluster), the L1 table or a snapshot's L1 table, or an L1
# entry whose L2 table is a refcount block. The same NBD client (qemu-io) writes into
# that cluster through `ioplane serve` and through qemu-storage-daemon: both fail the
# write, refuse the writes after it, and mark the image corrupt (qemu: "Preventing
# invalid write on metadata"); ioplane logs the offset and the kind of metadata, changes
# nothing else in the file, and still serves reads of the intact clusters.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/img-lib.sh"

nbd_need_ioplane
[ -z "$NBD_TEST_PEER" ] || skip "NBD_TEST_PEER: this test runs both servers itself"
need qemu-storage-daemon

CRAFT=$IMG_LIB_DIR/_qcow2craft.py
sock=$T/nbd.sock
uri=$(nbd_uri d "$sock")

# name|guest offset written|what ioplane's log says|what qemu says
cases=(
	"data-on-l2|0|has data at 0x[0-9a-f]+ that overlaps the L2 table at 0x[0-9a-f]+ \(L1 entry 0\)|active L2 table"
	"data-on-rb|0|has data at 0x[0-9a-f]+ that overlaps the refcount block at 0x[0-9a-f]+ \(refcount table entry 0\)|refcount block"
	"data-on-l1|0|has data at 0x[0-9a-f]+ that overlaps the L1 table at 0x[0-9a-f]+|active L1 table"
	"zero-on-rb|0|has data at 0x[0-9a-f]+ that overlaps the refcount block at 0x[0-9a-f]+ \(refcount table entry 0\)|refcount block"
	"l2-on-rb|12k|refcount block offset 0x[0-9a-f]+ .* overlaps the L2 table at 0x[0-9a-f]+ \(L1 entry 0\)|active L2 table"
	"data-on-snapshot-l1|0|overlaps the L1 table of snapshot 1 at 0x[0-9a-f]+|inactive L1 table"
)

# corrupt_bit FILE: 1 if the header's corrupt bit is set.
corrupt_bit() {
	python3 -c 'import sys; d = open(sys.argv[1], "rb").read(80); print(d[79] >> 1 & 1)' "$1"
}

# same_but_features A B: B is A with at most the incompatible feature bits changed.
same_but_features() {
	python3 - "$1" "$2" <<-'EOF' || fail "$2 changed outside the feature bits"
	import sys
	a, b = (open(p, 'rb').read() for p in sys.argv[1:])
	b = b[:len(a)] if len(b) >= len(a) and not b[len(a):].strip(b'\0') else b
	sys.exit(0 if len(a) == len(b) and a[:72] + a[80:] == b[:72] + b[80:] else 1)
	EOF
}

[ "$(python3 "$CRAFT" list overlap | wc -l)" -eq ${#cases[@]} ] ||
	fail "a case of _qcow2craft.py is not tested"
for c in "${cases[@]}"; do
	IFS='|' read -r name off io_says qemu_says <<<"$c"
	echo "== $name"
	python3 "$CRAFT" "$name" orig.qcow2
	cp orig.qcow2 io.qcow2
	cp orig.qcow2 qsd.qcow2

	nbd_serve --image d,file=io.qcow2,format=qcow2 --nbd unix="$sock",image=d,writable=on
	nbd_qemu_io_fails "$uri" "write -P 0x77 $off 4k" >/dev/null
	nbd_qemu_io_fails "$uri" "write -P 0x78 4k 4k" >/dev/null
	[ "$name" = l2-on-rb ] || nbd_qemu_io "$uri" "read -P 0x5a 4k 4k" >/dev/null
	nbd_stop
	expect_grep "$NBD_LOG" "qcow2: image is corrupt: .*$io_says; marked corrupt"
	[ "$(corrupt_bit io.qcow2)" = 1 ] || fail "$name: ioplane did not mark the image corrupt"
	same_but_features orig.qcow2 io.qcow2

	log=$T/qsd-$name.log
	rm -f "$sock"
	qemu-storage-daemon --blockdev driver=file,node-name=f,filename=qsd.qcow2 \
		--blockdev driver=qcow2,node-name=q,file=f \
		--nbd-server addr.type=unix,addr.path="$sock" \
		--export nbd,id=e,node-name=q,name=d,writable=on >"$log" 2>&1 &
	qpid=$!
	nbd_pids+=("$qpid")
	for ((i = 0; i < 100; i++)); do
		[ -S "$sock" ] && break
		sleep 0.1
	done
	nbd_qemu_io_fails "$uri" "write -P 0x77 $off 4k" >/dev/null
	nbd_qemu_io_fails "$uri" "write -P 0x78 4k 4k" >/dev/null
	nbd_stop "$qpid"
	expect_grep "$log" "Preventing invalid write on metadata \(overlaps with $qemu_says\)"
	[ "$(corrupt_bit qsd.qcow2)" = 1 ] || fail "$name: qemu did not mark the image corrupt"
done
echo "${#cases[@]} writes onto metadata refused, as by qemu-storage-daemon"
