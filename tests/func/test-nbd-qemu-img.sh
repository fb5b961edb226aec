#!/bin/bash
# qemu-img against NBD exports: info, convert out of and into an export, compare an export
# with a local file (equal and different), on a unix socket and on TCP loopback.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need qemu-img qemu-io

src=$NBD_TMP/src.img
dst=$NBD_TMP/dst.img
sock=$NBD_TMP/nbd.sock
port=$(nbd_free_port)

# A 32 MiB source with data, holes and a non-zero tail.
truncate -s 32M "$src"
qemu-io -f raw "$src" -c 'write -P 0x61 0 1M' -c 'write -P 0x62 5M 3M' \
	-c 'write -P 0x63 31M 1M' >/dev/null
truncate -s 32M "$dst"

nbd_serve --image s,file="$src",read-only=on --image d,file="$dst" \
	--nbd unix="$sock",image=s --nbd unix="$sock",image=d,writable=on \
	--nbd tcp=127.0.0.1:"$port",image=s
suri=$(nbd_uri s "$sock")
duri=$(nbd_uri d "$sock")

# info: size and format as served.
info=$(qemu-img info --output=json "$suri")
echo "$info"
python3 -c 'import json,sys
i = json.loads(sys.argv[1])
assert i["virtual-size"] == 32 << 20, i
assert i["format"] == "raw", i' "$info" || fail "qemu-img info $suri: $info"
tinfo=$(qemu-img info --output=json "$(nbd_tcp_uri s "$port")")
grep -q '"virtual-size": 33554432' <<<"$tinfo" || fail "qemu-img info over TCP: $tinfo"

# convert out of the export, from unix and from TCP: byte-identical to the source.
qemu-img convert -f raw -O raw "$suri" "$NBD_TMP/out.img"
cmp "$src" "$NBD_TMP/out.img" || fail "convert from $suri differs"
qemu-img convert -f raw -O raw "$(nbd_tcp_uri s "$port")" "$NBD_TMP/out-tcp.img"
cmp "$src" "$NBD_TMP/out-tcp.img" || fail "convert over TCP differs"

# compare: equal, then different at a known offset (exit 1 and the right offset).
qemu-img compare -f raw -F raw "$suri" "$src" || fail "compare $suri with source"
cp "$src" "$NBD_TMP/changed.img"
qemu-io -f raw "$NBD_TMP/changed.img" -c 'write -P 0x99 6M 512' >/dev/null
rc=0
out=$(qemu-img compare -f raw -F raw "$suri" "$NBD_TMP/changed.img" 2>&1) || rc=$?
[ $rc -eq 1 ] || fail "compare with a changed file: exit $rc, expected 1: $out"
grep -q 'offset 6291456' <<<"$out" || fail "compare reported the wrong offset: $out"

# convert into the writable export (-n: target exists), then compare through NBD.
qemu-img convert -n -f raw -O raw "$src" "$duri"
qemu-img compare -f raw -F raw "$duri" "$src" || fail "compare after convert into $duri"
qemu-img compare -f raw -F raw "$duri" "$suri" || fail "compare export with export"

# convert between two exports of one daemon, in both directions, with several coroutines.
qemu-io -f raw "$duri" -c 'write -z 0 32M' >/dev/null
qemu-img convert -n -m 8 -W -f raw -O raw "$suri" "$duri"
qemu-img compare -f raw -F raw "$duri" "$src" || fail "export-to-export convert"

nbd_stop
cmp "$src" "$dst" || fail "destination file differs from the source after the daemon exited"
echo PASS
