#!/bin/bash
# nbdinfo against ioplane: --list (names, descriptions, sizes, contexts), --size,
# --map on a sparse file (holes vs data), --can/--is flags of a writable and a read-only
# export, and the block-size constraints the server advertises (spec rules on their values).
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need nbdinfo qemu-io python3

img=$NBD_TMP/sparse.img
ro=$NBD_TMP/ro.img
sock=$NBD_TMP/nbd.sock

# 4 MiB sparse file: data at [1M, 1M+64K) and [3M, 3M+4K), holes elsewhere.
truncate -s 4M "$img"
qemu-io -f raw "$img" -c 'write -P 1 1M 64k' -c 'write -P 2 3M 4k' >/dev/null
truncate -s 2M "$ro"

nbd_serve --image sp,file="$img" --image ro,file="$ro",read-only=on \
	--nbd unix="$sock",image=sp,writable=on,description="sparse test disk" \
	--nbd unix="$sock",image=ro,name=readonly
uri=$(nbd_uri sp "$sock")
rouri=$(nbd_uri readonly "$sock")

# --list: both exports with their names, sizes, descriptions and base:allocation.
list=$(nbdinfo --list --json "nbd+unix://?socket=$sock")
echo "$list"
python3 - "$list" <<'EOF' || fail "nbdinfo --list"
import json, sys
j = json.loads(sys.argv[1])
assert j["protocol"] == "newstyle-fixed", j["protocol"]
assert j["structured"] is True, "structured replies not negotiated"
ex = {e["export-name"]: e for e in j["exports"]}
assert sorted(ex) == ["readonly", "sp"], sorted(ex)
sp, ro = ex["sp"], ex["readonly"]
assert sp["export-size"] == 4 << 20, sp
assert ro["export-size"] == 2 << 20, ro
assert sp.get("description") == "sparse test disk", sp
assert "base:allocation" in sp.get("contexts", []), sp
assert sp["is_read_only"] is False and ro["is_read_only"] is True
for e in (sp, ro):
    mn, pref, mx = (e["block_size_minimum"], e["block_size_preferred"],
                    e["block_size_maximum"])
    # proto.md "Size constraints": powers of two, min <= 64K, pref >= max(min, 512),
    # max payload >= pref.
    assert mn & (mn - 1) == 0 and 1 <= mn <= 65536, e
    assert pref & (pref - 1) == 0 and pref >= max(mn, 512), e
    assert mx >= pref, e
EOF

[ "$(nbdinfo --size "$uri")" = 4194304 ] || fail "--size of sp"
[ "$(nbdinfo --size "$rouri")" = 2097152 ] || fail "--size of readonly"

# --can / --is: exit 0 = true, 2 = false (anything else is an error).
can() {
	local want=$1 what=$2 u=$3 rc=0
	nbdinfo $what "$u" || rc=$?
	[ $rc -eq "$want" ] || fail "nbdinfo $what $u: exit $rc, expected $want"
}
for f in flush trim zero fua multi-conn fast-zero df cache; do
	can 0 "--can $f" "$uri"
done
can 2 "--is read-only" "$uri"
can 0 "--is read-only" "$rouri"
can 0 "--can multi-conn" "$rouri"
can 0 "--can df" "$rouri"

# --map: holes and data where the file has them (allocation status from the block layer).
map=$(nbdinfo --map --json "$uri")
echo "$map"
python3 - "$map" <<'EOF' || fail "nbdinfo --map"
import json, sys
ext = json.loads(sys.argv[1])
pos = 0
for e in ext:
    assert e["offset"] == pos, ("gap or overlap", e)
    pos += e["length"]
assert pos == 4 << 20, ("map does not cover the export", pos)
def kind(off):
    for e in ext:
        if e["offset"] <= off < e["offset"] + e["length"]:
            return e["type"]
M, K = 1 << 20, 1 << 10
for off in (0, 512 * K, M - 4 * K, M + 64 * K, 2 * M, 3 * M + 4 * K, 4 * M - 1):
    assert kind(off) & 3 == 3, ("expected hole,zero at", off, kind(off))
for off in (M, M + 60 * K, 3 * M):
    assert kind(off) & 3 == 0, ("expected data at", off, kind(off))
EOF

# The data is what was written (the map did not lie about the data regions).
nbd_qemu_io "$uri" 'read -P 1 1M 64k' 'read -P 2 3M 4k' 'read -P 0 0 1M' >/dev/null

# After write-zeroes with unmap, the range reads as zero and the map says so.
nbd_qemu_io "$uri" 'write -z -u 1M 64k' >/dev/null
nbdinfo --map --json "$uri" | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    if e["offset"] <= 1 << 20 < e["offset"] + e["length"]:
        sys.exit(0 if e["type"] & 2 else 1)
sys.exit(1)' || fail "zeroed range not reported as zero"
nbd_qemu_io "$uri" 'read -P 0 1M 64k' >/dev/null

nbd_stop
echo PASS
