#!/bin/bash
# Reading images made by qemu-img: a matrix of options (cluster sizes 512 B..2 MiB,
# compat=0.10/1.1, refcount_bits 1..64, extended_l2, lazy refcounts, backing chains with
# qcow2 and raw layers, compressed clusters zlib/zstd, internal snapshots, zero clusters,
# preallocation, external data files), each filled by a random qemu-io workload, must read
# back through `ioplane img convert -O raw` identical to `qemu-img convert -O raw`; and
# `ioplane img convert -O qcow2` of each must pass qemu-img check and compare equal.
# Then convert's own behaviour: sparse output, -S, -c, -B, -n, --target-is-zero, -m/-W,
# -p, cache modes, errors.
. "$(dirname "$0")/img-lib.sh"

n=0

# read_case NAME OPTIONS SIZE CLUSTER [_imgwork options]: make, fill, compare.
read_case() {
	local name=$1 opts=$2 size=$3 cs=$4
	shift 4
	n=$((n + 1))
	echo "== $name: -o $opts, $size"
	rm -f "$name.qcow2"
	qemu-img create -q -f qcow2 -o "$opts" "$name.qcow2" "$size"
	workload "$name.qcow2" "$n" "$cs" "$@"
	check_read "$name.qcow2"
}

# check_read IMAGE: ioplane reads it like qemu-img, and its qcow2 copy is clean and equal.
check_read() {
	same_as_qemu "$1"
	rm -f "$1.copy.qcow2"
	img convert -O qcow2 "$1" "$1.copy.qcow2"
	qcheck "$1.copy.qcow2"
	qsame "$1" "$1.copy.qcow2"
	rm -f "$1.copy.qcow2"
}

for cs in 512 1k 4k 16k 64k 256k 1M 2M; do
	read_case "cs$cs" "cluster_size=$cs" 24M "$(numfmt --from=iec "${cs^^}")" --compress --aio
done
read_case v2-4k compat=0.10,cluster_size=4k 8M 4096 --aio
read_case v2-64k compat=0.10 16M 65536 --compress
for rb in 1 2 4 8 16 32 64; do
	read_case "rb$rb" "refcount_bits=$rb,cluster_size=4k" 8M 4096
done
for cs in 16k 64k 2M; do
	read_case "extl2-$cs" "extended_l2=on,cluster_size=$cs" 16M \
		"$(numfmt --from=iec "${cs^^}")" --compress --aio
done
read_case lazy lazy_refcounts=on 8M 65536
read_case zstd compression_type=zstd,cluster_size=16k 8M 16384 --compress
for p in metadata falloc full; do
	read_case "pre-$p" "preallocation=$p,cluster_size=16k" 4M 16384
done
read_case pre-extl2 "preallocation=metadata,extended_l2=on,cluster_size=32k" 4M 32768
read_case datafile "data_file=datafile.raw,cluster_size=4k" 4M 4096 --no-discard

# Compressed throughout, as qemu-img convert -c makes it.
pattern_raw pat.raw $((6 << 20)) 3
qemu-img convert -q -c -O qcow2 -o cluster_size=4k pat.raw comp.qcow2
check_read comp.qcow2
qemu-img convert -q -c -O qcow2 -o compression_type=zstd pat.raw compz.qcow2
check_read compz.qcow2

# Internal snapshots: the active layer is read, snapshots stay intact.
qemu-img create -q -f qcow2 -o cluster_size=8k snap.qcow2 8M
workload snap.qcow2 101 8192 --compress
qemu-img snapshot -c one snap.qcow2
workload snap.qcow2 102 8192
qemu-img snapshot -c two snap.qcow2
workload snap.qcow2 103 8192 --aio
qemu-img snapshot -d one snap.qcow2
check_read snap.qcow2
qemu-img snapshot -l snap.qcow2 | grep -q ' two ' || fail "snapshot lost"

# Backing chains: raw base, qcow2 layers of different cluster sizes and versions; a
# shorter backing file (reads past its end are zeroes).
pattern_raw chain0.raw $((6 << 20)) 5
qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=4k -b chain0.raw -F raw chain1.qcow2 8M
workload chain1.qcow2 201 4096
qemu-img create -q -f qcow2 -o cluster_size=64k,extended_l2=on -b chain1.qcow2 -F qcow2 chain2.qcow2
workload chain2.qcow2 202 65536 --aio
qemu-img create -q -f qcow2 -o cluster_size=512 -b chain2.qcow2 -F qcow2 chain3.qcow2 10M
workload chain3.qcow2 203 512 --no-discard
for f in chain1 chain2 chain3; do
	check_read $f.qcow2
done
# Zero clusters over backing data read as zeroes, not the backing file's bytes.
qemu-io -f qcow2 -c 'write -z 0 1M' -c 'write -z -u 2M 512k' chain3.qcow2 >/dev/null
check_read chain3.qcow2

# ---- convert's own behaviour ----
echo "== convert options"
pattern_raw src.raw $((16 << 20)) 11
qemu-img convert -q -f raw -O qcow2 -o cluster_size=64k src.raw src.qcow2

