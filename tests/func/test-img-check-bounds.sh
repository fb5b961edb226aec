#!/bin/bash
# `img check` costs what the file holds, not what its tables claim. Images from
# _qcow2craft.py (group size): every refcount table entry naming one refcount block (16-
# and 1-bit refcounts: 8192 entries claim refcounts for 16 TiB and 256 TiB), every entry
# of a 64 Ki- or 4 Mi-entry L1 table naming one L2 table, 2000 or 65536 snapshots sharing
# one L1 table (of 4 Mi entries). Each check finishes within the command time limit (the
# old code needed minutes to hours for four of them) and, where qemu-img check finishes
# too, reports what it reports (image end offset, corruptions, leaks, check errors,
# allocated clusters); otherwise the image end offset is the file's end. info, map and
# convert finish as well; a writable open of an image whose refcount table names one
# block twice is refused, and check -r leaks on it exits as qemu-img's does. Last, map of
# empty disks of 2 PiB and 256 TiB.
. "$(dirname "$0")/img-lib.sh"

CRAFT=$IMG_LIB_DIR/_qcow2craft.py
sock=$T/s.sock

# name|qemu (compare with qemu-img check) or own (qemu-img takes minutes)
cases=(
	"rb-alias|qemu"
	"rb-alias-rc1|qemu"
	"l1-alias|qemu"
	"l1-alias-huge|own"
	"snap-alias|qemu"
	"snap-alias-huge|own"
)

[ "$(python3 "$CRAFT" list size | wc -l)" -eq ${#cases[@]} ] ||
	fail "a case of _qcow2craft.py is not tested"
for c in "${cases[@]}"; do
	IFS='|' read -r name ref <<<"$c"
	echo "== $name"
	f=$name.qcow2
	python3 "$CRAFT" "$name" "$f"
	img_status 2 check --output=json "$f"
	cp "$OUT" io.json
	if [ "$ref" = qemu ]; then
		timeout 300 qemu-img check --output=json "$f" >q.json 2>/dev/null || true
	else
		echo "{\"image-end-offset\": $(stat -c %s "$f")}" >q.json
	fi
	python3 - io.json q.json <<-'EOF' || fail "$name: check differs from the reference"
	import json, sys
	io, q = (json.load(open(p)) for p in sys.argv[1:])
	keys = [k for k in ('image-end-offset', 'corruptions', 'leaks', 'check-errors',
	                    'allocated-clusters') if k in q]
	bad = [f'{k}: ioplane {io.get(k)}, reference {q.get(k)}' for k in keys
	       if io.get(k, 0) != q.get(k, 0)]
	print('\n'.join(bad), file=sys.stderr)
	sys.exit(1 if bad else 0)
	EOF
	img info "$f"
	img map --output=json "$f"
	img map "$f"
	img convert -O raw "$f" out.raw
	rm -f out.raw "$f.ref"
	case $name in
	rb-alias*)
		run_status 1 "$IOPLANE" serve --image "d,file=$f,format=qcow2" \
			--nbd "unix=$sock,image=d,writable=on"
		expect_grep "$ERR" "refcount table entries 0 and 1 both name the refcount block"
		# -r leaks: the same verdict as qemu-img's (1: needs a rebuild; 2: overflows).
		cp "$f" q.qcow2
		rc=0
		qemu-img check -r leaks q.qcow2 >/dev/null 2>&1 || rc=$?
		img_status $rc check -r leaks "$f" ;;
	esac
	rm -f "$f"
done

# Virtual disks with nothing allocated: 2 PiB (its L1 table alone is 32 MiB), and 256 TiB
# over a raw backing file whose size is no multiple of the cluster size. map costs a step
# per L2 table it reads, not one per cluster of the disk (the old code: over two minutes
# for the first), and prints what qemu-img map prints.
echo "== map of empty 2 PiB and 256 TiB disks"
qemu-img create -q -f qcow2 big0.qcow2 2P
img map --output=json big0.qcow2
expect_line "$OUT" '[{ "start": 0, "length": 2251799813685248, "depth": 0, "present": false, "zero": true, "data": false}]'
img check big0.qcow2
pattern_raw base.raw 1000448 5 # a 512-byte multiple: qemu pads raw files to one
qemu-img create -q -f qcow2 -b base.raw -F raw big1.qcow2 256T
img map --output=json big1.qcow2
timeout 300 qemu-img map --output=json big1.qcow2 >m.q
diff -u m.q "$OUT" || fail "map --output=json big1.qcow2 differs from qemu-img's"
echo "${#cases[@]} checks bounded by the file, maps bounded by the tables"
