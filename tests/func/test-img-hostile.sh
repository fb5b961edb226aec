#!/bin/bash
# Hostile qcow2 headers (tests/func/_qcow2craft.py): offsets and lengths taken from the
# image that wrap past 2^64, point outside the header cluster or the file, or claim more
# than the file holds - backing file name, header length and extensions, the feature name
# table, bitmaps and crypto extensions, external data file name, L1 and refcount tables,
# snapshot table entries and their L1 tables. Every `ioplane img` command and `ioplane
# serve` refuse each image with a clear message naming the field (exit 1; compare 2, serve
# 2), nothing crashes (in the sanitizer build: no report), and qemu-img refuses or opens the
# same image. The images are also kept as fuzz crashers (tests/fuzz/crashers-qcow2/hdr-*,
# written by `_qcow2craft.py NAME OUT`).
. "$(dirname "$0")/img-lib.sh"

CRAFT=$IMG_LIB_DIR/_qcow2craft.py
sock=$T/s.sock

# name|what the error must say
cases=(
	"backing-offset-wrap|backing file name at 0xffffffffffffff9c is outside the header cluster"
	"backing-offset-past-cluster|backing file name at 0x1008 is outside the header cluster"
	"header-ext-length-wrap|header extension 0x12345678 \(length 4294967288\) runs past"
	"header-length-huge|invalid header length 4294967288"
	"l1-offset-wrap|L1 table at 0xffffffffffffe000 .* is outside the file"
	"l1-size-huge|L1 table too large"
	"rct-offset-wrap|refcount table at 0xfffffffffffff000 .* is outside the file"
	"rct-clusters-huge|refcount table too large"
	"bitmaps-dir-wrap|bitmap directory at 0xfffffffffffff000 .* is outside the file"
	"bitmaps-dir-huge|bitmap directory too large"
	"bitmaps-dir-past-eof|bitmap directory at 0x2000 \(1048576 bytes\) is outside the file"
	"bitmaps-count-huge|bitmaps extension with 4294967295 bitmaps"
	"bitmaps-ext-short|bad bitmaps header extension \(length 16\)"
	"snapshot-count-huge|snapshot table \(65536 entries at 0x[0-9a-f]+\) runs past the end"
	"snapshot-extra-huge|snapshot has bad extra data size 4294967295"
	"snapshot-names-past-eof|snapshot table \(1 entries at 0x[0-9a-f]+\) runs past the end"
	"snapshot-l1-wrap|the L1 table of snapshot '1' \(0xfffffffffffff000, 1024 entries\) is outside"
	"snapshot-l1-huge|the L1 table of snapshot '1' .* is too large"
	"data-file-name-long|data file name header extension has bad length 2000"
	"crypto-ext|encrypted images are not supported"
	"feature-table-huge|header extension 0x6803f857 \(length 4294967040\) runs past"
)

[ "$(python3 "$CRAFT" list header | wc -l)" -eq ${#cases[@]} ] || fail "a case of _qcow2craft.py is not tested"
for c in "${cases[@]}"; do
	name=${c%%|*}
	want=${c#*|}
	echo "== $name"
	f=$name.qcow2
	python3 "$CRAFT" "$name" "$f"
	for cmd in info check "check --output=json" map "map --output=json"; do
		# shellcheck disable=SC2086
		img_status 1 $cmd "$f"
		expect_grep "$ERR" "Could not open '$f': qcow2: $want"
	done
	img_status 1 convert -O raw "$f" out.raw
	expect_grep "$ERR" "$want"
	img_status 2 compare -f qcow2 -F qcow2 "$f" "$f"
	expect_grep "$ERR" "$want"
	run_status 1 "$IOPLANE" serve --image "d,file=$f,format=qcow2" --nbd "unix=$sock,image=d"
	expect_grep "$ERR" "$want"
	# qemu-img either refuses the image too or opens it; it never crashes.
	rc=0
	qemu-img info "$f" >/dev/null 2>&1 || rc=$?
	[ $rc -le 1 ] || fail "qemu-img info $f: exit $rc"
done
echo "${#cases[@]} hostile headers refused by every command"
