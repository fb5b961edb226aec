#!/bin/bash
# Writes the seed corpus of the qcow2 fuzz target (tests/fuzz/corpus-qcow2/): small
# images made by qemu-img/qemu-io covering versions 2 and 3, cluster sizes 512 B to
# 64 KiB, every refcount width (one image with a full refcount table), extended L2
# entries, lazy refcounts (a dirty image),
# zlib and zstd compressed clusters, zero clusters, discards, internal snapshots (with a
# script that creates, applies and deletes snapshots between writes, on good and on
# malformed snapshot tables), a backing file name, bitmaps (several granularities, disabled, in use, an all-ones
# table entry), an external data file and metadata preallocation.
# Trailing zero bytes of the last cluster are cut (readers pad a short file with zeroes;
# checked with qemu-img compare), so each file stays below 300 KiB.
#
#     bash tests/fuzz/gen-qcow2-corpus.sh [DIR]   (default: corpus-qcow2/ next to it)
set -euo pipefail

out=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/corpus-qcow2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"

img() { # NAME SIZE OPTIONS
	qemu-img create -q -f qcow2 -o "$3" "$tmp/$1.qcow2" "$2"
}

io() { # NAME qemu-io commands...
	local name=$1 args=()
	shift
	for c in "$@"; do args+=(-c "$c"); done
	qemu-io -f qcow2 "${args[@]}" "$tmp/$name.qcow2" >/dev/null
}

