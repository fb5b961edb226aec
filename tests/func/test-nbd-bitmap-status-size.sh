#!/bin/bash
# One NBD_CMD_BLOCK_STATUS of qemu:dirty-bitmap:NAME answers the whole range asked, as
# qemu-storage-daemon does, however many extents that takes: a backup client walks the
# disk in few round trips. The same nbdsh script against both: a 4 KiB-granularity
# bitmap with 300 dirty granules (600 extents) in 4 MiB is listed by one request over
# the disk (compact replies, then extended headers where libnbd has them) and the
# extents are the same; REQ_ONE still gets one; a request past a granule boundary
# ends where asked.
. "$(dirname "$0")/nbd-lib.sh"
need qemu-img qemu-io qemu-storage-daemon
py=
for p in /usr/bin/python3 python3; do
	if "$p" -c 'import nbd' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || skip "nbdsh (python3-libnbd) is not installed"

cd "$NBD_TMP"
qemu-img create -q -f qcow2 disk.qcow2 4M
qemu-img bitmap --add -g 4096 disk.qcow2 b0
for ((i = 0; i < 300; i++)); do echo "write -P 7 $((i * 12288)) 4k"; done >writes
qemu-io -f qcow2 disk.qcow2 <writes >/dev/null
qemu-img bitmap --disable disk.qcow2 b0

walk() { # URI
	"$py" - "$1" <<'PY'
import nbd, sys
def run(extended):
    h = nbd.NBD()
    h.add_meta_context("qemu:dirty-bitmap:b0")
    if hasattr(h, "set_request_extended_headers"):
        h.set_request_extended_headers(extended)
    elif extended:
        return
    h.connect_uri(sys.argv[1])
    size = h.get_size()
    got = []
    def cb(meta, off, ents, err):
        got.append(list(ents))
        return 0
    h.block_status(size, 0, cb)
    if len(got) != 1:
        sys.exit("%d chunks" % len(got))
    e = got[0]
    print("extended=%s extents=%d covered=%d dirty=%d" % (extended, len(e) // 2,
          sum(e[0::2]), sum(n for n, f in zip(e[0::2], e[1::2]) if f & 1)))
    got.clear()
    h.block_status(size, 0, cb, nbd.CMD_FLAG_REQ_ONE)
    print("req-one: %d extent(s), %s" % (len(got[0]) // 2, got[0][:2]))
    got.clear()
    h.block_status(6144, 2048, cb)
    print("part:", got[0])
    h.shutdown()
run(False)
run(True)
PY
}

for kind in qsd ioplane; do
	cp disk.qcow2 "$kind.qcow2"
	sock=$NBD_TMP/$kind.sock
	cmd=(qemu-storage-daemon)
	[ "$kind" = qsd ] || cmd=("$IOPLANE" serve -q)
	"${cmd[@]}" --blockdev "driver=file,filename=$kind.qcow2,node-name=f,read-only=on" \
		--blockdev driver=qcow2,file=f,node-name=q,read-only=on \
		--nbd-server "addr.type=unix,addr.path=$sock" \
		--export type=nbd,id=e,node-name=q,name=d,bitmaps.0=b0 </dev/null >"$kind.log" 2>&1 &
	pid=$!
	nbd_pids+=("$pid")
	nbd_logs+=("$NBD_TMP/$kind.log")
	for ((i = 0; i < 200; i++)); do
		[ -S "$sock" ] && break
		kill -0 "$pid" 2>/dev/null || fail "$kind did not start: $(cat "$kind.log")"
		sleep 0.05
	done
	walk "nbd+unix:///d?socket=$sock" >"$kind.out" || fail "$kind: $(cat "$kind.out")"
	kill "$pid"
	wait "$pid" || true
done
cat ioplane.out
grep -q "extended=False extents=600 covered=4194304 dirty=1228800" ioplane.out ||
	fail "ioplane did not answer the whole disk in one reply"
diff -u qsd.out ioplane.out || fail "the replies differ (qsd -, ioplane +)"
echo "bitmap block status: one reply for the disk, as qsd"
