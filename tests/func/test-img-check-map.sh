#!/bin/bash
# `ioplane img map` and `ioplane img check` next to qemu-img on images qemu-img makes and
# fills with random workloads (cluster sizes, extended_l2, backing chains, compressed,
# v2): map --output=json describes the same ranges (zero ranges compared without their
# host offset, which the qcow2 driver does not report), map's human form and check's
# counters are the same; check's exit status follows qemu-img check (0, 2 corruption,
# 3 leaks, 63 raw); check -r leaks and -r all repair what qemu-img then finds clean.
. "$(dirname "$0")/img-lib.sh"

# map_norm: qemu-img map JSON on stdin -> ranges without host offsets of non-data ranges,
# merged again where that makes neighbours equal.
map_norm() {
	python3 -c '
import json, sys
out = []
for e in json.load(sys.stdin):
    if not e["data"]:
        e.pop("offset", None)
    p = out[-1] if out else None
    if p and all(p[k] == e[k] for k in ("depth", "present", "zero", "data")) and \
            ("offset" in p) == ("offset" in e) and \
            ("offset" not in p or p["offset"] + p["length"] == e["offset"]):
        p["length"] += e["length"]
    else:
        out.append(e)
for e in out:
    print(e)'
}

# same_map_check IMAGE: map (JSON normalised, human) and check agree with qemu-img.
same_map_check() {
	local f=$1 rc=0
	img map --output=json "$f"
	map_norm <"$OUT" >m.io
	qemu-img map --output=json "$f" | map_norm >m.q
	diff -u m.q m.io || fail "map $f differs from qemu-img's"
	qemu-img map "$f" >mh.q 2>/dev/null || rc=$?
	run_status $rc "$IOPLANE" img map "$f"
	diff -u mh.q "$OUT" || fail "human map $f differs"
	img check --output=json "$f"
	python3 - "$OUT" "$f" <<'PY' || fail "check $f differs from qemu-img's"
import json, subprocess, sys
io = json.load(open(sys.argv[1]))
q = json.loads(subprocess.run(['qemu-img', 'check', '--output=json', sys.argv[2]],
                              capture_output=True).stdout)
for k in ('image-end-offset', 'total-clusters', 'allocated-clusters', 'corruptions',
          'leaks', 'check-errors', 'filename', 'format'):
    if io.get(k) != q.get(k):
        print(f'{k}: ioplane {io.get(k)}, qemu-img {q.get(k)}', file=sys.stderr)
        sys.exit(1)
PY
}

n=0
for spec in "cluster_size=512 512" "cluster_size=4k 4096" "cluster_size=64k 65536" \
	"cluster_size=2M 2097152" "compat=0.10,cluster_size=16k 16384" \
	"extended_l2=on,cluster_size=32k 32768" "refcount_bits=2,cluster_size=4k 4096"; do
	n=$((n + 1))
	set -- $spec
	echo "== -o $1"
	rm -f m.qcow2
	qemu-img create -q -f qcow2 -o "$1" m.qcow2 12M
	workload m.qcow2 $((300 + n)) "$2" --aio
	same_map_check m.qcow2
done

# Compressed clusters: JSON map has no offset for them; the human map refuses.
qemu-img create -q -f qcow2 c.qcow2 4M
workload c.qcow2 400 65536 --compress
same_map_check c.qcow2
rm -f c.qcow2
qemu-img create -q -f qcow2 c.qcow2 4M
qemu-io -c 'write -c -P 7 0 128k' -c 'write -P 8 1M 64k' c.qcow2 >/dev/null
same_map_check c.qcow2
img_status 1 map c.qcow2
expect_grep "$ERR" "compressed clusters"

# Backing chain with a raw base: depth counts the layers, raw layers are "present".
pattern_raw base.raw $((6 << 20)) 9
qemu-img create -q -f qcow2 -o cluster_size=4k -b base.raw -F raw mid.qcow2 8M
workload mid.qcow2 401 4096 --no-discard
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2
workload top.qcow2 402 65536 --no-discard
same_map_check mid.qcow2
same_map_check top.qcow2
img map --output=json top.qcow2
grep -q '"depth": 2' "$OUT" || fail "no range from the raw base: $(cat "$OUT")"

# A sparse raw file: holes are zero, data is data, offsets are the guest's.
truncate -s 4M sp.raw
printf 'x' | dd of=sp.raw bs=1 seek=$((1 << 20)) conv=notrunc status=none
img map --output=json sp.raw
qemu-img map --output=json sp.raw >sp.q
diff -u sp.q "$OUT" || fail "raw map differs"
img map -f raw sp.raw
qemu-img map -f raw sp.raw >sp.q
diff -u sp.q "$OUT" || fail "raw human map differs"
img map --output=json --start-offset=512k --max-length=1M sp.raw
qemu-img map --output=json --start-offset=512k --max-length=1M sp.raw >sp.q
diff -u sp.q "$OUT" || fail "map range differs"

# check: exit statuses, raw, and repairs.
img_status 63 check sp.raw
expect_line "$ERR" "ioplane img: This image format does not support checks"
qemu-img create -q -f qcow2 -o cluster_size=4k lk.qcow2 1M
qemu-io -c 'write -P 1 0 64k' lk.qcow2 >/dev/null
# Leak: raise the refcount of the first data cluster (host offset from the map).
host=$(qemu-img map --output=json lk.qcow2 |
	python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["offset"])')
set_rc() {
	python3 - "$1" "$2" "$3" <<'PY'
import struct, sys
path, host, val = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, 'r+b') as f:
    h = f.read(104)
    cbits = struct.unpack('>I', h[20:24])[0]
    rct = struct.unpack('>Q', h[48:56])[0]
    per = (1 << cbits) // 2
    cl = host >> cbits
    f.seek(rct + 8 * (cl // per))
    rb = struct.unpack('>Q', f.read(8))[0]
    f.seek(rb + 2 * (cl % per))
    f.write(struct.pack('>H', val))
PY
}
cp lk.qcow2 leak.qcow2
# A cluster past the data, inside the file: the file is extended to hold it.
truncate -s $(( $(stat -c %s leak.qcow2) + 8192 )) leak.qcow2
set_rc leak.qcow2 $(( $(stat -c %s leak.qcow2) - 4096 )) 1
img_status 3 check leak.qcow2
expect_line "$OUT" "1 leaked clusters were found on the image."
rc=0; qemu-img check leak.qcow2 >/dev/null 2>&1 || rc=$?
[ $rc = 3 ] || fail "qemu-img does not see the leak (test bug): $rc"
img check -r leaks leak.qcow2
expect_line "$OUT" "    1 leaked clusters"
expect_line "$OUT" "No errors were found on the image."
qcheck leak.qcow2
cp lk.qcow2 bad.qcow2
set_rc bad.qcow2 "$host" 0
img_status 2 check bad.qcow2
img_status 2 check --output=json bad.qcow2
expect_grep "$OUT" '"corruptions": [1-9]'
img_status 2 check -r leaks bad.qcow2
img check -r all bad.qcow2
expect_grep "$OUT" "^    [1-9][0-9]* corruptions"
qcheck bad.qcow2
qemu-io -c 'read -P 1 0 64k' bad.qcow2 | grep -q 'read 65536' || fail "data lost by the repair"
img_status 1 check -r sometimes lk.qcow2
img_status 1 check --output=xml lk.qcow2
img_status 1 check missing.qcow2
img check -q lk.qcow2
[ ! -s "$OUT" ] || fail "check -q printed something"
echo "check/map: agree with qemu-img"
