#!/bin/bash
# The nbd protocol driver under `ioplane img` and `ioplane bench`, against nbdkit's memory
# plugin (unix and TCP), qemu-nbd and ioplane itself: info, map (the holes come through
# and match qemu-img's map of the same export), convert out of and into an export, compare
# (equal, then one byte changed), bench reads and writes (data checked afterwards), a
# qcow2 image on an NBD export, and clear errors for a server that is not there, a
# read-only export opened for writing and a bad URI.
. "$(dirname "$0")/nbdc-lib.sh"

nbdc_need_memory
nbd_need qemu-img qemu-io qemu-nbd

T=$NBD_TMP
msock=$T/mem.sock
muri="nbd+unix:///?socket=$msock"
nbdc_nbdkit "$msock" memory 64M
qemu-io -f raw "$muri" -c 'write -P 0x61 0 1M' -c 'write -P 0x62 5M 3M' \
	-c 'write -P 0x63 63M 1M' >/dev/null

# info
info=$("$IOPLANE" img info --output=json "$muri")
python3 -c 'import json, sys
i = json.loads(sys.argv[1])
assert i["virtual-size"] == 64 << 20 and i["format"] == "raw", i' "$info" ||
	fail "img info: $info"

# map: the same extents as qemu-img's, with the holes.
"$IOPLANE" img map --output=json -f raw "$muri" >"$T/map.ioplane"
qemu-img map --output=json -f raw "$muri" >"$T/map.qemu"
diff -u "$T/map.qemu" "$T/map.ioplane" || fail "img map differs from qemu-img's"
grep -q '"start": 1048576, "length": 4194304, "depth": 0, "present": true, "zero": true, "data": false' \
	"$T/map.ioplane" || fail "img map lost the hole at 1M: $(cat "$T/map.ioplane")"

# convert out of the export: the same bytes as qemu-img's copy; then compare.
"$IOPLANE" img convert -f raw -O raw "$muri" "$T/out.img"
qemu-img convert -f raw -O raw "$muri" "$T/ref.img"
cmp "$T/out.img" "$T/ref.img" || fail "img convert from NBD differs from qemu-img's"
"$IOPLANE" img compare -f raw -F raw "$muri" "$T/ref.img" || fail "img compare: not equal"
qemu-io -f raw "$T/ref.img" -c 'write -P 0x64 6M 1' >/dev/null
rc=0
"$IOPLANE" img compare -f raw -F raw "$muri" "$T/ref.img" >/dev/null || rc=$?
[ $rc -eq 1 ] || fail "img compare of different images exited $rc, not 1"

# convert into an export that exists (-n), over TCP this time.
port=$(nbd_free_port)
nbdkit -f -i 127.0.0.1 -p "$port" memory 64M </dev/null >"$T/tcp.log" 2>&1 &
tpid=$!
nbd_pids+=("$tpid")
for ((i = 0; i < 600; i++)); do
	nbd_tcp_listening "$port" && break
	sleep 0.05
done
turi="nbd://127.0.0.1:$port/"
"$IOPLANE" img convert -n -f raw -O raw "$T/ref.img" "$turi" || fail "img convert -n into $turi"
qemu-img compare -f raw -F raw "$T/ref.img" "$turi" || fail "data converted into NBD differ"

# bench: writes land on the server (-P pattern), reads run.
"$IOPLANE" bench -w -c 4096 -d 32 -s 4k --pattern=0x5a -f raw "$turi" >"$T/bench.out" ||
	fail "bench -w on $turi: $(cat "$T/bench.out")"
qemu-io -f raw "$turi" -c 'read -P 0x5a 0 16M' | grep -q "read 16777216" ||
	fail "bench's writes are not on the server"
"$IOPLANE" bench -c 4096 -d 32 -f raw "$muri" >"$T/bench.out" || fail "bench on $muri"
grep -q "^IOPS" "$T/bench.out" || fail "bench printed no IOPS: $(cat "$T/bench.out")"

# qcow2 on NBD: created with qemu-img on a file, served by qemu-nbd as raw bytes;
# ioplane probes the format through the driver and reads the guest's data.
qemu-img create -q -f qcow2 "$T/q.qcow2" 16M
qemu-io -f qcow2 "$T/q.qcow2" -c 'write -P 0x71 1M 64k' >/dev/null
qsock=$T/q.sock
nbdc_qemu_nbd "$qsock" "$T/q.qcow2"
quri="nbd+unix:///?socket=$qsock"
"$IOPLANE" img info "$quri" | grep -q "file format: qcow2" || fail "qcow2 on NBD not probed"
"$IOPLANE" img convert -f qcow2 -O raw "$quri" "$T/q.raw"
qemu-img compare -U -f qcow2 -F raw "$T/q.qcow2" "$T/q.raw" || fail "qcow2 on NBD read wrongly"
"$IOPLANE" img map --output=json -f qcow2 "$quri" | grep -q '"start": 1048576, "length": 65536' ||
	fail "img map of qcow2 on NBD"

# ioplane as the server.
isock=$T/ioplane.sock
nbd_serve --image d,file="$T/ref.img",format=raw --nbd unix="$isock",image=d,writable=on
"$IOPLANE" img compare -f raw -F raw "$(nbd_uri d "$isock")" "$T/ref.img" ||
	fail "compare through ioplane's own NBD server"
nbd_stop

# Errors: no server, read-only export opened for writing, bad URI. Clear, no crash.
out=$("$IOPLANE" img info "nbd+unix:///?socket=$T/nothing.sock" 2>&1) && fail "no server: $out"
grep -q "cannot connect" <<<"$out" || fail "no server: unclear error: $out"
rsock=$T/ro.sock
nbdc_qemu_nbd "$rsock" "$T/ref.img" -r
out=$("$IOPLANE" img convert -n -f raw -O raw "$T/out.img" "nbd+unix:///?socket=$rsock" 2>&1) &&
	fail "writing to a read-only export succeeded"
grep -q "read-only" <<<"$out" || fail "read-only export: unclear error: $out"
out=$("$IOPLANE" img info "nbd+unix:///?socket=$rsock" 2>&1) || fail "read-only info: $out"
out=$("$IOPLANE" serve --image x,driver=nbd,server.type=unix --nbd unix="$T/x.sock",image=x 2>&1) && fail "bad options: $out"
grep -q "server.path" <<<"$out" || fail "missing server.path: unclear error: $out"
echo PASS
