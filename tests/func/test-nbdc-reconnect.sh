#!/bin/bash
# The nbd driver when its server goes away. ioplane re-exports a remote disk over NBD
# (reconnect-delay=30); fio writes with verification through it while the remote server
# (qemu-nbd, then ioplane itself) is killed with SIGKILL and started again: every write
# succeeds and reads back right (nothing acknowledged is lost). With reconnect-delay=1
# and the server down for longer, requests fail with EIO and the daemon stays up; once
# the server is back, the next request gets through.
. "$(dirname "$0")/nbdc-lib.sh"

nbd_need_ioplane
nbd_need fio qemu-io qemu-nbd
fio --enghelp 2>/dev/null | grep -qw nbd || skip "this fio has no nbd engine"

T=$NBD_TMP
img=$T/back.img
bsock=$T/back.sock
fsock=$T/front.sock
truncate -s 64M "$img"

# back_start KIND: the remote server on $bsock (qemu-nbd or ioplane).
back_start() {
	if [ "$1" = qemu-nbd ]; then
		nbdc_qemu_nbd "$bsock" "$img"
	else
		nbdc_bg "$bsock" "$IOPLANE" serve --image b,file="$img",format=raw \
			--nbd unix="$bsock",image=b,name=,writable=on
	fi
	BACK_PID=$NBDC_PID
}

# fio_verify URI SIZE: random 4k writes at depth 16 over SIZE, then verified.
fio_verify() {
	(cd "$T" && exec timeout 300 fio --name=rc --ioengine=nbd --uri="$1" --rw=randwrite \
		--bs=4k --size="$2" --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 \
		--randrepeat=1 --output-format=json)
}

# Prints "error WRITTEN_KiB READ_KiB" of a fio JSON report.
fio_sum() {
	python3 -c 'import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]
print(j["error"], j["write"]["io_kbytes"], j["read"]["io_kbytes"])' "$1"
}

for kind in qemu-nbd ioplane; do
	back_start $kind
	nbd_serve --image r,driver=nbd,server.type=unix,server.path="$bsock",reconnect-delay=30 \
		--nbd unix="$fsock",image=r,writable=on
	front=$NBD_PID
	fio_verify "$(nbd_uri r "$fsock")" 48M >"$T/fio.json" 2>&1 &
	fpid=$!
	# Kill the server twice while fio runs (bounded: fio may finish first).
	for n in 1 2; do
		sleep 0.4
		kill -0 $fpid 2>/dev/null || break
		nbdc_kill "$BACK_PID"
		sleep 0.5
		back_start $kind
	done
	rc=0
	wait $fpid || rc=$?
	[ $rc -eq 0 ] || fail "$kind: fio failed across server restarts: $(tail -20 "$T/fio.json")"
	read -r err wkb rkb < <(fio_sum "$T/fio.json")
	[ "$err" = 0 ] && [ "$wkb" -ge 49152 ] && [ "$rkb" -ge 49152 ] ||
		fail "$kind: fio error=$err written=$wkb read=$rkb KiB"
	grep -q "connection lost" "$NBD_LOG" || fail "$kind: the server was never lost"
	grep -q "connected again" "$NBD_LOG" || fail "$kind: no reconnection logged"
	nbd_alive "$front"
	nbd_stop "$front"
	nbdc_kill "$BACK_PID"
done

# Beyond reconnect-delay: EIO, the daemon stays, the next request after the server's
# return gets through.
back_start qemu-nbd
nbd_serve --image r,driver=nbd,server.type=unix,server.path="$bsock",reconnect-delay=1 \
	--nbd unix="$fsock",image=r,writable=on
front=$NBD_PID
furi=$(nbd_uri r "$fsock")
nbd_qemu_io "$furi" 'write -P 0x33 0 64k' >/dev/null
nbdc_kill "$BACK_PID"
rm -f "$bsock"
out=$(timeout 60 qemu-io -f raw "$furi" -c 'read -P 0x33 0 64k' 2>&1) || true
grep -q "Input/output error" <<<"$out" || fail "server down past the delay: $out"
nbd_alive "$front"
back_start qemu-nbd
nbd_qemu_io "$furi" 'read -P 0x33 0 64k' >/dev/null
nbd_qemu_io "$furi" 'write -P 0x34 64k 64k' 'read -P 0x34 64k 64k' >/dev/null
nbd_stop "$front"
echo PASS
