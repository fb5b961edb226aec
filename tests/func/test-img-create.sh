#!/bin/bash
# `ioplane img create` against qemu-img: every create option (cluster sizes 512 B..2 MiB,
# compat, extended_l2, lazy_refcounts, refcount_bits 1..64, preallocation, backing files,
# zstd, external data files) makes an image that qemu-img check finds clean, whose
# properties qemu-img info reports as asked, that ioplane img info describes the same way,
# and that reads back what is written into it - through ioplane (convert -n) and through
# qemu-io - with qemu-img check clean afterwards. Then raw images and the command line.
. "$(dirname "$0")/img-lib.sh"

pattern_raw pat.raw $((3 << 20)) 7

# info_has IMAGE KEY VALUE: qemu-img info --output=json has format-specific KEY = VALUE,
# or a top-level KEY when VALUE starts with '@'.
info_has() {
	python3 - "$1" "$2" "$3" <<'PY' || fail "qemu-img info $1: $2 is not $3"
import json, subprocess, sys
img, key, want = sys.argv[1:]
i = json.loads(subprocess.check_output(['qemu-img', 'info', '--output=json', img]))
if want.startswith('@'):
    got, want = i.get(key), want[1:]
else:
    got = i['format-specific']['data'].get(key)
if str(got).lower() != want.lower():
    print(f'{key}: {got!r}, want {want!r}', file=sys.stderr)
    sys.exit(1)
PY
}

size_norm() {
	sed -E -e 's/^disk size: .*/disk size: N/' -e 's/"actual-size": [0-9]+/"actual-size": N/'
}

# same_info IMAGE: ioplane img info prints what qemu-img info prints (sizes on disk aside).
same_info() {
	local o
	for o in human json; do
		img info --output=$o "$1"
		size_norm <"$OUT" >info.io
		qemu-img info --output=$o "$1" | size_norm >info.q
		diff -u info.q info.io || fail "info --output=$o $1 differs from qemu-img's"
	done
}

# roundtrip IMAGE: data written by ioplane and by qemu-io reads back, image stays clean.
roundtrip() {
	local f=$1
	qcheck "$f"
	img convert -n -f raw -O qcow2 pat.raw "$f"
	qcheck "$f"
	qemu-img compare -q -f raw pat.raw "$f" || fail "$f: pattern written by ioplane differs"
	qemu-io -f qcow2 -c 'write -P 0xc3 100k 300k' -c 'write -z 1M 128k' "$f" >/dev/null
	qemu-io -f raw -c 'write -P 0xc3 100k 300k' -c 'write -z 1M 128k' pat.raw >/dev/null
	same_as_qemu "$f"
	ioplane_raw "$f" back.raw
	cmp <(head -c 3M back.raw) pat.raw || fail "$f: ioplane reads back other data"
	qcheck "$f"
	pattern_raw pat.raw $((3 << 20)) 7
}

# create_case OPTIONS [KEY=VALUE...]: create with -o OPTIONS and check everything.
create_case() {
	local opts=$1 kv
	shift
	echo "== create -o $opts"
	rm -f c.qcow2 c.data
	img create -f qcow2 -o "$opts" c.qcow2 3M
	expect_grep "$OUT" "^Formatting 'c.qcow2', fmt=qcow2 "
	for kv in "$@"; do
		info_has c.qcow2 "${kv%%=*}" "${kv#*=}"
	done
	same_info c.qcow2
	roundtrip c.qcow2
}

for cs in 512 4k 64k 2M; do
	create_case cluster_size=$cs "cluster-size=@$(numfmt --from=iec ${cs^^})"
done
create_case compat=0.10 compat=0.10
create_case compat=1.1,lazy_refcounts=on compat=1.1 lazy-refcounts=true
for rb in 1 2 4 8 16 32 64; do
	create_case refcount_bits=$rb refcount-bits=$rb
done
create_case extended_l2=on,cluster_size=16k extended-l2=true
create_case extended_l2=on extended-l2=true
create_case compression_type=zstd compression-type=zstd
for p in off metadata falloc full; do
	create_case preallocation=$p,cluster_size=4k
done
create_case preallocation=metadata,extended_l2=on,cluster_size=32k
create_case data_file=c.data data-file=c.data
create_case data_file=c.data,data_file_raw=on,preallocation=full data-file-raw=true

# Preallocation really allocates: metadata maps every cluster, full writes the data.
rm -f p.qcow2
img create -q -f qcow2 -o preallocation=full p.qcow2 8M
[ "$(stat -c %b p.qcow2)" -ge $((8 * 2048)) ] || fail "preallocation=full left holes"
qemu-img map --output=json p.qcow2 | grep -q '"present": false' && fail "full: unallocated"

