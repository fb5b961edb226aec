#!/bin/bash
# Malformed and hostile NBD clients (tests/func/nbd-hostile.py, a raw-protocol client)
# against one daemon with a writable and a read-only export: every reply is checked
# against the NBD spec, a well-behaved client keeps being served meanwhile, the daemon
# never dies and still stops cleanly (exit 0) at the end; the data on disk is intact.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need python3 qemu-io

w=$NBD_TMP/w.img
ro=$NBD_TMP/ro.img
sock=$NBD_TMP/nbd.sock
# Writable: 16 MiB, sparse (the hostile client writes its own data; [8M, 12M) stays a hole).
truncate -s 16M "$w"
truncate -s 4M "$ro"
qemu-io -f raw "$ro" -c 'write -P 0x3c 0 4M' >/dev/null

nbd_serve --image w,file="$w" --image r,file="$ro",read-only=on \
	--nbd unix="$sock",image=w,writable=on --nbd unix="$sock",image=r,name=ro
rc=0
python3 "$NBD_LIB_DIR/nbd-hostile.py" --socket "$sock" --export w --ro-export ro \
	--pid "$NBD_PID" "$@" || rc=$?
nbd_alive
nbd_stop
[ $rc -eq 0 ] || fail "nbd-hostile.py: $rc"

nbd_file_check "$ro" 'read -P 0x3c 0 4M'
# The hole was never written through any client.
nbd_file_check "$w" 'read -P 0 8M 4M'
echo PASS
