#!/bin/bash
# ioplane re-exporting a remote NBD disk (the nbd driver under the NBD server):
#  - each client command reaches the remote server as the same command with the same
#    flags (FUA, zero with and without trim, trim, flush), seen in nbdkit's log filter;
#  - holes come through block status (nbdinfo --map), the same map as
#    qemu-storage-daemon's re-export (--blockdev driver=nbd) after the same client script;
#  - a slow server (delay filter) under fio with verification at depth 16;
#  - a failing server (error filter): reads fail with EIO while errors are injected,
#    writes and the daemon go on, reads work again afterwards;
#  - connections=2 with two iothreads: two connections when the server offers multi-conn,
#    one (requests forwarded between iothreads) when it does not; data verified.
. "$(dirname "$0")/nbdc-lib.sh"

nbdc_need_memory
nbd_need qemu-io nbdinfo fio
fio --enghelp 2>/dev/null | grep -qw nbd || skip "this fio has no nbd engine"

T=$NBD_TMP
bsock=$T/back.sock
fsock=$T/front.sock
furi=$(nbd_uri r "$fsock")

# front [OPTS]: ioplane re-exporting $bsock as export r on $fsock.
front() {
	nbd_serve --image r,driver=nbd,server.type=unix,server.path="$bsock"${1:+,$1} \
		--nbd unix="$fsock",image=r,writable=on "${@:2}"
}

# The client script of the comparison with qemu-storage-daemon.
client_script() {
	qemu-io -f raw -t none "$1" -c 'write -P 0x41 0 1M' -c 'write -f -P 0x42 2M 64k' \
		-c 'write -z -u 4M 1M' -c 'write -z 6M 64k' -c 'discard 0 64k' -c 'flush' \
		-c 'write -P 0x43 9M 4k' >/dev/null
}

# 1. One to one, with the log filter.
log=$T/nbdkit.log
nbdc_nbdkit "$bsock" --filter=log memory 64M logfile="$log"
back=$NBDC_PID
front
client_script "$furi"
nbd_qemu_io "$furi" 'read -P 0x41 64k 960k' 'read -P 0x42 2M 64k' 'read -P 0 4M 1M' >/dev/null
grep -q 'Write id=[0-9]* offset=0x200000 count=0x10000 fua=1' "$log" || fail "FUA write not passed"
grep -q 'Write id=[0-9]* offset=0x0 count=0x100000 fua=0' "$log" || fail "plain write"
grep -q 'Zero id=[0-9]* offset=0x400000 count=0x100000 trim=1 fua=0' "$log" ||
	fail "write-zeroes with unmap not passed as a trimming zero"
grep -q 'Zero id=[0-9]* offset=0x600000 count=0x10000 trim=0 fua=0' "$log" ||
	fail "write-zeroes without unmap not passed as zero without trim"
grep -q 'Trim id=[0-9]* offset=0x0 count=0x10000' "$log" || fail "discard not passed as trim"
grep -q 'Flush id=' "$log" || fail "flush not passed"
nbdinfo --map "$furi" >"$T/map.ioplane"
cat "$T/map.ioplane"
python3 - "$T/map.ioplane" <<'PY' || fail "the zeroed range at 4M is not a hole"
import sys
for line in open(sys.argv[1]):
    start, length, flags = (int(x) for x in line.split()[:3])
    if start <= 4 << 20 and start + length >= 5 << 20:
        sys.exit(0 if flags == 3 else 1)
sys.exit(1)
PY
nbd_stop
nbdc_kill "$back"

# 2. The same script through qemu-storage-daemon's re-export (discard=unmap, ioplane's
# default): the same map.
if command -v qemu-storage-daemon >/dev/null; then
	nbdc_nbdkit "$bsock" memory 64M
	back=$NBDC_PID
	nbdc_bg "$fsock" qemu-storage-daemon \
		--blockdev driver=nbd,node-name=r,discard=unmap,server.type=unix,server.path="$bsock" \
		--nbd-server addr.type=unix,addr.path="$fsock" \
		--export type=nbd,id=e,node-name=r,name=r,writable=on
	qsd=$NBDC_PID
	client_script "$furi"
	nbdinfo --map "$furi" >"$T/map.qsd"
	nbdc_kill "$qsd"
	nbdc_kill "$back"
	diff -u "$T/map.qsd" "$T/map.ioplane" || fail "map differs from qemu-storage-daemon's"
fi

# fio_verify URI SIZE [JOBS]: random 4k writes at depth 16, verified.
fio_verify() {
	(cd "$T" && exec timeout 300 fio --name=v --ioengine=nbd --uri="$1" --rw=randwrite \
		--bs=4k --size="$2" --numjobs="${3:-1}" --offset_increment="$2" --iodepth=16 \
		--verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=1 \
		--group_reporting --output-format=terse) >"$T/fio.out" 2>&1 ||
		fail "fio on $1: $(tail -5 "$T/fio.out")"
}

# 3. Slow server.
nbdc_nbdkit "$bsock" --filter=delay memory 64M rdelay=2ms wdelay=2ms
back=$NBDC_PID
front
fio_verify "$furi" 2M
nbd_stop
nbdc_kill "$back"

# 4. Failing server: EIO on reads while $T/err exists.
nbdc_nbdkit "$bsock" --filter=error memory 64M error=EIO error-pread-rate=100% \
	error-pread-file="$T/err"
back=$NBDC_PID
front
nbd_qemu_io "$furi" 'write -P 0x51 0 64k' >/dev/null
touch "$T/err"
out=$(timeout 60 qemu-io -f raw "$furi" -c 'read -P 0x51 0 64k' 2>&1) || true
grep -q "Input/output error" <<<"$out" || fail "read from a failing server: $out"
nbd_qemu_io "$furi" 'write -P 0x52 64k 64k' >/dev/null
nbd_alive
rm -f "$T/err"
nbd_qemu_io "$furi" 'read -P 0x51 0 64k' 'read -P 0x52 64k 64k' >/dev/null
nbd_stop
nbdc_kill "$back"

# 5. connections=2 over two iothreads, with and without multi-conn.
for mc in plugin disable; do
	: >"$log"
	nbdc_nbdkit "$bsock" --filter=multi-conn --filter=log memory 64M \
		multi-conn-mode=$mc logfile="$log"
	back=$NBDC_PID
	front connections=2 --iothreads 2
	fio_verify "$furi" 8M 4
	n=$(grep -c ' Connect export=' "$log")
	if [ $mc = plugin ]; then
		[ "$n" -eq 2 ] || fail "multi-conn: $n connections, not 2"
	else
		[ "$n" -eq 1 ] || fail "no multi-conn: $n connections, not 1"
		grep -q "does not offer multi-conn" "$NBD_LOG" || fail "no multi-conn warning"
	fi
	nbd_stop
	nbdc_kill "$back"
done
echo PASS