# Backing files, qcow2 and raw; size taken from the backing file when not given.
qemu-img create -q -f qcow2 base.qcow2 3M
qemu-io -c 'write -P 0x5a 0 3M' base.qcow2 >/dev/null
img create -f qcow2 -b base.qcow2 -F qcow2 ov.qcow2
info_has ov.qcow2 virtual-size @3145728
info_has ov.qcow2 backing-filename @base.qcow2
info_has ov.qcow2 backing-filename-format @qcow2
qcheck ov.qcow2
qsame base.qcow2 ov.qcow2
same_info ov.qcow2
img convert -n -f raw -O qcow2 pat.raw ov.qcow2
qsame pat.raw ov.qcow2
qcheck ov.qcow2
truncate -s 1M rbase.raw
img create -f qcow2 -o backing_file=rbase.raw,backing_fmt=raw,cluster_size=4k ov2.qcow2 2M
info_has ov2.qcow2 backing-filename-format @raw
qcheck ov2.qcow2
same_as_qemu ov2.qcow2

# Backing files are never probed: a format is required, a missing file is refused.
img_status 1 create -f qcow2 -b base.qcow2 nofmt.qcow2 1M
expect_grep "$ERR" 'format'
img_status 1 create -f qcow2 -b missing.qcow2 -F qcow2 nob.qcow2
img create -q -f qcow2 -u -b missing.qcow2 -F qcow2 unsafe.qcow2 1M
info_has unsafe.qcow2 backing-filename @missing.qcow2

# raw: sparse, with preallocation.
img create r.raw 5M
expect_line "$OUT" "Formatting 'r.raw', fmt=raw size=5242880"
[ "$(stat -c %s r.raw)" = 5242880 ] || fail "raw size"
[ "$(stat -c %b r.raw)" -le 8 ] || fail "raw image not sparse"
img create -q -f raw -o preallocation=full rf.raw 1M
[ "$(stat -c %b rf.raw)" -ge 2048 ] || fail "raw preallocation=full left holes"
img create -q -f raw -o preallocation=falloc ra.raw 1M
[ "$(stat -c %b ra.raw)" -ge 2048 ] || fail "raw preallocation=falloc left holes"
img create -q -f qcow2 s1000.qcow2 1000
[ "$(qinfo s1000.qcow2 virtual-size)" = 1024 ] || fail "size not rounded up to sectors"
img create -q s1000.raw 1000
[ "$(stat -c %s s1000.raw)" = 1024 ] || fail "raw size not rounded up to sectors"
img create -q r2.raw 1.5M
[ "$(stat -c %s r2.raw)" = 1572864 ] || fail "1.5M is not 1572864 bytes"
[ ! -s "$OUT" ] || fail "-q printed something"

# Bad command lines: one line on stderr, exit 1, no image left behind where refused early.
for bad in "-f qcow2 x.qcow2" "-f qcow2 x.qcow2 -1" "-f qcow2 x.qcow2 1Q" \
	"-f qcow2 -o cluster_size=3k x.qcow2 1M" "-f qcow2 -o cluster_size=4M x.qcow2 1M" \
	"-f qcow2 -o refcount_bits=3 x.qcow2 1M" \
	"-f qcow2 -o compat=0.10,extended_l2=on x.qcow2 1M" \
	"-f qcow2 -o extended_l2=on,cluster_size=4k x.qcow2 1M" "-f qcow2 -o nosuch=1 x.qcow2 1M" \
	"-f vmdk x.img 1M" "-f raw -b base.qcow2 -F qcow2 x.raw" \
	"-f raw -o cluster_size=4k x.raw 1M" \
	"-f qcow2 -o preallocation=sometimes x.qcow2 1M" "--bogus x.qcow2 1M"; do
	# shellcheck disable=SC2086
	img_status 1 create $bad
	[ "$(wc -l <"$ERR")" -ge 1 ] || fail "create $bad: no message"
done
img create --help
expect_grep "$OUT" '^Usage: ioplane img create'

# A file in a directory that does not exist: exit 1 and a message naming the file and
# ending with the errno text, next to qemu-img doing the same.
qemu-img create -q -f qcow2 src.qcow2 1M
# nodir NAME ARGS...: `img ARGS` and `qemu-img ARGS` both fail so, naming NAME.
nodir() {
	local name=$1 qrc=0 last
	shift
	qemu-img "$@" >/dev/null 2>q.err || qrc=$?
	[ "$qrc" -eq 1 ] || fail "qemu-img $*: exit $qrc"
	last=$(tail -n 1 q.err)
	[ "${last##*: }" = "No such file or directory" ] || fail "qemu-img $*: $last (test bug?)"
	img_status 1 "$@"
	expect_grep "$ERR" "${name//./\\.}.*: No such file or directory$"
	rm -f x.qcow2
}
for f in raw qcow2; do
	nodir nodir/x.img create -f "$f" nodir/x.img 1M
done
nodir nodir/d.raw create -f qcow2 -o data_file=nodir/d.raw x.qcow2 1M
nodir nodir/c.qcow2 convert -O qcow2 src.qcow2 nodir/c.qcow2
nodir nodir/c.raw convert -O raw src.qcow2 nodir/c.raw
echo "create: all cases passed"