# Output stays sparse: zero ranges and holes are not written.
img convert -f raw -O raw src.raw out.raw
cmp src.raw out.raw || fail "raw -> raw differs"
[ "$(stat -c %b out.raw)" -le "$(stat -c %b src.raw)" ] || fail "raw output less sparse than input"
truncate -s 64M holes.raw
printf 'x' | dd of=holes.raw bs=1 seek=$((40 << 20)) conv=notrunc status=none
img convert -f raw -O qcow2 holes.raw holes.qcow2
qcheck holes.qcow2
alloc=$(qcheck_get holes.qcow2 allocated-clusters)
[ "$alloc" = 1 ] || fail "sparse input made $alloc clusters"
qsame holes.raw holes.qcow2
# -S: allocated zeroes in the source are skipped by default, written with -S 0.
dd if=/dev/zero of=zeros.raw bs=1M count=4 status=none
img convert -f raw -O raw zeros.raw z1.raw
[ "$(stat -c %b z1.raw)" -le 8 ] || fail "zero data was written with the default -S"
img convert -S 0 -f raw -O raw zeros.raw z2.raw
[ "$(stat -c %b z2.raw)" -ge 8192 ] || fail "-S 0 skipped zero data"
cmp z1.raw z2.raw

# -c: compressed clusters, equal content; refused for raw output.
img convert -c -O qcow2 src.qcow2 c.qcow2
qcheck c.qcow2
qsame src.qcow2 c.qcow2
comp=$(qcheck_get c.qcow2 compressed-clusters)
[ "$comp" -gt 0 ] || fail "convert -c wrote no compressed cluster"
img_status 1 convert -c -O raw src.qcow2 c.raw
img convert -c -O qcow2 -o compression_type=zstd,cluster_size=16k src.raw cz.qcow2
qcheck cz.qcow2
qsame src.raw cz.qcow2

# Sizes that are not a whole number of sectors or clusters: the target is rounded up to
# sectors (like qemu-img) and reads as the source followed by zeroes.
for sz in 1000 3000000; do
	head -c $sz /dev/urandom >odd.raw
	for opt in "" "-c" "-c -o cluster_size=4k" "-W -m 3"; do
		rm -f odd.qcow2
		# shellcheck disable=SC2086
		img convert $opt -f raw -O qcow2 odd.raw odd.qcow2
		qcheck odd.qcow2
		qsame odd.raw odd.qcow2
	done
	ioplane_raw odd.qcow2 odd.back
	cmp odd.raw <(head -c $sz odd.back) || fail "odd size $sz: data differs"
done

# -m, -W, cache modes: same result.
for opt in "-m 1" "-m 16" "-m 4 -W" "-W" "-t none -T none" "-t unsafe"; do
	rm -f m.qcow2
	# shellcheck disable=SC2086
	img convert $opt -O qcow2 src.qcow2 m.qcow2
	qcheck m.qcow2
	qsame src.raw m.qcow2
done

# -n into an existing (larger) image; --target-is-zero; smaller target refused.
qemu-img create -q -f qcow2 big.qcow2 20M
qemu-io -c 'write -P 0xee 0 20M' big.qcow2 >/dev/null
img convert -n -O qcow2 src.qcow2 big.qcow2
qcheck big.qcow2
qemu-img compare -q src.raw big.qcow2 && fail "size mismatch not seen" || true
qemu-io -c 'read -P 0xee 16M 4M' big.qcow2 | grep -q 'read 4194304' ||
	fail "-n wrote past the source"
ioplane_raw big.qcow2 big.raw
cmp <(head -c 16M big.raw) src.raw || fail "-n: target does not hold the source"
# Without -O, an existing target's format is probed, not taken as raw.
img convert -n -f raw src.raw big.qcow2
qcheck big.qcow2
qemu-img create -q -f qcow2 small.qcow2 1M
img_status 1 convert -n -O qcow2 src.qcow2 small.qcow2
qemu-img create -q -f qcow2 tz.qcow2 16M
img convert -n --target-is-zero -O qcow2 src.qcow2 tz.qcow2
qsame src.raw tz.qcow2
img_status 1 convert --target-is-zero -O qcow2 src.qcow2 tz2.qcow2

# -B: the new image has the backing file; only the source's own clusters are copied.
qemu-img create -q -f qcow2 -b src.qcow2 -F qcow2 ovl.qcow2
qemu-io -c 'write -P 0x99 1M 128k' -c 'write -z 4M 64k' ovl.qcow2 >/dev/null
img convert -B src.qcow2 -F qcow2 -O qcow2 ovl.qcow2 rebased.qcow2
qcheck rebased.qcow2
qsame ovl.qcow2 rebased.qcow2
qemu-img info --output=json rebased.qcow2 | grep -q '"backing-filename": "src.qcow2"' ||
	fail "-B: no backing file in the output"
alloc=$(qcheck_get rebased.qcow2 allocated-clusters)
[ "$alloc" -le 4 ] || fail "-B copied $alloc clusters, the overlay has 3"
img_status 1 convert -B src.qcow2 -O qcow2 ovl.qcow2 nofmt.qcow2

# -p: qemu-img's progress line, updated in place, on stdout.
rm -f p.qcow2
img convert -p -O qcow2 src.qcow2 p.qcow2
grep -q $'    (100.00/100%)\r' "$OUT" || fail "no progress: $(od -c "$OUT" | head)"
grep -q $'    (0.00/100%)\r' "$OUT" || fail "progress does not start at 0"
rm -f q.qcow2
img convert -p -q -O qcow2 src.qcow2 q.qcow2
[ ! -s "$OUT" ] || fail "-q printed something"

# Errors: one line, exit 1.
img_status 1 convert -O qcow2 missing.qcow2 x.qcow2
[ "$(wc -l <"$ERR")" = 1 ] || fail "more than one error line: $(cat "$ERR")"
img_status 1 convert -O vmdk src.raw x.vmdk
img_status 1 convert -m 0 -O raw src.raw x.raw
img_status 1 convert -m 65 -O raw src.raw x.raw
img_status 1 convert -O raw src.raw
img_status 1 convert -O qcow2 -o cluster_size=5k src.raw x.qcow2
echo "convert: $n qemu-img images read identically; options behave"
