#!/bin/bash
# qcow2 persistent bitmaps (the bitmaps extension) in `ioplane img`, next to qemu-img:
# info lists them as qemu-img does (human and JSON); a bitmap directory whose entries
# break the rules QEMU loads them by (a flag, type or granularity out of range, a table
# of zero entries, a name too long, extra data, fewer or more entries than the header
# says) is refused by info and check (exit 1, a message naming the bitmaps), as qemu-img
# refuses it, and nothing crashes; check counts the bitmaps' clusters (no leak).
. "$(dirname "$0")/img-lib.sh"

qemu-img create -q -f qcow2 -o cluster_size=4k bm.qcow2 1M
qemu-img bitmap --add bm.qcow2 first
qemu-img bitmap --add -g 64k --disable bm.qcow2 'a second one'
qemu-io -f qcow2 -c 'write -P 0x61 0 128k' bm.qcow2 >/dev/null

for out in human json; do
	img info --output=$out bm.qcow2
	diff -u <(qemu-img info --output=$out bm.qcow2 | grep -v -e '^disk size' -e actual-size) \
		<(grep -v -e '^disk size' -e actual-size "$OUT") || fail "info --output=$out differs"
done
img check bm.qcow2
expect_line "$OUT" "No errors were found on the image."

# patch FILE ENTRY_OFFSET FORMAT VALUE: overwrite a field of the first directory entry
# (struct format at that offset of the entry), or with ENTRY_OFFSET "count" the header's
# bitmap count.
patch() {
	python3 - "$@" <<'PY'
import struct, sys
path, where, fmt, value = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4], 0)
with open(path, 'r+b') as f:
    d = bytearray(f.read())
    hlen = struct.unpack_from('>I', d, 100)[0]
    pos = hlen
    while True:
        typ, ln = struct.unpack_from('>II', d, pos)
        if typ == 0x23852875:
            break
        assert typ != 0, 'no bitmaps extension'
        pos += 8 + (ln + 7) // 8 * 8
    if where == 'count':
        struct.pack_into('>I', d, pos + 8, value)
    else:
        dir_off = struct.unpack_from('>Q', d, pos + 8 + 16)[0]
        struct.pack_into(fmt, d, dir_off + int(where), value)
    f.seek(0)
    f.write(d)
PY
}

# name|entry offset|struct format|value
cases=(
	"reserved-flag|12|>I|4"
	"type|16|>B|2"
	"granularity-small|17|>B|8"
	"granularity-large|17|>B|32"
	"table-empty|8|>I|0"
	"table-unaligned|0|>Q|0x1200"
	"name-long|18|>H|2000"
	"extra-data|20|>I|8"
	"count-more|count||3"
	"count-fewer|count||1"
)
for c in "${cases[@]}"; do
	IFS='|' read -r name where fmt value <<<"$c"
	cp bm.qcow2 "$name.qcow2"
	patch "$name.qcow2" "$where" "$fmt" "$value"
	rc=0
	qemu-img info "$name.qcow2" >/dev/null 2>&1 || rc=$?
	[ $rc = 1 ] || fail "$name: qemu-img info exit $rc, the case expects it to refuse"
	img_status 1 info "$name.qcow2"
	expect_grep "$ERR" "bitmap"
	img_status 1 info --output=json "$name.qcow2"
	[ ! -s "$OUT" ] || fail "$name: info printed a partial description"
	img_status 1 check "$name.qcow2"
	expect_grep "$ERR" "bitmap"
done
echo "bitmaps: info and check agree with qemu-img; ${#cases[@]} bad directories refused"
