#!/bin/bash
# The rbd protocol driver against a real single-node Ceph cluster (lib-ceph.sh):
#  - img create (raw, qcow2), info, map (the same extents as qemu-img's), convert to and
#    from RBD, compare, check, resize, with QEMU's rbd driver and `rbd export` reading
#    back what ioplane wrote, and ioplane reading what QEMU wrote;
#  - raw and qcow2 on RBD served over NBD: writes, FUA, write-zeroes, discard, flush,
#    holes in nbdinfo --map; data checked with rbd export and qemu-img compare rbd:;
#    qcow2 on RBD over vhost-user-blk, written and verified by a vhost-user front-end;
#  - the OSD frozen mid-run (rados_osd_op_timeout=3): requests fail with an error, the
#    daemon and its other export stay up.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/lib-ceph.sh"

nbd_need_ioplane
ceph_need
nbd_need qemu-img qemu-io nbdinfo
qemu-img --help | grep -qw rbd || skip "qemu-img has no rbd driver (qemu-block-extra)"
ceph_start

# Every client command is bounded: a stalled cluster must fail the test, not hang it.
b() {
	timeout 120 "$@"
}

# rbd_size IMAGE: its size in bytes, as rbd sees it.
rbd_size() {
	b rbd info "rbd/$1" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])'
}

T=$NBD_TMP
truncate -s 32M "$T/src.img"
qemu-io -f raw "$T/src.img" -c 'write -P 0x61 0 1M' -c 'write -P 0x62 9M 2M' \
	-c 'write -P 0x63 31M 1M' >/dev/null

# 1. The image tool. Raw: ioplane creates and writes, QEMU and rbd read back.
b "$IOPLANE" img create -q -f raw rbd:rbd/a 32M
[ "$(rbd_size a)" = 33554432 ] ||
	fail "img create: wrong size"
b "$IOPLANE" img convert -n -f raw -O raw "$T/src.img" rbd:rbd/a
b qemu-img compare -f raw -F raw "$T/src.img" rbd:rbd/a || fail "QEMU reads other data"
b rbd export --no-progress rbd/a "$T/a.exp" >/dev/null
cmp "$T/src.img" "$T/a.exp" || fail "rbd export differs from what was written"
b "$IOPLANE" img compare -f raw -F raw rbd:rbd/a "$T/src.img" || fail "img compare on rbd:"
b "$IOPLANE" img map --output=json -f raw rbd:rbd/a >"$T/map.ioplane"
b qemu-img map --output=json -f raw rbd:rbd/a >"$T/map.qemu"
diff -u "$T/map.qemu" "$T/map.ioplane" || fail "img map differs from qemu-img's"
grep -q '"data": false' "$T/map.ioplane" || fail "img map shows no hole"
b "$IOPLANE" img info rbd:rbd/a | grep -q "virtual size: 32 MiB" || fail "img info"

# convert: to qcow2 on RBD (created by ioplane), back to a file; QEMU reads the qcow2.
b "$IOPLANE" img convert -f raw -O qcow2 "$T/src.img" rbd:rbd/q
b qemu-img compare -f raw -F qcow2 "$T/src.img" rbd:rbd/q || fail "qcow2 on RBD: QEMU differs"
b "$IOPLANE" img check rbd:rbd/q >/dev/null || fail "img check of qcow2 on RBD"
b qemu-img check -f qcow2 rbd:rbd/q >/dev/null || fail "qemu-img check of qcow2 on RBD"
b "$IOPLANE" img convert -O raw rbd:rbd/q "$T/q.raw"
cmp "$T/src.img" "$T/q.raw" || fail "convert from qcow2 on RBD"
# And the reverse: QEMU writes, ioplane reads.
b qemu-img create -q -f raw rbd:rbd/b 8M
b qemu-io -f raw rbd:rbd/b -c 'write -P 0x71 1M 64k' >/dev/null
b "$IOPLANE" img convert -f raw -O raw rbd:rbd/b "$T/b.raw"
qemu-io -f raw "$T/b.raw" -c 'read -P 0x71 1M 64k' -c 'read -P 0 0 1M' | grep -q "read 1048576" ||
	fail "ioplane read what QEMU wrote wrongly"

# resize
b "$IOPLANE" img resize -f raw rbd:rbd/b +8M >/dev/null
[ "$(rbd_size b)" = 16777216 ] ||
	fail "img resize on rbd:"

# 2. Served over NBD: raw, then qcow2.
sock=$T/nbd.sock
uri=$(nbd_uri r "$sock")
b "$IOPLANE" img create -q -f raw rbd:rbd/s 32M
nbd_serve --image r,file=rbd:rbd/s,format=raw --nbd unix="$sock",image=r,writable=on
nbd_qemu_io "$uri" 'write -P 0x41 0 1M' 'write -f -P 0x42 4M 64k' 'write -z 8M 1M' \
	'write -P 0x43 12M 1M' 'discard 12M 1M' 'write -z -u 16M 64k' 'flush' \
	'read -P 0x41 0 1M' 'read -P 0x42 4M 64k' 'read -P 0 12M 1M' >/dev/null