# Cut trailing zero bytes down to the last cluster; the result must read the same.
finish() { # NAME
	local f=$tmp/$1.qcow2
	python3 - "$f" "$tmp/$1.cut" <<-'EOF'
	import struct, sys
	data = open(sys.argv[1], 'rb').read()
	cs = 1 << struct.unpack('>I', data[20:24])[0]
	# Keep a byte of the last cluster: every table stays inside the file.
	keep = max(len(data.rstrip(b'\0')), (len(data) - 1) // cs * cs + 1)
	open(sys.argv[2], 'wb').write(data[:keep])
	EOF
	qemu-img compare -q -f qcow2 -F qcow2 "$f" "$tmp/$1.cut"
	size=$(stat -c %s "$tmp/$1.cut")
	[ "$size" -lt 307200 ] || { echo "$1: $size bytes, too big" >&2; exit 1; }
	cp "$tmp/$1.cut" "$out/$1.qcow2"
}

# Version 2, 512-byte clusters, data over several L2 tables.
img v2-c512 256K compat=0.10,cluster_size=512
io v2-c512 'write -P 0x11 0 1k' 'write -P 0x22 40k 1536' 'write -P 0x33 200k 512'
finish v2-c512

# Version 2 with 64 KiB clusters: empty.
img v2-c64k 1M compat=0.10
finish v2-c64k

# Version 3, 64 KiB clusters: empty, and with zero clusters only.
img v3-c64k 4M compat=1.1
finish v3-c64k
img v3-c64k-zero 4M compat=1.1
io v3-c64k-zero 'write -z 0 64k' 'write -z 1M 128k'
finish v3-c64k-zero

# Refcount widths.
img v3-c512-rc1 128K refcount_bits=1,cluster_size=512
io v3-c512-rc1 'write -P 0xa1 0 2k' 'write -P 0xa2 60k 512' 'discard 1k 512'
finish v3-c512-rc1
img v3-c512-rc64 128K refcount_bits=64,cluster_size=512
io v3-c512-rc64 'write -P 0xb1 512 1k' 'write -z 4k 1k' 'write -P 0xb2 100k 3k'
finish v3-c512-rc64
for bits in 2 4 8 32; do
	img v3-c512-rc$bits 64K refcount_bits=$bits,cluster_size=512
	io v3-c512-rc$bits 'write -P 0xa3 0 1k' 'write -z 8k 512' 'write -P 0xa4 30k 2k'
	finish v3-c512-rc$bits
done
img v3-c4k-rc16 1M refcount_bits=16,cluster_size=4k
io v3-c4k-rc16 'write -P 0xc1 0 12k' 'write -z 64k 8k' 'discard 4k 4k' 'write -P 0xc2 900k 5k'
finish v3-c4k-rc16

# Every refcount table entry names one refcount block that says every cluster is
# in use (64-bit refcounts of 1): check reports each extra name of the block, and a
# writable open is refused (a refcount update there would change every range).
img v3-c512-rc64-full 4M refcount_bits=64,cluster_size=512
io v3-c512-rc64-full 'write -P 0xb3 0 512'
python3 - "$tmp/v3-c512-rc64-full.qcow2" <<-'EOF'
	import struct, sys
	f = open(sys.argv[1], 'r+b')
	f.seek(48)
	rct, = struct.unpack('>Q', f.read(8))
	f.seek(rct)
	rb, = struct.unpack('>Q', f.read(8))
	f.seek(rb)
	f.write(struct.pack('>Q', 1) * 64)
	f.seek(rct)
	f.write(struct.pack('>Q', rb) * 64)
	EOF
finish v3-c512-rc64-full

# Extended L2 entries (subclusters), partial writes and zeroed subclusters.
img v3-c32k-extl2 1M extended_l2=on,cluster_size=32k
io v3-c32k-extl2 'write -P 0xd1 1k 2k' 'write -z 8k 4k' 'write -P 0xd2 300k 1k'
finish v3-c32k-extl2
img v3-c16k-extl2-zstd 512K extended_l2=on,cluster_size=16k,compression_type=zstd
io v3-c16k-extl2-zstd 'write -P 0xd3 16k 1k' 'write -c -P 0xd4 64k 16k'
finish v3-c16k-extl2-zstd

# Compressed clusters, zlib and zstd.
img v3-c4k-zlib 256K cluster_size=4k
io v3-c4k-zlib 'write -c -P 0xe1 0 4k' 'write -c -P 0xe2 8k 8k' 'write -P 0xe3 32k 4k'
finish v3-c4k-zlib
img v3-c4k-zstd 256K cluster_size=4k,compression_type=zstd
io v3-c4k-zstd 'write -c -P 0xe4 0 4k' 'write -c -P 0xe5 12k 4k' 'write -z 20k 4k'
finish v3-c4k-zstd
img v2-c512-zlib 64K compat=0.10,cluster_size=512
io v2-c512-zlib 'write -c -P 0xe6 0 512' 'write -c -P 0xe7 2k 1k'
finish v2-c512-zlib

# Lazy refcounts, left dirty by a simulated crash.
img v3-c4k-lazy 256K lazy_refcounts=on,cluster_size=4k
(ulimit -c 0; qemu-io -f qcow2 -c 'write -P 0xf1 0 8k' -c 'write -P 0xf2 64k 4k' -c abort \
	"$tmp/v3-c4k-lazy.qcow2" >/dev/null 2>&1 || true) 2>/dev/null
cp "$tmp/v3-c4k-lazy.qcow2" "$out/v3-c4k-lazy-dirty.qcow2"
[ "$(stat -c %s "$out/v3-c4k-lazy-dirty.qcow2")" -lt 307200 ]

# Internal snapshot, then writes that copy shared clusters.
img v3-c4k-snap 256K cluster_size=4k
io v3-c4k-snap 'write -P 0x51 0 8k' 'write -P 0x52 128k 4k'
qemu-img snapshot -c snap1 "$tmp/v3-c4k-snap.qcow2"
io v3-c4k-snap 'write -P 0x53 4k 4k' 'write -z 128k 4k'
finish v3-c4k-snap
img v2-c512-snap 32K compat=0.10,cluster_size=512
io v2-c512-snap 'write -P 0x54 0 1k'
qemu-img snapshot -c first "$tmp/v2-c512-snap.qcow2"
io v2-c512-snap 'write -P 0x55 512 512'
finish v2-c512-snap

# Snapshot operations: a script tail (see fuzz-qcow2.c: XORed with fz_default) that
# creates, applies and deletes snapshots between writes, zeroes, discards and a
# compressed write, with the reopen oracle on.
with_script() { # SOURCE NAME [table patch: l1-unaligned|l1-past-eof|count|extra|idlen|l1-meta|l2-past-eof]
	python3 - "$1" "$out/$2.qcow2" "${3:-}" <<-'EOF'
	import struct, sys
	src, dst, patch = sys.argv[1:4]
	d = bytearray(open(src, 'rb').read())
	cs = 1 << struct.unpack_from('>I', d, 20)[0]
	nsn, snoff = struct.unpack_from('>IQ', d, 60)
	if patch and nsn:
	    l1off = struct.unpack_from('>Q', d, snoff)[0]
	    if patch == 'l1-unaligned':
	        struct.pack_into('>Q', d, snoff, l1off + 8)
	    elif patch == 'l1-past-eof':
	        struct.pack_into('>Q', d, snoff, (len(d) + 16 * cs) // cs * cs)
	    elif patch == 'count':
	        struct.pack_into('>I', d, 60, 4000)
	    elif patch == 'extra':
	        struct.pack_into('>I', d, snoff + 36, 2000)
	    elif patch == 'idlen':
	        struct.pack_into('>H', d, snoff + 12, 0xffff)
	    elif patch == 'l1-meta':  # the snapshot's L2 table is the refcount table
	        rct = struct.unpack_from('>Q', d, 48)[0]
	        struct.pack_into('>Q', d, struct.unpack_from('>Q', d, snoff)[0], rct)
	    elif patch == 'l2-past-eof':  # a data entry far past the end of the file
	        l2 = struct.unpack_from('>Q', d, l1off)[0] & 0x00fffffffffffe00
	        struct.pack_into('>Q', d, l2, (len(d) // cs + 1000) * cs)
	default = bytes([0x11, 0x01, 0x10, 0x01, 0x29, 0x43, 0x21, 0x85, 0x33, 0x02, 0x04, 0x03,
	                 0xb3, 0x44, 0x05, 0x00, 0x16, 0x00, 0x1f, 0x07, 0x47, 0x08, 0x09, 0xc4,
	                 0x30, 0x05, 0x52, 0x46, 0x85, 0x01, 0x20, 0x81, 0x00])
	ops = [0x86, 0x00, 0x11, 0x01, 0x23, 0x02, 0x14, 0x03, 0x86, 0x00, 0x11, 0x05,
	       0x86, 0x02, 0x86, 0x01, 0x11, 0x07, 0x86, 0x03, 0x86, 0x00, 0x17, 0x00,
	       0x86, 0x01, 0x05, 0x00, 0x86, 0x02, 0x10, 0x01, 0x00]
	d += bytes(a ^ b for a, b in zip(ops, default))
	open(dst, 'wb').write(d)
	EOF
}
with_script "$out/v3-c4k-snap.qcow2" v3-c4k-snap-ops
with_script "$out/v2-c512-snap.qcow2" v2-c512-snap-ops
img v3-c16k-el2 256K cluster_size=16k,extended_l2=on
io v3-c16k-el2 'write -P 0x56 0 6k' 'write -P 0x57 64k 16k'
finish v3-c16k-el2
with_script "$out/v3-c16k-el2.qcow2" v3-c16k-el2-snap-ops
for p in l1-unaligned l1-past-eof count extra idlen l1-meta l2-past-eof; do
	with_script "$out/v3-c4k-snap.qcow2" "v3-c4k-snap-bad-$p" "$p"
done

# A backing file name and format in the header (never opened by the fuzz target).
qemu-img create -q -f raw "$tmp/base.raw" 64K
img v3-c4k-backing 64K cluster_size=4k,backing_file=base.raw,backing_fmt=raw
(cd "$tmp" && qemu-io -f qcow2 -c 'write -P 0x61 4k 2k' v3-c4k-backing.qcow2 >/dev/null)
cp "$tmp/v3-c4k-backing.qcow2" "$out/v3-c4k-backing.qcow2"

# A persistent bitmap (header extension and autoclear bit).
img v3-c4k-bitmap 128K cluster_size=4k
qemu-img bitmap --add "$tmp/v3-c4k-bitmap.qcow2" b0
io v3-c4k-bitmap 'write -P 0x71 0 4k'
finish v3-c4k-bitmap

# Bitmaps as the driver loads and writes them back: two of 512 B and 4 KiB granularity
# on 512-byte clusters (a table of several entries; one disabled), and copies whose
# first bitmap is in use (inconsistent: kept as found) or whose first table entry says
# "all ones".
img v3-c512-bitmaps 4M cluster_size=512
qemu-img bitmap --add -g 512 "$tmp/v3-c512-bitmaps.qcow2" fine
qemu-img bitmap --add "$tmp/v3-c512-bitmaps.qcow2" coarse
io v3-c512-bitmaps 'write -P 0x72 0 3k' 'write -P 0x73 3M 4k' 'write -z 2M 8k'
qemu-img bitmap --disable "$tmp/v3-c512-bitmaps.qcow2" coarse
finish v3-c512-bitmaps
bm_patch() { # SOURCE NAME in-use|ones
	cp "$out/$1.qcow2" "$out/$2.qcow2"
	python3 - "$out/$2.qcow2" "$3" <<-'EOF'
	import struct, sys
	path, what = sys.argv[1], sys.argv[2]
	d = bytearray(open(path, 'rb').read())
	pos = struct.unpack_from('>I', d, 100)[0]
	while struct.unpack_from('>I', d, pos)[0] != 0x23852875:
	    pos += 8 + (struct.unpack_from('>I', d, pos + 4)[0] + 7) // 8 * 8
	ent = struct.unpack_from('>Q', d, pos + 24)[0]
	if what == 'in-use':
	    struct.pack_into('>I', d, ent + 12, struct.unpack_from('>I', d, ent + 12)[0] | 1)
	else:
	    struct.pack_into('>Q', d, struct.unpack_from('>Q', d, ent)[0], 1)
	open(path, 'wb').write(d)
	EOF
}
bm_patch v3-c512-bitmaps v3-c512-bitmap-inuse in-use
bm_patch v3-c4k-bitmap v3-c4k-bitmap-ones ones

# External data file name (the fuzz target clears the bit: no host file is opened).
(cd "$tmp" && img v3-c4k-datafile 64K cluster_size=4k,data_file=data.raw)
cp "$tmp/v3-c4k-datafile.qcow2" "$out/v3-c4k-datafile.qcow2"

# Metadata preallocation.
img v3-c512-prealloc 16K cluster_size=512,preallocation=metadata
finish v3-c512-prealloc

ls -l "$out"
