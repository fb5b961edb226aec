#!/bin/bash
# Makes the small fixed images of the `ioplane img` golden-output tests with qemu-img and
# qemu-io, and records qemu-img's output for every case of cases.sh as the expected output
# (expected/NAME.out: stdout, then "[exit N]", with file-system dependent sizes normalised).
#
# The images and .out files are committed: run this only to change the set. Without
# arguments it rewrites every image (so snapshot dates and the like change); with
# --missing it makes only the images of EXTRA_IMAGES that are not there yet. Either way it
# records every expected output again, from sparse copies of the images (see cases.sh).
# Outputs named in KNOWN-DIFFERENCES are where ioplane deliberately or knowingly prints
# something else than qemu-img; they are not regenerated (review and update them by hand;
# the reason is given there).
#
# Usage: tests/golden/make-images.sh [--missing]
#        (needs qemu-img, qemu-io, python3, fallocate; TZ is forced to UTC)
set -euo pipefail

cd "$(dirname "$0")"
export TZ=UTC
. ./cases.sh

q() { qemu-img create -q -f qcow2 "$@"; }
io() { local f=$1; shift; qemu-io -f qcow2 "$@" "$f" >/dev/null; }

# set_refcount FILE HOST_OFFSET VALUE [INCOMPAT_BITS_TO_SET]: edit a refcount (any width
# from 8 to 64 bits) and optionally set incompatible feature bits, as a crash or a bug would.
set_refcount() {
	python3 - "$@" <<'PY'
import struct, sys
path, host, value = sys.argv[1], int(sys.argv[2], 0), int(sys.argv[3], 0)
bits = int(sys.argv[4], 0) if len(sys.argv) > 4 else 0
with open(path, 'r+b') as f:
    h = f.read(112)
    cbits = struct.unpack('>I', h[20:24])[0]
    rct = struct.unpack('>Q', h[48:56])[0]
    order = struct.unpack('>I', h[96:100])[0] if struct.unpack('>I', h[4:8])[0] >= 3 else 4
    width = 1 << order
    assert width >= 8, 'byte-sized refcounts only'
    per_block = (1 << cbits) * 8 // width
    cl = host >> cbits
    f.seek(rct + 8 * (cl // per_block))
    rb = struct.unpack('>Q', f.read(8))[0]
    f.seek(rb + (cl % per_block) * width // 8)
    f.write(value.to_bytes(width // 8, 'big'))
    if bits:
        f.seek(72)
        inc = struct.unpack('>Q', f.read(8))[0] | bits
        f.seek(72)
        f.write(struct.pack('>Q', inc))
PY
}

# host_offset IMAGE GUEST_OFFSET: where qemu-img map says the guest offset lives.
host_offset() {
	qemu-img map --output=json "$1" | python3 -c '
import json, sys
off = int(sys.argv[1])
for e in json.load(sys.stdin):
    if e["start"] <= off < e["start"] + e["length"] and "offset" in e:
        print(e["offset"] + off - e["start"]); break
' "$2"
}

make_images() {
	rm -f ./*.qcow2 ./*.raw

	q -o cluster_size=4k empty.qcow2 1M

	q data.qcow2 2M
	io data.qcow2 -c 'write -P 0x11 0 64k' -c 'write -P 0x22 192k 100k' \
		-c 'write -z 512k 64k' -c 'write -P 0x33 1M 64k' -c 'write -z 1M 64k' \
		-c 'write -P 0x44 1536k 64k' -c 'discard 1536k 64k'

	q -o compat=0.10,cluster_size=4k v2.qcow2 1M
	io v2.qcow2 -c 'write -P 0x12 0 12k' -c 'write -P 0x13 100k 3k' -c 'write -z 4k 4k'

	q -o extended_l2=on,cluster_size=32k extl2.qcow2 1M
	io extl2.qcow2 -c 'write -P 1 0 4k' -c 'write -z 8k 4k' -c 'write -P 2 40k 1k' \
		-c 'write -P 3 64k 32k' -c 'write -z 72k 2k'

	q -o cluster_size=4k snap.qcow2 1M
	io snap.qcow2 -c 'write -P 0x21 0 8k'
	qemu-img snapshot -c snap1 snap.qcow2
	io snap.qcow2 -c 'write -P 0x22 4k 8k'
	qemu-img snapshot -c 'second snapshot' snap.qcow2
	io snap.qcow2 -c 'discard 0 4k'

	q -o cluster_size=4k base.qcow2 1M
	io base.qcow2 -c 'write -P 0x31 0 64k' -c 'write -P 0x32 512k 16k'
	q -o cluster_size=4k -b base.qcow2 -F qcow2 mid.qcow2
	io mid.qcow2 -c 'write -P 0x41 16k 8k' -c 'write -z 512k 4k'
	q -o cluster_size=8k -b mid.qcow2 -F qcow2 top.qcow2
	io top.qcow2 -c 'write -P 0x51 8k 8k' -c 'write -z 32k 8k' -c 'write -P 0x52 1000k 8k'

	truncate -s 64k rawbase.raw
	q -b rawbase.raw -F raw ovl-raw.qcow2 128k

	q -o cluster_size=4k compressed.qcow2 256k
	io compressed.qcow2 -c 'write -c -P 0x61 0 4k' -c 'write -c -P 0x62 8k 8k' \
		-c 'write -P 0x63 64k 4k'
	q -o cluster_size=4k,compression_type=zstd zstd.qcow2 256k
	io zstd.qcow2 -c 'write -c -P 0x64 4k 4k' -c 'write -P 0x65 16k 4k'

	q -o cluster_size=4k,refcount_bits=1 rc1.qcow2 1M
	io rc1.qcow2 -c 'write -P 0x71 0 8k' -c 'write -P 0x72 200k 4k'
	q -o cluster_size=4k,refcount_bits=64 rc64.qcow2 1M
	io rc64.qcow2 -c 'write -P 0x73 0 8k' -c 'write -P 0x74 300k 4k'

	q -o cluster_size=512 c512.qcow2 256k
	io c512.qcow2 -c 'write -P 0x75 0 1536' -c 'write -P 0x76 100000 3000'

	# Left dirty by a crash: lazy refcounts not written back.
	q -o cluster_size=4k,lazy_refcounts=on dirty.qcow2 1M
	(ulimit -c 0; qemu-io -f qcow2 -c 'write -P 0x81 0 8k' -c abort dirty.qcow2 \
		>/dev/null 2>&1) || true

	# Two leaked clusters inside the file: freed by discard, refcount put back.
	q -o cluster_size=4k leaks.qcow2 1M
	io leaks.qcow2 -c 'write -P 0x91 0 16k'
	local h1 h2
	h1=$(host_offset leaks.qcow2 4096)
	h2=$(host_offset leaks.qcow2 8192)
	io leaks.qcow2 -c 'discard 4k 8k'
	set_refcount leaks.qcow2 "$h1" 1
	set_refcount leaks.qcow2 "$h2" 1

	# A data cluster whose refcount was lost, and the corrupt bit set.
	q -o cluster_size=4k corrupt.qcow2 1M
	io corrupt.qcow2 -c 'write -P 0xa1 0 8k'
	set_refcount corrupt.qcow2 "$(host_offset corrupt.qcow2 4096)" 0 2

	q -o cluster_size=4k,data_file=extdata.raw extdata.qcow2 256k
	io extdata.qcow2 -c 'write -P 0xb1 4k 8k'

	truncate -s 64k blank.raw
	for n in $EXTRA_IMAGES; do
		"img_$n"
	done
}

# Images added later, each by its img_NAME (NAME.qcow2 is the image --missing looks for).
EXTRA_IMAGES="prealloc utf8 ovl-odd nobacking bitmaps bminuse frag"

# A backing file name (never opened: -u) of every kind of byte qemu-img's JSON escapes:
# controls, quotes, valid UTF-8 of 2, 3 and 4 bytes, and invalid sequences (overlong,
# surrogates, noncharacters, past U+10FFFF, 5 and 6 bytes, cut short, stray bytes).
img_utf8() {
	local n
	n=$(printf 'a/b\b\f\r\t\n"\\\x1f\x7f\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbf\xbd')
	n+=$(printf '\xc0\x80\xc0\xaf\xc1\xbf\xe0\x80\x80\xed\xa0\x80\xed\xbf\xbf\xef\xb7\x90')
	n+=$(printf '\xef\xbf\xbe\xf4\x90\x80\x80\xf8\x88\x80\x80\x80\xfc\x84\x80\x80\x80\x80')
	n+=$(printf '\xe2\x82(\xc3(\xff\xfe\x80.qcow2')
	q -u -b "$n" -F qcow2 utf8.qcow2 64k
}

# A raw backing file of 1000 bytes, not whole sectors: qemu-img sizes it to 1024, the
# rest reading as zeroes.
img_ovl-odd() {
	python3 -c 'import sys; sys.stdout.buffer.write(bytes([0x5a]) * 1000)' >odd.raw
	q -b odd.raw -F raw ovl-odd.qcow2 64k
}

# Persistent bitmaps (qemu-img bitmap): one enabled, one disabled of another granularity
# and a space in its name; the enabled one records a write, so it has a data cluster.
img_bitmaps() {
	q -o cluster_size=4k bitmaps.qcow2 1M
	qemu-img bitmap --add bitmaps.qcow2 b0
	qemu-img bitmap --add -g 128k --disable bitmaps.qcow2 'second bitmap'
	io bitmaps.qcow2 -c 'write -P 0xd1 0 64k'
}

# Bitmaps left in use: the writer crashed before it saved them.
img_bminuse() {
	q -o cluster_size=4k bminuse.qcow2 1M
	qemu-img bitmap --add bminuse.qcow2 b0
	qemu-img bitmap --add --disable bminuse.qcow2 b1
	io bminuse.qcow2 -c 'write -P 0xd2 0 8k'
	(ulimit -c 0; qemu-io -f qcow2 -c 'write -P 0xd3 64k 8k' -c abort bminuse.qcow2 \
		>/dev/null 2>&1) || true
}

# Fragmentation over several L2 tables (4k clusters: 2 MiB each), after a snapshot made
# the rewritten clusters and their tables move.
img_frag() {
	q -o cluster_size=4k frag.qcow2 16M
	io frag.qcow2 -c 'write -P 1 0 8k' -c 'write -P 1 2M 8k' -c 'write -P 1 4M 8k' \
		-c 'write -P 1 6M 8k' -c 'write -P 1 8M 8k'
	qemu-img snapshot -c s1 frag.qcow2
	io frag.qcow2 -c 'write -P 2 4k 4k' -c 'write -P 2 2M 4k' -c 'write -P 3 4M 4k' \
		-c 'write -P 3 6M 4k'
}

# A backing file that is not there: info works, check and map do not.
img_nobacking() {
	q -u -b missing-base.qcow2 -F qcow2 nobacking.qcow2 64k
}

# preallocation=metadata: data clusters over holes (qemu-img map says they read as zero),
# and one written.
img_prealloc() {
	q -o cluster_size=4k,preallocation=metadata prealloc.qcow2 256k
	io prealloc.qcow2 -c 'write -P 0xc1 8k 4k'
}

# golden_case NAME ARGS...: record qemu-img's output for this case (in the sparse copies'
# directory, $work).
golden_case() {
	local name=$1 rc=0
	shift
	if grep -qx "$name" <(sed -e 's/[[:space:]]*#.*//' -e '/^$/d' KNOWN-DIFFERENCES); then
		return 0
	fi
	{
		(cd "$work" && qemu-img "$@" 2>/dev/null) || rc=$?
		echo "[exit $rc]"
	} | golden_normalise >"expected/$name.out"
}

# golden_case_err NAME ARGS...: the same with stderr after stdout.
golden_case_err() {
	local name=$1 rc=0
	shift
	if grep -qx "$name" <(sed -e 's/[[:space:]]*#.*//' -e '/^$/d' KNOWN-DIFFERENCES); then
		return 0
	fi
	{
		(cd "$work" && qemu-img "$@" 2>"$work/stderr") || rc=$?
		echo "[stderr]"
		cat "$work/stderr"
		echo "[exit $rc]"
	} | golden_normalise >"expected/$name.out"
}

if [ "${1:-}" = --missing ]; then
	for n in $EXTRA_IMAGES; do
		[ -e "$n.qcow2" ] || "img_$n"
	done
else
	make_images
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp ./*.qcow2 ./*.raw "$work/"
golden_sparsify "$work"/*.qcow2 "$work"/*.raw
mkdir -p expected
golden_cases
echo "made $(ls ./*.qcow2 ./*.raw | wc -l) images and $(ls expected | wc -l) expected outputs"
echo "now refresh the KNOWN-DIFFERENCES cases from ioplane and review them:"
echo "  GOLDEN_UPDATE=1 IOPLANE=build/ioplane tests/func/test-img-golden.sh; git diff tests/golden"