nbdinfo --map "$uri" >"$T/nbdmap"
awk '$1 == 0 && $4 == "data" { d = 1 } $4 == "hole,zero" { h = 1 } END { exit !(d && h) }' \
	"$T/nbdmap" || fail "holes lost through NBD: $(cat "$T/nbdmap")"
nbd_stop
truncate -s 32M "$T/want.img"
qemu-io -f raw "$T/want.img" -c 'write -P 0x41 0 1M' -c 'write -P 0x42 4M 64k' >/dev/null
b rbd export --no-progress rbd/s "$T/s.exp" >/dev/null
cmp "$T/want.img" "$T/s.exp" || fail "data written over NBD: rbd export differs"
b qemu-img compare -f raw -F raw "$T/want.img" rbd:rbd/s || fail "qemu-img compare rbd:rbd/s"

b qemu-img create -q -f qcow2 rbd:rbd/sq 32M
nbd_serve --image r,file=rbd:rbd/sq,format=qcow2 --nbd unix="$sock",image=r,writable=on
nbd_qemu_io "$uri" 'write -P 0x41 0 1M' 'write -f -P 0x42 4M 64k' 'write -z 8M 1M' \
	'flush' >/dev/null
nbd_stop
b qemu-img compare -f raw -F qcow2 "$T/want.img" rbd:rbd/sq || fail "qcow2 on RBD over NBD"
b qemu-img check -f qcow2 rbd:rbd/sq >/dev/null || fail "qcow2 on RBD: qemu-img check"

# vhost-user-blk: qcow2 on RBD, written and read back by a vhost-user front-end that
# checks the data (--verify); QEMU then reads the same bytes.
vsock=$T/vhost.sock
nbd_serve --image v,file=rbd:rbd/sq,format=qcow2 \
	--vhost-user-blk unix="$vsock",image=v,num-queues=2,writable=on
for ((i = 0; i < 100; i++)); do [ -S "$vsock" ] && break; sleep 0.1; done
b "$IOPLANE" bench --vhost-user "$vsock" --num-queues 2 -w -c 512 -d 16 -s 4096 -o 20M \
	--verify -q || fail "vhost-user writes on qcow2 on RBD"
b "$IOPLANE" bench --vhost-user "$vsock" --num-queues 2 -c 512 -d 16 -s 4096 -o 20M \
	--verify -q || fail "vhost-user reads on qcow2 on RBD do not verify"
nbd_stop
b qemu-img convert -f qcow2 -O raw rbd:rbd/sq "$T/sq.raw"
cmp -n 20M "$T/want.img" "$T/sq.raw" || fail "vhost-user writes changed other data"
python3 - "$T/sq.raw" <<'PY' || fail "vhost-user writes are not on RBD"
import sys
with open(sys.argv[1], "rb") as f:
    f.seek(20 << 20)
    data = f.read(512 * 4096)
sys.exit(0 if data.strip(b"\0") else 1)
PY

# 3. The OSD frozen mid-run: errors within the op timeout, the daemon and its null
# export stay up; I/O works again afterwards.
nsock=$T/null.sock
nbd_serve --image r,file=rbd:rbd/s:rados_osd_op_timeout=3,format=raw,cache=none \
	--image n,driver=null,size=16M,read-zeroes=on \
	--nbd unix="$sock",image=r,writable=on --nbd unix="$nsock",image=n,writable=on
# The freeze lasts one op timeout: much longer and librbd's watch on the image
# expires, after which it waits on the cluster without a timeout.
ceph_osd_freeze
out=$(timeout 60 qemu-io -f raw "$uri" -c 'read -P 0x41 0 64k' 2>&1) || true
nbd_qemu_io "$(nbd_uri n "$nsock")" 'read -P 0 0 1M' >/dev/null
ceph_osd_thaw
grep -qiE "error|timed out" <<<"$out" || fail "frozen OSD: no error: $out"
nbd_alive
# Recovery is not asserted: on a loaded machine this one-OSD cluster sometimes
# answers nobody after the thaw, a new `rbd export` included (docs/remote.md).
# The daemon must still shut down cleanly: status 0, or 1 when its last flush
# failed, never a crash or a hang.
kill -TERM "$NBD_PID"
for ((i = 0; i < 600; i++)); do
	kill -0 "$NBD_PID" 2>/dev/null || break
	sleep 0.1
done
kill -0 "$NBD_PID" 2>/dev/null && fail "the daemon did not exit after SIGTERM"
rc=0
wait "$NBD_PID" || rc=$?
nbd_forget "$NBD_PID"
[ $rc -le 1 ] || fail "the daemon exited with status $rc"
echo PASS
